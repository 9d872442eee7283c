"""A grid's outputs: table.md, table.csv, table-seeds.csv, table.json and the accuracy plot.

Seeds are replicates: every table cell is the mean over its seeds with a 95 % Student-t interval
(fedsmix.tables.interval), table-seeds.csv and table.json keep every seed's value."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsmix import tables, tuning
from fedsmix.config import load_settings
from fedsmix.runs import atomic_write_bytes
from fedsmix.tables import write_csv

from .plan import SEED, Cell, GridPlan, depends_on, shared_axis


def label(cell: Cell, strategy: str, table_rows: tuple[str, ...] = ()) -> str:
    """Strategy name plus the axis values only it depends on (e.g. mixup-union radius-mode=theorem)."""
    own = [
        f"{k}={v}"
        for k, v in cell.values
        if depends_on(strategy, k) and k not in table_rows and not shared_axis(k)
    ]
    return strategy + (f" {' '.join(own)}" if own else "")


def row_key(cell: Cell, table_rows: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """Axes every baseline depends on (parties, data) plus the chosen table-rows axes; never the seed, a
    replicate every cell is aggregated over."""
    shared = [(k, v) for k, v in cell.values if k != SEED and (k in table_rows or shared_axis(k))]
    return (("parties", cell.parties),) + tuple(shared)


CSV_FIRST = [
    "cell",
    "parties",
    "seed",
    "strategy",
    "label",
    "n",
    "seeds",
    "accuracy",
    "party0-accuracy",
    "mean-party-accuracy",
    "radius-mode",
    "snr-bound-max",
    "snr-bound-mean",
    "snr-empirical-mean",
    "radius-mean",
    "m-f-mean",
    "D-mean",
    "c-mean",
    "bytes-up-per-party",
    "bytes-down-per-party",
    "wall-seconds",
    "reused-from",
]


def write_all(out: Path, plan: GridPlan, rows: list[dict[str, Any]], engine: str = "") -> None:
    """table.md, table.csv (one row per table cell and strategy: means and interval bounds), table-seeds.csv (one
    row per run: cell, seed, strategy), table.json (both, every seed's value) and the plot the preset names."""
    cells = aggregate(plan, rows)
    flat = [_flat(c) for c in cells]
    metrics = {k for c in cells for k in c["stats"]}
    keys = {k for f in flat for k in f} - {f"{m}-ci-{end}" for m in metrics for end in ("low", "high")}
    order = [c for c in CSV_FIRST if c in keys] + sorted(keys - set(CSV_FIRST))
    write_csv(out / "table.csv", flat,
              [x for c in order for x in ((c, f"{c}-ci-low", f"{c}-ci-high") if c in metrics else (c,))])
    first = [c for c in CSV_FIRST if any(c in r for r in rows)]
    write_csv(out / "table-seeds.csv", rows, first + sorted({k for r in rows for k in r} - set(first)))
    text = markdown(plan, rows, engine)
    atomic_write_bytes(out / "table.md", text.encode())
    summary = {
        "preset": plan.preset, "engine": engine, "seeds": plan.seeds, "level": LEVEL,
        "interval": tables.ci_caption([c["n"] for c in cells], LEVEL, plan.seeds),
        "crossovers": [line.strip()[2:] for line in crossovers(rows, row_of=_row_of(plan))[1:]],
        "cells": [{**{k: v for k, v in c.items() if k not in ("stats", "stat-seeds")},
                   "metrics": {k: {**iv.as_dict(), "seeds": c["stat-seeds"][k]} for k, iv in c["stats"].items()}}
                  for c in cells],
        "runs": rows,
    }
    atomic_write_bytes(out / "table.json", json.dumps(summary, indent=1, default=str).encode())
    plot(plan, rows, out / f"accuracy_vs_{plan.plot.replace('-', '_')}.png")


LEVEL = 0.95  # of every interval the grid reports
#: a run's row keys that name it rather than measure it: never averaged over seeds
IDENTITY = frozenset({"cell", "table-cell", "parties", "seed", "strategy", "label", "reused-from", "run-dir", "error"})


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _failed(row: dict) -> bool:
    return bool(row.get("error")) and row.get("accuracy") is None


def _table_id(cell_id: str) -> str:
    """A run's cell id without its seed: the table cell it is a replicate of."""
    return re.sub(rf"_{SEED}=-?\d+(?=_|$)", "", cell_id)


def aggregate(plan: GridPlan, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs -> one record per table cell and strategy, in the order first run: the axis values, the seeds, n (the
    seeds that finished), `stats` (each numeric field's Interval over those seeds) and `stat-seeds` (the seed of
    each of its values); a text field keeps its value, or where seeds differ each seed's (`seed s: value; ...`)."""
    axes = set(plan.axes) - {SEED}
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("table-cell") or _table_id(r["cell"]), r["strategy"]), []).append(r)
    out = []
    for (cell, strategy), runs in groups.items():
        done = [r for r in runs if not _failed(r)]
        record: dict[str, Any] = {"cell": cell, "parties": runs[0]["parties"], "strategy": strategy,
                                  "label": runs[0]["label"]}
        record.update({k: runs[0][k] for k in plan.axes if k in runs[0] and k != SEED})
        record.update(seeds=[r.get("seed") for r in runs], n=len(done), stats={}, **{"stat-seeds": {}})
        for key in dict.fromkeys(k for r in runs for k in r):
            if key in IDENTITY or key in axes or key in record:
                continue
            if any(_number(r.get(key)) for r in done):
                values = [(r.get("seed"), r[key]) for r in done if _number(r.get(key))]
                record["stats"][key] = tables.interval([v for _, v in values], LEVEL)
                record["stat-seeds"][key] = [s for s, _ in values]
            elif texts := list(dict.fromkeys(str(r[key]) for r in runs if r.get(key) not in (None, ""))):
                if len(texts) > 1 and all(r.get("seed") is not None for r in runs):  # say which seed chose what
                    texts = [f"seed {r['seed']}: {r[key]}" for r in runs if r.get(key) not in (None, "")]
                record[key] = "; ".join(texts)
        reused = list(dict.fromkeys(_table_id(r["reused-from"]) for r in runs if r.get("reused-from")))
        record["reused-from"] = "; ".join(reused)
        errors = [f"seed {r.get('seed')}: {r['error']}" for r in runs if _failed(r)]
        record["error"] = "; ".join(errors) or None
        out.append(record)
    return out


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """A table.csv row: each numeric field's mean and interval bounds (empty with one seed)."""
    out = {k: v for k, v in record.items() if k not in ("stats", "stat-seeds")}
    out["seeds"] = ";".join(str(s) for s in record["seeds"])
    for key, iv in record["stats"].items():
        out[key], out[f"{key}-ci-low"], out[f"{key}-ci-high"] = iv.mean, iv.low, iv.high
    return out


