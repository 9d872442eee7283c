"""The honest-but-curious server at work: attack every stored upload, score it, write the report.

Called by the ServerApp after mixup-union when `adversary` is set. What each attack observes is
the upload as stored (`uploads/party-XXX.x.npy`); what the threat model grants (pairing, weights,
radius) and the ground truth come from the oracle's replay, never from the upload.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import numpy as np
import torch

from fedsmix import data as datalib
from fedsmix.models import load_split_model
from fedsmix.runs import atomic_write_bytes
from fedsmix.seeding import generator
from fedsmix.space import mixing_shape, pixel_spec
from fedsmix.tables import markdown, pm, signed, write_csv

from .analysis import Blind, Outcome, attack_cases
from .cases import public_samples, threat_model, upload_case, valid_bounds
from .figures import recovery_grid, stretched, unit_images
from .oracle import ReplayMismatch, replay_party, stored_upload
from .registry import build_attacks


def pick_victims(n: int, k: int, seed: int, party: int) -> torch.Tensor:
    """A fixed, seeded subset of a party's rows (all of them when k >= n)."""
    if k >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=generator(seed, party, "victims"))[:k].sort().values


def learned(attacks: dict) -> list[str]:
    """The attacks that learn an inverse from the attacker's own public encodings at a radius (U-Net, refined):
    fitted once before they attack."""
    from .unet import UNetAttack

    return [name for name, attack in attacks.items() if isinstance(attack, UNetAttack)]


def attack_uploads(ctx, store, parties: list[int], n_nodes: int) -> dict:
    """Attack `attack-victims` victims of each party with every configured attack."""
    s, t0 = ctx.settings, time.perf_counter()
    out_dir = Path(ctx.run_dir) / "adversary"
    spec = pixel_spec(s)
    to_unit = (lambda t: datalib.denormalize(t, spec)) if s.backbone == "none" else None  # features: SNR only
    public = public_samples(s, spec)  # pixels, or features of the parties' backbone
    public_mean = public.mean(dim=0)
    bounds = valid_bounds(s, spec)

    pairing = None
    if s.attack_pairing == "recovered":  # no oracle pairing: the server recovers pi and the weights itself
        from .pairing import build_pairing

        pairing = build_pairing(s, public, device=ctx.device)
    refused, cases, radii = {}, [], []
    corrupted = set(store.verify())
    encoder = None
    if s.encoder == "mixcon":  # the white-box attacker holds the h it trained and shipped
        encoder = load_split_model(s, ctx.run_dir, mixing_shape(s), spec.num_classes).encoder
    for party in parties:
        if party in corrupted:
            refused[str(party)] = "stored upload no longer matches its sha256"
            continue
        try:
            uploaded = stored_upload(store, party)
            rep = replay_party(s, party, n_nodes, uploaded,
                               encoder_state=encoder.state_dict() if encoder is not None else None)
        except ReplayMismatch as err:
            refused[str(party)] = str(err)
            continue
        victims = pick_victims(len(rep.partition.x), s.attack_victims, s.seed, party)
        cases.append(upload_case(s, rep.partition, rep.encoded, rep.calibration, victims, uploaded=uploaded,
                                 bounds=bounds, prior_mean=public_mean, pairing=pairing, encoder=encoder))
        if rep.calibration is not None:
            radii.append(rep.calibration.radius)

    attacks, skipped = build_attacks(s.adversary, s, public, mixing_shape(s), device=ctx.device)
    errors: dict[str, str] = {}
    for name in learned(attacks) if radii else ():  # one fit per run, at the parties' median radius
        try:
            attacks[name].fit(float(np.median(radii)))
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
            del attacks[name]
    progress = getattr(ctx, "progress", None)
    if progress is not None:
        progress.emit("attack-start", attacks=list(attacks), parties=len(cases),
                      victims=sum(len(case.rows) for case in cases), tau=s.tau)
    outcome = attack_cases(cases, attacks, Blind.of(public, to_unit), to_unit, ctx.device, per_case=True)
    if progress is not None:
        for name, entry in outcome.summary.get("attacks", {}).items():
            progress.emit("attack", attack=name, tau=s.tau, snr=entry["score"]["snr_mean"],
                          gain=entry.get("gain", {}).get("snr_db"))
    per_party = {}
    for case, report in zip(cases, outcome.per_case):
        report.update({"n": case.observation.n_private, "victims": len(case.rows), "radius": case.radius,
                       "tau": s.tau, "replay": "verified", "pairing": s.attack_pairing,
                       **{k: v for k, v in case.observation.extras.items() if k.startswith("pairing-")}})
        per_party[str(case.party)] = report
    result = {
        "attacks": list(s.adversary),
        "space": mixing_space(s),
        "threat-model": threat_model(s),
        "threat-models": {name: attack.threat_model for name, attack in attacks.items()},
        "victims-per-party": s.attack_victims,
        "parties": per_party,
        "refused": refused,
        "skipped": {**skipped, **outcome.skipped},
        "errors": {**errors, **outcome.errors},
    }
    for name in learned(attacks):
        if attacks[name].report:
            result[f"{name}-training"] = attacks[name].report
    hits = [r["pairing-accuracy"] for r in per_party.values() if "pairing-accuracy" in r]
    if hits:  # recovered pairing: the server's hit rate beside a random label-consistent guess
        result["pairing-accuracy"] = float(np.mean(hits))
        result["pairing-chance"] = float(np.mean([r["pairing-chance"] for r in per_party.values()]))
    if len(outcome.truth):
        result["pooled"] = outcome.summary
        result["files"] = write_report(out_dir, s, outcome, to_unit)
    result["seconds"] = time.perf_counter() - t0
    return result


