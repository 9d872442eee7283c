"""In-process simulation of the real apps (Flower's simulation engine on Ray), for tests and
scripts that want results back as a dict without the `flwr` CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

from flwr.simulation import run_simulation

from clients.app import app as client_app
from fedsmix.config import load_settings
from server.app import make_app


def simulate(overrides: dict, num_parties: int, backend_config: dict | None = None) -> dict:
    """Run the ServerApp with `num_parties` virtual SuperNodes; return the run's results.json."""
    settings = load_settings(overrides)  # fail fast on bad settings
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    backend = backend_config or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 2, "include_dashboard": False}}
    before = dict(os.environ)
    try:
        run_simulation(make_app(dict(overrides)), client_app, num_supernodes=num_parties, backend_config=backend)
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
