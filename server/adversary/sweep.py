"""The paper's security tables from one command: sweep tau over a fixed victim set.

The victims (the first `victims` images of a split) are encoded as one party would encode
them, at every tau, from one seed: pairing, weights and noise directions stay the same and only
the radius r = m_f(tau) D grows. Every attack runs on every encoding; each score sits beside the
trivial guess's and Theorem 4.1's bound, and the paper's own numbers where it reports them.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from fedsmix import data as datalib
from fedsmix.config import Settings, SettingsError
from fedsmix.encoders import calibrate, data_statistics
from fedsmix.metrics import score
from fedsmix.pipeline import Partition, calibrate_party, encode_partition, to_space
from fedsmix.runs import atomic_write_bytes, atomic_write_json
from fedsmix.seeding import generator

from .analysis import leakage, theorem41
from .cases import build_attacks, observation, public_samples
from .figures import recovery_grid, stretched, unit_images
from .tables import markdown, pm, signed, write_csv

PAPER_TAUS = (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
# Table 1 (linear attack, 224 px) and Table 2 (U-Net, CIFAR-10), mean SNR in dB per tau above
PAPER_LINEAR = {
    "mnist": (8.19, 0.09, -2.79, -3.65, -3.90, -3.98, -4.01),
    "cifar10": (0.85, -5.06, -6.92, -7.45, -7.61, -7.66, -7.67),
    "cifar100": (0.94, -4.86, -6.66, -7.17, -7.32, -7.37, -7.38),
    "tiny-imagenet": (1.24, -4.60, -6.42, -6.94, -7.09, -7.14, -7.15),
}
PAPER_UNET = {"cifar10": (7.76, 7.27, 5.44, 2.84, -0.13, -0.13, -0.14)}
KNOWN_W = ("linear", "mmse")


def paper_value(table: dict, dataset: str, tau: float) -> float | None:
    for t, value in zip(PAPER_TAUS, table.get(dataset, ())):
        if np.isclose(t, tau, rtol=1e-6):
            return value
    return None


def victim_partition(settings: Settings, victims: int, split: str = "test", resize: int = 0) -> Partition:
    """The first `victims` samples of a split, in mixing space, as a one-party partition.

    resize > 0 upsamples pixels first (bilinear, antialiased), as the paper's 224 px preprocessing.
    """
    raw = datalib.load_split(settings.dataset, split, settings.data_dir, settings.download)
    rows = np.arange(min(victims, len(raw)))
    labels = torch.from_numpy(raw.labels[rows].astype(np.int64))
    if not resize:
        return Partition(0, to_space(settings, raw, split, rows), labels, raw.spec.num_classes, raw.spec, rows)
    if settings.backbone != "none":
        raise SettingsError("--resize: only for pixels (no backbone); a backbone has its own input size")
    unit = F.interpolate(datalib.to_unit(raw.images[rows], raw.spec), size=(resize, resize), mode="bilinear",
                         antialias=True, align_corners=False).clamp(0, 1)
    spec = replace(raw.spec, image_size=resize)
    return Partition(0, datalib.normalize(unit, spec), labels, spec.num_classes, spec, rows)


def run_sweep(settings: Settings, taus, attacks, victims: int, out_dir: Path, device: str = "cpu",
              mmse_rank: int = 256, split: str = "test", resize: int = 0, log=print) -> dict:
    """One data set: every tau, every attack; writes <dataset>-sweep.{json,md,csv} and figures."""
    out_dir = Path(out_dir)
    pixels = settings.backbone == "none"
    part = victim_partition(settings, victims, split, resize)
    spec = part.spec
    to_unit = (lambda t: datalib.denormalize(t, spec)) if pixels else None
    x_eval = part.x.to(device)  # scoring (SSIM at 224 px) runs where the attacks ran
    public = public_samples(settings, spec)
    public_mean = public.mean(dim=0) if public is not None else None
    t_build = time.perf_counter()
    built, skipped = build_attacks(attacks, settings, public, device, mmse_rank, sample_shape=part.sample_shape)
    log(f"[{settings.dataset}] {len(part.x)} victims {tuple(part.sample_shape)}; attacks {list(built)} "
        f"(prior/setup {time.perf_counter() - t_build:.1f}s); skipped {skipped or 'none'}")
    result = {
        "dataset": settings.dataset, "victims": len(part.x), "split": split, "sample-shape": list(part.sample_shape),
        "resize": resize,
        "attacks": list(built), "skipped": skipped, "device": device, "mmse-rank": mmse_rank,
        "settings": json.loads(settings.to_json()), "taus": [],
    }
    panels: dict[str, dict[str, list]] = {name: {"original": [], "mixed": [], "recovered": []} for name in built}
    best: dict[str, int] = {}
    stats = data_statistics(part.x, generator(settings.seed, part.party, "calibrate"))  # as calibrate_party does
    for tau in sorted(taus, reverse=True):  # the figure shows the victim recovered best at the largest tau
        st = settings.replace(tau=tau)
        # V and D do not depend on tau: estimate them once (a minute at 224 px), as calibrate_party would
        calibration = calibrate(stats, tau, st.alpha) if st.radius_mode == "theorem" else calibrate_party(st, part)
        enc, _ = encode_partition(st, part, calibration)
        obs = observation(enc, calibration.radius, spec if pixels else None, tau=tau).to(device)
        estimates, seconds, training = {}, {}, {}
        for name, attack in built.items():
            started = time.perf_counter()
            if name == "unet":
                attack.fit(calibration.radius)
                training = attack.report
            estimates[name] = attack.reconstruct(obs)
            seconds[name] = time.perf_counter() - started
        report, per_image = leakage(x_eval, estimates, public_mean, to_unit)
        mixed, _ = score(x_eval, obs.x_tilde, to_unit)
        record = {
            "tau": tau, "radius": calibration.radius, "m_f": calibration.m_f, "snr-bound": calibration.snr_bound,
            **report, "mixed": mixed.as_dict(), "seconds": seconds,
            "theorem41": {n: theorem41(part.x, estimates[n], enc.weights, enc.sources[:, 1], calibration.radius)
                          for n in KNOWN_W if n in estimates},
            "paper": {"linear": paper_value(PAPER_LINEAR, settings.dataset, tau),
                      "unet": paper_value(PAPER_UNET, settings.dataset, tau)},
        }
        if training:
            record["unet-training"] = training
        result["taus"].append(record)
        for name in built:
            best.setdefault(name, int(torch.argmax(per_image[name]["snr"])))
            i = best[name]
            panels[name]["original"].append(part.x[i])
            panels[name]["mixed"].append(enc.x[i])
            panels[name]["recovered"].append(estimates[name][i].cpu())
        log(f"[{settings.dataset}] tau={tau:g} r={calibration.radius:.4g} "
            + " ".join(f"{n}={e['score']['snr_mean']:.2f}dB({seconds[n]:.0f}s)" for n, e in report["attacks"].items())
            + (f" trivial={report['trivial']['snr_mean']:.2f}dB" if "trivial" in report else ""))
        atomic_write_json(out_dir / f"{settings.dataset}-sweep.json", result)  # partial results survive a timeout
        del estimates, obs
    result["files"] = write_sweep_tables(out_dir, result) + write_sweep_figures(out_dir, result, panels, best, to_unit)
    atomic_write_json(out_dir / f"{settings.dataset}-sweep.json", result)
    return result


def csv_rows(result: dict) -> list[dict]:
    rows = []
    for rec in result["taus"]:
        row = {"dataset": result["dataset"], "victims": result["victims"], "tau": rec["tau"], "radius": rec["radius"],
               "m_f": rec["m_f"], "mixed_snr_mean": rec["mixed"]["snr_mean"]}
        if "trivial" in rec:
            row.update({f"trivial_{k}": v for k, v in rec["trivial"].items() if not k.startswith("best")})
        for name, entry in rec["attacks"].items():
            row.update({f"{name}_{k}": v for k, v in entry["score"].items()})
            row.update({f"{name}_gain_{k}": v for k, v in entry.get("gain", {}).items()})
            row[f"{name}_seconds"] = rec["seconds"][name]
            row[f"paper_{name}_snr"] = rec["paper"].get(name)
        for name, t41 in rec["theorem41"].items():
            row.update({f"thm41_{name}_{k}": v for k, v in t41.items()})
        rows.append(row)
    return rows


def markdown_rows(result: dict) -> tuple[list[dict], list[tuple[str, str]]]:
    names = result["attacks"]
    columns = [("tau", "tau"), ("radius", "r")]
    if "linear" in names:
        columns += [("paper_linear", "paper linear"), ("linear", "linear (paper attack)")]
    if "mmse" in names:
        columns += [("mmse", "MMSE")]
    if "unet" in names:
        columns += [("paper_unet", "paper U-Net"), ("unet", "U-Net")]
    columns += [("trivial", "trivial guess")] + [(f"gain_{n}", f"gain {n}") for n in names]
    if "linear" in names:
        columns += [("t41", "Thm 4.1: r²T / linear error (median)")]
    rows = []
    for rec in result["taus"]:
        row = {"tau": f"{rec['tau']:g}", "radius": f"{rec['radius']:.3g}",
               "paper_linear": pm(rec["paper"]["linear"]), "paper_unet": pm(rec["paper"]["unet"]),
               "trivial": pm(rec["trivial"]["snr_mean"], rec["trivial"]["snr_std"]) if "trivial" in rec else "-"}
        for name, entry in rec["attacks"].items():
            row[name] = pm(entry["score"]["snr_mean"], entry["score"]["snr_std"])
            row[f"gain_{name}"] = signed(entry.get("gain", {}).get("snr_db"))
        if "linear" in rec["theorem41"]:
            t41 = rec["theorem41"]["linear"]
            row["t41"] = f"{t41['bound-median']:.3g} / {t41['error-median']:.3g}"
        rows.append(row)
    return rows, columns


def write_sweep_tables(out_dir: Path, result: dict) -> list[str]:
    rows, columns = markdown_rows(result)
    title = (f"## {result['dataset']}: {result['victims']} {result['split']} images, SNR dB (mean ± std); "
             "gains over the trivial guess (public mean image) in dB\n\n")
    md = out_dir / f"{result['dataset']}-sweep.md"
    atomic_write_bytes(md, (title + markdown(rows, columns)).encode())
    return [str(md), str(write_csv(out_dir / f"{result['dataset']}-sweep.csv", csv_rows(result)))]


def write_sweep_figures(out_dir: Path, result: dict, panels: dict, best: dict, to_unit) -> list[str]:
    if to_unit is None or len(result["sample-shape"]) != 3:
        return []  # feature vectors have no picture
    files = []
    columns = [f"τ={rec['tau']:g}" for rec in result["taus"]]
    for name, rows in panels.items():
        images = {
            "original": unit_images(torch.stack(rows["original"]), to_unit),
            "mixed (stretched)": stretched(torch.stack(rows["mixed"])),
            "recovered": unit_images(torch.stack(rows["recovered"]), to_unit),
        }
        title = f"{result['dataset']}: {name} attack, victim {best[name]} (best recovered at τ={result['taus'][0]['tau']:g})"
        files.append(str(recovery_grid(out_dir / f"{result['dataset']}-{name}.png", columns, images, title)))
    return files