def mixing_space(s) -> str:
    """Where the uploads live, hence where the attacks run and are scored."""
    if s.backbone == "none":
        return "pixels"
    from fedsmix.features import feature_dim, input_size

    return f"features ({s.backbone}, {input_size(s)} px, {feature_dim(s)}-d)"


SUMMARY_COLUMNS = [
    ("attack", "attack"), ("snr", "SNR dB"), ("psnr", "PSNR dB"), ("ssim", "SSIM"), ("best", "best SNR"),
    ("st_lpips", "ST-LPIPS"), ("trivial", "trivial SNR"), ("gain", "gain SNR"), ("gain_psnr", "gain PSNR"),
    ("gain_ssim", "gain SSIM"), ("gain_st_lpips", "gain ST-LPIPS"), ("t41", "Thm 4.1 r²T / error (median)"),
]


def summary_rows(summary: dict) -> list[dict]:
    rows = []
    trivial = summary.get("trivial")
    na = (lambda value, text: "n/a" if value is None else text)  # PSNR/SSIM/ST-LPIPS of feature vectors
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
            "st_lpips": na(sc.get("st_lpips_mean"), pm(sc.get("st_lpips_mean"), sc.get("st_lpips_std"), 3)),
            "gain_st_lpips": na(sc.get("st_lpips_mean"), signed(gain.get("st_lpips"), 3)),
            "t41": "-" if t41 is None else f"{t41['bound-median']:.3g} / {t41['error-median']:.3g}",
        })
    return rows


def write_report(out_dir: Path, s, outcome: Outcome, to_unit) -> list[str]:
    """summary.md, summary.csv and, for images, the best-recovered victims per attack."""
    summary = outcome.summary
    rows = summary_rows(summary)
    title = f"{s.dataset}, tau = {s.tau:g} ({s.radius_mode}), {summary['victims']} victims, in {mixing_space(s)}"
    text = f"Threat model: {threat_model(s)}.\n\n" + markdown(rows, SUMMARY_COLUMNS)
    atomic_write_bytes(out_dir / "summary.md", f"# Attacks on the uploads: {title}\n\n{text}".encode())
    files = [str(out_dir / "summary.md"), str(write_csv(out_dir / "summary.csv", rows))]
    x, estimates = outcome.truth, outcome.estimates
    if to_unit is not None and x.dim() == 4 and estimates:
        best = [int(torch.argmax(outcome.per_image[name]["snr"])) for name in estimates]
        images = {"original": unit_images(x[best], to_unit)}
        if outcome.mixed is not None:
            images["mixed (stretched)"] = stretched(outcome.mixed[best])
        for name, value in estimates.items():
            images[name] = unit_images(value[best], to_unit)
        labels = [f"best for {name}" for name in estimates]
        files.append(str(recovery_grid(out_dir / "best-recovered.png", labels, images, title)))
    print(f"fedsmix adversary: {title}\n{text}", flush=True)
    return files
