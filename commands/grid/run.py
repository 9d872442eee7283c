"""Run a grid's cells (one simulation each, through the chosen engine) and keep its state on disk.

Finished strategies are kept in grid.json by signature, so `--resume` skips them; a failed one is
recorded with its error and retried on `--resume`.
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

from fedsmix import tuning
from fedsmix.config import load_settings
from fedsmix.registry import STRATEGIES
from fedsmix.runs import atomic_write_json

from . import report
from .plan import GridPlan


def warm_feature_cache(plan: GridPlan) -> None:
    """Extract backbone features once, here, before thirty parties would wait on the same lock."""
    from fedsmix.trainers import ensure_run_features

    for cell in plan.cells:  # a cached split costs one file check
        settings = load_settings({**plan.base, **cell.overrides()})
        if settings.backbone != "none":
            ensure_run_features(settings)


def run_cell(overrides: dict[str, Any], parties: int, engine: str, runs_dir: Path) -> dict:
    """One simulation; returns its results.json (partial results when a strategy failed)."""
    overrides = {**overrides, "runs-dir": str(runs_dir)}
    error = None
    try:
        if engine == "flwr":
            from ..federation import environment, federation_config, flower_part
            from ..launch import flwr_run, free_ports
            from ..options import absolute_paths

            federation = federation_config(overrides.get("preset", ""))  # as `fedsmix run` passes it
            outcome = flwr_run(
                absolute_paths(overrides),
                parties,
                flower_part(federation),
                ports=tuple(free_ports(2)),
                flwr_home=runs_dir / ".flwr",
                environment=environment(federation),
            )
            if not outcome.ok:
                error = f"flwr run {outcome.run_id}: {outcome.status} (exit {outcome.returncode})"
        elif engine in ("inprocess", "direct"):  # direct: the in-process transport's former name
            from ..inprocess import run as run_inprocess

            run_inprocess(load_settings(overrides), parties)
        else:
            from ..simulate import simulate

            simulate(overrides, parties)
    except Exception as err:  # keep going: one failed cell must not lose the grid
        error = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    results_path = runs_dir / "latest" / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {"strategies": {}}
    if error:
        results["error"] = error
    return results


def summarize(name: str, res: dict) -> dict[str, Any]:
    """The numbers a table row needs from one strategy's results."""
    row: dict[str, Any] = {
        "accuracy": res.get("accuracy"),
        "wall-seconds": res.get("wall-seconds"),
        "bytes-up-per-party": res.get("mean-bytes-up-per-party"),
        "bytes-down-per-party": res.get("mean-bytes-down-per-party"),
        "parties-used": res.get("parties-used"),
        "error": res.get("error"),
    }
    row.update(tuning.described(res))  # what the shared selection protocol chose (its stopping round), of how many
    if name == "local-only":
        row["party0-accuracy"] = res.get("party0-accuracy")
        row["mean-party-accuracy"] = res.get("mean-party-accuracy")
    if STRATEGIES[name].uploads and res.get("parties"):
        parties = list(res["parties"].values())

        def column(key: str) -> list[float]:
            return [float(p[key]) for p in parties if key in p]

        row["radius-mode"] = res.get("radius-mode")
        row["trainer"] = res.get("trainer")
        returned = res.get("returned") or {}
        for stat in ("mean", "min", "max"):
            row[f"returned-{stat}-accuracy"] = returned.get(stat)
        for key in ("snr-bound", "snr-empirical", "radius", "m-f", "D", "c"):
            values = column(key)
            if values:
                row[f"{key}-mean"] = statistics.fmean(values)
                row[f"{key}-max"] = max(values)
                row[f"{key}-min"] = min(values)
    return row


class GridRun:
    """A grid in its directory: grid.json keeps each finished strategy's summary by signature (`results`)
    and each failed one with its error (`failed`); `--resume` skips the former and retries the latter."""

    def __init__(self, plan: GridPlan, out: Path, engine: str = "simulate"):
        self.plan, self.out, self.engine = plan, out, engine
        self.state_path = out / "grid.json"
        state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self.done: dict[str, dict] = state.get("results", {})  # signature -> summary + source cell
        self.failed: dict[str, dict] = state.get("failed", {})  # signature -> summary with its error
        self.state = {
            "preset": plan.preset,
            "base": plan.base,
            "axes": plan.axes,
            "engine": engine,
            "started": state.get("started", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
            "cells": state.get("cells", {}),
            "results": self.done,
            "failed": self.failed,
        }

    def run(self) -> Path:
        warm_feature_cache(self.plan)
        for cell, todo in self.plan.schedule():
            todo = [s for s in todo if cell.signature(s) not in self.done]
            if not todo:
                continue
            print(f"fedsmix grid: cell {cell.id}: {', '.join(todo)}", flush=True)
            overrides = {**self.plan.base, **cell.overrides(), "strategies": ",".join(todo), "run-name": cell.id}
            t0 = time.perf_counter()
            results = run_cell(overrides, cell.parties, self.engine, self.out / "cells" / cell.id)
            self.state["cells"][cell.id] = {
                "strategies": todo,
                "seconds": time.perf_counter() - t0,
                "run-dir": results.get("run-dir"),
                "error": results.get("error"),
            }
            for strategy in todo:
                res = results.get("strategies", {}).get(strategy, {"error": results.get("error", "no result")})
                summary = {**summarize(strategy, res), "cell": cell.id, "run-dir": results.get("run-dir")}
                if summary["error"] or summary["accuracy"] is None:
                    self.failed[cell.signature(strategy)] = summary
                else:
                    self.done[cell.signature(strategy)] = summary
                    self.failed.pop(cell.signature(strategy), None)
            self.write()
        self.state["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.write()
        return self.out

    def rows(self) -> list[dict[str, Any]]:
        """One row per run (cell, seed and strategy); the report aggregates a table cell's seeds."""
        out, seed = [], self.plan.seeds[0]
        for cell in self.plan.cells:
            for strategy in self.plan.strategies():
                summary = self.done.get(cell.signature(strategy)) or self.failed.get(cell.signature(strategy))
                if summary is None:
                    continue
                out.append(
                    {
                        **summary,
                        "cell": cell.id,
                        "table-cell": cell.table_id,
                        "parties": cell.parties,
                        "seed": seed,  # the preset's, unless the grid has a seed axis
                        **cell.overrides(),
                        "trainer-chosen": summary.get("trainer"),  # the cell's `trainer` axis would hide it
                        "strategy": strategy,
                        "label": report.label(cell, strategy, self.plan.table_rows),
                        "reused-from": "" if summary["cell"] == cell.id else summary["cell"],
                    }
                )
        return out

    def write(self) -> None:
        atomic_write_json(self.state_path, self.state)
        self.write_report()

    def write_report(self) -> None:
        """Tables, CSV and plot of this plan's finished cells (`--report`: grid.json is left as it is)."""
        rows = self.rows()
        if rows:
            report.write_all(self.out, self.plan, rows, self.engine)
