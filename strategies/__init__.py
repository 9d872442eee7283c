"""Protocols, one file each, and the one list of them: `run(ctx)` returns a JSON-able dict of results."""

from __future__ import annotations

from fedsmix.registry import STRATEGIES

from . import centralized, fedprox, local_only, mixup_union
from .common import Protocol

STRATEGIES.add("mixup-union", Protocol(mixup_union.run, uploads=True))
STRATEGIES.add("local-only", Protocol(local_only.run))
STRATEGIES.add("fedavg", Protocol(fedprox.run_fedavg))
STRATEGIES.add("fedprox", Protocol(fedprox.run))
STRATEGIES.add("centralized", Protocol(centralized.run, parties=False))
