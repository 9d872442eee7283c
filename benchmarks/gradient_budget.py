"""The gradient attacker at the appendix's budget, and what decides whether a batch of 16 or 32 leaks.

The frontier's gradient study (docs/results/defences.md) attacks party 0's round-1 update with 500 steps and 2
restarts (tv 1e-2, alpha_BN 1e-2): on MNIST it recovers batches of 16 and 32, on CIFAR-10 no attacker beats the
blind guess from B = 16 on, where the appendix (Table 5, ResNet-18) still reads LPIPS 0.41-0.48. This script runs
the same attacker (server/adversary/gradient.py) on the same victims and update (`update_case`: one SGD step of
party 0 on its first B images from the initial model, the frontier-defences preset's partitions) at the
appendix's budget (GradAttack's 10,000 steps, Adam 0.1 decayed at 3/8, 5/8, 7/8, signed gradients, boxed; tv 0.1
and alpha_BN 0.005 for BN_exact, tv 0.05 and alpha_BN 0.001 for the realistic BN_infer), with snapshots along
the way (a learning curve of one schedule), and with `--widths`, wider CNNs (`cnn-width`): ResNet-18 gives
the attacker 11.2 M equations for 16 x 3,072 unknowns (227 per unknown) where the frontier's CNN has 60,554 (1.2
at B = 16, 0.6 at B = 32; MNIST's 4.0 and 2.0). Measured: alpha_TV, not steps or equations, kept the study at the
blind guess (docs/results/defences.md).

Scores: gains over the blind guesses (SNR / SSIM against the public mean image; ST-LPIPS against the public
ST-LPIPS medoid; MNIST's 28 px grey images go through it as three equal channels), victims matched to
reconstructions by least squared error (Hungarian), as the frontier scores them. Labels known (the appendix's
Table 5 setting). Attackers: `ATTACKERS` below (the
frontier's study as its tables ran, the same with alpha_TV chosen on a public probe, GradAttack's BN_exact and
realistic settings, and two ablations of the realistic one). Run one at a time on a 2-core machine:

    .venv/bin/python benchmarks/gradient_budget.py --dataset cifar10 --batch 16,32 --attackers frontier,exact,infer \
        --steps 10000
    .venv/bin/python benchmarks/gradient_budget.py --dataset cifar10 --batch 16,32 \
        --attackers frontier-probe,frontier-probe-infer
    .venv/bin/python benchmarks/gradient_budget.py --dataset cifar10 --batch 16 --steps 2000 --snapshots 500,1000 \
        --attackers exact-tv0.01,infer-no-prior,exact-masks-unknown
    .venv/bin/python benchmarks/gradient_budget.py --dataset cifar10 --batch 16 --attackers exact --steps 2000 \
        --rows fedavg-prune0.9,fedavg-mixup-k4,fedavg-instahide-k4,fedavg-instahide-k4-prune0.9
    .venv/bin/python benchmarks/gradient_budget.py --dataset mnist --batch 16,32 --attackers exact,infer \
        --steps 2000 --snapshots 500,1000
"""

from __future__ import annotations

import argparse
import math
import time

import common  # noqa: F401  (sets the OpenMP wait policy before torch loads)
import torch

from commands.frontier.plan import parse_row
from fedsmix import data as datalib
from fedsmix.config import load_settings
from fedsmix.party import load_partition
from server.adversary.analysis import Blind, leakage
from server.adversary.cases import match_rows, public_samples, update_case
from server.adversary.gradient import InvertingGradients
from server.adversary.registry import public_probe

PRESETS = {"cifar10": "configs/frontier-defences-cifar10.yaml", "mnist": "configs/frontier-defences-mnist.yaml"}

# name: (steps or None for --steps, restarts, tv, alpha_BN, bn, dropout masks)
ATTACKERS = {
    "frontier": (500, 2, 1e-2, 1e-2, "exact", "known"),  # the frontier's gradient study, as its tables ran
    "frontier-probe": (500, 2, (1e-2, 1e-1), 1e-2, "exact", "known"),  # the same, alpha_TV chosen on a public probe
    "frontier-probe-infer": (500, 2, (1e-2, 1e-1), 1e-2, "infer", "replay"),  # its realistic attacker, alike
    "exact": (None, 1, 0.1, 5e-3, "exact", "known"),  # GradAttack's BN_exact command
    "exact-tv0.01": (None, 1, 1e-2, 5e-3, "exact", "known"),  # the appendix's best tv for one image (its Fig. 4)
    "infer": (None, 1, 0.05, 1e-3, "infer", "replay"),  # GradAttack's realistic command, labels known
    "exact-masks-unknown": (None, 1, 0.1, 5e-3, "exact", "replay"),  # BN_exact without the party's dropout masks
    "infer-no-prior": (None, 1, 0.05, 0.0, "infer", "replay"),  # no BN prior: round 1's running statistics are
    # the initialisation's (0, 1), not the data's
}


def gains(report: dict, name: str) -> dict:
    entry = report["attacks"][name]
    gain, score = entry.get("gain", {}), entry["score"]
    return {"gain_snr_db": gain.get("snr_db"), "gain_ssim": gain.get("ssim"), "gain_st_lpips": gain.get("st_lpips"),
            "ssim": score.get("ssim_mean"), "st_lpips": score.get("st_lpips_mean")}


