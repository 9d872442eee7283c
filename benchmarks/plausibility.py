"""Plausibility checks on honest uploads (false rejections) and on one dishonest party (detections).

For every setting below, 10 parties prepare their uploads exactly as the ClientApp does
(fedsmix.party.prepare_upload: no Flower needed), the server's checks (server/plausibility.py) run on
them, and every party they quarantine is counted: all of them are honest, so the count must be 0.
Then party 3's upload is replaced by each dishonest version (the run's fault kinds: scale 100 and 10^4,
garbage, label-flip, replay) and the script records whether the checks name party 3, and only it.

Settings: digits, MNIST (12,000-image subset), CIFAR-10 pixels (10,000-image subset) and CIFAR-10
EfficientNet-Lite0 features (64 px; only when the feature cache holds them); partitions iid, Dirichlet
0.1 and 0.5, pathological (2 classes per party) at tau = 1; tau 1e-3 and 1e-6 and a fixed radius (r = the
parties' median D) under Dirichlet 0.5; on digits also 3 parties, no encoder, two encodings per sample,
float16 uploads and another seed.

    .venv/bin/python benchmarks/plausibility.py            # everything (about 10 min on 2 busy cores)
    .venv/bin/python benchmarks/plausibility.py --datasets digits --quick
"""

from __future__ import annotations

import argparse
import time

from common import DATA_DIR, write

from fedsmix.config import load_settings
from fedsmix.faults import corrupt
from fedsmix.features import cache_path
from fedsmix.party import prepare_upload
from fedsmix.seeding import generator
from server import plausibility

BAD = 3
FAULTS = (("scale", 100.0), ("scale", 1e4), ("garbage", 0.0), ("label-flip", 0.0), ("replay", 0.0))
DATASETS = {
    "digits": {"dataset": "digits"},
    "mnist": {"dataset": "mnist", "train-subset": 12000},
    "cifar10": {"dataset": "cifar10", "train-subset": 10000},
    "cifar10-features": {"dataset": "cifar10", "backbone": "efficientnet-lite0", "image-size": 64},
}
PARTITIONS = {
    "iid": {"partitioner": "iid"},
    "dirichlet-0.1": {"partitioner": "dirichlet", "dirichlet-alpha": 0.1},
    "dirichlet-0.5": {"partitioner": "dirichlet", "dirichlet-alpha": 0.5},
    "pathological": {"partitioner": "pathological", "classes-per-party": 2},
}


def settings_list(dataset: str, quick: bool) -> list[tuple[str, dict, int]]:
    base = {"preset": "configs/quickstart.yaml", "data-dir": DATA_DIR, **DATASETS[dataset]}
    rows = [(f"{name}, tau 1", {**base, **part, "tau": 1.0}, 10) for name, part in PARTITIONS.items()]
    if quick:
        return rows[2:3]
    for tau in (1e-3, 1e-6):
        rows.append((f"dirichlet-0.5, tau {tau:g}", {**base, **PARTITIONS["dirichlet-0.5"], "tau": tau}, 10))
    rows.append(("dirichlet-0.5, fixed radius", {**base, **PARTITIONS["dirichlet-0.5"], "radius-mode": "fixed"}, 10))
    if dataset == "digits":
        dirichlet = {**base, **PARTITIONS["dirichlet-0.5"], "tau": 1.0}
        rows += [
            ("dirichlet-0.5, 3 parties", dirichlet, 3),
            ("dirichlet-0.5, no encoder", {**dirichlet, "encoder": "none"}, 10),
            ("dirichlet-0.5, 2 encodings per sample", {**dirichlet, "encodings-per-sample": 2}, 10),
            ("dirichlet-0.5, float16 upload", {**dirichlet, "upload-dtype": "float16"}, 10),
            ("dirichlet-0.5, seed 1", {**dirichlet, "seed": 1}, 10),
        ]
    return rows


