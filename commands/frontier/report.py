"""The frontier's outputs: a markdown table, CSVs, a scatter plot and a reconstruction panel."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from fedsmix.runs import atomic_write_bytes
from fedsmix.tables import fmt as _f
from fedsmix.tables import write_csv

COLUMNS = (
    "strategy",
    "accuracy",
    "attack",
    "batch_size",
    "local_steps",
    "snr_db",
    "psnr_db",
    "ssim",
    "gain_snr_db",
    "gain_psnr_db",
    "gain_ssim",
    "best_ssim",
    "trivial_snr_db",
    "trivial_psnr_db",
    "trivial_ssim",
    "party_mean_snr_db",
    "gain_vs_party_mean_db",
    "bytes_up_per_party",
    "measured_bytes_up_per_party",
    "wall_seconds",
    "attack_seconds",
    "dominated_by",
)


def dominated_by(records: list[dict]) -> None:
    """Mark each row with the rows that beat it on accuracy, leakage (SNR gain) and bytes at once."""

    def key(r):
        return (r["accuracy"] if r["accuracy"] is not None else -math.inf, -r["gain_snr_db"], -r["bytes_up_per_party"])

    for r in records:
        mine = key(r)
        better = [
            o["strategy"]
            for o in records
            if o is not r and all(a >= b for a, b in zip(key(o), mine)) and any(a > b for a, b in zip(key(o), mine))
        ]
        r["dominated_by"] = " ".join(better)


def write_all(run_dir: Path, records: list[dict], attacks: list[dict], study: list[dict], meta: dict,
              truth: torch.Tensor, panels: dict[str, torch.Tensor], to_unit) -> list[str]:
    """frontier.md, frontier.csv, attacks.csv, reencoding.csv, frontier.png and reconstructions.png."""
    files = [
        write_csv(run_dir / "frontier.csv", records, COLUMNS),
        write_csv(run_dir / "attacks.csv", attacks, COLUMNS),
        write_csv(run_dir / "reencoding.csv", study, ("strategy", "encodings_per_sample") + COLUMNS[5:17]),
    ]
    atomic_write_bytes(run_dir / "frontier.md", markdown(records, study, meta).encode())
    scatter(run_dir / "frontier.png", records, f"{meta['dataset']}: accuracy vs leakage")
    reconstructions(run_dir / "reconstructions.png", truth, panels, to_unit)
    return [str(f) for f in files] + [str(run_dir / n) for n in ("frontier.md", "frontier.png", "reconstructions.png")]


def markdown(records: list[dict], reencoding: list[dict], meta: dict) -> str:
    lines = [
        f"# Privacy-utility-cost frontier: {meta['dataset']}",
        "",
        meta["budget"],
        "",
        f"Threat model of the upload attacks: {meta.get('threat-model', 'oracle pairing')}; model updates: the "
        "party's own update with its labels known.",
        "",
        "Leakage: the strongest applicable attack on the same victims; gain = attack minus the trivial guess "
        "(the public mean sample), so 0 means the attacker learnt nothing a data-free guess would not give; "
        "gain vs party mean compares with the victim party's own mean sample (an oracle guess): positive only when "
        "individual samples leak. SSIM of the best-recovered image is the highest per-victim SSIM. Bytes: what a "
        "party sends (local-only: nothing; the simulator returns its model only to evaluate it).",
        "",
        "| strategy | test acc % | strongest attack | SNR dB | PSNR dB | SSIM | gain SNR dB | gain PSNR dB | gain SSIM "
        "| best-image SSIM | gain vs party mean dB | bytes up/party | wall s | dominated by |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in records:
        attack = r["attack"] + (f" (B={r['batch_size']}, S={r['local_steps']})" if r.get("batch_size") else "")
        lines.append(
            f"| {r['strategy']} | {_f(100 * r['accuracy'] if r['accuracy'] is not None else None, '.2f')} | {attack} "
            f"| {_f(r['snr_db'], '.2f')} | {_f(r['psnr_db'], '.2f')} | {_f(r['ssim'], '.3f')} "
            f"| {_f(r['gain_snr_db'], '+.2f')} | {_f(r['gain_psnr_db'], '+.2f')} | {_f(r['gain_ssim'], '+.3f')} "
            f"| {_f(r['best_ssim'], '.3f')} | {_f(r['gain_vs_party_mean_db'], '+.2f')} "
            f"| {r['bytes_up_per_party']:,.0f} | {_f(r['wall_seconds'], '.1f')} "
            f"| {r['dominated_by'] or '-'} |"
        )
    if reencoding:
        lines += [
            "",
            "## What re-encoding costs: the averaging attack against T encodings per sample",
            "",
            "| strategy | T | SNR dB | gain SNR dB | gain vs party mean dB | SSIM | gain SSIM | best-image SSIM |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in reencoding:
            lines.append(
                f"| {r['strategy']} | {r['encodings_per_sample']} | {_f(r['snr_db'], '.2f')} "
                f"| {_f(r['gain_snr_db'], '+.2f')} | {_f(r['gain_vs_party_mean_db'], '+.2f')} "
                f"| {_f(r['ssim'], '.3f')} | {_f(r['gain_ssim'], '+.3f')} | {_f(r['best_ssim'], '.3f')} |"
            )
    return "\n".join(lines) + "\n"


def scatter(path: Path, records: list[dict], title: str) -> None:
    """Accuracy against leakage gain; marker area grows with the bytes a party sends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in records if r["accuracy"] is not None]
    biggest = max((r["bytes_up_per_party"] for r in points), default=1) or 1
    fig, ax = plt.subplots(figsize=(7.5, 5))
    groups: list[tuple[float, float, list[str]]] = []  # rows on (nearly) the same spot share one label
    for r in points:
        x, y = r["gain_snr_db"], 100 * r["accuracy"]
        size = 30 + 900 * math.sqrt(r["bytes_up_per_party"] / biggest)
        ax.scatter(x, y, s=size, alpha=0.55, edgecolors="black", linewidths=0.6)
        near = next((g for g in groups if abs(g[0] - x) < 0.5 and abs(g[1] - y) < 2.0), None)
        if near:
            near[2].append(r["strategy"])
        else:
            groups.append((x, y, [r["strategy"]]))
    for x, y, names in groups:
        ax.annotate(", ".join(names), (x, y), fontsize=8, xytext=(5, 4), textcoords="offset points")
    ax.set_xscale("symlog", linthresh=10)  # exact recoveries reach +100 dB; keep 0-10 dB readable
    ax.axvline(0.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("leakage: strongest attack's SNR gain over the trivial guess (dB, symlog)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{title}\nmarker area ~ sqrt(bytes sent per party); max {biggest:,.0f} B")
    ax.grid(alpha=0.3)
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