def _ci(record: dict | None, key: str, spec: str, scale: float = 1.0, most: int = 1) -> str:
    """A table cell: mean ± 95 % half-width over the record's seeds ('(n=k)' when fewer than the table's most)."""
    iv = record["stats"].get(key) if record else None
    if iv is None:
        return "-"
    return tables.ci(iv, spec, scale) + (f" (n={iv.n})" if iv.n < most else "")


def _columns(rows: list[dict]) -> list[tuple[str, str, str]]:
    """(column title, label, field): local-only gets party 0 and the mean over parties."""
    cols, seen = [], set()
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    for r in sorted(rows, key=lambda r: strategies.index(r["strategy"])):  # stable: a strategy's labels together
        if r["label"] in seen:
            continue
        seen.add(r["label"])
        if r["strategy"] == "local-only":
            cols += [
                (f"{r['label']} (party 0)", r["label"], "party0-accuracy"),
                (f"{r['label']} (mean)", r["label"], "mean-party-accuracy"),
            ]
        else:
            cols.append((r["label"], r["label"], "accuracy"))
    return cols


def _table(header: list[str], body: list[list[str]]) -> str:
    columns = [(str(i), title) for i, title in enumerate(header)]
    return tables.markdown([{str(i): cell for i, cell in enumerate(row)} for row in body], columns)


def _row_of(plan: GridPlan) -> Callable[[dict], tuple]:
    """A run's table row (parties and the shared axes), from its cell in the plan."""
    cells = {c.table_id: c for c in plan.cells}

    def row_of(r: dict) -> tuple:
        cell = cells.get(r.get("table-cell") or _table_id(r["cell"]))
        return row_key(cell, plan.table_rows) if cell else (("parties", r["parties"]),)

    return row_of


