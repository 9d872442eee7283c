"""Protocols, one file each. Every `run(ctx)` returns a JSON-able dict of results."""

from __future__ import annotations

from collections.abc import Callable

from server.context import RunContext

from . import centralized, fedprox, local_only, mixup_union

REGISTRY: dict[str, Callable[[RunContext], dict]] = {
    "mixup-union": mixup_union.run,
    "local-only": local_only.run,
    "fedavg": fedprox.run_fedavg,
    "fedprox": fedprox.run,
    "centralized": centralized.run,
}