def examine_setting(overrides: dict, parties: int, median_d: float | None) -> dict:
    if overrides.get("radius-mode") == "fixed":
        overrides = {**overrides, "radius": round(median_d, 3)}
    settings = load_settings(overrides)
    t0 = time.perf_counter()
    uploads = [prepare_upload(settings, p, parties) for p in range(parties)]
    t_encode = time.perf_counter() - t0
    evidence = [
        plausibility.examine(p, u.arrays["x"], u.arrays["y"], u.metrics, settings) for p, u in enumerate(uploads)
    ]
    honest = plausibility.quarantine(evidence, settings)
    t_checks = time.perf_counter() - t0 - t_encode
    scores = plausibility.agreement(evidence)
    row = {
        "parties": parties,
        "radius": overrides.get("radius"),
        "honest-quarantined": honest,
        "energy-ratio": [round(e.energy / e.expected, 4) for e in evidence if e.expected],
        "agreement-lift": {p: round(a - c, 3) for p, (a, c) in scores.items()},
        "structure-excess": {p: round(share - iso, 3) for shares, iso in [plausibility.structure(evidence)]
                             for p, (share, _) in shares.items()},
        "median-D": sorted(float(u.metrics["D"]) for u in uploads)[parties // 2],
        "seconds": {"encode": t_encode, "checks": t_checks},
        "faults": {},
    }
    if parties <= BAD:
        return row
    for kind, scale in FAULTS:
        upload = uploads[BAD]
        if kind == "replay":
            arrays, metrics = uploads[BAD - 1].arrays, {**uploads[BAD - 1].metrics, "party": BAD}
        else:
            fault = generator(settings.seed, BAD, "fault")
            arrays, metrics = corrupt(kind, upload.arrays, upload.metrics, scale, fault)
        faulty = list(evidence)
        faulty[BAD] = plausibility.examine(BAD, arrays["x"], arrays["y"], metrics, settings)
        verdicts = plausibility.quarantine(faulty, settings)
        name = f"{kind} {scale:g}" if kind == "scale" else kind
        row["faults"][name] = {
            "caught": any(v["party"] == BAD for v in verdicts),
            "check": next((v["check"] for v in verdicts if v["party"] == BAD), None),
            "honest-quarantined": [v for v in verdicts if v["party"] != BAD],
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits,mnist,cifar10,cifar10-features")
    parser.add_argument("--quick", action="store_true", help="one setting per data set")
    args = parser.parse_args()
    results, honest_parties, false_rejections = {}, 0, 0
    for dataset in args.datasets.split(","):
        if dataset == "cifar10-features" and not cache_path(load_settings(DATASETS[dataset]), "train").is_file():
            print("cifar10-features: not in the feature cache, skipped", flush=True)
            continue
        median_d = None
        for label, overrides, parties in settings_list(dataset, args.quick):
            row = examine_setting(overrides, parties, median_d)
            median_d = median_d or row["median-D"]
            results[f"{dataset}: {label}"] = row
            honest_parties += parties + sum(parties - 1 for _ in row["faults"])
            false_rejections += len(row["honest-quarantined"]) + sum(
                len(f["honest-quarantined"]) for f in row["faults"].values()
            )
            caught = {name: f["check"] if f["caught"] else "MISSED" for name, f in row["faults"].items()}
            span = {key: (min(row[key].values()), max(row[key].values()))
                    for key in ("agreement-lift", "structure-excess")}
            energy = (min(row["energy-ratio"], default=0), max(row["energy-ratio"], default=0))
            print(f"{dataset}: {label}: honest quarantined {len(row['honest-quarantined'])}; {caught}; "
                  f"energy ratio {energy[0]:.3f}..{energy[1]:.3f}; agreement lift {span['agreement-lift'][0]:.2f}.."
                  f"{span['agreement-lift'][1]:.2f}; structure {span['structure-excess'][0]:.2f}.."
                  f"{span['structure-excess'][1]:.2f}; {row['seconds']['checks']:.1f}s checks", flush=True)
    summary = {"honest-party-checks": honest_parties, "honest-parties-quarantined": false_rejections}
    print(summary)
    write("plausibility", {"command": "benchmarks/plausibility.py " + " ".join(
        f"--{k} {v}" if not isinstance(v, bool) else f"--{k}" for k, v in vars(args).items() if v), **summary,
        "settings": results})


if __name__ == "__main__":
    main()
