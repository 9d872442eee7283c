"""What the genie of fedsmix/bound.py knows that a trainer lacks: the clean covariance, or the class means' subspace?

For finished mixup-union runs (their stored uploads), the Gaussian Bayes learner of `fedsmix.bound.genie_accuracy`
with its knowledge taken away piece by piece:

- `subspace`: the genie as `fedsmix bound` reports it: the clean within-class covariance W and the true class means'
  between-class covariance B as the means' prior.
- `clean-cov@lam`: W known, and the prior lam x the clean total covariance (W + B): the class means are assumed to
  lie where the clean data varies, nothing told of where they are.
- `public@t,lam`: what a trainer can have: W = t x the public pool's covariance (scaled to W's trace), the prior
  lam x the same; class priors and the overall mean from the uploads. Reported as the best over the grid, picked on
  the test split: an optimistic figure for a learner that would choose on validation.

And the noise per coordinate against the clean within-class variance per coordinate: why W cannot be estimated
from the uploads at these taus.

`--sizes 3,10,30`: the `clean-cov` learner (at its best lam for that size, picked on the test split: an
optimistic reference) and the subspace genie for unions of that many times the rows, the parties' noise and mixing
unchanged (`fedsmix.bound.simulated`, `--draws` draws each): the union size at which a learner told no more than the
clean covariance would reach a given accuracy. `--out NAME` writes benchmarks/results/NAME.json (default
bound_priors).

    .venv/bin/python benchmarks/bound_priors.py RUN_DIR [RUN_DIR ...]     # about 1 min a run on 2 cores
    .venv/bin/python benchmarks/bound_priors.py --sizes 3,10,30 --draws 3 --out bound_priors_128px RUN_DIR ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from common import PROJECT, write

from fedsmix import bound as genie_bound
from fedsmix.config import load_settings
from fedsmix.data import dataset_spec
from fedsmix.party import pooled_data
from fedsmix.space import load_test, public_in_space
from fedsmix.trainers import weight_moments
from fedsmix.trainers.linear import public_covariance
from server.store import UploadStore

CLEAN_LAMBDAS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
PUBLIC_T = (0.5, 1.0)
PUBLIC_LAMBDAS = (0.003, 0.01, 0.03)


def of_run(run_dir: Path, cache: dict, sizes: tuple[float, ...] = (), draws: int = 3) -> dict:
    t0 = time.perf_counter()
    results = json.loads((run_dir / "results.json").read_text())
    settings, entry = load_settings(results["settings"]), results["strategies"]["mixup-union"]
    parties = int(results.get("num-parties") or entry.get("num-partitions"))
    key = (settings.dataset, settings.backbone, settings.image_size, parties)
    if key not in cache:
        x, labels = pooled_data(settings, parties)
        cache[key] = (genie_bound.Genie.of(x, labels, dataset_spec(settings).num_classes), load_test(settings),
                      public_covariance(public_in_space(settings)))
    genie, (test_x, test_y), public = cache[key]
    x, y = UploadStore(run_dir / "uploads").union(sorted(int(p) for p in entry["parties"]))
    uploads = genie_bound.Regression.of(x, y)
    within_trace = float(torch.trace(genie.within))
    out = {"run": str(run_dir), "tau": settings.tau, "seed": settings.seed, "trainer": entry["accuracy"],
           "chosen": entry.get("trainer"),
           "subspace": genie_bound.genie_accuracy(genie, uploads, test_x, test_y, genie.between())}
    total = genie.within + genie.between()
    for lam in CLEAN_LAMBDAS:
        out[f"clean-cov@{lam:g}"] = genie_bound.genie_accuracy(genie, uploads, test_x, test_y, lam * total)
    prior = torch.diagonal(uploads.gram) / torch.diagonal(uploads.gram).sum()  # the uploads' class priors
    overall = prior @ torch.nan_to_num(uploads.means)
    shape = public * within_trace / float(torch.trace(public))
    best = (-1.0, "")
    for t in PUBLIC_T:
        learner = genie_bound.Genie(overall.repeat(len(prior), 1), t * shape, prior)  # nothing clean in it
        for lam in PUBLIC_LAMBDAS:
            accuracy = genie_bound.genie_accuracy(learner, uploads, test_x, test_y, lam * shape)
            out[f"public@{t:g},{lam:g}"] = accuracy
            best = max(best, (accuracy, f"public@{t:g},{lam:g}"))
    out["public-best"], out["public-best-setting"] = best
    partner, _ = weight_moments(float(settings.alpha))
    radius = sum(float(p["radius"]) * int(p["num-examples"]) for p in entry["parties"].values()) / sum(
        int(p["num-examples"]) for p in entry["parties"].values())
    dim = genie.within.shape[0]
    out["noise-var-per-coordinate"] = partner * radius**2 / dim
    out["clean-within-var-per-coordinate"] = within_trace / dim
    out["rows"] = uploads.rows
    out["clean-cov-best-lam"] = max(CLEAN_LAMBDAS, key=lambda lam: out[f"clean-cov@{lam:g}"])
    for size in sizes:
        rows = round(size * uploads.rows)
        mean, std = genie_bound.simulated(genie, uploads, test_x, test_y, rows, draws, settings.seed, genie.between())
        out[f"subspace@{size:g}x"], out[f"subspace@{size:g}x-std"] = mean, std
        scored = {lam: genie_bound.simulated(genie, uploads, test_x, test_y, rows, draws, settings.seed, lam * total)
                  for lam in CLEAN_LAMBDAS}  # the same draws for every lam (one seed): lam picked per size
        lam = max(scored, key=lambda k: scored[k][0])
        out[f"clean-cov@{size:g}x"], out[f"clean-cov@{size:g}x-std"] = scored[lam]
        out[f"clean-cov@{size:g}x-lam"] = lam
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="finished mixup-union run directories (with their uploads)")
    parser.add_argument("--sizes", default="", help="comma-separated multiples of the union's rows to simulate")
    parser.add_argument("--draws", type=int, default=3, help="simulated draws per size")
    parser.add_argument("--out", default="bound_priors", help="results name under benchmarks/results/")
    args = parser.parse_args()
    sizes = tuple(float(s) for s in args.sizes.split(",") if s.strip())
    cache: dict = {}
    rows = []
    for arg in args.runs:
        row = of_run(Path(arg).resolve(), cache, sizes, args.draws)
        rows.append(row)
        clean = ", ".join(f"{100 * row['clean-cov@' + format(lam, 'g')]:.2f}" for lam in CLEAN_LAMBDAS)
        scaled = "; ".join(f"{size:g}x rows: clean covariance {100 * row[f'clean-cov@{size:g}x']:.1f} "
                           f"(lam {row[f'clean-cov@{size:g}x-lam']:g}), subspace "
                           f"{100 * row[f'subspace@{size:g}x']:.1f}" for size in sizes)
        print(f"tau {row['tau']:g} seed {row['seed']}: trainer {100 * row['trainer']:.2f}, subspace genie "
              f"{100 * row['subspace']:.2f}, clean covariance prior {clean}, public best "
              f"{100 * row['public-best']:.2f} ({row['public-best-setting']}); noise/clean variance per coordinate "
              f"{row['noise-var-per-coordinate'] / row['clean-within-var-per-coordinate']:.0f}"
              f"{'; ' + scaled if scaled else ''} ({row['seconds']:.0f} s)", flush=True)
        write(args.out, {"command": "benchmarks/bound_priors.py " + " ".join(sys.argv[1:]), "rows": rows})


if __name__ == "__main__":
    import os

    os.chdir(PROJECT)
    main()
