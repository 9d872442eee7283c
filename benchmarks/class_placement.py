"""Could a per-class test tell a consistent liar from an honest party that differs? Measured: no.

`labels-vs-peers` (server/plausibility.py) scores a party by one mass-weighted alignment of all its class means
and misses a consistent liar (`relabel-target` 1: its commonest class called the next, in its upload, its
validation counts and its votes alike). This asks whether judging each class on its own would catch it: for every
class a party holds, its class mean as the labels recover it (acquisition offset removed, as the check does) is
compared with the other parties' means of every class, and the class is *misplaced* by z standard errors when
another class's mean is nearer than its own (z: the gap over the noise of the party's class mean, its rows'
spread per coordinate over the class's label mass). Two nearness rules: the inner product the check uses
(`inner`) and the Euclidean distance (`euclid`). A test would flag a party whose largest z passes a threshold;
it can work only if every honest party's largest z stays below every liar's.

Settings: 10 parties of digits or MNIST (12,000 images), tau 1, seeds 1-3; honest under Dirichlet 0.5, feature
skew 1 (fedsmix/acquisition.py), Dirichlet 0.05, feature skew 1 with Dirichlet 0.1, two classes per party; and
party 3 a consistent liar (`relabel-target` 1, `relabel-flip`) under Dirichlet 0.5. Uploads as the ClientApp
prepares them (no training): about 2 min for both data sets here.

    .venv/bin/python benchmarks/class_placement.py --datasets digits,mnist
"""

from __future__ import annotations

import argparse
import math
import warnings

import numpy as np
from common import DATA_DIR, write

from fedsmix.config import load_settings
from fedsmix.party import prepare_upload
from server import plausibility

BAD, PARTIES, SEEDS = 3, 10, (1, 2, 3)
DATASETS = {"digits": {"dataset": "digits"}, "mnist": {"dataset": "mnist", "train-subset": 12000}}
SETTINGS = {
    "honest, dirichlet-0.5": {},
    "honest, feature skew 1": {"feature-skew": 1.0},
    "honest, dirichlet-0.05": {"dirichlet-alpha": 0.05},
    "honest, feature skew 1 + dirichlet-0.1": {"feature-skew": 1.0, "dirichlet-alpha": 0.1},
    "honest, two classes a party": {"partitioner": "pathological", "classes-per-party": 2},
    "liar relabel-target 1": {"fault": f"relabel-target:{BAD}", "fault-strength": 1.0},
    "liar relabel-flip": {"fault": f"relabel-flip:{BAD}"},
}


def misplacement(evidence: list, rule: str) -> dict[int, float]:
    """Per judged party: the largest z over its classes by which another class's mean (the other parties') is
    nearer to its class mean than that class's own (> 0: misplaced)."""
    out = {}
    for e, mine, theirs, known, held in plausibility.peer_class_means(evidence):  # as labels-vs-peers sees them
        worst = -math.inf
        for c in held:
            near = theirs @ mine[c] if rule == "inner" else -((mine[c] - theirs) ** 2).sum(axis=1)
            rival = max((j for j in np.flatnonzero(known) if j != c), key=lambda j: near[j])
            sigma = math.sqrt(e.energy / mine.shape[1] / e.label_sums[c])  # noise of the class mean per coordinate
            scale = (1.0 if rule == "inner" else 2.0) * sigma * float(np.linalg.norm(theirs[rival] - theirs[c]))
            worst = max(worst, float(near[rival] - near[c]) / scale)
        out[e.party] = round(worst, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits,mnist")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="The specified min_partition_size")
    rows = []
    for dataset in args.datasets.split(","):
        for name, overrides in SETTINGS.items():
            for seed in SEEDS:
                settings = load_settings({"preset": "configs/quickstart.yaml", "data-dir": DATA_DIR,
                                          **DATASETS[dataset], "partitioner": "dirichlet", "dirichlet-alpha": 0.5,
                                          "tau": 1.0, "seed": seed, **overrides})
                uploads = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
                evidence = [plausibility.examine(p, u.arrays["x"], u.arrays["y"], u.metrics, settings)
                            for p, u in enumerate(uploads)]
                row = {"dataset": dataset, "setting": name, "seed": seed}
                for rule in ("inner", "euclid"):
                    z = misplacement(evidence, rule)
                    honest = [v for p, v in z.items() if p != BAD or name.startswith("honest")]
                    row[rule] = {"honest-max": max(honest) if honest else None,
                                 "liar": z.get(BAD) if name.startswith("liar") else None}
                rows.append(row)
                print(row, flush=True)
    summary = {}
    for dataset in args.datasets.split(","):
        for rule in ("inner", "euclid"):
            mine = [r for r in rows if r["dataset"] == dataset]
            honest = [r[rule]["honest-max"] for r in mine if r[rule]["honest-max"] is not None]
            liars = [r[rule]["liar"] for r in mine if r[rule]["liar"] is not None]
            summary[f"{dataset} {rule}"] = {"honest-max": max(honest), "liar-min": min(liars),
                                            "separable": min(liars) > max(honest)}
    print(summary)
    write("class_placement", {"command": "benchmarks/class_placement.py --datasets " + args.datasets,
                              "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
