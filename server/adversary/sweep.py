"""The paper's security tables from one command: sweep tau over a fixed victim set.

The victims (the first `victims` images of a split, or `victims` / P rows of each of P parties'
training partitions) are encoded as their party would encode them, at every tau, from one seed:
pairing, weights and noise directions stay the same and only the radius grows. Every attack runs
on every encoding, in the space where the mixing happens (pixels, or a backbone's features); each
score sits beside the trivial guess's and Theorem 4.1's bound, and the paper's own numbers where
it reports them (pixels only).
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
from fedsmix.metrics import score, snr_db
from fedsmix.party import Partition, calibrate_party, encode_partition, load_partition, party_statistics
from fedsmix.progress import SILENT, Progress
from fedsmix.runs import atomic_write_bytes, atomic_write_json
from fedsmix.space import pixel_spec, to_space
from fedsmix.tables import markdown, pm, signed, write_csv

from .analysis import Blind, attack_cases
from .cases import THREAT_MODELS, public_samples, threat_model, upload_case, valid_bounds
from .figures import recovery_grid, stretched, unit_images
from .registry import build_attacks
from .runner import learned, mixing_space, pick_victims

PAPER_TAUS = (1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
PAIRING_KEYS = ("pairing-accuracy", "pairing-chance", "pairing-candidates", "pairing-seconds")
# Table 1 (linear attack, 224 px) and Table 2 (U-Net, CIFAR-10), mean SNR in dB per tau above
PAPER_LINEAR = {
    "mnist": (8.19, 0.09, -2.79, -3.65, -3.90, -3.98, -4.01),
    "cifar10": (0.85, -5.06, -6.92, -7.45, -7.61, -7.66, -7.67),
    "cifar100": (0.94, -4.86, -6.66, -7.17, -7.32, -7.37, -7.38),
    "tiny-imagenet": (1.24, -4.60, -6.42, -6.94, -7.09, -7.14, -7.15),
}
PAPER_UNET = {"cifar10": (7.76, 7.27, 5.44, 2.84, -0.13, -0.13, -0.14)}


def paper_value(table: dict, dataset: str, tau: float) -> float | None:
    for t, value in zip(PAPER_TAUS, table.get(dataset, ())):
        if np.isclose(t, tau, rtol=1e-6):
            return value
    return None


def victim_partition(settings: Settings, victims: int, split: str = "test", resize: int = 0) -> Partition:
    """The first `victims` samples of a split, in mixing space, as a one-party partition.

    resize > 0 upsamples pixels first (bilinear, antialiased), as the paper's 224 px preprocessing.
    """
    raw = datalib.load_dataset(settings, split)
    rows = np.arange(min(victims, len(raw)))
    labels = torch.from_numpy(raw.labels[rows].astype(np.int64))
    if not resize:
        return Partition(0, to_space(settings, raw, split, rows), labels, raw.spec.num_classes,
                         pixel_spec(settings, raw.spec), rows, split)
    if settings.backbone != "none":
        raise SettingsError("--resize: only for pixels (no backbone); a backbone has its own input size")
    unit = F.interpolate(datalib.to_unit(raw.images[rows], raw.spec), size=(resize, resize), mode="bilinear",
                         antialias=True, align_corners=False).clamp(0, 1)
    spec = replace(pixel_spec(settings, raw.spec), image_size=resize)
    return Partition(0, datalib.normalize(unit, spec), labels, spec.num_classes, spec, rows, split)


def victim_cases(settings: Settings, victims: int, split: str = "test", resize: int = 0,
                 parties: int = 0) -> list[tuple[Partition, torch.Tensor]]:
    """Who gets encoded, and which of its rows are scored.

    parties = 0: one party holding the first `victims` images of `split`, all scored.
    parties = P: the run's own P training partitions (partitioner, seed), each encoded whole as that
    party would, and `victims` / P of each party's rows scored: the rows the ServerApp's adversary
    picks with attack-victims = victims / P.
    """
    if not parties:
        part = victim_partition(settings, victims, split, resize)
        return [(part, torch.arange(len(part.x)))]
    if resize:
        raise SettingsError("--resize: only for the first images of a split, not with --parties")
    if victims < parties:
        raise SettingsError(f"--victims: {victims} victims cannot be spread over {parties} parties")
    cases = []
    for party in range(parties):
        part = load_partition(settings, party, parties)
        count = victims // parties + (party < victims % parties)
        cases.append((part, pick_victims(len(part.x), count, settings.seed, party)))
    return cases


# settings that change what a sweep measures, named in its file stem when they differ from the default
NON_DEFAULT_LABELS = (
    ("mixing_weights", "algorithm1"), ("normalisation", "dataset"), ("calibration", "scalar"),
    ("variance_centring", "per-pixel"), ("public_classes", "all"), ("attack_pairing", "oracle"), ("screen", "none"),
)


def sweep_label(settings: Settings, parties: int = 0) -> str:
    """The file stem of one sweep: data set, and where it differs from pixels/theorem/one party."""
    parts = [datalib.dataset_key(settings)]
    if settings.backbone != "none":
        from fedsmix.features import input_size

        parts += [settings.backbone, f"{input_size(settings)}px"]
    if settings.radius_mode != "theorem":
        parts.append(settings.radius_mode)
    for key, default in NON_DEFAULT_LABELS:
        value = getattr(settings, key)
        if value != default:
            prefix = {"public_classes": "public", "attack_pairing": "pairing", "variance_centring": "centring"}
            parts.append(f"{prefix[key]}-{value}" if key in prefix else value)
    if parties:
        parts.append(f"{parties}parties")
    return "-".join(parts)


def victim_uploads(settings: Settings, cases, calibrations, bounds, pairing=None) -> list:
    """The victims' uploads at one tau, as the attack loop sees them (for the learned attacks' learning curves)."""
    return [upload_case(settings, part, encode_partition(settings, part, calibration)[0], calibration, rows,
                        bounds=bounds, pairing=pairing)
            for (part, rows), calibration in zip(cases, calibrations)]


def victims_snr(uploads: list):
    """A learned attack's learning curve on the victims: after an epoch, their mean SNR (dB) under the model so
    far (analysis only: nothing is chosen on it)."""
    inputs: dict[int, torch.Tensor] = {}  # what the network reads of each upload (refined: its MMSE estimate), once

    def score(epoch: int, attack) -> dict:
        snr = []
        for i, case in enumerate(uploads):
            if i not in inputs:
                inputs[i] = attack.model_input(case.observation)
            estimate = attack.predict(inputs[i], case.observation.lo, case.observation.hi)[case.rows]
            snr.append(snr_db(case.truth.float(), estimate))
        return {"victims-snr": float(torch.cat(snr).mean())}

    return score


def run_sweep(settings: Settings, taus, attacks, victims: int, out_dir: Path, device: str = "cpu",
              mmse_rank: int = 256, split: str = "test", resize: int = 0, log=print, parties: int = 0,
              progress: Progress = SILENT, unet_curve: bool = False) -> dict:
    """One data set and radius mode: every tau, every attack; writes <label>-sweep.{json,md,csv} and figures.

    Where a backbone is set, victims, public data, attacks and scores all live in its feature space
    (SNR only: PSNR and SSIM do not apply to feature vectors).

    Each tau's U-Net is checkpointed after every epoch under <out_dir>/unet-checkpoints/: the same command with
    the same --out continues an interrupted fit. `unet_curve` scores the victims after every epoch (the
    record's `unet-training.curve`, `refined-training.curve`): a learning curve for analysis; the epoch kept is
    `unet-select`'s.
    """
    out_dir = Path(out_dir)
    pixels = settings.backbone == "none"
    label = sweep_label(settings, parties)
    cases = victim_cases(settings, victims, split, resize, parties)
    spec = cases[0][0].spec
    sample_shape = cases[0][0].sample_shape
    to_unit = (lambda t: datalib.denormalize(t, spec)) if pixels else None
    bounds = valid_bounds(settings, spec)
    public = public_samples(settings, spec)
    public_mean = public.mean(dim=0)
    blind = Blind.of(public, to_unit)  # the best guesses without an upload, per metric
    t_build = time.perf_counter()
    built, skipped = build_attacks(attacks, settings, public, sample_shape, device=device, mmse_rank=mmse_rank)
    pairing = None
    if settings.attack_pairing == "recovered":  # the attacker recovers pi and the weights from each upload
        from .pairing import build_pairing

        pairing = build_pairing(settings, public, getattr(built.get("mmse"), "prior", None), device, mmse_rank)
    del public  # the prior, the U-Net and the pairing attack keep what they need
    n_victims = sum(len(rows) for _, rows in cases)
    log(f"[{label}] {n_victims} victims {tuple(sample_shape)} from {len(cases)} partition(s); "
        f"attacks {list(built)} (prior/setup {time.perf_counter() - t_build:.1f}s); skipped {skipped or 'none'}")
    result = {
        "dataset": settings.dataset, "label": label, "victims": n_victims, "split": "train" if parties else split,
        "parties": parties, "sample-shape": list(sample_shape), "space": mixing_space(settings), "resize": resize,
        "radius-mode": settings.radius_mode, "bounds": [None if b is None else b.flatten().tolist() for b in bounds],
        "attacks": list(built), "skipped": skipped, "device": device, "mmse-rank": mmse_rank,
        "threat-model": threat_model(settings), "pairing": settings.attack_pairing,
        "variant": sweep_label(settings, parties).removeprefix(settings.dataset).strip("-") or "default",
        "encoder": {k: getattr(settings, k) for k in ("mixing_weights", "normalisation", "variance_centring",
                                                      "calibration", "alpha", "screen", "screen_threshold")},
        "settings": json.loads(settings.to_json()), "taus": [],
    }
    panels: dict[str, dict[str, list]] = {name: {"original": [], "mixed": [], "recovered": []} for name in built}
    best: dict[str, int] = {}
    # V and D do not depend on tau: estimate them once per party (a minute at 224 px), as calibrate_party would
    stats = [party_statistics(settings, part) for part, _ in cases]
    ordered, t_taus = sorted(taus, reverse=True), time.perf_counter()
    for index, tau in enumerate(ordered, start=1):  # the figure shows the victim recovered best at the largest tau
        st = settings.replace(tau=tau)
        calibrations = [calibrate_party(st, part, stat) for stat, (part, _) in zip(stats, cases)]
        training, fit_seconds = {}, {}
        uploads = victim_uploads(st, cases, calibrations, bounds, pairing) if unet_curve and learned(built) else []
        for name in learned(built):  # one fit per tau, at the parties' median radius (as the ServerApp's adversary)
            started = time.perf_counter()
            on_epoch = victims_snr(uploads) if unet_curve else None
            size = f"-{resize}px" if resize else ""
            checkpoint = out_dir / "unet-checkpoints" / f"{name}-{label}{size}-tau{tau:g}.pt"
            built[name].fit(float(np.median([c.radius for c in calibrations])), checkpoint=checkpoint,
                            on_epoch=on_epoch, log=log)
            training[name], fit_seconds[name] = built[name].report, time.perf_counter() - started

        recovered: list[dict] = []

        def encoded_cases(st=st, calibrations=calibrations, recovered=recovered):  # one party at a time
            for (part, rows), calibration in zip(cases, calibrations):
                enc, _ = encode_partition(st, part, calibration)
                case = upload_case(st, part, enc, calibration, rows, uploaded=enc.x, bounds=bounds,
                                   prior_mean=public_mean, pairing=pairing)
                if pairing is not None:
                    recovered.append({k: case.observation.extras[k] for k in PAIRING_KEYS})
                yield case

        outcome = attack_cases(encoded_cases(), built, blind, to_unit, device)
        if outcome.errors:
            raise RuntimeError(f"[{label}] tau={tau:g}: attacks failed: {outcome.errors}")
        result["skipped"].update(outcome.skipped)
        seconds = {name: outcome.seconds.get(name, 0.0) for name in built}
        for name, spent in fit_seconds.items():
            seconds[name] += spent
        x, mixed_x, estimates = outcome.truth, outcome.mixed, outcome.estimates
        report = {k: v for k, v in outcome.summary.items() if k not in ("theorem41", "victims")}
        mixed, _ = score(x.to(device), mixed_x.to(device), to_unit)
        record = {
            "tau": tau, **calibration_summary(calibrations, [part.party for part, _ in cases]),
            **report, "mixed": mixed.as_dict(), "seconds": seconds,
            "strongest": outcome.best(),  # the leakage cell: the attack with the highest SNR gain, named
            "victims-mean-snr": victims_mean_snr(x),
            "theorem41": outcome.summary.get("theorem41", {}),
            "paper": {"linear": paper_value(PAPER_LINEAR, settings.dataset, tau) if pixels else None,
                      "unet": paper_value(PAPER_UNET, settings.dataset, tau) if pixels else None},
        }
        for name, fitted in training.items():
            record[f"{name}-training"] = fitted
        if recovered:  # the pairing attack's hit rate beside a random label-consistent guess (mean over parties)
            record["pairing"] = {k: float(np.mean([r[k] for r in recovered])) for k in PAIRING_KEYS}
        result["taus"].append(record)
        for name in estimates:
            best.setdefault(name, int(torch.argmax(outcome.per_image[name]["snr"])))
            i = best[name]
            panels[name]["original"].append(x[i])
            panels[name]["mixed"].append(mixed_x[i])
            panels[name]["recovered"].append(estimates[name][i].cpu())
        log(f"[{label}] tau={tau:g} r={record['radius']:.4g} bound={record['snr-bound']:.3g} "
            + " ".join(f"{n}={e['score']['snr_mean']:.2f}dB({seconds[n]:.0f}s)" for n, e in report["attacks"].items())
            + (f" trivial={report['trivial']['snr_mean']:.2f}dB" if "trivial" in report else "")
            + (f" pairing={record['pairing']['pairing-accuracy']:.3f} "
               f"(chance {record['pairing']['pairing-chance']:.3f})" if "pairing" in record else ""))
        elapsed = time.perf_counter() - t_taus
        progress.emit("tau", label=label, tau=tau, index=index, of=len(ordered), radius=record["radius"],
                      snr={n: e["score"]["snr_mean"] for n, e in report["attacks"].items()},
                      elapsed=round(elapsed, 3), eta=round(elapsed / index * (len(ordered) - index), 3))
        atomic_write_json(out_dir / f"{label}-sweep.json", result)  # partial results survive a timeout
        del estimates, outcome
    result["files"] = write_sweep_tables(out_dir, result) + write_sweep_figures(out_dir, result, panels, best, to_unit)
    atomic_write_json(out_dir / f"{label}-sweep.json", result)
    return result


def victims_mean_snr(x: torch.Tensor) -> float:
    """SNR of the victims' own mean sample guessed for every victim: an oracle's blind guess that knows the
    population but no individual (what averaging many uploads can teach an attacker; the frontier's party mean).
    An attack that does not beat it has learnt the data set, not its samples."""
    return float(snr_db(x, x.mean(dim=0, keepdim=True).expand_as(x)).mean())


def over_victims_mean(rec: dict) -> float | None:
    """The strongest attack's SNR minus the victims' mean guess's (None: no attack, or a sweep from before)."""
    name = rec.get("strongest")
    if not name or rec.get("victims-mean-snr") is None:
        return None
    return rec["attacks"][name]["score"]["snr_mean"] - rec["victims-mean-snr"]


def calibration_summary(calibrations: list, parties: list[int]) -> dict:
    """r, m_f and the effective bound: the party's own, or the mean and range over parties."""
    radius = np.array([c.radius for c in calibrations])
    m_f = np.array([c.m_f for c in calibrations])
    bound = np.array([c.snr_bound for c in calibrations])
    out = {"radius": float(radius.mean()), "m_f": float(m_f.mean()), "snr-bound": float(bound.mean())}
    if len(calibrations) > 1:
        out["radius-range"] = [float(radius.min()), float(radius.max())]
        out["snr-bound-range"] = [float(bound.min()), float(bound.max())]
        out["per-party"] = [{"party": p, **c.as_dict()} for p, c in zip(parties, calibrations)]
    return out


def csv_rows(result: dict) -> list[dict]:
    rows = []
    for rec in result["taus"]:
        row = {"dataset": result["dataset"], "space": result["space"], "radius_mode": result["radius-mode"],
               "parties": result["parties"], "victims": result["victims"], "tau": rec["tau"], "radius": rec["radius"],
               "m_f": rec["m_f"], "snr_bound": rec["snr-bound"], "mixed_snr_mean": rec["mixed"]["snr_mean"]}
        if "snr-bound-range" in rec:
            row.update({"snr_bound_min": rec["snr-bound-range"][0], "snr_bound_max": rec["snr-bound-range"][1],
                        "radius_min": rec["radius-range"][0], "radius_max": rec["radius-range"][1]})
        if "trivial" in rec:
            row.update({f"trivial_{k}": v for k, v in rec["trivial"].items() if not k.startswith("best")})
        for name, entry in rec["attacks"].items():
            row.update({f"{name}_{k}": v for k, v in entry["score"].items()})
            row.update({f"{name}_gain_{k}": v for k, v in entry.get("gain", {}).items()})
            row[f"{name}_seconds"] = rec["seconds"][name]
            row[f"paper_{name}_snr"] = rec["paper"].get(name)
        for name, t41 in rec["theorem41"].items():
            row.update({f"thm41_{name}_{k}": v for k, v in t41.items()})
        row["strongest_attack"], row["strongest_gain_snr_db"] = rec.get("strongest"), strongest_gain(rec)
        row["victims_mean_snr_db"], row["strongest_over_victims_mean_db"] = rec.get("victims-mean-snr"), \
            over_victims_mean(rec)
        row["threat_model"] = result.get("pairing", "oracle")
        if "pairing" in rec:
            row.update({k.replace("-", "_"): v for k, v in rec["pairing"].items()})
        rows.append(row)
    return rows


def strongest_gain(rec: dict) -> float | None:
    """The SNR gain of a tau record's strongest attack (None: no attack scored)."""
    name = rec.get("strongest")
    return rec["attacks"][name].get("gain", {}).get("snr_db") if name else None


def markdown_rows(result: dict) -> tuple[list[dict], list[tuple[str, str]]]:
    names = result["attacks"]
    pixels = result["space"] == "pixels"
    ranges = bool(result["taus"]) and "snr-bound-range" in result["taus"][0]
    columns = [("tau", "tau"), ("radius", "r (mean over parties)" if ranges else "r")]
    if result["radius-mode"] != "theorem":
        columns += [("bound", "effective bound" + (" (min-max)" if ranges else ""))]
    if not pixels:
        columns += [("mixed", "upload as guess")]
    if result["taus"] and "pairing" in result["taus"][0]:
        columns += [("pairing", "pairing recovered"), ("chance", "chance (labels)")]
    if "linear" in names:
        columns += ([("paper_linear", "paper linear")] if pixels else []) + [("linear", "linear (paper attack)")]
    if "mmse" in names:
        columns += [("mmse", "MMSE")]
    if "unet" in names:
        columns += [("paper_unet", "paper U-Net"), ("unet", "U-Net")]
    columns += [(n, n) for n in names if n not in ("linear", "mmse", "unet")]
    columns += [("trivial", "trivial guess")] + [(f"gain_{n}", f"gain {n}") for n in names]
    if pixels and any(e.get("gain", {}).get("st_lpips") is not None
                      for rec in result["taus"] for e in rec["attacks"].values()):
        columns += [(f"lpips_{n}", f"gain ST-LPIPS {n}") for n in names]
    if len(names) > 1:
        columns += [("strongest", "strongest attack (gain dB)")]
    if result["taus"] and result["taus"][0].get("victims-mean-snr") is not None:
        columns += [("victims_mean", "victims' mean (oracle guess)"), ("over_mean", "strongest − victims' mean")]
    if "linear" in names:
        columns += [("t41", "Thm 4.1: r²T / linear error (median)")]
    rows = []
    for rec in result["taus"]:
        low, high = rec.get("snr-bound-range", (rec["snr-bound"],) * 2)
        row = {"tau": f"{rec['tau']:g}", "radius": f"{rec['radius']:.3g}",
               "bound": f"{rec['snr-bound']:.3g}" if low == high else f"{low:.3g}-{high:.3g}",
               "mixed": pm(rec["mixed"]["snr_mean"], rec["mixed"]["snr_std"]),
               "paper_linear": pm(rec["paper"]["linear"]), "paper_unet": pm(rec["paper"]["unet"]),
               "trivial": pm(rec["trivial"]["snr_mean"], rec["trivial"]["snr_std"]) if "trivial" in rec else "-",
               "pairing": f"{100 * rec['pairing']['pairing-accuracy']:.1f} %" if "pairing" in rec else "-",
               "chance": f"{100 * rec['pairing']['pairing-chance']:.1f} %" if "pairing" in rec else "-"}
        for name, entry in rec["attacks"].items():
            row[name] = pm(entry["score"]["snr_mean"], entry["score"]["snr_std"])
            row[f"gain_{name}"] = signed(entry.get("gain", {}).get("snr_db"))
            row[f"lpips_{name}"] = signed(entry.get("gain", {}).get("st_lpips"), 3)
        row["strongest"] = f"{rec['strongest']} ({signed(strongest_gain(rec))})" if rec.get("strongest") else "-"
        row["victims_mean"] = pm(rec.get("victims-mean-snr"))
        row["over_mean"] = signed(over_victims_mean(rec))
        if "linear" in rec["theorem41"]:
            t41 = rec["theorem41"]["linear"]
            row["t41"] = f"{t41['bound-median']:.3g} / {t41['error-median']:.3g}"
        rows.append(row)
    return rows, columns


def write_sweep_tables(out_dir: Path, result: dict) -> list[str]:
    rows, columns = markdown_rows(result)
    label = result["label"]
    where = (f"{result['victims']} {result['split']} images" if not result["parties"]
             else f"{result['victims']} victims from {result['parties']} parties' training partitions")
    space = result["space"]
    setting = f" [{result['variant']}]" if result.get("variant", "default") != "default" else ""
    if space == "pixels":
        title = (f"## {result['dataset']}{setting}: {where}, SNR dB (mean ± std); "
                 "gains over the trivial guess (public mean image) in dB; ST-LPIPS gain: the best blind guess's "
                 "shift-tolerant LPIPS distance (the public images' ST-LPIPS medoid, or the mean image if closer) "
                 "minus the attack's (28 px and more; docs/attacks.md)\n\n")
    else:
        title = (f"## {result['dataset']}{setting} in {space}, radius mode {result['radius-mode']}: {where}, SNR dB in "
                 "feature space (mean ± std); gains over the trivial guess (public mean feature) in dB; PSNR/SSIM n/a "
                 "(feature vectors)\n\n")
    title += f"Threat model: {result.get('threat-model', THREAT_MODELS['oracle'])}.\n\n"
    md = out_dir / f"{label}-sweep.md"
    atomic_write_bytes(md, (title + markdown(rows, columns)).encode())
    return [str(md), str(write_csv(out_dir / f"{label}-sweep.csv", csv_rows(result)))]


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
        first = result["taus"][0]["tau"]
        title = f"{result['dataset']}: {name} attack, victim {best[name]} (best recovered at τ={first:g})"
        files.append(str(recovery_grid(out_dir / f"{result['label']}-{name}.png", columns, images, title)))
    return files


def write_comparison(out_dir: Path, results: list[dict]) -> str:
    """comparison.md: per data set and attack, every variant's SNR beside the paper's, one column each."""
    lines = ["# The same victims under each setting, beside the paper's Tables 1-2", ""]
    for dataset in dict.fromkeys(r["dataset"] for r in results):
        group = [r for r in results if r["dataset"] == dataset]
        names = list(dict.fromkeys(n for r in group for n in r["attacks"]))
        for name in names:
            runs = [r for r in group if name in r["attacks"]]
            models = sorted({r.get("threat-model", THREAT_MODELS["oracle"]) for r in runs})
            lines += [f"## {dataset}: {name} attack, SNR dB (mean ± std) on {runs[0]['victims']} victims", "",
                      "Threat model: " + "; ".join(models) + ".", ""]
            taus = sorted({rec["tau"] for r in runs for rec in r["taus"]}, reverse=True)
            paper = {"linear": PAPER_LINEAR, "unet": PAPER_UNET}.get(name, {})
            columns = [("tau", "tau")] + ([("paper", "paper")] if paper.get(dataset) else [])
            columns += [(f"v{i}", r.get("variant", "default")) for i, r in enumerate(runs)]
            rows = []
            for tau in taus:
                row = {"tau": f"{tau:g}", "paper": pm(paper_value(paper, dataset, tau))}
                for i, r in enumerate(runs):
                    rec = next((rec for rec in r["taus"] if np.isclose(rec["tau"], tau)), None)
                    entry = rec["attacks"].get(name) if rec else None
                    row[f"v{i}"] = pm(entry["score"]["snr_mean"], entry["score"]["snr_std"]) if entry else "-"
                rows.append(row)
            lines += [markdown(rows, columns), ""]
    path = Path(out_dir) / "comparison.md"
    atomic_write_bytes(path, "\n".join(lines).encode())
    return str(path)