def crossovers(rows: list[dict[str, Any]], margin: float = 0.03,
               row_of: Callable[[dict], tuple] | None = None) -> list[str]:
    """Per mixup-union variant and table row (party count, shared axes): the smallest effective bound at which
    its seed mean beats local-only party 0's (same row) by at least `margin`, with the 95 % interval of the
    accuracy difference paired by seed (both runs of a seed share its partitions) and whether that interval's low
    end clears the margin too (a claim beyond the seed interval). `rows`: one per run; a
    run's `seed` pairs it (absent: one seed), its `table-cell` (else its bound) makes it a point."""
    row_of = row_of or (lambda r: (("parties", r["parties"]),))
    local: dict[tuple, dict[Any, float]] = {}
    for r in rows:
        if r["strategy"] == "local-only" and _number(r.get("party0-accuracy")):
            local.setdefault(row_of(r), {})[r.get("seed")] = r["party0-accuracy"]
    lines = []
    mix = [r for r in rows if r["strategy"] == "mixup-union"
           and _number(r.get("accuracy")) and _number(r.get("snr-bound-max"))]
    for lab, where in dict.fromkeys((r["label"], row_of(r)) for r in mix):
        base = local.get(where)
        if not base:
            continue
        points: dict[Any, list[dict]] = {}
        for r in mix:
            if r["label"] == lab and row_of(r) == where:
                points.setdefault(r.get("table-cell") or r["snr-bound-max"], []).append(r)
        found = []  # (bound, paired difference, a run of the point)
        for runs in points.values():
            runs = list({r.get("seed"): r for r in runs}.values())  # a reused result counts once per seed
            diff = tables.interval([r["accuracy"] - base[r.get("seed")] for r in runs if r.get("seed") in base])
            if diff is not None:
                found.append((tables.interval([r["snr-bound-max"] for r in runs]).mean, diff, runs[0]))
        if not found:
            continue
        name = (f"{where[0][1]} parties" if len(where) == 1
                else ", ".join(f"{k}={v}" for k, v in where))
        beating = [f for f in found if f[1].mean >= margin]
        claim = (f"local-only party 0 ({tables.ci(tables.interval(base.values()), '.2f', 100)} %) by >= "
                 f"{100 * margin:.0f} points")
        if beating:
            bound, diff, run = min(beating, key=lambda f: f[0])
            text = f"beats {claim} from smallest effective bound {bound:.3g}{_at(run)}, there by {_points(diff)}"
            if diff.low is not None and diff.low < margin:
                text += f"; not beyond the seed interval (its low end {100 * diff.low:+.1f} points)"
            elif diff.low is not None:
                text += "; beyond the seed interval"
        else:
            bound, diff, run = max(found, key=lambda f: f[1].mean)
            text = (f"never beats {claim} at any bound of this grid; closest {_points(diff)} at effective bound "
                    f"{bound:.3g}{_at(run)}")
        lines.append(f"- {lab}, {name}: {text}\n")
    return ["\n## Crossover with local-only\n\n", *lines] if lines else []


def _at(run: dict) -> str:
    return f" (tau {run['tau']:g})" if _number(run.get("tau")) else ""


def _points(diff: tables.Interval) -> str:
    """An accuracy difference over seeds, in points: '12.1 ± 3.4 points (3 seeds)'."""
    if diff.n == 1:
        return f"{100 * diff.mean:+.1f} points (one seed, no interval)"
    return f"{tables.ci(diff, '+.1f', 100)} points ({diff.n} seeds, paired by seed)"


def markdown(plan: GridPlan, rows: list[dict[str, Any]], engine: str = "") -> str:
    """`rows`: one per run (cell, seed, strategy); every table cell is the mean and 95 % interval over its seeds."""
    records = aggregate(plan, rows)
    most = max((r["n"] for r in records), default=1)
    columns = _columns(records)
    cells = {c.table_id: c for c in plan.cells}
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        groups.setdefault(row_key(cells[r["cell"]], plan.table_rows), {})[r["label"]] = r
    keys = [k for k, _ in next(iter(groups))]
    body = []
    for key, by_label in groups.items():
        line = [str(v) for _, v in key]
        for _, lab, fld in columns:
            r = by_label.get(lab)
            text = _ci(r, fld, ".2f", 100, most)
            if r and r["n"] == 0 and r.get("error"):
                text = "failed"
            elif r and r["strategy"] == "mixup-union" and "snr-bound-max" in r["stats"]:
                text += f" [{_ci(r, 'snr-bound-max', '.2g')}]"
            line.append(text)
        body.append(line)
    out = [
        f"# {plan.name}: test accuracy (%)\n",
        f"Every cell: {tables.ci_caption([r['n'] for r in records], LEVEL, plan.seeds)}. {_budget(plan, engine)}\n\n"
        f"Preset `{plan.preset}`; overrides {json.dumps({k: v for k, v in plan.base.items() if k != 'preset'})}. "
        "mixup-union cells show `accuracy [effective SNR bound]`, the bound alpha^2/((1-alpha)^2(1+2c m_f^2)) "
        "with m_f = r/D of the least protected party (largest bound).\n",
        _table(keys + [c[0] for c in columns], body),
    ]
    detail = []
    for r in records:
        if r["reused-from"]:
            continue
        detail.append(
            [
                r["cell"],
                r["label"],
                str(r["n"]),
                _ci(r, "accuracy", ".2f", 100),
                (r.get("radius-mode") or "-") if r["strategy"] == "mixup-union" else "-",
                tuning.cell_text(r) if r.get("tuning") else r.get("trainer-chosen") or "-",
                _ci(r, "returned-mean-accuracy", ".2f", 100),
                _ci(r, "snr-bound-max", ".2g"),
                _ci(r, "snr-empirical-mean", ".2g"),
                _ci(r, "radius-mean", ".2g"),
                _ci(r, "m-f-mean", ".2g"),
                _ci(r, "bytes-up-per-party", ",.0f"),
                _ci(r, "bytes-down-per-party", ",.0f"),
                _ci(r, "wall-seconds", ".0f"),
            ]
        )
    out += crossovers(rows, row_of=_row_of(plan))
    out.append("\n## Cost and calibration per cell (mean ± 95 % CI over its n seeds)\n\n")
    out.append(
        _table(
            [
                "cell",
                "strategy",
                "n",
                "acc %",
                "radius mode",
                "chosen (tuning)",
                "parties' returned models, mean acc %",
                "SNR bound (max)",
                "SNR measured (mean)",
                "r (mean)",
                "m_f = r/D (mean)",
                "bytes up/party",
                "bytes down/party",
                "wall s",
            ],
            detail,
        )
    )
    return "".join(out)


