"""Run a frontier: every row a real run on the same partitions, then every applicable attack on the
same victims, through the adversary's one registry and one attack-and-score loop.

1. Runs: one in-process Flower simulation runs the real ServerApp logic once per row (a row is the
   preset plus a strategy/encoder override), so accuracy, bytes sent and wall time come from real
   runs on the same partitions and seeds.
2. Leakage: the victim party's upload (or first-round update) is replayed with the party's own code,
   every applicable attack reconstructs the same victims, and each row keeps its strongest attack.
3. Re-encoding: the averaging attack against T encodings per sample, for every upload row.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedsmix import data as datalib
from fedsmix.config import Settings, load_settings
from fedsmix.metrics import snr_db
from fedsmix.models import load_split_model
from fedsmix.party import Partition, encode_partition, load_partition
from fedsmix.runs import atomic_write_json, new_run_dir
from server.adversary.analysis import Outcome, attack_cases, leakage
from server.adversary.cases import Case, public_samples, update_case, upload_case
from server.adversary.registry import applicable, build_attacks

from ..simulate import simulate_each
from . import report
from .plan import FrontierPlan, Row, load_plan, parse_row

TRIVIAL = "trivial guess"


@dataclass
class Victims:
    """The private samples every attack is scored on: the first rows of the victim party."""

    part: Partition
    index: torch.Tensor  # rows of part.x

    @property
    def x(self) -> torch.Tensor:
        return self.part.x[self.index]


def victims(settings: Settings, party: int, num_parties: int, count: int) -> Victims:
    part = load_partition(settings, party, num_parties)
    return Victims(part, torch.arange(min(count, len(part.x))))


def to_unit_for(settings: Settings, vict: Victims):
    return None if settings.backbone != "none" else (lambda t: datalib.denormalize(t, vict.part.spec))


def check_against_store(replayed: torch.Tensor, upload_path: Path) -> None:
    """The replayed upload must be the one the run stored (same partitions, same seeds, same h)."""
    stored = torch.from_numpy(np.load(upload_path).astype(np.float32))
    if stored.shape != replayed.shape or not torch.equal(stored, replayed.float()):
        raise RuntimeError(f"replayed upload differs from the stored one at {upload_path}: settings or seeds drifted")


def row_cases(row: Row, settings: Settings, run: dict, vict: Victims, prior: torch.Tensor, plan: FrontierPlan,
              encodings_per_sample: int | None = None) -> list[Case]:
    """What the server saw from the victim party in this row, as attackable cases."""
    if row.strategy in ("fedavg", "fedprox"):
        mu = settings.proximal_mu if row.strategy == "fedprox" else 0.0
        B = plan.gradient_batch_size
        return [
            update_case(settings, vict.part, vict.index[start : start + B], proximal_mu=mu, batch_size=B,
                        local_epochs=plan.gradient_local_epochs)
            for start in range(0, len(vict.index), B)
        ]
    if row.strategy != "mixup-union":
        return []  # local-only: nothing a party sends is attacked
    if encodings_per_sample is not None:
        settings = settings.replace(encodings_per_sample=encodings_per_sample)
    encoder = None
    if settings.encoder == "mixcon":  # the split model the run trained and shipped: the white-box h
        encoder = load_split_model(settings, Path(run.get("run-dir", "")), vict.part.sample_shape,
                                   vict.part.num_classes).encoder
    enc, calibration = encode_partition(settings, vict.part,
                                        encoder_state=encoder.state_dict() if encoder is not None else None)
    case = upload_case(settings, vict.part, enc, calibration, vict.index, prior_mean=prior, encoder=encoder)
    stored = Path(run.get("run-dir", "")) / "uploads" / f"party-{plan.victim_party:03d}.x.npy"
    if encodings_per_sample is None and stored.is_file():
        dtype = torch.float16 if settings.upload_dtype == "float16" else torch.float32
        check_against_store(enc.x.to(dtype), stored)
    return [case]


def _digest(cases: list[Case]) -> str:
    """Equal digests: the same updates and labels (FedAvg and FedProx agree after one local step)."""
    h = hashlib.sha256()
    for case in cases:
        for t in [*case.observation.update, case.observation.labels]:
            h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def scored(name: str, summary: dict, per_image: dict, vict: Victims, seconds: float, **info) -> dict:
    """One attack's record: scores, gains over the trivial guess, and against the party's own mean
    sample, an oracle guess: a gain over the trivial guess but not over the party mean means the
    attack learnt the party's average image, not its individual samples."""
    x = vict.x
    party_mean = snr_db(x, vict.part.x.mean(dim=0, keepdim=True).expand_as(x)).mean().item()
    trivial = summary["trivial"]
    if name == TRIVIAL:
        zero = (lambda metric: None if trivial[metric] is None else 0.0)
        a, g = trivial, {"snr_db": 0.0, "psnr_db": zero("psnr_mean"), "ssim": zero("ssim_mean")}
        ssim = per_image["trivial"]["ssim"]
    else:
        entry = summary["attacks"][name]
        a, g, ssim = entry["score"], entry["gain"], per_image[name]["ssim"]
    return {
        "attack": name, "snr_db": a["snr_mean"], "psnr_db": a["psnr_mean"], "ssim": a["ssim_mean"],
        "trivial_snr_db": trivial["snr_mean"], "trivial_psnr_db": trivial["psnr_mean"],
        "trivial_ssim": trivial["ssim_mean"], "gain_snr_db": g["snr_db"], "gain_psnr_db": g["psnr_db"],
        "gain_ssim": g["ssim"], "best_ssim": float(ssim.max()) if not torch.isnan(ssim).all() else float("nan"),
        "party_mean_snr_db": party_mean, "gain_vs_party_mean_db": a["snr_mean"] - party_mean,
        "attack_seconds": seconds, **info,
    }


