"""The frontier's outputs: a markdown table, CSVs, a scatter plot and a reconstruction panel; and, over several
frontiers of one preset at different seeds, every row's mean and 95 % interval (`write_seeds`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from fedsmix import tables, tuning
from fedsmix.runs import atomic_write_bytes
from fedsmix.tables import fmt as _f
from fedsmix.tables import write_csv

SCORES = (
    "snr_db",
    "psnr_db",
    "ssim",
    "gain_snr_db",
    "gain_psnr_db",
    "gain_ssim",
    "best_ssim",
    "st_lpips",
    "gain_st_lpips",
    "trivial_snr_db",
    "trivial_psnr_db",
    "trivial_ssim",
    "trivial_st_lpips",
    "party_mean_snr_db",
    "gain_vs_party_mean_db",
)
#: each defence's own privacy parameter, its own column (different units, never one axis)
PRIVACY = ("tau", "upload_k", "mixcon", "prune_p", "batch_mix", "dp_fedavg_epsilon", "dp_fedavg_noise",
           "dp_sgd_epsilon")
COLUMNS = (
    "strategy",
    "space",
    "accuracy",
    "chosen",
    "tuning",
    *PRIVACY,
    "attack",
    "attack_setting",
    "batch_size",
    "local_steps",
    "round",
    *SCORES,
    "bytes_up_per_party",
    "measured_bytes_up_per_party",
    "wall_seconds",
    "local_train_seconds",
    "time_overhead",
    "attack_seconds",
    "dominated_by",
)


def _space(r: dict) -> str:
    """Where a record's leakage was scored (records of frontiers before feature rows: pixels)."""
    return r.get("space", "pixels")


def dominated_by(records: list[dict]) -> None:
    """Mark each row with the rows of its own space that beat it on accuracy, leakage (SNR gain) and bytes at
    once: a gain in feature space and one in pixel space are different units, so rows of different spaces are
    never ranked against each other."""

    def key(r):
        return (r["accuracy"] if r["accuracy"] is not None else -math.inf, -r["gain_snr_db"], -r["bytes_up_per_party"])

    for r in records:
        mine = key(r)
        rivals = [o for o in records if o is not r and _space(o) == _space(r)]
        better = [
            o["strategy"]
            for o in rivals
            if all(a >= b for a, b in zip(key(o), mine)) and any(a > b for a, b in zip(key(o), mine))
        ]
        r["dominated_by"] = " ".join(better)


def write_all(run_dir: Path, records: list[dict], attacks: list[dict], study: list[dict], meta: dict,
              truth: torch.Tensor, panels: dict[str, torch.Tensor], to_unit,
              gradient_study: list[dict] | None = None, study_panels: dict[str, torch.Tensor] | None = None
              ) -> list[str]:
    """frontier.md, frontier.csv, attacks.csv, reencoding.csv, gradient-study.csv, frontier.png,
    reconstructions.png and, with a gradient study, gradient-study.png (its reconstructions by batch size)."""
    gradient_study = gradient_study or []
    files = [
        write_csv(run_dir / "frontier.csv", records, COLUMNS),
        write_csv(run_dir / "attacks.csv", attacks, COLUMNS),
        write_csv(run_dir / "reencoding.csv", study, ("strategy", "space", "encodings_per_sample") + SCORES),
        write_csv(run_dir / "gradient-study.csv", gradient_study,
                  ("strategy", "study_batch_size", "victims", "attack", "attack_setting", "local_steps", "round",
                   *SCORES,
                   "attack_seconds")),
    ]
    atomic_write_bytes(run_dir / "frontier.md", markdown(records, study, meta, gradient_study).encode())
    scatter(run_dir / "frontier.png", records, f"{meta['dataset']}: accuracy vs leakage")
    reconstructions(run_dir / "reconstructions.png", truth, panels, to_unit)
    figures = ["frontier.md", "frontier.png", "reconstructions.png"]
    if study_panels:
        reconstructions(run_dir / "gradient-study.png", truth, study_panels, to_unit)
        figures.append("gradient-study.png")
    return [str(f) for f in files] + [str(run_dir / n) for n in figures]


def _privacy(r: dict) -> str:
    """The row's privacy parameters, each in its own cell."""
    return (f"| {_f(r.get('tau'), '.0e')} | {_f(r.get('upload_k'), 'd')} | {r.get('mixcon') or '-'} "
            f"| {_f(r.get('prune_p'), 'g')} "
            f"| {r.get('batch_mix') or '-'} | {_f(r.get('dp_fedavg_epsilon'), '.2f')} "
            f"| {_f(r.get('dp_sgd_epsilon'), '.2f')} ")


