"""ServerApp: read the run config once, run each configured strategy, write results.json."""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsmix.acquisition import acquisition
from fedsmix.config import Settings, dump_settings, settings_from_flower
from fedsmix.data import dataset_spec, describe_dataset
from fedsmix.device import select_device
from fedsmix.progress import FILE as PROGRESS_FILE
from fedsmix.progress import Progress
from fedsmix.registry import STRATEGIES
from fedsmix.runs import new_run_dir
from fedsmix.tensorboard_log import attach as attach_tensorboard
from server import results as results_io
from server import resume
from server.context import RunAborted, RunContext
from server.linkstate import index_messages_by_node


def run_experiment(grid: Grid, settings: Settings, run_id: int = 0) -> dict:
    """Run every strategy in `settings.strategies` on the same partitions; never lose a result.

    With `resume`, the interrupted run's directory is reused and finished strategies are kept.
    """
    done: set[str] = set()
    dataset = describe_dataset(settings)  # a path data set is read and checked here, before anything is written
    if settings.resume:
        run_dir, results, done = resume.reopen(settings)
    else:
        run_dir = new_run_dir(settings.runs_dir, settings.run_name, run_id)
        results = {
            "run-id": run_id,
            "run-dir": str(run_dir),
            "settings": dump_settings(settings),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "transport": getattr(grid, "transport", "flower"),  # Flower's runtime, or the in-process transport
            "strategies": {},
        }
    progress = Progress(run_dir / PROGRESS_FILE, interval=settings.progress_interval)
    board = attach_tensorboard(progress, run_dir) if settings.tensorboard else None  # event files in the run dir
    try:
        return run_strategies(grid, settings, run_id, run_dir, results, done, dataset, progress)
    finally:
        if board is not None:
            board.close()  # also when a strategy or the run failed


def run_strategies(grid: Grid, settings: Settings, run_id: int, run_dir: Path, results: dict, done: set[str],
                   dataset: dict, progress: Progress) -> dict:
    """`run_experiment`'s strategies, once the run directory and its progress log exist."""
    ctx = RunContext(
        settings=settings, grid=grid, run_dir=run_dir, device=select_device(settings.device), run_id=run_id,
        progress=progress,
    )
    results["dataset"] = dataset
    if settings.feature_skew > 0:  # each party's acquisition (a simulation fact: fedsmix/acquisition.py)
        spec = dataset_spec(settings)
        results["acquisitions"] = {str(p): acquisition(settings, spec, p).describe()
                                   for p in range(len(list(grid.get_node_ids())))}
    results["device"] = ctx.device
    results["torch-threads"] = torch.get_num_threads()  # the central trainer's CPU threads
    print(
        f"fedsmix: run directory {run_dir}" + (f" (resumed; kept {sorted(done)})" if settings.resume else ""),
        flush=True,
    )
    failures = []
    pending = [name for name in settings.strategies if name not in done]
    progress.emit("run-start", **{"run-dir": str(run_dir), "strategies": pending, "dataset": settings.dataset,
                                  "parties": len(list(grid.get_node_ids())) or None})
    progress.emit("dataset", **dataset)
    try:
        if any(STRATEGIES[name].parties for name in pending):
            with progress.watch():
                ctx.introduce()
    except RunAborted as err:  # too few nodes connected, or none could start: every strategy would fail the same way
        for name in pending:
            results["strategies"][name] = {"error": str(err), **err.details}
        failures, pending = [str(err)], []
    record_parties(results, ctx)
    for index, name in enumerate(pending, start=1):
        ctx.reset_traffic()
        ctx.progress, started = progress.bind(strategy=name), time.perf_counter()
        ctx.progress.emit("strategy-start", index=index, total=len(pending))
        try:
            with ctx.progress.watch():
                results["strategies"][name] = STRATEGIES[name].run(ctx)
                if STRATEGIES[name].uploads and settings.adversary:
                    results["strategies"][name]["adversary"] = attack_run(ctx, results["strategies"][name])
            res = results["strategies"][name]
            ctx.progress.emit("strategy-end", accuracy=res.get("accuracy"),
                              seconds=round(time.perf_counter() - started, 3),
                              **{"bytes-up-per-party": res.get("mean-bytes-up-per-party"),
                                 "bytes-down-per-party": res.get("mean-bytes-down-per-party")})
        except RunAborted as err:
            results["strategies"][name] = {"error": str(err), **err.details}  # who dropped out, and why
            failures.append(f"{name}: {err}")
        except Exception as err:  # keep the other strategies' results, then fail the run
            results["strategies"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            failures.append(f"{name}: {type(err).__name__}: {err}")
        if "error" in results["strategies"][name]:
            ctx.progress.emit("strategy-failed", error=results["strategies"][name]["error"],
                              seconds=round(time.perf_counter() - started, 3))
        ctx.progress = progress
        name_parties(results, ctx.learn_parties())
        record_parties(results, ctx)
        results_io.write(run_dir, results)  # after every strategy: nothing finished is lost
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results_io.write(run_dir, results)
    progress.emit("run-end", failures=failures)
    results_io.render(results)
    if failures:
        raise RunAborted("; ".join(failures) + f" (partial results in {run_dir / 'results.json'})")
    return results


def attack_run(ctx: RunContext, result: dict) -> dict:
    """The honest-but-curious server attacks the uploads a strategy stored (simulation only: the
    oracle replays each party's encoding for the ground truth)."""
    from server.adversary.runner import attack_uploads
    from server.store import UploadStore

    parties = sorted(int(p) for p in result["parties"])
    return attack_uploads(ctx, UploadStore(ctx.run_dir / "uploads"), parties, result["num-partitions"])


def record_parties(results: dict, ctx: RunContext) -> None:
    """Connected nodes (SuperNodes may register late: the most seen) and the node -> party map so far."""
    results["num-parties"] = max(results.get("num-parties", 0), len(list(ctx.grid.get_node_ids())))
    results["node-party"] = {str(node): party for node, party in sorted(ctx.node_party.items())}
    if ctx.node_ray:  # the ClientApps ran under Ray: which Ray node each party ran on
        results["party-ray-node"] = {
            str(party): ctx.node_ray[node]
            for node, party in sorted(ctx.node_party.items(), key=lambda kv: kv[1]) if node in ctx.node_ray
        }


def name_parties(results: dict, node_party: dict[int, int]) -> None:
    """Name the party of dropped nodes whose hello answered late (after the strategy ended)."""
    for res in results["strategies"].values():
        for record in res.get("dropped") or []:
            if record.get("party") is None and record.get("node") in node_party:
                record["party"] = node_party[record["node"]]


def make_app(overrides: dict | None = None) -> ServerApp:
    """The ServerApp. `flwr run` passes overrides through the run; in-process callers pass them here.

    Flower's simulation engine runs in the process that loads this module: its in-memory LinkState gets the
    per-node message index (server/linkstate.py), so a round's cost grows with the parties, not their square."""
    index_messages_by_node()
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        given = overrides if overrides is not None else grid.run.override_config
        settings = settings_from_flower(context.run_config, given)
        run_experiment(grid, settings, run_id=context.run_id)

    return server_app


app = make_app()