def run(dataset: str, row: str, width: int, batch: int, attacker: str, steps: int, snapshots: tuple[int, ...],
        seed: int) -> list[dict]:
    settings = load_settings({"cnn-width": width, "seed": seed}, preset=PRESETS[dataset])
    settings = settings.replace(**parse_row(row).overrides)  # the row's defences, as the frontier applies them
    parties = 5  # the frontier-defences presets' federation (frontier: parties)
    part = load_partition(settings, 0, parties)
    rows = torch.arange(batch)
    case = update_case(settings, part, rows, proximal_mu=0.0, batch_size=batch, local_epochs=1)
    fixed_steps, restarts, tv, alpha_bn, bn, dropout = ATTACKERS[attacker]
    steps = fixed_steps or steps
    curve = fixed_steps is None and not case.observation.masked  # InstaHide's unknowns are the masked inputs
    public = public_samples(settings, part.spec)
    probe = public_probe(settings, public) if isinstance(tv, tuple) else None
    attack = InvertingGradients(steps, restarts, tv=tv, seed=seed, bn=bn, alpha_bn=alpha_bn, labels="known",
                                dropout=dropout, snapshots=snapshots if curve else (), probe=probe)
    def to_unit(t):
        return datalib.denormalize(t, part.spec)

    blind = Blind.of(public, to_unit)
    started = time.perf_counter()
    final = attack.reconstruct(case.observation)
    seconds = time.perf_counter() - started
    truth = case.truth.float()
    estimates = {steps: match_rows(truth, final[case.rows])}
    for k, x_hat in attack.taken.items():
        if k != steps:
            estimates[k] = match_rows(truth, x_hat[case.rows])
    report, _ = leakage(truth, {str(k): v for k, v in estimates.items()}, blind, to_unit)
    params = sum(p.numel() for p in case.observation.model.parameters() if p.requires_grad)
    unknowns = batch * math.prod(part.sample_shape)
    out = []
    for k in sorted(estimates):
        out.append({
            "dataset": dataset, "row": row, "cnn-width": width, "parameters": params, "batch": batch,
            "equations-per-unknown": round(params / unknowns, 2), "attacker": attacker, "tv": attack.tv,
            "probe-snr-db": {f"{t:g}": round(v, 2) for t, v in attack.probe_scores.items()} or None,
            "alpha-bn": alpha_bn, "bn": bn, "restarts": restarts, "schedule-steps": steps, "steps": k,
            "seconds": round(seconds * k / steps, 1), "seconds-per-step": round(seconds / (steps * restarts), 4),
            **gains(report, str(k)),
        })
        r = out[-1]
        shown = {key: "n/a" if r[key] is None else f"{r[key]:+.3f}" for key in ("gain_snr_db", "ssim", "gain_st_lpips")}
        print(f"{dataset} {row} width {width} B={batch} {attacker} step {k}/{steps}: gain {shown['gain_snr_db']} dB, "
              f"SSIM {shown['ssim']}, ST-LPIPS gain {shown['gain_st_lpips']} ({seconds:.0f} s)", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cifar10", choices=sorted(PRESETS))
    parser.add_argument("--rows", default="fedavg", help="frontier rows: fedavg and its defences, e.g. "
                        "fedavg-prune0.9,fedavg-mixup-k4,fedavg-instahide-k4,fedavg-instahide-k4-prune0.9")
    parser.add_argument("--batch", default="16,32")
    parser.add_argument("--widths", default="32")
    parser.add_argument("--attackers", default="frontier,exact,infer")
    parser.add_argument("--steps", type=int, default=10000, help="the appendix-budget attackers' steps")
    parser.add_argument("--snapshots", default="500,1000,2000,5000", help="steps at which the curve is read")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="gradient_budget")
    args = parser.parse_args()
    torch.set_num_threads(2)
    snapshots = tuple(int(s) for s in args.snapshots.split(",") if s)
    rows, started = [], time.time()
    existing = common.RESULTS / f"{args.out}.json"
    if existing.is_file():  # runs of other datasets / widths already measured stay in the file
        import json

        rows = json.loads(existing.read_text()).get("rows", [])
    for row in args.rows.split(","):
        for width in (int(w) for w in args.widths.split(",")):
            for batch in (int(b) for b in args.batch.split(",")):
                for attacker in args.attackers.split(","):
                    new = run(args.dataset, row, width, batch, attacker, args.steps, snapshots, args.seed)
                    key = {(r["dataset"], r.get("row", "fedavg"), r["cnn-width"], r["batch"], r["attacker"],
                            r["schedule-steps"]) for r in new}
                    rows = [r for r in rows if (r["dataset"], r.get("row", "fedavg"), r["cnn-width"], r["batch"],
                                                r["attacker"], r["schedule-steps"]) not in key] + new
                    common.write(args.out, {"args": vars(args), "wall-seconds": round(time.time() - started),
                                            "rows": rows})


if __name__ == "__main__":
    main()