def markdown(records: list[dict], reencoding: list[dict], meta: dict, gradient_study: list[dict] | None = None) -> str:
    lines = [
        f"# Privacy-utility-cost frontier: {meta['dataset']}",
        "",
        meta["budget"],
        "",
        f"Threat model of the upload attacks: {meta.get('threat-model', 'oracle pairing')}; model updates: the "
        "party's own update with its labels known.",
        "",
        "Chosen: the setting each row's selection kept on the parties' own validation splits (never the test "
        "split), and how many settings it tried of the tuning budget every row shares. "
        "Leakage: the strongest applicable attack on the same victims; gain = attack minus the trivial guess "
        "(the public mean sample), so 0 means the attacker learnt nothing a data-free guess would not give; "
        "gain vs party mean compares with the victim party's own mean sample (an oracle guess): positive only when "
        "individual samples leak. SSIM of the best-recovered image is the highest per-victim SSIM. Bytes: what a "
        "party sends (local-only: nothing; the simulator returns its model only to evaluate it). Privacy "
        "parameters, each in its own column: tau (singularized mixup), k of an uploaded mixup/InstaHide encoding, "
        "MixCon's lambda and beta, "
        "p of gradient pruning, the batch defence and its k, DP-FedAvg's and DP-SGD's epsilon (from their "
        "accountants, at the run's delta). Time x: the row's local training time (mean party, all rounds) over "
        "undefended FedAvg's in the same run. Space: where the row's data is pooled and its leakage scored, "
        "pixels or a public backbone's features (frontier.features); gains in different spaces are different units, "
        "and a row is only ever dominated by rows of its own space. ST-LPIPS: shift-tolerant LPIPS distance "
        "(AlexNet, stlpips-pytorch; lower is closer; not numerically LPIPS), its gain = the guess's minus the "
        "attack's (positive: the attack came perceptually closer); images of 28 px and more.",
        "",
        "| strategy | space | test acc % | chosen (tuning) | tau | upload k | MixCon | prune p | batch mix "
        "| DP-FedAvg eps | DP-SGD eps "
        "| strongest attack | SNR dB | PSNR dB | SSIM | gain SNR dB | gain PSNR dB | gain SSIM "
        "| best-image SSIM | ST-LPIPS | gain ST-LPIPS | gain vs party mean dB | bytes up/party | wall s | time x "
        "| dominated by |",
        "|---|---|---:|---|---:|---:|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|---:|---:|---|",
    ]
    for r in records:
        attack = r["attack"] + (f" (B={r['batch_size']}, S={r['local_steps']})" if r.get("batch_size") else "") + (
            f" [{r['attack_setting']}]" if r.get("attack_setting") else "")
        lines.append(
            f"| {r['strategy']} | {_space(r)} "
            f"| {_f(100 * r['accuracy'] if r['accuracy'] is not None else None, '.2f')} | {tuning.cell_text(r)} "
            f"{_privacy(r)}| {attack} "
            f"| {_f(r['snr_db'], '.2f')} | {_f(r['psnr_db'], '.2f')} | {_f(r['ssim'], '.3f')} "
            f"| {_f(r['gain_snr_db'], '+.2f')} | {_f(r['gain_psnr_db'], '+.2f')} | {_f(r['gain_ssim'], '+.3f')} "
            f"| {_f(r['best_ssim'], '.3f')} | {_f(r.get('st_lpips'), '.3f')} | {_f(r.get('gain_st_lpips'), '+.3f')} "
            f"| {_f(r['gain_vs_party_mean_db'], '+.2f')} "
            f"| {r['bytes_up_per_party']:,.0f} | {_f(r['wall_seconds'], '.1f')} | {_f(r.get('time_overhead'), '.2f')} "
            f"| {r['dominated_by'] or '-'} |"
        )
    if reencoding:
        lines += [
            "",
            "## What re-encoding costs: the averaging attack against T encodings per sample",
            "",
            "| strategy | space | T | SNR dB | gain SNR dB | gain vs party mean dB | SSIM | gain SSIM "
            "| best-image SSIM |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in reencoding:
            lines.append(
                f"| {r['strategy']} | {_space(r)} | {r['encodings_per_sample']} "
                f"| {_f(r['snr_db'], '.2f')} "
                f"| {_f(r['gain_snr_db'], '+.2f')} | {_f(r['gain_vs_party_mean_db'], '+.2f')} "
                f"| {_f(r['ssim'], '.3f')} | {_f(r['gain_ssim'], '+.3f')} | {_f(r['best_ssim'], '.3f')} |"
            )
    if gradient_study:
        lines += [
            "",
            "## Gradient inversion by batch size (the appendix's table)",
            "",
            "Both gradient attackers on every FedAvg/FedProx row: 'gradient' = BN_exact (the batch's BatchNorm "
            "statistics and dropout masks known; against batch mixing, coefficients and indices known), "
            "'gradient-realistic' = BN_infer. Gain over the trivial guess.",
            "",
            "| strategy | B | victims | attack | gain SNR dB | gain PSNR dB | SSIM | gain SSIM | best-image SSIM "
            "| attack s |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in gradient_study:
            if "gain_snr_db" not in r:
                lines.append(f"| {r['strategy']} | {r['study_batch_size']} | - | {r['attack']} |" + " - |" * 6)
                continue
            lines.append(
                f"| {r['strategy']} | {r['study_batch_size']} | {r['victims']} | {r['attack']}"
                f"{' [' + r['attack_setting'] + ']' if r.get('attack_setting') else ''} "
                f"| {_f(r['gain_snr_db'], '+.2f')} "
                f"| {_f(r['gain_psnr_db'], '+.2f')} | {_f(r['ssim'], '.3f')} | {_f(r['gain_ssim'], '+.3f')} "
                f"| {_f(r['best_ssim'], '.3f')} | {_f(r['attack_seconds'], '.0f')} |"
            )
    return "\n".join(lines) + "\n"


#: the columns a frontier over seeds reports as mean ± 95 % interval: accuracy, leakage, cost
SEED_COLUMNS = ("accuracy", "snr_db", "ssim", "gain_snr_db", "gain_psnr_db", "gain_ssim", "best_ssim",
                "gain_st_lpips", "gain_vs_party_mean_db", "bytes_up_per_party", "wall_seconds")
LEVEL = 0.95


def over_seeds(summaries: list[dict]) -> list[dict]:
    """Frontiers of one preset at different seeds (each run_frontier's summary: its `settings` name the seed) -> one
    record per row, in the first frontier's order: space, seeds, n (the seeds the row finished), the strongest
    attack at each seed, `stats` (each SEED_COLUMNS' Interval) and `values` (column -> seed -> value). A seed
    draws the partitions, the initialisation and the victims (the victim party's first samples), so the
    leakage interval covers which samples are attacked too. `dominated_by` compares the means."""
    runs: dict[str, list[tuple[int, dict]]] = {}
    for summary in summaries:
        seed = summary["settings"]["seed"]
        for r in summary["records"]:
            runs.setdefault(r["strategy"], []).append((seed, r))
    out = []
    for name, seeded in runs.items():
        done = [(seed, r) for seed, r in seeded if not r.get("error") and r.get("accuracy") is not None]
        record: dict = {"strategy": name, "space": _space(seeded[0][1]), "seeds": [seed for seed, _ in seeded],
                        "n": len(done), "attack": "; ".join(dict.fromkeys(r["attack"] for _, r in done)) or "-",
                        "chosen": "; ".join(f"seed {seed}: {r['chosen']}" for seed, r in done if r.get("chosen")),
                        "tuning": "; ".join(dict.fromkeys(r["tuning"] for _, r in done if r.get("tuning"))),
                        "stats": {}, "values": {}}
        for column in SEED_COLUMNS:
            pairs = [(seed, r[column]) for seed, r in done
                     if isinstance(r.get(column), int | float) and math.isfinite(r[column])]
            if interval := tables.interval([v for _, v in pairs], LEVEL):
                record["stats"][column], record["values"][column] = interval, dict(pairs)
        out.append(record)
    means = [{"strategy": r["strategy"], "space": r["space"],
              **{c: (r["stats"][c].mean if c in r["stats"] else None)
                 for c in ("accuracy", "gain_snr_db", "bytes_up_per_party")}} for r in out]
    ranked = [m for m in means if m["gain_snr_db"] is not None and m["bytes_up_per_party"] is not None]
    dominated_by(ranked)
    for record, mean in zip(out, means):
        record["dominated_by"] = mean.get("dominated_by", "")
    return out


def seeds_markdown(records: list[dict], summaries: list[dict]) -> str:
    """The frontier table over seeds: every accuracy, leakage and cost cell a mean ± 95 % interval."""
    meta, seeds = summaries[0]["meta"], [s["settings"]["seed"] for s in summaries]
    most = max((r["n"] for r in records), default=1)

    def cell(r: dict, column: str, spec: str, scale: float = 1.0) -> str:
        iv = r["stats"].get(column)
        text = tables.ci(iv, spec, scale)
        return text + (f" (n={iv.n})" if iv is not None and iv.n < most else "")

    lines = [
        f"# Privacy-utility-cost frontier over seeds: {meta['dataset']}",
        "",
        f"Every cell: {tables.ci_caption([r['n'] for r in records], LEVEL, seeds)}; one frontier per seed (its "
        "own partitions, initialisation and victims), the strongest attack chosen per seed. Budget of each "
        f"frontier (seed {seeds[0]}'s): {meta['budget']}",
        "",
        f"Threat model of the upload attacks: {meta.get('threat-model', 'oracle pairing')}; model updates: the "
        "party's own update with its labels known. Dominated by: on the seed means, within a space.",
        "",
        "| strategy | space | n | test acc % | strongest attack (per seed) | SNR dB | SSIM | gain SNR dB "
        "| gain PSNR dB | gain SSIM | best-image SSIM | gain ST-LPIPS | gain vs party mean dB | bytes up/party "
        "| wall s | chosen (tuning) | dominated by |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['strategy']} | {r['space']} | {r['n']} | {cell(r, 'accuracy', '.2f', 100)} | {r['attack']} "
            f"| {cell(r, 'snr_db', '.2f')} | {cell(r, 'ssim', '.3f')} | {cell(r, 'gain_snr_db', '+.2f')} "
            f"| {cell(r, 'gain_psnr_db', '+.2f')} | {cell(r, 'gain_ssim', '+.3f')} | {cell(r, 'best_ssim', '.3f')} "
            f"| {cell(r, 'gain_st_lpips', '+.3f')} | {cell(r, 'gain_vs_party_mean_db', '+.2f')} "
            f"| {cell(r, 'bytes_up_per_party', ',.0f')} "
            f"| {cell(r, 'wall_seconds', '.1f')} | {tuning.cell_text(r)} | {r['dominated_by'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


def write_seeds(out: Path, summaries: list[dict]) -> list[str]:
    """frontier-seeds.md, frontier-seeds.csv (per row: n, seeds, each column's mean, ci-low, ci-high) and
    frontier-seeds.json (the same with every seed's value, and each seed's frontier directory)."""
    records = over_seeds(summaries)
    flat = []
    for r in records:
        row = {k: r[k] for k in ("strategy", "space", "n", "attack", "chosen", "tuning", "dominated_by")}
        row["seeds"] = ";".join(str(seed) for seed in r["seeds"])
        for column in SEED_COLUMNS:
            iv = r["stats"].get(column)
            row[column], row[f"{column}_ci_low"], row[f"{column}_ci_high"] = (
                (iv.mean, iv.low, iv.high) if iv else (None, None, None))
        flat.append(row)
    columns = ["strategy", "space", "n", "seeds", "attack",
               *[f"{c}{end}" for c in SEED_COLUMNS for end in ("", "_ci_low", "_ci_high")], "chosen", "tuning",
               "dominated_by"]
    files = [write_csv(out / "frontier-seeds.csv", flat, columns)]
    atomic_write_bytes(out / "frontier-seeds.md", seeds_markdown(records, summaries).encode())
    detail = {
        "seeds": [s["settings"]["seed"] for s in summaries], "level": LEVEL,
        "runs": {str(s["settings"]["seed"]): s.get("run-dir") for s in summaries},
        "rows": [{**{k: v for k, v in r.items() if k not in ("stats", "values")},
                  "columns": {c: {**iv.as_dict(), "seeds": list(r["values"][c])} for c, iv in r["stats"].items()}}
                 for r in records],
    }
    atomic_write_bytes(out / "frontier-seeds.json", json.dumps(detail, indent=1, default=str).encode())
    return [str(f) for f in files] + [str(out / "frontier-seeds.md"), str(out / "frontier-seeds.json")]


FAMILIES = {  # marker and colour per kind of row: defences differ in kind, so each has its own
    "local-only": ("X", "grey"),
    "upload encoding": ("o", "tab:blue"),
    "MixCon cut layer": ("h", "tab:cyan"),
    "FedAvg/FedProx": ("s", "tab:red"),
    "gradient pruning": ("^", "tab:orange"),
    "batch mixing": ("D", "tab:green"),
    "batch mixing + pruning": ("P", "tab:olive"),
    "DP-FedAvg": ("*", "tab:purple"),
    "DP-SGD": ("v", "tab:pink"),
    "GroupNorm": ("s", "tab:brown"),
}


def _family(r: dict) -> str:
    if r["strategy"].startswith("local-only"):  # local-only-features too
        return "local-only"
    if r.get("mixcon"):
        return "MixCon cut layer"
    if r.get("tau") is not None or r.get("upload_k") is not None:
        return "upload encoding"
    if r.get("dp_fedavg_epsilon") is not None or "-dp-" in r["strategy"] or "-dpclient-" in r["strategy"]:
        return "DP-FedAvg"
    if r.get("dp_sgd_epsilon") is not None or "-dpsgd-" in r["strategy"]:
        return "DP-SGD"
    if r.get("batch_mix"):
        return "batch mixing + pruning" if r.get("prune_p") else "batch mixing"
    if r.get("prune_p"):
        return "gradient pruning"
    return "GroupNorm" if "groupnorm" in r["strategy"] else "FedAvg/FedProx"


def scatter(path: Path, records: list[dict], title: str) -> None:
    """Accuracy against leakage gain, one panel per space (pixels, features: different units) on a shared
    accuracy axis; marker area grows with the bytes a party sends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in records if r["accuracy"] is not None]
    names = [s for s in ("pixels", "features") if any(_space(r) == s for r in points)] or ["pixels"]
    biggest = max((r["bytes_up_per_party"] for r in points), default=1) or 1
    fig, axes = plt.subplots(1, len(names), figsize=(7.5 * len(names), 5), sharey=True, squeeze=False)
    for ax, space in zip(axes[0], names):
        groups: list[tuple[float, float, list[str]]] = []  # rows on (nearly) the same spot share one label
        shown: set[str] = set()
        for r in (r for r in points if _space(r) == space):
            x, y = r["gain_snr_db"], 100 * r["accuracy"]
            size = 30 + 900 * math.sqrt(r["bytes_up_per_party"] / biggest)
            family = _family(r)
            marker, color = FAMILIES[family]
            ax.scatter(x, y, s=size, alpha=0.55, edgecolors="black", linewidths=0.6, marker=marker, color=color,
                       label=None if family in shown else family)
            shown.add(family)
            near = next((g for g in groups if abs(g[0] - x) < 0.5 and abs(g[1] - y) < 2.0), None)
            if near:
                near[2].append(r["strategy"])
            else:
                groups.append((x, y, [r["strategy"]]))
        for x, y, labels in groups:
            ax.annotate(", ".join(labels), (x, y), fontsize=8, xytext=(5, 4), textcoords="offset points")
        ax.set_xscale("symlog", linthresh=10)  # exact recoveries reach +100 dB; keep 0-10 dB readable
        gains = [r["gain_snr_db"] for r in points if _space(r) == space] or [0.0]
        ax.set_xlim(min(-1.0, min(gains) - 1.0), max(10.0, 1.3 * max(gains)))  # a few points: readable ticks
        ax.axvline(0.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xlabel(f"leakage in {space}: best attack's SNR gain over the trivial guess (dB, symlog)", fontsize=9)
        ax.set_title(f"{title} ({space})\nmarker area ~ sqrt(bytes sent per party); max {biggest:,.0f} B")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", markerscale=0.5)
    axes[0][0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reconstructions(
    path: Path, truth: torch.Tensor, panels: dict[str, torch.Tensor], to_unit, columns: int = 8
) -> None:
    """First victims (top row) and each strategy's strongest reconstruction of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if truth.dim() != 4:
        return
    columns = min(columns, len(truth))
    rows = [("victims", truth)] + list(panels.items())
    fig, axes = plt.subplots(len(rows), columns, figsize=(1.1 * columns + 1.6, 1.15 * len(rows)), squeeze=False)
    for i, (name, images) in enumerate(rows):
        unit = to_unit(images[:columns].float()).clamp(0, 1)
        for j in range(columns):
            ax = axes[i][j]
            ax.imshow(unit[j].permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[i][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
