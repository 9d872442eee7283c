"""ServerApp: read the run config once, run each configured strategy, write results.json."""

from __future__ import annotations

import time
import traceback

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsmix.config import Settings, dump_settings, settings_from_flower
from fedsmix.device import select_device
from fedsmix.runs import new_run_dir
from server import results as results_io
from server.context import RunAborted, RunContext
from strategies import REGISTRY

def run_experiment(grid: Grid, settings: Settings, run_id: int = 0) -> dict:
    """Run every strategy in `settings.strategies` on the same partitions; never lose a result."""
    run_dir = new_run_dir(settings.runs_dir, settings.run_name, run_id)
    ctx = RunContext(settings=settings, grid=grid, run_dir=run_dir, device=select_device(settings.device), run_id=run_id)
    results = {
        "run-id": run_id,
        "run-dir": str(run_dir),
        "settings": dump_settings(settings),
        "num-parties": len(list(grid.get_node_ids())),
        "device": ctx.device,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "strategies": {},
    }
    print(f"fedsmix: run directory {run_dir}", flush=True)
    failures = []
    for name in settings.strategies:
        ctx.reset_traffic()
        try:
            results["strategies"][name] = REGISTRY[name](ctx)
        except RunAborted as err:
            results["strategies"][name] = {"error": str(err)}
            failures.append(f"{name}: {err}")
        except Exception as err:  # keep the other strategies' results, then fail the run
            results["strategies"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            failures.append(f"{name}: {type(err).__name__}: {err}")
        results["num-parties"] = len(list(grid.get_node_ids()))  # SuperNodes may register after the start
        results_io.write(run_dir, results)  # after every strategy: nothing finished is lost
    results["num-parties"] = max(results["num-parties"], len(list(grid.get_node_ids())))  # may still register at start
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results_io.write(run_dir, results)
    results_io.render(results)
    if failures:
        raise RunAborted("; ".join(failures) + f" (partial results in {run_dir / 'results.json'})")
    return results


def make_app(overrides: dict | None = None) -> ServerApp:
    """The ServerApp. `flwr run` passes overrides through the run; in-process callers pass them here."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        given = overrides if overrides is not None else grid.run.override_config
        settings = settings_from_flower(context.run_config, given)
        run_experiment(grid, settings, run_id=context.run_id)

    return server_app


app = make_app()
