"""The one in-process launcher: the real ServerApp and ClientApp on Flower's simulation engine (Ray),
for the grid, the frontier, tests and benchmarks that want results back as dicts, without the
`flwr` CLI. Resources come from the preset's `federation:` block, as `fedsmix run` passes
them (commands/federation.py)."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from clients.app import app as client_app
from fedsmix.config import Settings, load_settings
from fedsmix.data import describe_dataset
from server.app import make_app, run_experiment

from .federation import DEFAULT_FEDERATION, federation_config
from .federation import backend_config as federation_backend


def backend_for(preset: str = "", federation: dict | None = None) -> dict:
    """Flower's `backend_config` from the preset's `federation:` block and overrides."""
    chosen = federation_config(preset, federation)
    defaults = dict(DEFAULT_FEDERATION)
    if chosen.get("ray-address"):  # Ray refuses resource counts when it joins a cluster
        defaults.pop("init-args-num-cpus")
    return federation_backend(chosen, defaults)


def launch(server_app, num_parties: int, backend_config: dict) -> None:
    """Run `server_app` against `num_parties` virtual SuperNodes of the fedsmix ClientApp."""
    from flwr.simulation import run_simulation

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    before = dict(os.environ)
    try:
        run_simulation(server_app, client_app, num_supernodes=num_parties, backend_config=backend_config)
    finally:
        _restore_environment(before)


def simulate(
    overrides: dict, num_parties: int, backend_config: dict | None = None, federation: dict | None = None
) -> dict:
    """Run the ServerApp with `num_parties` virtual SuperNodes; return the run's results.json.

    Resources: `backend_config` as Flower takes it, else the preset's `federation:` block with
    `federation` (federation-config keys) on top.
    """
    settings = load_settings(overrides)  # fail fast on bad settings, and on a bad data set of your own
    describe_dataset(settings)
    launch(make_app(dict(overrides)), num_parties, backend_config or backend_for(settings.preset, federation))
    latest = Path(settings.runs_dir).expanduser() / "latest"
    return json.loads((latest / "results.json").read_text())


def simulate_each(
    runs: Sequence[Settings],
    num_parties: int,
    federation: dict | None = None,
    on_result: Callable[[Settings, dict], None] | None = None,
) -> list[dict]:
    """Several experiments in one simulation, one after another on the same SuperNodes (the frontier's
    rows): each keeps its results, or its partial results and the error that stopped it."""
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp

    results: list[dict] = []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for settings in runs:
            try:
                results.append(run_experiment(grid, settings, run_id=context.run_id))
            except Exception as err:  # keep the row, with its partial results and the reason
                latest = Path(settings.runs_dir) / "latest" / "results.json"
                partial = json.loads(latest.read_text()) if latest.exists() else {"strategies": {}}
                results.append(
                    {**partial, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                )
            if on_result is not None:
                on_result(settings, results[-1])

    launch(app, num_parties, backend_for(runs[0].preset if runs else "", federation))
    if len(results) != len(runs):
        raise RuntimeError(f"the simulation finished {len(results)} of {len(runs)} runs; see the log above")
    return results


def _restore_environment(before: dict[str, str]) -> None:
    """Ray's driver exports PYTHONPATH (and more) into os.environ; later subprocesses, such as a
    system tool run by Debian's python, must not inherit this venv's site-packages."""
    for key in set(os.environ) - set(before):
        del os.environ[key]
    for key, value in before.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
