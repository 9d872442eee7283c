"""`python -m fedsmix ...`: the entry point only. The commands live in `commands/` (they import the
server side; the library never does), so this shim hands over to them."""

import sys

from commands.cli import main

sys.exit(main())
