"""`python -m fedsmix grid`: run a preset's grid through Flower simulation; write table, CSV and plot.

A preset's `grid:` block names the axes: `parties` (numbers of SuperNodes) and any run setting with a
list of values (`seed`, `tau`, `radius-mode`, ...). Every cell is one simulation of the preset's
strategies on the same partitions. A strategy is not rerun for an axis it cannot depend on: the
encoder's keys (tau, radius-mode, ...) only change mixup-union, the number of parties does not change
the centralised bound, FedAvg/FedProx keys only change those two. Their result is reused and the table
says from which cell.

Precedence, lowest first: schema defaults < the preset's keys < the preset's grid axes < `--axis`
(replaces an axis) < `--set key=value` (fixes a key everywhere, collapsing its axis).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .config import KEYS, PROJECT_ROOT, SettingsError, load_settings, resolve_preset
from .runs import atomic_write_bytes, atomic_write_json, link_latest

ENCODING_KEYS = frozenset(
    {
        "encoder", "tau", "alpha", "radius-mode", "radius", "permutation", "mix-k", "coefficient-cap",
        "private-mass-min", "encodings-per-sample", "upload-dtype", "max-upload-mb", "max-upload-samples",
        "adversary", "attack-victims", "attack-steps", "unet-width", "unet-epochs", "unet-train-size",
    }
)
FEDERATED_KEYS = frozenset({"rounds", "local-epochs", "proximal-mu", "fraction-train", "client-lr"})
PLOTS = ("parties", "snr-bound")


def depends_on(strategy: str, key: str) -> bool:
    """Whether a strategy's result can change along an axis (conservative: unknown keys count)."""
    if key == "parties":
        return strategy != "centralized"
    if key in ENCODING_KEYS:
        return strategy == "mixup-union"
    if key in FEDERATED_KEYS:
        return strategy in ("fedavg", "fedprox")
    return True


# ------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Cell:
    parties: int
    values: tuple[tuple[str, Any], ...]  # axis key -> value, in axis order

    @property
    def id(self) -> str:
        parts = [f"p{self.parties}"] + [f"{k}={v}" for k, v in self.values]
        return "_".join(parts).replace("/", "-")

    def overrides(self) -> dict[str, Any]:
        return dict(self.values)

    def signature(self, strategy: str) -> str:
        keys = [("parties", self.parties)] + list(self.values)
        return strategy + "|" + ",".join(f"{k}={v}" for k, v in keys if depends_on(strategy, k))


