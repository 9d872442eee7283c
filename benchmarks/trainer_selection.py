"""Every central-trainer candidate on the same uploads: the parties' pooled validation accuracy (what the
honest selection sees) beside the clean test accuracy (what it must never see). docs/results/utility.md.

    python benchmarks/trainer_selection.py --taus 1e-2,1e-3,1e-4,1e-6 --epochs 2

Uploads are made exactly as a run makes them (`prepare_upload`, every party its partition less its validation
split); every candidate (not only the tuning budget's draw) is fit on the union, as `trainers.train_union` does,
and scored by each party on its own validation split.
Writes benchmarks/results/trainer-selection.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from common import DATA_DIR, write

from fedsmix import data as datalib
from fedsmix import trainers
from fedsmix.config import load_settings
from fedsmix.party import load_partition, prepare_upload
from fedsmix.space import load_test, mixing_shape
from fedsmix.tuning import pooled


def measure(preset: str, tau: float, parties: int, epochs: int, overrides: dict) -> dict:
    s = load_settings({"preset": preset, "data-dir": DATA_DIR, "tau": tau, "epochs": epochs, "device": "cpu",
                       "trainer": "auto", **overrides})
    t0 = time.perf_counter()
    ups = [prepare_upload(s, p, parties) for p in range(parties)]
    x = np.concatenate([u.arrays["x"] for u in ups])
    y = np.concatenate([u.arrays["y"] for u in ups])
    rows = np.concatenate([np.full(len(u.arrays["y"]), p) for p, u in enumerate(ups)])
    shape, num_classes = mixing_shape(s), datalib.dataset_spec(s).num_classes
    union = trainers.Union(torch.from_numpy(x), y, rows,
                          *trainers.union_statistics([u.metrics for u in ups], int(np.prod(shape)), s.encoder))
    names = trainers.candidate_names(s)
    fitted = trainers.fit(s, union, shape, num_classes, "cpu", names, public=trainers.server_public(s))
    scores = {}
    for p in range(parties):  # a party scores on its own validation split
        held = load_partition(s, p, parties, "validation")
        scores[p] = trainers.score_models(fitted.models, held.x, held.labels)
    chosen, validation = pooled(scores, names)
    test = load_test(s)
    accuracy = {n: trainers.test_accuracy(m, test, "cpu")["accuracy"] for n, m in fitted.models.items()}
    record = {"tau": tau, "r": float(np.mean([u.metrics["radius"] for u in ups])), "noise_var": union.noise_var,
              "mix_scale": union.mix_scale, "selected": chosen, "val": validation, "test": accuracy,
              "seconds": time.perf_counter() - t0}
    print(f"tau={tau:g} r={record['r']:.0f} selected={chosen} (val {validation[chosen]:.3f}, test "
          f"{accuracy[chosen]:.3f}); best test {max(accuracy, key=accuracy.get)} {max(accuracy.values()):.3f}",
          flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="configs/table4-cifar10.yaml")
    parser.add_argument("--taus", default="1e-2,1e-3,1e-4,1e-6")
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=0, help="backbone input size (0: the preset's)")
    args = parser.parse_args()
    overrides = {"image-size": args.image_size} if args.image_size else {}
    records = [measure(args.preset, float(t), args.parties, args.epochs, overrides) for t in args.taus.split(",")]
    write("trainer-selection", {"preset": args.preset, "parties": args.parties, "epochs": args.epochs,
                                       "records": records})


if __name__ == "__main__":
    main()
