"""`python -m fedsmix frontier`: every strategy of a preset, its accuracy, cost and leakage on one table.

1. Runs: one in-process Flower simulation runs the real ServerApp logic once per row (a row is the
   preset plus a strategy/encoder override), so accuracy, bytes sent and wall time come from real
   runs on the same partitions and seeds.
2. Leakage: the victim party's upload (or first-round update) is replayed, every applicable attack
   reconstructs the same victims, and each row keeps its strongest attack.
3. Re-encoding: the averaging attack against T encodings per sample, for every upload row.
4. Report: frontier.md, frontier.csv, attacks.csv, reencoding.csv, frontier.png, reconstructions.png
   and frontier.json in runs/<time>-frontier-<dataset>/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import traceback
from pathlib import Path

import torch

from fedsmix import data as datalib
from fedsmix.config import Settings, load_settings
from fedsmix.metrics import snr_db
from fedsmix.runs import atomic_write_bytes, atomic_write_json, new_run_dir
from server.adversary.analysis import score_with_baseline
from server.adversary.averaging import Averaging
from server.adversary.gradient import InvertingGradients

from . import report
from .attacks import APPLICABLE, MIXING_ATTACKS
from .cases import (
    Victims,
    check_against_store,
    first_round_update,
    match_within_labels,
    public_mean,
    upload_observation,
    victims,
)
from .plan import FrontierPlan, Row, load_plan, parse_row

BACKEND = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "include_dashboard": False},
}


def run_rows(row_settings: list[Settings], num_parties: int) -> list[dict]:
    """One Flower simulation; its ServerApp runs `run_experiment` once per row, on the same SuperNodes."""
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from clients.app import app as client_app
    from server.app import run_experiment

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    results: list[dict] = []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for settings in row_settings:
            try:
                results.append(run_experiment(grid, settings, run_id=context.run_id))
            except Exception as err:  # keep the row, with its partial results and the reason
                latest = Path(settings.runs_dir) / "latest" / "results.json"
                partial = json.loads(latest.read_text()) if latest.exists() else {"strategies": {}}
                results.append(
                    {**partial, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                )

    run_simulation(app, client_app, num_supernodes=num_parties, backend_config=BACKEND)
    if len(results) != len(row_settings):
        raise RuntimeError(f"the simulation finished {len(results)} of {len(row_settings)} rows; see the log above")
    return results


def _to_unit(vict: Victims, settings: Settings):
    if settings.backbone != "none":
        return None
    return lambda t: datalib.denormalize(t, vict.part.spec)


def _scored(
    name: str, vict: Victims, x_hat: torch.Tensor, prior: torch.Tensor, to_unit, seconds: float, **info
) -> dict:
    """Scores against the trivial guess (the agreed leakage axis) and against the party's own mean
    sample, an oracle guess: a gain over the trivial guess but not over the party mean means the
    attack learnt the party's average image, not its individual samples."""
    x = vict.x
    s = score_with_baseline(x, x_hat, prior, to_unit)
    party_mean = snr_db(x, vict.part.x.mean(dim=0, keepdim=True).expand_as(x)).mean().item()
    a, t, g = s["attack"], s["trivial"], s["gain"]
    ssim = s["per_image"]["ssim"]
    return {
        "attack": name,
        "snr_db": a["snr_mean"],
        "psnr_db": a["psnr_mean"],
        "ssim": a["ssim_mean"],
        "trivial_snr_db": t["snr_mean"],
        "trivial_psnr_db": t["psnr_mean"],
        "trivial_ssim": t["ssim_mean"],
        "gain_snr_db": g["snr_db"],
        "gain_psnr_db": g["psnr_db"],
        "gain_ssim": g["ssim"],
        "best_ssim": float(ssim.max()) if not torch.isnan(ssim).all() else float("nan"),
        "party_mean_snr_db": party_mean,
        "gain_vs_party_mean_db": a["snr_mean"] - party_mean,
        "attack_seconds": seconds,
        **info,
    }


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def gradient_estimates(
    settings: Settings, vict: Victims, plan: FrontierPlan, mu: float, cache: dict
) -> tuple[torch.Tensor, dict]:
    """Invert the victim's first-round update, one batch of `gradient-batch-size` victims at a time."""
    B, pieces, steps = plan.gradient_batch_size, [], 0
    for start in range(0, len(vict.index), B):
        rows = vict.index[start : start + B]
        obs = first_round_update(settings, vict.part, rows, mu, B, plan.gradient_local_epochs)
        if all(float(u.abs().max()) == 0 for u in obs.update):
            raise ValueError(
                f"frontier.gradient-batch-size {B}: the party's update is zero (a model with BatchNorm1d skips "
                "single-sample batches); use gradient-batch-size >= 2 for this model"
            )
        key = _digest(obs.update + [obs.labels])
        if key not in cache:  # FedAvg and FedProx send the same update after one step: attack it once
            attack = InvertingGradients(
                plan.gradient_steps, plan.gradient_restarts, tv=plan.gradient_tv, seed=settings.seed
            )
            cache[key] = attack.reconstruct(obs)
        pieces.append(match_within_labels(vict.part.x[rows], cache[key], vict.part.labels[rows]))
        steps = obs.local_steps
    return torch.cat(pieces), {"batch_size": B, "local_steps": steps}


