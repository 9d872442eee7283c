"""Plausibility checks on honest uploads (false rejections, per check) and on one dishonest party (detections).

For every setting below, 10 parties prepare their uploads exactly as the ClientApp does
(fedsmix.party.prepare_upload: no Flower needed), the server's checks (server/plausibility.py) run on
them, and every party they quarantine is counted: all of them are honest, so the count must be 0.
Then party 3's upload is replaced by each dishonest version (the run's fault kinds: scale 100 and 10^4,
garbage, label-flip, label-target (its commonest class relabelled as the next), replay) and the script
records whether the checks name party 3, and only it.

Settings: digits, MNIST (12,000-image subset), CIFAR-10 pixels (10,000-image subset) and CIFAR-10
EfficientNet-Lite0 features (64 px; only when the feature cache holds them); partitions iid, Dirichlet
0.1 and 0.5, pathological (2 classes per party) at tau = 1; tau 1e-3 and 1e-6 and a fixed radius (r = the
parties' median D) under Dirichlet 0.5; on digits also 3 parties, no encoder, two encodings per sample,
float16 uploads and another seed.

Honest heterogeneity (`--group heterogeneity`): every party honest, 10 parties, each check run on its own
over every party (not only on the parties an earlier check let through), so each check's false alarms are
counted: feature skew (fedsmix/acquisition.py) at strength 0.25, 0.5 and 1 at tau 1 and 1e-3, and at strength 1
at tau 1e-2 and 1e-6; size skew down to a party of about 10 rows; label skew down to Dirichlet 0.05; feature
and label skew together.

    .venv/bin/python benchmarks/plausibility.py            # everything (about 45 min on 2 busy cores)
    .venv/bin/python benchmarks/plausibility.py --datasets digits     # one data set; the others' rows are kept
    .venv/bin/python benchmarks/plausibility.py --group heterogeneity --datasets digits,mnist
    .venv/bin/python benchmarks/plausibility.py --figure    # what feature skew 1 does to parties 0-5's images
    .venv/bin/python benchmarks/plausibility.py --group tiny    # 10,000 honest MNIST parties of 5-6 rows

Tiny parties (`--group tiny`): the party-cost benchmark's federation (MNIST, IID, 10,000 parties of 5-6 rows each,
tau 1), every check on its own over every party, as above; a summary only (benchmarks/results/plausibility_tiny.json).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from common import DATA_DIR, PROJECT, RESULTS, write

from fedsmix.config import SettingsError, load_settings
from fedsmix.data import load_dataset
from fedsmix.faults import corrupt
from fedsmix.features import cache_path
from fedsmix.party import prepare_upload
from fedsmix.seeding import generator
from fedsmix.trainers import Union, clipped
from server import plausibility

BAD = 3
FAULTS = (("scale", 100.0), ("scale", 1e4), ("garbage", 0.0), ("label-flip", 0.0), ("label-target", 0.0),
          ("replay", 0.0))
DATASETS = {
    "digits": {"dataset": "digits"},
    "mnist": {"dataset": "mnist", "train-subset": 12000},
    "cifar10": {"dataset": "cifar10", "train-subset": 10000},
    "cifar10-features": {"dataset": "cifar10", "backbone": "efficientnet-lite0", "image-size": 64},
}
HETEROGENEITY_SUBSET = {"cifar10-features": {"train-subset": 10000}}  # shifted features are extracted per party
POOR_ROWS = 10  # size skew: the data-poor party's rows
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


def heterogeneity_list(dataset: str) -> list[tuple[str, dict, int]]:
    """Honest parties that differ: in acquisition, in size, in labels."""
    base = {"preset": "configs/quickstart.yaml", "data-dir": DATA_DIR, **DATASETS[dataset],
            **HETEROGENEITY_SUBSET.get(dataset, {}), **PARTITIONS["dirichlet-0.5"]}
    rows = [(f"feature skew {strength:g}, tau {tau:g}", {**base, "feature-skew": strength, "tau": tau}, 10)
            for tau in (1.0, 1e-3) for strength in (0.25, 0.5, 1.0)]
    rows += [(f"feature skew 1, tau {tau:g}", {**base, "feature-skew": 1.0, "tau": tau}, 10) for tau in (1e-2, 1e-6)]
    n = load_settings(base).train_subset or len(load_dataset(load_settings(base), "train"))
    ratio = min(1.0, POOR_ROWS * 9 / (n - POOR_ROWS))  # n_poor = rho n / (N - 1 + rho)
    for tau in (1.0, 1e-3):
        skew = {"partitioner": "size-skew", "poor-party-ratio": ratio, "poor-party": BAD}
        rows.append((f"size skew ({POOR_ROWS} rows), tau {tau:g}", {**base, **skew, "tau": tau}, 10))
        rows.append((f"dirichlet-0.05, tau {tau:g}", {**base, "dirichlet-alpha": 0.05, "tau": tau}, 10))
    rows.append(("feature skew 1 + dirichlet-0.1, tau 1", {**base, "feature-skew": 1.0, "dirichlet-alpha": 0.1}, 10))
    return rows


def flags_per_check(evidence: list, uploads: list, settings) -> dict[str, list[int]]:
    """The honest parties each check would quarantine, every check run on its own over every party."""
    flags = {}
    for name, check in plausibility.UPLOAD_CHECKS.items():
        flags[name] = []
        for e, u in zip(evidence, uploads):
            try:
                check(e, u.arrays["y"], u.metrics, settings)
            except plausibility.Implausible:
                flags[name].append(e.party)
    usable = [e for e in evidence if e.problem is None]
    for name, check in plausibility.CROSS_CHECKS.items():
        flags[name] = sorted({v["party"] for v in check(usable)})
    return flags


def prepared(settings, parties: int) -> tuple[list, list, float]:
    """Every party's upload as the ClientApp prepares it, the server's evidence of each, and the encoding time."""
    t0 = time.perf_counter()
    uploads = [prepare_upload(settings, p, parties) for p in range(parties)]
    t_encode = time.perf_counter() - t0
    evidence = [
        plausibility.examine(p, u.arrays["x"], u.arrays["y"], u.metrics, settings) for p, u in enumerate(uploads)
    ]
    return uploads, evidence, t_encode


def examine_honest(overrides: dict, parties: int) -> dict:
    settings = load_settings(overrides)
    t0 = time.perf_counter()
    uploads, evidence, t_encode = prepared(settings, parties)
    flags = flags_per_check(evidence, uploads, settings)
    spread = [float(np.sqrt(e.energy)) for e in evidence]
    return {
        "parties": parties,
        "rows-per-party": [len(u.arrays["y"]) for u in uploads],
        "honest-quarantined": plausibility.quarantine(evidence, settings),
        "flags-per-check": flags,
        "spread-vs-median": [round(v / float(np.median(spread)), 3) for v in spread],  # what a norm rule would see
        "outside-vs-allowed": [round(e.outside / max(plausibility.domain_allowance(u.metrics, settings), 1e-12), 3)
                               for e, u in zip(evidence, uploads)],
        "energy-ratio": [round(e.energy / e.expected, 4) for e in evidence if e.expected],
        "spread-ratio": spread_ratio(evidence),
        **peer_alignment(evidence),
        **label_mix(evidence),
        "seconds": {"encode": t_encode, "checks": time.perf_counter() - t0 - t_encode},
    }


def spread_ratio(evidence: list) -> list[float]:
    """Every party's variance of its rows' energies over the least its report allows (norm-spread flags below
    1 / SPREAD_FACTOR)."""
    return [round(e.energy_var / e.spread_floor, 4) for e in evidence if e.spread_floor]


def label_mix(evidence: list) -> dict[str, object]:
    """Every party's label-mix chance (the bound on an honest split differing so much; 1: no disagreement) and the
    threshold below which the check names a party."""
    delta = plausibility.FALSE_ALARM / len(evidence)
    chances = {e.party: plausibility.label_mix(e, delta).chance for e in evidence}
    classes = next((len(e.validation_counts) for e in evidence if e.validation_counts is not None), 1)
    return {"label-mix-chance": {p: float(f"{c:.3g}") for p, c in chances.items()},
            "label-mix-threshold": delta / (4 * classes),
            "validation-rows": [int(e.validation_counts.sum()) if e.validation_counts is not None else 0
                                for e in evidence]}


def peer_alignment(evidence: list) -> dict[str, dict]:
    """Every judged party's labels-vs-peers alignment and its standard error (one pass of the check's statistic)."""
    judged = plausibility.alignment(evidence)
    return {"peer-alignment": {p: round(a.score, 3) for p, a in judged.items()},
            "peer-alignment-error": {p: round(a.error, 3) for p, a in judged.items()}}


def rates(rows: dict) -> dict[str, dict]:
    """Per check: honest parties it would quarantine, of the honest parties judged."""
    out: dict[str, dict] = {}
    for row in rows.values():
        for name, flagged in row.get("flags-per-check", {}).items():
            cell = out.setdefault(name, {"flagged": 0, "judged": 0})
            cell["flagged"] += len(flagged)
            cell["judged"] += row["parties"]
    return out


def examine_setting(overrides: dict, parties: int, median_d: float | None) -> dict:
    if overrides.get("radius-mode") == "fixed":
        overrides = {**overrides, "radius": round(median_d, 3)}
    settings = load_settings(overrides)
    t0 = time.perf_counter()
    uploads, evidence, t_encode = prepared(settings, parties)
    honest = plausibility.quarantine(evidence, settings)
    flags = flags_per_check(evidence, uploads, settings)
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
        "flags-per-check": flags,
        "energy-ratio": [round(e.energy / e.expected, 4) for e in evidence if e.expected],
        "spread-ratio": spread_ratio(evidence),
        "agreement-shortfall": {p: round(a.shortfall, 3) for p, a in scores.items() if a.rows},
        "agreement-lift": {p: round((a.expected - a.chance) / a.rows, 3) for p, a in scores.items() if a.rows},
        "structure-excess": {p: round(share - iso, 3) for shares, iso in [plausibility.structure(evidence)]
                             for p, (share, _) in shares.items()},
        **peer_alignment(evidence),
        **label_mix(evidence),
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
            judged = plausibility.alignment(faulty).get(BAD)
            row["faults"][name]["peer-alignment"] = (judged.score, judged.error) if judged else None
            row["faults"][name]["label-mix-chance"] = label_mix(faulty)["label-mix-chance"][BAD]
        if faulty[BAD].spread_floor:
            row["faults"][name]["spread-ratio"] = round(faulty[BAD].energy_var / faulty[BAD].spread_floor, 4)
    return row


def count(rows: dict) -> dict:
    """Honest parties judged (each setting's honest parties, plus the honest ones beside each fault) and how
    many of them were quarantined."""
    rows = {k: r for k, r in rows.items() if "error" not in r}
    judged = sum(r["parties"] + sum(r["parties"] - 1 for _ in r.get("faults", {})) for r in rows.values())
    wrong = sum(len(r["honest-quarantined"]) + sum(len(f["honest-quarantined"]) for f in r.get("faults", {}).values())
                for r in rows.values())
    return {"honest-party-checks": judged, "honest-parties-quarantined": wrong}


def skew_figure(path, strength: float = 1.0, parties: int = 6, images: int = 8) -> None:
    """The first training images of CIFAR-10 and MNIST as parties 0..parties-1 hold them at `strength` (seed 0):
    one row per data set and party."""
    import torch
    import torchvision

    from fedsmix import data as datalib
    from fedsmix.acquisition import KINDS, party_acquisition

    rows = []
    for name in ("cifar10", "mnist"):
        raw = datalib.load_split(name, "train", DATA_DIR)
        for party in range(parties):
            shift = party_acquisition(strength, KINDS, 0, party, tuple(raw.spec.sample_shape))
            unit = shift(datalib.to_unit(raw.images[:images], raw.spec))
            rows.append(torch.nn.functional.interpolate(unit.expand(-1, 3, -1, -1), size=(32, 32)))
    path.parent.mkdir(parents=True, exist_ok=True)
    torchvision.utils.save_image(torchvision.utils.make_grid(torch.cat(rows), nrow=images, padding=1), path)
    print(f"wrote {path}")


TINY_PARTIES = 10_000


def tiny() -> None:
    """10,000 honest parties of a few rows: what each check would quarantine, in summary."""
    overrides = {"preset": "configs/quickstart.yaml", "data-dir": DATA_DIR, "dataset": "mnist", "partitioner": "iid"}
    row = examine_honest(overrides, TINY_PARTIES)
    chances = list(row["label-mix-chance"].values())
    summary = {
        "setting": overrides, "parties": TINY_PARTIES,
        "rows-per-party": [min(row["rows-per-party"]), max(row["rows-per-party"])],
        "validation-rows": [min(row["validation-rows"]), max(row["validation-rows"])],
        "honest-quarantined": row["honest-quarantined"],
        "flags-per-check": {name: {"flagged": len(v), "parties": v[:20]} for name, v in row["flags-per-check"].items()},
        "label-mix-chance-min": min(chances), "label-mix-threshold": row["label-mix-threshold"],
        "norm-spread-judged": sum(n >= plausibility.SPREAD_ROWS for n in row["rows-per-party"]),  # it abstains below
        "energy-ratio": [min(row["energy-ratio"]), max(row["energy-ratio"])],
        "seconds": row["seconds"],
    }
    write("plausibility_tiny", {"command": "benchmarks/plausibility.py --group tiny", **summary})
    print({k: v for k, v in summary.items() if k != "setting"}, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits,mnist,cifar10,cifar10-features")
    parser.add_argument("--group", choices=("faults", "heterogeneity", "tiny"), default="faults")
    parser.add_argument("--quick", action="store_true", help="one setting per data set")
    parser.add_argument("--figure", action="store_true", help="only draw feature skew at strength 1")
    args = parser.parse_args()
    if args.figure:
        skew_figure(PROJECT / "docs" / "results" / "robustness" / "feature-skew-1.png")
        return
    if args.group == "tiny":
        tiny()
        return
    datasets = args.datasets.split(",")
    name = "plausibility" if args.group == "faults" else "plausibility_heterogeneity"
    path = RESULTS / f"{name}.json"
    earlier = json.loads(path.read_text()).get("settings", {}) if path.exists() else {}
    results = {k: v for k, v in earlier.items() if k.split(":")[0] not in datasets}  # other data sets: kept
    for dataset in datasets:
        features = load_settings({**DATASETS[dataset], "data-dir": DATA_DIR})
        if dataset == "cifar10-features" and args.group == "faults" and not cache_path(features, "train").is_file():
            print("cifar10-features: not in the feature cache, skipped", flush=True)
            continue
        if args.group == "heterogeneity":
            for label, overrides, parties in heterogeneity_list(dataset):
                try:
                    row = examine_honest(overrides, parties)
                except (SettingsError, ValueError) as err:  # a partition flwr-datasets cannot draw
                    results[f"{dataset}: {label}"] = {"error": str(err)}
                    print(f"{dataset}: {label}: {err}", flush=True)
                    continue
                results[f"{dataset}: {label}"] = row
                flagged = {k: v for k, v in row["flags-per-check"].items() if v}
                print(f"{dataset}: {label}: quarantined {[q['party'] for q in row['honest-quarantined']]}; "
                      f"flags {flagged or 'none'}; spread/median {min(row['spread-vs-median']):.2f}.."
                      f"{max(row['spread-vs-median']):.2f}; outside/allowed max {max(row['outside-vs-allowed']):.2f}; "
                      f"peers {min(row['peer-alignment'].values(), default=float('nan')):.2f}; "
                      f"label-mix min {min(row['label-mix-chance'].values()):.2g}; "
                      f"spread {min(row['spread-ratio'], default=0):.2f}; "
                      f"rows {min(row['rows-per-party'])}..{max(row['rows-per-party'])}; "
                      f"{row['seconds']['encode'] + row['seconds']['checks']:.0f}s", flush=True)
                write(name, {"command": "benchmarks/plausibility.py --group heterogeneity", **count(results),
                             "per-check": rates(results), "settings": results})
            continue
        median_d = None
        for label, overrides, parties in settings_list(dataset, args.quick):
            row = examine_setting(overrides, parties, median_d)
            median_d = median_d or row["median-D"]
            results[f"{dataset}: {label}"] = row
            caught = {name: f["check"] if f["caught"] else "MISSED" for name, f in row["faults"].items()}
            span = {key: (min(row[key].values(), default=float("nan")), max(row[key].values(), default=float("nan")))
                    for key in ("agreement-shortfall", "structure-excess", "peer-alignment")}
            energy = (min(row["energy-ratio"], default=0), max(row["energy-ratio"], default=0))
            print(f"{dataset}: {label}: honest quarantined {len(row['honest-quarantined'])}; {caught}; "
                  f"energy ratio {energy[0]:.3f}..{energy[1]:.3f}; shortfall {span['agreement-shortfall'][0]:.2f}.."
                  f"{span['agreement-shortfall'][1]:.2f}; structure {span['structure-excess'][0]:.2f}.."
                  f"{span['structure-excess'][1]:.2f}; peers {span['peer-alignment'][0]:.2f}.."
                  f"{span['peer-alignment'][1]:.2f}; label-mix min {min(row['label-mix-chance'].values()):.2g} "
                  f"(threshold {row['label-mix-threshold']:.2g}); spread {min(row['spread-ratio'], default=0):.2f}; "
                  f"clip {row['clipped-rows']}/{row['rows']} rows; "
                  f"{row['seconds']['checks']:.1f}s checks", flush=True)
    summary = count(results)
    print(summary, rates(results))
    if args.group == "faults":
        write(name, {"command": "benchmarks/plausibility.py (per data set: --datasets NAME)", **summary,
                     "per-check": rates(results), "settings": results})


if __name__ == "__main__":
    main()
