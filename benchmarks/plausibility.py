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

    .venv/bin/python benchmarks/plausibility.py            # everything (about 45 min on 2 busy cores)
    .venv/bin/python benchmarks/plausibility.py --datasets digits     # one data set; the others' rows are kept
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from common import DATA_DIR, RESULTS, write

from fedsmix.config import load_settings
from fedsmix.faults import corrupt
from fedsmix.features import cache_path
from fedsmix.party import prepare_upload
from fedsmix.seeding import generator
from fedsmix.trainers import Union, clipped
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
    union = Union(np.concatenate([u.arrays["x"] for u in uploads]), np.concatenate([u.arrays["y"] for u in uploads]),
                  np.repeat(np.arange(parties), [len(u.arrays["y"]) for u in uploads]))
    view = clipped(union, settings.seed).x
    distances = np.linalg.norm((np.asarray(union.x, dtype=np.float64) - view.center).reshape(len(union), -1), axis=1)
    row = {
        "parties": parties,
        "radius": overrides.get("radius"),
        "honest-quarantined": honest,
        "energy-ratio": [round(e.energy / e.expected, 4) for e in evidence if e.expected],
        "agreement-shortfall": {p: round(a.shortfall, 3) for p, a in scores.items() if a.rows},
        "agreement-lift": {p: round((a.expected - a.chance) / a.rows, 3) for p, a in scores.items() if a.rows},
        "structure-excess": {p: round(share - iso, 3) for shares, iso in [plausibility.structure(evidence)]
                             for p, (share, _) in shares.items()},
        "clipped-rows": int((distances > view.bound).sum()),  # robust-training clip on these honest rows
        "rows": len(union),
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
        if faulty[BAD].problem is None:  # what the cross-party label and structure checks saw of it
            scores = plausibility.agreement(faulty)
            shares, isotropic = plausibility.structure(faulty)
            row["faults"][name]["agreement-shortfall"] = round(scores[BAD].shortfall, 3) if scores[BAD].rows else None
            row["faults"][name]["structure-excess"] = round(shares[BAD][0] - isotropic, 3)
    return row


def count(rows: dict) -> dict:
    """Honest parties judged (each setting's honest parties, plus the honest ones beside each fault) and how
    many of them were quarantined."""
    judged = sum(r["parties"] + sum(r["parties"] - 1 for _ in r["faults"]) for r in rows.values())
    wrong = sum(len(r["honest-quarantined"]) + sum(len(f["honest-quarantined"]) for f in r["faults"].values())
                for r in rows.values())
    return {"honest-party-checks": judged, "honest-parties-quarantined": wrong}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits,mnist,cifar10,cifar10-features")
    parser.add_argument("--quick", action="store_true", help="one setting per data set")
    args = parser.parse_args()
    datasets = args.datasets.split(",")
    path = RESULTS / "plausibility.json"
    earlier = json.loads(path.read_text()).get("settings", {}) if path.exists() else {}
    results = {k: v for k, v in earlier.items() if k.split(":")[0] not in datasets}  # other data sets: kept
    for dataset in datasets:
        if dataset == "cifar10-features" and not cache_path(load_settings(DATASETS[dataset]), "train").is_file():
            print("cifar10-features: not in the feature cache, skipped", flush=True)
            continue
        median_d = None
        for label, overrides, parties in settings_list(dataset, args.quick):
            row = examine_setting(overrides, parties, median_d)
            median_d = median_d or row["median-D"]
            results[f"{dataset}: {label}"] = row
            caught = {name: f["check"] if f["caught"] else "MISSED" for name, f in row["faults"].items()}
            span = {key: (min(row[key].values()), max(row[key].values()))
                    for key in ("agreement-shortfall", "structure-excess")}
            energy = (min(row["energy-ratio"], default=0), max(row["energy-ratio"], default=0))
            print(f"{dataset}: {label}: honest quarantined {len(row['honest-quarantined'])}; {caught}; "
                  f"energy ratio {energy[0]:.3f}..{energy[1]:.3f}; shortfall {span['agreement-shortfall'][0]:.2f}.."
                  f"{span['agreement-shortfall'][1]:.2f}; structure {span['structure-excess'][0]:.2f}.."
                  f"{span['structure-excess'][1]:.2f}; clip {row['clipped-rows']}/{row['rows']} rows; "
                  f"{row['seconds']['checks']:.1f}s checks", flush=True)
    summary = count(results)
    print(summary)
    write("plausibility", {"command": "benchmarks/plausibility.py (per data set: --datasets NAME)", **summary,
                           "settings": results})


if __name__ == "__main__":
    main()