def _budget(plan: GridPlan, engine: str) -> str:
    """The budget, engine and threat model every table states."""
    s = load_settings(plan.base)
    return (f"Engine: {engine or 'not recorded'}. Budget (unless an axis changes it): {s.dataset}, train subset "
            f"{s.train_subset or 'all'}, partitioner {s.partitioner}, central/local {s.epochs} epochs at batch "
            f"{s.batch_size}, FedAvg/FedProx {s.rounds} rounds x {s.local_epochs} local epoch(s)"
            f"{f', backbone {s.backbone} at {s.image_size} px' if s.backbone != 'none' else ''}. Threat model: none "
            "attacked here (utility only); the bracket is the encoder's analytic SNR bound, not a measured attack.")


def plot(plan: GridPlan, rows: list[dict[str, Any]], path: Path) -> None:
    """Seed means, with their 95 % intervals as error bars where a point is one table cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = aggregate(plan, rows)

    def half(ivs: list[tables.Interval]) -> float:  # a point averaged over other axes gets no bar
        return 100 * ivs[0].half if len(ivs) == 1 and ivs[0].half is not None else 0.0

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if plan.plot == "parties":
        for title, lab, fld in _columns(records):
            points: dict[int, list[tables.Interval]] = {}
            for r in records:
                if r["label"] == lab and fld in r["stats"]:
                    points.setdefault(r["parties"], []).append(r["stats"][fld])
            if points:
                xs = sorted(points)
                ys = [100 * math.fsum(iv.mean for iv in points[x]) / len(points[x]) for x in xs]
                ax.errorbar(xs, ys, yerr=[half(points[x]) for x in xs], marker="o", capsize=3, label=title)
        ax.set_xlabel("number of parties")
        ax.set_xticks(sorted({r["parties"] for r in rows}))
    else:  # accuracy against the effective SNR bound, one line per mixup-union variant
        mix = [r for r in records if r["strategy"] == "mixup-union" and "snr-bound-max" in r["stats"]
               and r["stats"]["snr-bound-max"].mean > 0]
        for variant in sorted({r.get("radius-mode") or "" for r in mix}):
            pts = sorted(
                (r["stats"]["snr-bound-max"].mean, 100 * r["stats"]["accuracy"].mean, half([r["stats"]["accuracy"]]),
                 r.get("tau"))
                for r in mix
                if (r.get("radius-mode") or "") == variant and "accuracy" in r["stats"]
            )
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                            capsize=3, label=f"mixup-union ({variant})")
                clusters: dict[float, list] = {}  # points within ~25 % of each other share one label
                for x, y, _, tau in pts:
                    clusters.setdefault(round(math.log10(x) * 10) / 10, []).append((x, y, tau))
                for group in clusters.values():
                    taus = sorted(t for _, _, t in group if t is not None)
                    if taus:
                        text = f"tau={taus[0]:g}" if len(taus) == 1 else f"tau={taus[0]:g}..{taus[-1]:g}"
                        ax.annotate(text, group[0][:2], textcoords="offset points", xytext=(-40, 6), fontsize=7)
        baselines = _columns([r for r in records if r["strategy"] != "mixup-union"])
        for i, (title, lab, fld) in enumerate(baselines):
            values = [100 * r["stats"][fld].mean for r in records if r["label"] == lab and fld in r["stats"]]
            if values:
                ax.axhline(math.fsum(values) / len(values), linestyle="--", linewidth=1, label=title,
                           color=f"C{i + 2}")
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