@dataclass
class GridPlan:
    preset: str
    name: str
    base: dict[str, Any]  # overrides shared by every cell (preset path + --set)
    axes: dict[str, list[Any]]  # parties first, then settings keys
    plot: str = "parties"
    table_rows: tuple[str, ...] = ()
    cells: list[Cell] = field(default_factory=list)

    def strategies(self) -> tuple[str, ...]:
        return load_settings(self.base).strategies

    def schedule(self) -> list[tuple[Cell, list[str]]]:
        """Each cell with the strategies it must run (first cell of each signature runs it)."""
        seen, out = set(), []
        for cell in self.cells:
            todo = [s for s in self.strategies() if cell.signature(s) not in seen]
            seen.update(cell.signature(s) for s in todo)
            out.append((cell, todo))
        return out


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _list(key: str, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise SettingsError(f"grid: axis {key!r} has no values")
    return values


def make_plan(preset: str, sets: dict[str, Any] | None = None, axes: dict[str, list[Any]] | None = None) -> GridPlan:
    """Preset + overrides -> validated cells (every cell's settings are checked before anything runs)."""
    path = resolve_preset(preset)
    data = yaml.safe_load(path.read_text()) or {}
    grid = dict(data.get("grid") or {})
    plot = str(grid.pop("plot", "parties"))
    if plot not in PLOTS:
        raise SettingsError(f"grid.plot: {plot!r} unknown; allowed: {', '.join(PLOTS)}")
    table_rows = tuple(grid.pop("table-rows", ()) or ())
    grid_axes: dict[str, list[Any]] = {"parties": _list("parties", grid.pop("parties", [10]))}
    for key, value in grid.items():
        if key not in KEYS:
            raise SettingsError(f"grid: unknown axis {key!r}; axes are 'parties' or run settings: {', '.join(KEYS)}")
        grid_axes[key] = _list(key, value)
    for key, values in (axes or {}).items():
        if key != "parties" and key not in KEYS:
            raise SettingsError(f"--axis: unknown key {key!r}; allowed: parties, {', '.join(KEYS)}")
        grid_axes[key] = _list(key, values)
    sets = dict(sets or {})
    if "parties" in sets:
        grid_axes["parties"] = _list("parties", sets.pop("parties"))
    for key in sets:  # an explicit override fixes the key everywhere
        grid_axes.pop(key, None)
    for key in table_rows:
        if key not in grid_axes and key not in sets:
            raise SettingsError(f"grid.table-rows: {key!r} is not an axis of this grid ({', '.join(grid_axes)})")
    table_rows = tuple(k for k in table_rows if k in grid_axes)
    base = {"preset": str(preset), **sets}
    base.pop("runs-dir", None)
    load_settings(base)
    keys = [k for k in grid_axes if k != "parties"]
    cells = []
    for parties, *values in itertools.product(grid_axes["parties"], *(grid_axes[k] for k in keys)):
        if not isinstance(parties, int) or parties < 2:
            raise SettingsError(f"grid: parties must be integers >= 2, got {parties!r}")
        cell = Cell(parties, tuple(zip(keys, values)))
        load_settings({**base, **cell.overrides()})  # fail now, naming the key, not hours later
        cells.append(cell)
    return GridPlan(str(preset), path.stem, base, grid_axes, plot, table_rows, cells)


# -------------------------------------------------------------------------------------------- run
def warm_feature_cache(plan: GridPlan) -> None:
    """Extract backbone features once, here, before thirty parties would wait on the same lock."""
    done = set()
    for cell in plan.cells:
        settings = load_settings({**plan.base, **cell.overrides()})
        if settings.backbone == "none":
            continue
        from .features import ensure_features

        for split in ("train", "test"):
            key = (settings.dataset, split, settings.backbone, settings.image_size, settings.weights_path, settings.feature_cache_dir)
            if key not in done:
                ensure_features(settings, split)
                done.add(key)


def run_cell(overrides: dict[str, Any], parties: int, engine: str, runs_dir: Path) -> dict:
    """One simulation; returns its results.json (partial results when a strategy failed)."""
    overrides = {**overrides, "runs-dir": str(runs_dir)}
    error = None
    try:
        if engine == "flwr":
            from .cli import _absolute_paths
            from .federation import environment, federation_config, flower_part
            from .launch import flwr_run, free_port

            federation = federation_config(overrides.get("preset", ""))  # as `fedsmix run` passes it
            outcome = flwr_run(_absolute_paths(overrides), parties, flower_part(federation), ports=(free_port(), free_port()),
                               flwr_home=runs_dir / ".flwr", environment=environment(federation))
            if not outcome.ok:
                error = f"flwr run {outcome.run_id}: {outcome.status} (exit {outcome.returncode})"
        elif engine == "direct":
            from .direct import run as run_direct

            run_direct(load_settings(overrides), parties)
        else:
            from server.simulate import simulate

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
    if name == "local-only":
        row["party0-accuracy"] = res.get("party0-accuracy")
        row["mean-party-accuracy"] = res.get("mean-party-accuracy")
    if name == "mixup-union" and res.get("parties"):
        parties = list(res["parties"].values())

        def column(key: str) -> list[float]:
            return [float(p[key]) for p in parties if key in p]

        row["radius-mode"] = res.get("radius-mode")
        for key in ("snr-bound", "snr-empirical", "radius", "m-f", "D", "c"):
            values = column(key)
            if values:
                row[f"{key}-mean"] = statistics.fmean(values)
                row[f"{key}-max"] = max(values)
                row[f"{key}-min"] = min(values)
    return row


def label(cell: Cell, strategy: str, table_rows: tuple[str, ...] = ()) -> str:
    """Strategy name plus the axis values only it depends on (e.g. mixup-union radius-mode=theorem)."""
    own = [
        f"{k}={v}" for k, v in cell.values
        if depends_on(strategy, k) and k not in table_rows and not all(depends_on(s, k) for s in ("local-only", "centralized"))
    ]
    return strategy + (f" {' '.join(own)}" if own else "")


def row_key(cell: Cell, table_rows: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """Axes every baseline depends on (parties, seed, data) plus the chosen table-rows axes."""
    shared = [(k, v) for k, v in cell.values if k in table_rows or all(depends_on(s, k) for s in ("local-only", "centralized"))]
    return (("parties", cell.parties),) + tuple(shared)


class GridRun:
    def __init__(self, plan: GridPlan, out: Path, engine: str = "simulate"):
        self.plan, self.out, self.engine = plan, out, engine
        self.state_path = out / "grid.json"
        state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self.done: dict[str, dict] = state.get("results", {})  # signature -> summary + source cell
        self.state = {
            "preset": plan.preset, "base": plan.base, "axes": plan.axes, "engine": engine,
            "started": state.get("started", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
            "cells": state.get("cells", {}),
            **({"finished": state["finished"]} if "finished" in state else {}),
            "results": self.done,
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
                "strategies": todo, "seconds": time.perf_counter() - t0,
                "run-dir": results.get("run-dir"), "error": results.get("error"),
            }
            for strategy in todo:
                res = results.get("strategies", {}).get(strategy, {"error": results.get("error", "no result")})
                self.done[cell.signature(strategy)] = {**summarize(strategy, res), "cell": cell.id, "run-dir": results.get("run-dir")}
            self.write()
        self.state["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.write()
        return self.out

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for cell in self.plan.cells:
            for strategy in self.plan.strategies():
                summary = self.done.get(cell.signature(strategy))
                if summary is None:
                    continue
                out.append(
                    {
                        **summary, "cell": cell.id, "parties": cell.parties, **cell.overrides(), "strategy": strategy,
                        "label": label(cell, strategy, self.plan.table_rows),
                        "reused-from": "" if summary["cell"] == cell.id else summary["cell"],
                    }
                )
        return out

    def write(self) -> None:
        atomic_write_json(self.state_path, self.state)
        rows = self.rows()
        if not rows:
            return
        write_csv(self.out / "table.csv", rows)
        atomic_write_bytes(self.out / "table.md", markdown(self.plan, rows).encode())
        plot(self.plan, rows, self.out / f"accuracy_vs_{self.plan.plot.replace('-', '_')}.png")


# ---------------------------------------------------------------------------------------- outputs
CSV_FIRST = ["cell", "parties", "strategy", "label", "accuracy", "party0-accuracy", "mean-party-accuracy",
             "radius-mode", "snr-bound-max", "snr-bound-mean", "snr-empirical-mean", "radius-mean", "m-f-mean",
             "D-mean", "c-mean", "bytes-up-per-party", "bytes-down-per-party", "wall-seconds", "reused-from"]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    columns = [c for c in CSV_FIRST if any(c in r for r in rows)]
    columns += sorted({k for r in rows for k in r} - set(columns))
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    tmp.replace(path)


def _pct(value: Any) -> str:
    return f"{100 * value:.2f}" if isinstance(value, int | float) and not math.isnan(value) else "-"


def _sci(value: Any) -> str:
    return f"{value:.2g}" if isinstance(value, int | float) else "-"


def _columns(rows: list[dict]) -> list[tuple[str, str, str]]:
    """(column title, label, field): local-only gets party 0 and the mean over parties."""
    cols, seen = [], set()
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    for r in sorted(rows, key=lambda r: strategies.index(r["strategy"])):  # stable: a strategy's labels together
        if r["label"] in seen:
            continue
        seen.add(r["label"])
        if r["strategy"] == "local-only":
            cols += [(f"{r['label']} (party 0)", r["label"], "party0-accuracy"), (f"{r['label']} (mean)", r["label"], "mean-party-accuracy")]
        else:
            cols.append((r["label"], r["label"], "accuracy"))
    return cols


def _table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines) + "\n"


def markdown(plan: GridPlan, rows: list[dict[str, Any]]) -> str:
    columns = _columns(rows)
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        key = row_key(next(c for c in plan.cells if c.id == r["cell"]), plan.table_rows)
        groups.setdefault(key, {})[r["label"]] = r
    keys = [k for k, _ in next(iter(groups))]
    body = []
    for key, by_label in groups.items():
        cells = [str(v) for _, v in key]
        for _, lab, fld in columns:
            r = by_label.get(lab)
            text = _pct(r.get(fld)) if r else "-"
            if r and r.get("error") and r.get("accuracy") is None:
                text = "failed"
            elif r and r["strategy"] == "mixup-union" and "snr-bound-max" in r:
                text += f" [{_sci(r['snr-bound-max'])}]"
            cells.append(text)
        body.append(cells)
    out = [f"# {plan.name}: test accuracy (%)\n", f"Preset `{plan.preset}`; overrides {json.dumps({k: v for k, v in plan.base.items() if k != 'preset'})}. "
           "mixup-union cells show `accuracy [effective SNR bound]`, the bound alpha^2/((1-alpha)^2(1+2c m_f^2)) "
           "with m_f = r/D of the least protected party (largest bound).\n", _table(keys + [c[0] for c in columns], body)]
    detail = []
    for r in rows:
        if r["reused-from"]:
            continue
        detail.append([
            r["cell"], r["label"], _pct(r.get("accuracy")),
            (r.get("radius-mode") or "-") if r["strategy"] == "mixup-union" else "-", _sci(r.get("snr-bound-max")),
            _sci(r.get("snr-empirical-mean")), _sci(r.get("radius-mean")), _sci(r.get("m-f-mean")),
            f"{r['bytes-up-per-party']:,.0f}" if r.get("bytes-up-per-party") is not None else "-",
            f"{r['bytes-down-per-party']:,.0f}" if r.get("bytes-down-per-party") is not None else "-",
            f"{r['wall-seconds']:.0f}" if r.get("wall-seconds") is not None else "-",
        ])
    out.append("\n## Cost and calibration per run\n\n")
    out.append(_table(["cell", "strategy", "acc %", "radius mode", "SNR bound (max)", "SNR measured (mean)", "r (mean)",
                       "m_f = r/D (mean)", "bytes up/party", "bytes down/party", "wall s"], detail))
    return "".join(out)


def plot(plan: GridPlan, rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if plan.plot == "parties":
        for title, lab, fld in _columns(rows):
            points: dict[int, list[float]] = {}
            for r in rows:
                if r["label"] == lab and isinstance(r.get(fld), float):
                    points.setdefault(r["parties"], []).append(100 * r[fld])
            if points:
                xs = sorted(points)
                ax.plot(xs, [statistics.fmean(points[x]) for x in xs], marker="o", label=title)
        ax.set_xlabel("number of parties")
        ax.set_xticks(sorted({r["parties"] for r in rows}))
    else:  # accuracy against the effective SNR bound, one line per mixup-union variant
        mix = [r for r in rows if r["strategy"] == "mixup-union" and isinstance(r.get("snr-bound-max"), float)]
        for variant in sorted({r.get("radius-mode") or "" for r in mix}):
            pts = sorted((r["snr-bound-max"], 100 * r["accuracy"], r.get("tau")) for r in mix
                         if (r.get("radius-mode") or "") == variant and isinstance(r.get("accuracy"), float))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"mixup-union ({variant})")
                clusters: dict[float, list] = {}  # points within ~25 % of each other share one label
                for x, y, tau in pts:
                    clusters.setdefault(round(math.log10(x) * 10) / 10, []).append((x, y, tau))
                for group in clusters.values():
                    taus = sorted(t for _, _, t in group if t is not None)
                    if taus:
                        text = f"tau={taus[0]:g}" if len(taus) == 1 else f"tau={taus[0]:g}..{taus[-1]:g}"
                        ax.annotate(text, group[0][:2], textcoords="offset points", xytext=(-40, 6), fontsize=7)
        baselines = _columns([r for r in rows if r["strategy"] != "mixup-union"])
        for i, (title, lab, fld) in enumerate(baselines):
            values = [100 * r[fld] for r in rows if r["label"] == lab and isinstance(r.get(fld), float)]
            if values:
                ax.axhline(statistics.fmean(values), linestyle="--", linewidth=1, label=title, color=f"C{i + 2}")
        ax.set_xscale("log")
        ax.set_xlabel("effective SNR bound (largest over parties; smaller = more private)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"{plan.name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


# ---------------------------------------------------------------------------------------- command
def _pairs(values: list[str], what: str) -> dict[str, Any]:
    out = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SettingsError(f"{what} expects key=value, got {pair!r}")
        out[key.strip()] = _value(value)
    return out


def grid_dir(runs_dir: str, name: str) -> Path:
    root = Path(runs_dir or PROJECT_ROOT / "runs").expanduser().resolve() / "grid"
    path = root / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{name}"
    path.mkdir(parents=True, exist_ok=False)
    link_latest(root, path)
    return path


def cmd_grid(args: argparse.Namespace) -> int:
    sets = _pairs(args.set, "--set")
    axes = {k: [_value(v) for v in str(vals).split(",")] if isinstance(vals, str) else [vals] for k, vals in _pairs(args.axis, "--axis").items()}
    if args.parties:
        axes["parties"] = [int(p) for p in args.parties.split(",")]
    plan = make_plan(args.preset, sets, axes)
    for cell, todo in plan.schedule():
        print(f"{cell.id}: {', '.join(todo) or '(all results reused)'}")
    if args.dry_run:
        return 0
    out = Path(args.resume).resolve() if args.resume else grid_dir(str(sets.get("runs-dir", "")), plan.name)
    GridRun(plan, out, args.engine).run()
    print((out / "table.md").read_text() if (out / "table.md").exists() else "no results")
    print(f"grid results: {out}")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    from .features import ensure_features

    settings = load_settings({"preset": args.preset, **_pairs(args.set, "--set")} if args.preset else _pairs(args.set, "--set"))
    if settings.backbone == "none":
        raise SettingsError("features: set a backbone (e.g. --set backbone=efficientnet-lite0)")
    for split in ("train", "test"):
        print(ensure_features(settings, split))
    if settings.adversary:  # the attacker's public set, through the same backbone
        from .features import PUBLIC_DATASET

        print(ensure_features(settings.replace(dataset=PUBLIC_DATASET), "train"))
    return 0


def register(subparsers) -> None:
    grid = subparsers.add_parser("grid", help="run a preset's grid (strategies x parties x seeds x axes) through Flower simulation")
    grid.add_argument("--preset", required=True, help="YAML preset with a `grid:` block, e.g. configs/table4-cifar10.yaml")
    grid.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run setting in every cell")
    grid.add_argument("--axis", action="append", default=[], metavar="KEY=V1,V2", help="replace or add an axis")
    grid.add_argument("--parties", default="", help="comma-separated party counts (replaces the preset's)")
    grid.add_argument("--engine", choices=("simulate", "flwr", "direct"), default="simulate",
                      help="in-process Flower simulation (default), the `flwr run` CLI per cell, or `direct`: the same "
                      "library calls without Flower (for accelerator machines without Flower/Ray; payload bytes only)")
    grid.add_argument("--resume", default="", metavar="GRID_DIR", help="continue an interrupted grid in its directory")
    grid.add_argument("--dry-run", action="store_true", help="print the cells and what each runs, then stop")
    grid.set_defaults(func=cmd_grid)
    feats = subparsers.add_parser("features", help="extract and cache a preset's backbone features (train and test)")
    feats.add_argument("--preset", default="")
    feats.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    feats.set_defaults(func=cmd_features)
