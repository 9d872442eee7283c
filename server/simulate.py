"""In-process simulation of the real apps (Flower's simulation engine on Ray), for tests and
scripts that want results back as a dict without the `flwr` CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

from flwr.simulation import run_simulation

from clients.app import app as client_app
from fedsmix.config import load_settings
from fedsmix.federation import DEFAULT_FEDERATION
from fedsmix.federation import backend_config as federation_backend
from fedsmix.federation import federation_config
from server.app import make_app


def simulate(overrides: dict, num_parties: int, backend_config: dict | None = None, federation: dict | None = None) -> dict:
    """Run the ServerApp with `num_parties` virtual SuperNodes; return the run's results.json.

    Resources: `backend_config` as Flower takes it, else the preset's `federation:` block with
    `federation` (federation-config keys) on top, as `python -m fedsmix run` would pass them.
    """
    settings = load_settings(overrides)  # fail fast on bad settings
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if backend_config is None:
        chosen = federation_config(settings.preset, federation)
        defaults = dict(DEFAULT_FEDERATION)
        if chosen.get("ray-address"):  # Ray refuses resource counts when it joins a cluster
            defaults.pop("init-args-num-cpus")
        backend_config = federation_backend(chosen, defaults)
    before = dict(os.environ)
    try:
        run_simulation(make_app(dict(overrides)), client_app, num_supernodes=num_parties, backend_config=backend_config)
    finally:
        _restore_environment(before)
    latest = Path(settings.runs_dir).expanduser() / "latest"
    return json.loads((latest / "results.json").read_text())


def _restore_environment(before: dict[str, str]) -> None:
    """Ray's driver exports PYTHONPATH (and more) into os.environ; later subprocesses, such as a
    system tool run by Debian's python, must not inherit this venv's site-packages."""
    for key in set(os.environ) - set(before):
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