def leakage(
    row: Row, settings: Settings, run: dict, vict: Victims, prior: torch.Tensor, plan: FrontierPlan, cache: dict
):
    """Every applicable attack on the victims, scored; the trivial guess is the floor."""
    to_unit, x = _to_unit(vict, settings), vict.x
    trivial = prior.unsqueeze(0).expand_as(x).clone()
    scored = [(_scored("trivial guess", vict, trivial, prior, to_unit, 0.0), trivial)]
    names = APPLICABLE[row.target]
    if names == ("gradient",):
        t0 = time.perf_counter()
        mu = settings.proximal_mu if row.strategy == "fedprox" else 0.0
        x_hat, info = gradient_estimates(settings, vict, plan, mu, cache)
        scored.append(
            (_scored("gradient inversion", vict, x_hat, prior, to_unit, time.perf_counter() - t0, **info), x_hat)
        )
    elif names:
        obs, _ = upload_observation(settings, vict.part, prior)
        stored = Path(run.get("run-dir", "")) / "uploads" / f"party-{plan.victim_party:03d}.x.npy"
        if stored.is_file():
            check_against_store(obs, stored)
        for name in names:
            t0 = time.perf_counter()
            x_hat = MIXING_ATTACKS[name](settings).reconstruct(obs)[vict.index]
            scored.append((_scored(name, vict, x_hat, prior, to_unit, time.perf_counter() - t0), x_hat))
    best = max(scored, key=lambda item: item[0]["gain_snr_db"])
    return best, [s for s, _ in scored]


def reencoding(
    rows: list[Row], row_settings: list[Settings], vict: Victims, prior: torch.Tensor, plan: FrontierPlan
) -> list[dict]:
    """The averaging attack against T encodings of each private sample (InstaHide re-encodes every epoch)."""
    out = []
    for row, settings in zip(rows, row_settings):
        if row.strategy != "mixup-union":
            continue
        for T in plan.reencoding:
            obs, _ = upload_observation(settings.replace(encodings_per_sample=T), vict.part, prior)
            t0 = time.perf_counter()
            x_hat = Averaging().reconstruct(obs)[vict.index]
            record = _scored("averaging", vict, x_hat, prior, _to_unit(vict, settings), time.perf_counter() - t0)
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
    runs = run_rows(row_settings, plan.parties)

    vict = victims(base, plan.victim_party, plan.parties, base.attack_victims)
    prior = public_mean(base, vict.part)
    records, attacks, panels, cache = [], [], {}, {}
    for row, settings, run in zip(rows, row_settings, runs):
        result = run.get("strategies", {}).get(row.strategy, {})
        (best, x_hat), scored = leakage(row, settings, run, vict, prior, plan, cache)
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
        attacks += [{**base_record, **s} for s in scored]
        panels[f"{row.name}\n{best['attack']}"] = x_hat
        print(
            f"  {row.name}: accuracy {base_record['accuracy']}, strongest {best['attack']} "
            f"gain {best['gain_snr_db']:+.2f} dB",
            flush=True,
        )
    report.dominated_by(records)
    study = reencoding(rows, row_settings, vict, prior, plan)

    meta = {
        "dataset": base.dataset,
        "budget": (
            f"{base.dataset}, train-subset {base.train_subset or 'all'}, {plan.parties} parties "
            f"({base.partitioner}), seed {base.seed}; victims: party {plan.victim_party}'s first "
            f"{len(vict.index)} of {len(vict.part.x)} samples, the same for every attack. Central/local training "
            f"{base.epochs} epochs, FedAvg/FedProx {base.rounds} rounds x {base.local_epochs} local epoch(s) "
            f"(mu {base.proximal_mu}), batch {base.batch_size}. abs-solve {base.attack_steps} iterations; gradient "
            f"inversion {plan.gradient_steps} steps x {plan.gradient_restarts} restarts on the first-round update of "
            f"B={plan.gradient_batch_size} image(s), {plan.gradient_local_epochs} local epoch(s). "
            f"Total wall time {time.perf_counter() - t_start:.0f} s."
        ),
    }
    report.write_csv(run_dir / "frontier.csv", records)
    report.write_csv(run_dir / "attacks.csv", attacks)
    report.write_csv(run_dir / "reencoding.csv", study, ("strategy", "encodings_per_sample") + report.COLUMNS[5:17])
    text = report.markdown(records, study, meta)
    atomic_write_bytes(run_dir / "frontier.md", text.encode())
    report.scatter(run_dir / "frontier.png", records, f"{base.dataset}: accuracy vs leakage")
    report.reconstructions(run_dir / "reconstructions.png", vict.x, panels, _to_unit(vict, base))
    summary = {
        "run-dir": str(run_dir),
        "plan": plan.model_dump(by_alias=True),
        "settings": base.model_dump(by_alias=True),
        "meta": meta,
        "records": records,
        "attacks": attacks,
        "reencoding": study,
    }
    atomic_write_json(run_dir / "frontier.json", summary)
    print(text, flush=True)
    return summary


def cmd_frontier(args: argparse.Namespace) -> int:
    from fedsmix.cli import _absolute_paths, _parse_sets

    overrides = _absolute_paths({**_parse_sets(args.set), "preset": args.preset})
    plan = _parse_sets(args.plan)
    if args.parties:
        plan["parties"] = args.parties
    summary = run_frontier(args.preset, overrides, plan)
    print(f"frontier written to {summary['run-dir']} (frontier.md, frontier.csv, frontier.png)")
    return 0


def register(subparsers) -> None:
    frontier = subparsers.add_parser("frontier", help="accuracy, bytes and leakage of every strategy on one table")
    frontier.add_argument("--preset", default="configs/frontier-mnist.yaml")
    frontier.add_argument(
        "--parties", type=int, default=0, help="number of parties (default: the preset's frontier.parties)"
    )
    frontier.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run setting override")
    frontier.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="frontier section override, e.g. rows=fedavg,mixup-k2 or gradient-steps=200",
    )
    frontier.set_defaults(func=cmd_frontier)
