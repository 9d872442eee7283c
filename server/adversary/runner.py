"""The honest-but-curious server at work: attack every stored upload, score it, write the report.

Called by the mixup-union strategy when `adversary` is set. What each attack observes is the
upload as stored (`uploads/party-XXX.x.npy`); what the threat model grants (pairing, weights,
radius) and the ground truth come from the oracle's replay, never from the upload.
"""

from __future__ import annotations

import time
import traceback
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from fedsmix import data as datalib
from fedsmix.pipeline import mixing_shape
from fedsmix.runs import atomic_write_bytes
from fedsmix.seeding import generator

from .analysis import leakage, theorem41_samples, theorem41_summary
from .cases import build_attacks, observation, public_samples, valid_bounds
from .figures import recovery_grid, stretched, unit_images
from .oracle import ReplayMismatch, replay_party, stored_upload
from .tables import markdown, pm, signed, write_csv

KNOWN_W = ("linear", "mmse")  # attacks Theorem 4.1's bound speaks about (they invert W)


def pick_victims(n: int, k: int, seed: int, party: int) -> torch.Tensor:
    """A fixed, seeded subset of a party's rows (all of them when k >= n)."""
    if k >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=generator(seed, party, "victims"))[:k].sort().values


def attack_uploads(ctx, store, parties: list[int], n_nodes: int) -> dict:
    """Attack `attack-victims` victims of each party with every configured attack."""
    s, t0 = ctx.settings, time.perf_counter()
    out_dir = Path(ctx.run_dir) / "adversary"
    pixels = s.backbone == "none"
    spec = datalib.spec(s.dataset)
    to_unit = (lambda t: datalib.denormalize(t, spec)) if pixels else None  # features are scored by SNR only
    public = public_samples(s, spec)  # pixels, or features of the parties' backbone
    public_mean = public.mean(dim=0)
    bounds = valid_bounds(s, spec)

    refused, replays = {}, {}
    corrupted = set(store.verify())
    for party in parties:
        if party in corrupted:
            refused[str(party)] = "stored upload no longer matches its sha256"
            continue
        try:
            uploaded = stored_upload(store, party)
            replays[party] = (replay_party(s, party, n_nodes, uploaded), uploaded)
        except ReplayMismatch as err:
            refused[str(party)] = str(err)

    attacks, skipped = build_attacks(s.adversary, s, public, ctx.device, sample_shape=mixing_shape(s))
    errors: dict[str, str] = {}
    if "unet" in attacks and replays:  # one U-Net per run, at the parties' median radius
        radius = float(np.median([rep.calibration.radius for rep, _ in replays.values()]))
        try:
            attacks["unet"].fit(radius)
        except Exception as err:
            errors["unet"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"

    per_party, pooled = {}, defaultdict(list)
    for party, (rep, uploaded) in sorted(replays.items()):
        obs = observation(
            rep.encoded, rep.calibration.radius, None, x_tilde=torch.from_numpy(np.asarray(uploaded, dtype=np.float32)),
            bounds=bounds, party=party, tau=s.tau,
        ).to(ctx.device)
        victims = pick_victims(obs.n_private, s.attack_victims, s.seed, party)
        estimates, seconds = {}, {}
        for name, attack in attacks.items():
            if name in errors:
                continue
            started = time.perf_counter()
            try:
                estimates[name] = attack.reconstruct(obs)[victims.to(ctx.device)].cpu()
            except ValueError as err:  # the attack does not apply to this encoder / shape
                skipped[name] = str(err)
            except Exception as err:  # a failing attack must not cost the run its other results
                errors[name] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
            seconds[name] = time.perf_counter() - started
        x = rep.partition.x[victims]
        report, _ = leakage(x, estimates, public_mean, to_unit)
        report["theorem41"] = {}
        for name in KNOWN_W:
            if name in estimates:
                samples = theorem41_samples(x, estimates[name], rep.encoded.weights, rep.perm, rep.calibration.radius, victims)
                report["theorem41"][name] = theorem41_summary(samples)
                pooled[f"t41-{name}"].append(samples)
        report.update(
            {"n": obs.n_private, "victims": len(victims), "radius": rep.calibration.radius, "tau": s.tau,
             "replay": "verified", "seconds": seconds}
        )
        per_party[str(party)] = report
        pooled["x"].append(x)
        pooled["mixed"].append(obs.x_tilde[victims.to(ctx.device)].cpu())
        for name, value in estimates.items():
            pooled[name].append(value)

    result = {
        "attacks": list(s.adversary),
        "space": mixing_space(s),
        "threat-models": {name: attack.threat_model for name, attack in attacks.items()},
        "victims-per-party": s.attack_victims,
        "parties": per_party,
        "refused": refused,
        "skipped": skipped,
        "errors": errors,
    }
    if "unet" in attacks and attacks["unet"].report:
        result["unet-training"] = attacks["unet"].report
    if pooled["x"]:
        x_all = torch.cat(pooled["x"])
        estimates = {  # attacks that ran on every party's victims
            name: torch.cat(pooled[name]) for name in attacks if sum(map(len, pooled[name])) == len(x_all) > 0
        }
        summary, per_image = leakage(x_all, estimates, public_mean, to_unit)
        summary["theorem41"] = {
            name: theorem41_summary({k: torch.cat([p[k] for p in pooled[f"t41-{name}"]]) for k in ("bound", "error", "signal")})
            for name in KNOWN_W if pooled[f"t41-{name}"]
        }
        summary["victims"] = len(x_all)
        result["pooled"] = summary
        result["files"] = write_report(out_dir, s, summary, x_all, torch.cat(pooled["mixed"]), estimates, per_image, to_unit)
    result["seconds"] = time.perf_counter() - t0
    return result


def mixing_space(s) -> str:
    """Where the uploads live, hence where the attacks run and are scored."""
    if s.backbone == "none":
        return "pixels"
    from fedsmix.features import feature_dim, input_size

    return f"features ({s.backbone}, {input_size(s)} px, {feature_dim(s)}-d)"


def summary_rows(summary: dict) -> list[dict]:
    rows = []
    trivial = summary.get("trivial")
    na = (lambda value, text: "n/a" if value is None else text)  # PSNR/SSIM of feature vectors
    for name, entry in summary["attacks"].items():
        sc, gain = entry["score"], entry.get("gain", {})
        t41 = summary.get("theorem41", {}).get(name)
        rows.append({
            "attack": name,
            "snr": pm(sc["snr_mean"], sc["snr_std"]),
            "psnr": na(sc["psnr_mean"], pm(sc["psnr_mean"], sc["psnr_std"])),
            "ssim": na(sc["ssim_mean"], pm(sc["ssim_mean"], sc["ssim_std"], 3)),
            "best": f"{sc['best_snr']:.2f}",
            "trivial": pm(trivial["snr_mean"]) if trivial else "-",
            "gain": signed(gain.get("snr_db")),
            "gain_psnr": na(sc["psnr_mean"], signed(gain.get("psnr_db"))),
            "gain_ssim": na(sc["ssim_mean"], signed(gain.get("ssim"), 3)),
            "t41": "-" if t41 is None else f"{t41['bound-median']:.3g} / {t41['error-median']:.3g}",
        })
    return rows


def write_report(out_dir: Path, s, summary: dict, x, mixed, estimates: dict, per_image: dict, to_unit) -> list[str]:
    """summary.md, summary.csv and, for images, the best-recovered victims per attack."""
    columns = [
        ("attack", "attack"), ("snr", "SNR dB"), ("psnr", "PSNR dB"), ("ssim", "SSIM"), ("best", "best SNR"),
        ("trivial", "trivial SNR"), ("gain", "gain SNR"), ("gain_psnr", "gain PSNR"), ("gain_ssim", "gain SSIM"),
        ("t41", "Thm 4.1 r²T / error (median)"),
    ]
    rows = summary_rows(summary)
    title = f"{s.dataset}, tau = {s.tau:g} ({s.radius_mode}), {summary['victims']} victims, in {mixing_space(s)}"
    atomic_write_bytes(out_dir / "summary.md", f"# Attacks on the uploads: {title}\n\n{markdown(rows, columns)}".encode())
    files = [str(out_dir / "summary.md"), str(write_csv(out_dir / "summary.csv", rows))]
    if to_unit is not None and x.dim() == 4 and estimates:
        columns_shown = [name for name in estimates]
        best = [int(torch.argmax(per_image[name]["snr"])) for name in columns_shown]
        rows_img = {"original": unit_images(x[best], to_unit), "mixed (stretched)": stretched(mixed[best])}
        for name, value in estimates.items():
            rows_img[name] = unit_images(value[best], to_unit)
        labels = [f"best for {name}" for name in columns_shown]
        files.append(str(recovery_grid(out_dir / "best-recovered.png", labels, rows_img, title)))
    print(f"fedsmix adversary: {title}\n{markdown(rows, columns)}", flush=True)
    return files
