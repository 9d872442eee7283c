"""Imports run one way (commands -> server/strategies/clients -> fedsmix), and the attack registry is
the one list of attacks the settings schema accepts."""

from __future__ import annotations

import ast
from pathlib import Path

from fedsmix.config import ATTACKS
from server.adversary.registry import REGISTRY, applicable

ROOT = Path(__file__).resolve().parent.parent


def imported_packages(folder: str, skip: tuple[str, ...] = ()) -> dict[str, set[str]]:
    out = {}
    for path in (ROOT / folder).rglob("*.py"):
        if path.name in skip:
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


def test_the_library_imports_neither_flower_nor_the_apps():
    # fedsmix/__main__.py is the `python -m fedsmix` entry shim: it hands over to commands/
    for path, names in imported_packages("fedsmix", skip=("__main__.py",)).items():
        assert not names & {"flwr", "server", "strategies", "clients", "commands"}, path


def test_protocols_and_apps_never_import_the_commands_or_the_clients():
    for folder in ("server", "strategies"):
        for path, names in imported_packages(folder).items():
            assert not names & {"clients", "commands"}, path
    for path, names in imported_packages("clients").items():
        assert not names & {"server", "strategies", "commands"}, path


def test_the_registry_is_the_schemas_list_of_attacks():
    assert tuple(REGISTRY) == ATTACKS
    assert applicable("singularized") == ("linear", "mmse", "unet", "abs-solve", "averaging")
    assert applicable("fedprox") == ("gradient", "gradient-realistic") and applicable("local-only") == ()
