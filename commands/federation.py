"""Simulation resources: Flower's federation config from a preset's `federation:` block and flags.

Flower 1.42 takes a fixed set of keys through `flwr run --federation-config` (its
`SimulationConfig`: flwr/proto/federation_config.proto, parsed by
flwr/supercore/utils.py::simulation_config_from_json) and turns them into the Ray backend's
config in flwr/simulation/app.py::_run_simulation_settings. This module checks a preset's keys
against that set, with the types Flower's protobuf needs, and gives both spellings: the one for
`--federation-config` and the `backend_config` of the in-process `run_simulation`.

Joining a Ray cluster: Flower's Ray backend calls `ray.init()` without an address, so Ray uses
`RAY_ADDRESS` when it is set (else the cluster `ray start` last wrote to its temp dir). The key
`ray-address` is ours: the launcher exports it as RAY_ADDRESS. With a cluster, leave
`init-args-num-cpus`/`init-args-num-gpus` out: Ray refuses them when connecting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedsmix.config import SettingsError, read_preset_block

# one CPU per party on a 2-core machine; a preset's `federation:` block or the caller overrides
DEFAULT_FEDERATION = {"client-resources-num-cpus": 1, "client-resources-num-gpus": 0.0, "init-args-num-cpus": 2}

# Flower 1.42 SimulationConfig fields (dashed, as on the command line) and their protobuf types
FLOWER_KEYS: dict[str, type] = {
    "num-supernodes": int,
    "client-resources-num-cpus": int,  # uint32 in the proto: whole CPUs only
    "client-resources-num-gpus": float,  # fractions share a GPU: 0.25 = four parties per GPU
    "backend": str,
    "verbose": bool,
    "init-args-num-cpus": int,
    "init-args-num-gpus": int,
    "init-args-logging-level": str,
    "init-args-log-to-driver": bool,
}
OUR_KEYS: dict[str, type] = {"ray-address": str}
KEYS = {**FLOWER_KEYS, **OUR_KEYS}


def _typed(key: str, value: Any) -> Any:
    want = KEYS[key]
    if want is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "false"):
            return str(value).lower() == "true"
    elif want is int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, float) and value.is_integer() and value >= 0:
            return int(value)
    elif want is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value)
    elif isinstance(value, str):
        return value
    raise SettingsError(f"federation: {key} = {value!r}: expected a non-negative {want.__name__}")


def federation_config(preset: str = "", overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The preset's `federation:` block, then the overrides (`--federation key=value`), checked and typed."""
    merged: dict[str, Any] = {}
    if preset:
        block = read_preset_block(preset, "federation")
        if not isinstance(block, Mapping):
            raise SettingsError(f"preset {preset!r}: 'federation' must be a mapping of federation-config keys")
        merged.update(block)
    merged.update(overrides or {})
    unknown = sorted(k for k in merged if k not in KEYS)
    if unknown:
        raise SettingsError(f"federation: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    return {key: _typed(key, value) for key, value in merged.items()}


def flower_part(federation: Mapping[str, Any]) -> dict[str, Any]:
    """What `flwr run --federation-config` accepts (our own keys removed)."""
    return {k: v for k, v in federation.items() if k in FLOWER_KEYS}


def environment(federation: Mapping[str, Any]) -> dict[str, str]:
    """Environment for the process that starts the simulation (and the SuperLink it spawns)."""
    return {"RAY_ADDRESS": str(federation["ray-address"])} if federation.get("ray-address") else {}


def backend_config(federation: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`backend_config` for flwr.simulation.run_simulation, mapped as Flower maps `--federation-config`."""
    config: dict[str, Any] = {"client_resources": {}, "init_args": {}}
    for key, value in {**(defaults or {}), **federation}.items():
        if key.startswith("client-resources-"):
            config["client_resources"][key.removeprefix("client-resources-").replace("-", "_")] = value
        elif key.startswith("init-args-"):
            config["init_args"][key.removeprefix("init-args-").replace("-", "_")] = value
        elif key == "ray-address":
            config["init_args"]["address"] = value
    return config
