"""A grid's outputs: table.csv, table.md and the accuracy plot."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from fedsmix import tables
from fedsmix.runs import atomic_write_bytes
from fedsmix.tables import write_csv

from .plan import Cell, GridPlan, depends_on, shared_axis


def label(cell: Cell, strategy: str, table_rows: tuple[str, ...] = ()) -> str:
    """Strategy name plus the axis values only it depends on (e.g. mixup-union radius-mode=theorem)."""
    own = [
        f"{k}={v}"
        for k, v in cell.values
        if depends_on(strategy, k) and k not in table_rows and not shared_axis(k)
    ]
    return strategy + (f" {' '.join(own)}" if own else "")


def row_key(cell: Cell, table_rows: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """Axes every baseline depends on (parties, seed, data) plus the chosen table-rows axes."""
    shared = [(k, v) for k, v in cell.values if k in table_rows or shared_axis(k)]
    return (("parties", cell.parties),) + tuple(shared)


CSV_FIRST = [
    "cell",
    "parties",
    "strategy",
    "label",
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


def write_all(out: Path, plan: GridPlan, rows: list[dict[str, Any]]) -> None:
    """table.csv, table.md and the plot the preset names."""
    first = [c for c in CSV_FIRST if any(c in r for r in rows)]
    write_csv(out / "table.csv", rows, first + sorted({k for r in rows for k in r} - set(first)))
    atomic_write_bytes(out / "table.md", markdown(plan, rows).encode())
    plot(plan, rows, out / f"accuracy_vs_{plan.plot.replace('-', '_')}.png")


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


def crossovers(rows: list[dict[str, Any]], margin: float = 0.03) -> list[str]:
    """Per mixup-union variant and party count: the smallest effective bound at which it beats local-only
    party 0 (of the same party count) by at least `margin`."""
    local = {r["parties"]: r.get("party0-accuracy") for r in rows if r["strategy"] == "local-only"}
    lines = []
    variants = sorted({(r["label"], r["parties"]) for r in rows if r["strategy"] == "mixup-union"})
    for lab, parties in variants:
        base = local.get(parties)
        points = [r for r in rows if r["label"] == lab and r["parties"] == parties
                  and isinstance(r.get("accuracy"), float) and isinstance(r.get("snr-bound-max"), float)]
        if base is None or not points:
            continue
        beating = [r["snr-bound-max"] for r in points if r["accuracy"] >= base + margin]
        text = (f"smallest effective bound {min(beating):.3g}" if beating
                else "never (at any bound of this grid)")
        lines.append(f"- {lab}, {parties} parties: beats local-only party 0 ({_pct(base)} %) by >= "
                     f"{100 * margin:.0f} points from {text}\n")
    return ["\n## Crossover with local-only\n\n", *lines] if lines else []


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
    out = [
        f"# {plan.name}: test accuracy (%)\n",
        f"Preset `{plan.preset}`; overrides {json.dumps({k: v for k, v in plan.base.items() if k != 'preset'})}. "
        "mixup-union cells show `accuracy [effective SNR bound]`, the bound alpha^2/((1-alpha)^2(1+2c m_f^2)) "
        "with m_f = r/D of the least protected party (largest bound).\n",
        _table(keys + [c[0] for c in columns], body),
    ]
    detail = []
    for r in rows:
        if r["reused-from"]:
            continue
        detail.append(
            [
                r["cell"],
                r["label"],
                _pct(r.get("accuracy")),
                (r.get("radius-mode") or "-") if r["strategy"] == "mixup-union" else "-",
                r.get("trainer-chosen") or "-",
                _pct(r.get("returned-mean-accuracy")),
                _sci(r.get("snr-bound-max")),
                _sci(r.get("snr-empirical-mean")),
                _sci(r.get("radius-mean")),
                _sci(r.get("m-f-mean")),
                f"{r['bytes-up-per-party']:,.0f}" if r.get("bytes-up-per-party") is not None else "-",
                f"{r['bytes-down-per-party']:,.0f}" if r.get("bytes-down-per-party") is not None else "-",
                f"{r['wall-seconds']:.0f}" if r.get("wall-seconds") is not None else "-",
            ]
        )
    out += crossovers(rows)
    out.append("\n## Cost and calibration per run\n\n")
    out.append(
        _table(
            [
                "cell",
                "strategy",
                "acc %",
                "radius mode",
                "trainer (chosen)",
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
            pts = sorted(
                (r["snr-bound-max"], 100 * r["accuracy"], r.get("tau"))
                for r in mix
                if (r.get("radius-mode") or "") == variant and isinstance(r.get("accuracy"), float)
            )
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