def row_leakage(outcome: Outcome | None, vict: Victims, prior: torch.Tensor, to_unit, info: dict):
    """(strongest record, its estimate), and every record: the trivial guess is the floor."""
    if outcome is None or not len(outcome.truth):
        summary, per_image = leakage(vict.x, {}, prior, to_unit)
        estimates, seconds = {}, {}
    else:
        summary, per_image, estimates, seconds = outcome.summary, outcome.per_image, outcome.estimates, outcome.seconds
    trivial = prior.unsqueeze(0).expand_as(vict.x).clone()
    records = [(scored(TRIVIAL, summary, per_image, vict, 0.0), trivial)]
    for name, estimate in estimates.items():
        records.append((scored(name, summary, per_image, vict, seconds.get(name, 0.0), **info), estimate))
    best, x_hat = max(records, key=lambda item: item[0]["gain_snr_db"])
    return (best, x_hat), [r for r, _ in records]


def attack_row(row: Row, settings: Settings, cases: list[Case], public: torch.Tensor, prior: torch.Tensor, to_unit,
               plan: FrontierPlan, cache: dict) -> Outcome | None:
    names = [name for name in applicable(row.target) if name in plan.attacks]
    if not cases or not names:
        return None
    key = _digest(cases) if row.strategy in ("fedavg", "fedprox") else None
    if key is not None and key in cache:  # FedAvg and FedProx send the same update after one step
        return cache[key]
    attacks, skipped = build_attacks(
        names, settings, public, tuple(cases[0].truth.shape[1:]), gradient_steps=plan.gradient_steps,
        gradient_restarts=plan.gradient_restarts, gradient_tv=plan.gradient_tv, inversion_steps=plan.inversion_steps,
        inversion_lr=plan.inversion_lr, inversion_tv=plan.inversion_tv, decoder_epochs=plan.decoder_epochs,
    )
    outcome = attack_cases(cases, attacks, prior, to_unit)
    outcome.skipped.update(skipped)
    if outcome.errors:
        raise RuntimeError(f"frontier row {row.name}: attacks failed: {outcome.errors}")
    if key is not None:
        cache[key] = outcome
    return outcome


def reencoding(rows: list[Row], row_settings: list[Settings], runs: list[dict], vict: Victims, prior: torch.Tensor,
               plan: FrontierPlan) -> list[dict]:
    """The averaging attack against T encodings of each private sample (InstaHide re-encodes every epoch)."""
    out = []
    for row, settings, run in zip(rows, row_settings, runs):
        if row.strategy != "mixup-union" or row.target == "mixcon":  # h(x) is the same at every re-encoding
            continue
        to_unit = to_unit_for(settings, vict)
        attacks, _ = build_attacks(["averaging"], settings, None)
        for T in plan.reencoding:
            cases = row_cases(row, settings, run, vict, prior, plan, encodings_per_sample=T)
            outcome = attack_cases(cases, attacks, prior, to_unit)
            record = scored("averaging", outcome.summary, outcome.per_image, vict, outcome.seconds["averaging"])
            out.append({"strategy": row.name, "encodings_per_sample": T, **record})
    return out


def run_frontier(preset: str, overrides: dict | None = None, plan_overrides: dict | None = None) -> dict:
    t_start = time.perf_counter()
    base = load_settings({**(overrides or {}), "preset": preset})
    plan = load_plan(preset, plan_overrides)
    rows = [parse_row(name) for name in plan.rows]
    run_dir = new_run_dir(base.runs_dir, f"frontier-{base.dataset}")
    print(f"fedsmix frontier: {len(rows)} rows, {plan.parties} parties; output in {run_dir}", flush=True)
    row_settings = [row.settings(base, run_dir / "runs") for row in rows]
    runs = simulate_each(row_settings, plan.parties)

    vict = victims(base, plan.victim_party, plan.parties, base.attack_victims)
    public = public_samples(base, vict.part.spec)
    prior = public.mean(dim=0)
    records, attacks, panels, cache = [], [], {}, {}
    for row, settings, run in zip(rows, row_settings, runs):
        result = run.get("strategies", {}).get(row.strategy, {})
        to_unit = to_unit_for(settings, vict)
        cases = row_cases(row, settings, run, vict, prior, plan)
        outcome = attack_row(row, settings, cases, public, prior, to_unit, plan, cache)
        info = cases[0].info if cases else {}
        (best, x_hat), every = row_leakage(outcome, vict, prior, to_unit, info)
        measured = result.get("mean-bytes-up-per-party", 0.0)
        base_record = {
            "strategy": row.name,
            "accuracy": result.get("accuracy"),
            # local-only parties send nothing; the simulator returns their models only to evaluate them
            "bytes_up_per_party": 0.0 if row.strategy == "local-only" else measured,
            "measured_bytes_up_per_party": measured,
            "wall_seconds": result.get("wall-seconds"),
            "run_dir": run.get("run-dir"),
            "error": run.get("error") or result.get("error"),
        }
        records.append({**base_record, **best})
        attacks += [{**base_record, **s} for s in every]
        panels[f"{row.name}\n{best['attack']}"] = x_hat
        print(f"  {row.name}: accuracy {base_record['accuracy']}, strongest {best['attack']} "
              f"gain {best['gain_snr_db']:+.2f} dB", flush=True)
    report.dominated_by(records)
    study = reencoding(rows, row_settings, runs, vict, prior, plan)
    meta = {
        "dataset": base.dataset,
        "budget": (
            f"{base.dataset}, train-subset {base.train_subset or 'all'}, {plan.parties} parties "
            f"({base.partitioner}), seed {base.seed}; victims: party {plan.victim_party}'s first "
            f"{len(vict.index)} of {len(vict.part.x)} samples, the same for every attack. Central/local training "
            f"{base.epochs} epochs, FedAvg/FedProx {base.rounds} rounds x {base.local_epochs} local epoch(s) "
            f"(mu {base.proximal_mu}), batch {base.batch_size}. abs-solve {base.attack_steps} iterations; gradient "
            f"inversion {plan.gradient_steps} steps x {plan.gradient_restarts} restarts on the first-round update of "
            f"B={plan.gradient_batch_size} image(s), {plan.gradient_local_epochs} local epoch(s). Model inversion "
            f"(mixcon rows) {plan.inversion_steps} SGD steps at lr {plan.inversion_lr:g}, TV weight chosen on 16 "
            f"public images among {', '.join(f'{t:g}' for t in plan.inversion_tv)}; "
            f"its decoder {plan.decoder_epochs} epochs on the public images. Threat model: the "
            f"oracle pairing (the attacker is handed W, the pairing and r; for mixcon rows, h's weights). "
            f"Total wall time {time.perf_counter() - t_start:.0f} s."
        ),
    }
    files = report.write_all(run_dir, records, attacks, study, meta, vict.x, panels, to_unit_for(base, vict))
    summary = {
        "run-dir": str(run_dir), "plan": plan.model_dump(by_alias=True), "settings": base.model_dump(by_alias=True),
        "meta": meta, "records": records, "attacks": attacks, "reencoding": study, "files": files,
    }
    atomic_write_json(run_dir / "frontier.json", summary)
    print((run_dir / "frontier.md").read_text(), flush=True)
    return summary
