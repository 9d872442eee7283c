"""One bad party of ten: accuracy clean vs with each fault, for every strategy variant, and whether it was caught.

The quick-start setting (digits, 10 Dirichlet(0.5) parties, tau = 1, 30 epochs; FedAvg/FedProx 10 rounds of
1 local epoch) through the in-process transport (commands/inprocess.py: the real ServerApp and ClientApp, their
plausibility checks and Flower's own aggregators, without Ray). Party 3 is the bad one.
Runs one after another, each ~20-60 s on 2 busy cores; results are appended to
benchmarks/results/robustness.json as they finish, and a finished row is not run again (--fresh to redo).

    .venv/bin/python benchmarks/robustness.py                  # every row (about 40 min on 2 busy cores)
    .venv/bin/python benchmarks/robustness.py --only fedavg     # rows whose variant starts with "fedavg"
    .venv/bin/python benchmarks/robustness.py --families        # fault families by strength, tau 1 and 1e-3
    .venv/bin/python benchmarks/robustness.py --liars           # consistent liars against the class prior, 3 seeds

`--families`: mixup-union as a user gets it (checks on, robust training `clip`), each fault family of
fedsmix/faults.py at several strengths, at tau 1 (digits) and 1e-3 (CIFAR-10 EfficientNet-Lite0 features at 64 px,
20,000 images, 10 epochs: in pixels mixup-union is at chance below tau 0.1): the accuracy it costs and the check that
caught it.

`--liars`: a consistent liar (`relabel-target` 1, `relabel-flip`: party 3 relabels its own data, so its upload, its
validation counts and its votes tell one lie) and a dishonest voter (`vote-invert`: honest but for its selection
answers) against `class-prior` uploads / uniform, each with the pooled and the trimmed `selection-score`, at tau 1
on digits and MNIST (12,000 images, 10 epochs) and at tau 1e-3 / 1e-2 on the CIFAR-10 features, seeds 1-3
(partition, encoding, training): each cell the mean cost against the same seed's clean run of the same arm, with its
95 % interval, and each arm's clean change from the default one. The `fedavg` arm puts the same liar inside
federated training (tuned alike, its clean line its own accuracy), on digits and MNIST.
"""

from __future__ import annotations

import argparse
import json
import time

from common import PROJECT, RESULTS, write

from commands import inprocess
from fedsmix.config import load_settings
from fedsmix.tables import ci, ci_caption, fmt, interval, markdown

BAD, PARTIES = 3, 10
FAULTS = {
    "clean": {},
    "scale 100": {"fault": f"scale:{BAD}", "fault-scale": 100.0},
    "scale 10^4": {"fault": f"scale:{BAD}", "fault-scale": 1e4},
    "garbage": {"fault": f"garbage:{BAD}"},
    "label-flip": {"fault": f"label-flip:{BAD}"},
    "replay": {"fault": f"replay:{BAD}"},
    "sign-flip": {"fault": f"sign-flip:{BAD}"},
}
UPLOAD_FAULTS = ("clean", "scale 100", "scale 10^4", "garbage", "label-flip", "replay")
UPDATE_FAULTS = ("clean", "scale 100", "sign-flip", "label-flip")
MIXUP = {"strategies": "mixup-union"}
VARIANTS = {
    "mixup-union (checks on)": ({**MIXUP, "robust-training": "off"}, UPLOAD_FAULTS),
    "mixup-union (checks off)": ({**MIXUP, "plausibility": False, "robust-training": "off"}, UPLOAD_FAULTS[1:]),
    "mixup-union (checks off, clip)": ({**MIXUP, "plausibility": False, "robust-training": "clip"}, UPLOAD_FAULTS),
    "mixup-union (checks off, trim)": ({**MIXUP, "plausibility": False, "robust-training": "trim"}, UPLOAD_FAULTS),
    **{f"fedavg ({agg})": ({"strategies": "fedavg", "aggregation": agg}, UPDATE_FAULTS)
       for agg in ("fedavg", "fedmedian", "fedtrimmedavg", "krum", "multikrum", "bulyan")},
    **{f"fedprox ({agg})": ({"strategies": "fedprox", "aggregation": agg}, UPDATE_FAULTS[:3])
       for agg in ("fedavg", "fedtrimmedavg")},
}


FAMILIES = {
    "scale x1.5": {"fault": f"scale:{BAD}", "fault-scale": 1.5},
    "scale x3": {"fault": f"scale:{BAD}", "fault-scale": 3.0},
    **{f"scale-report x{k:g}": {"fault": f"scale-report:{BAD}", "fault-scale": k} for k in (0.3, 2.0, 3.0)},
    **{f"shift {k:g}": {"fault": f"shift:{BAD}", "fault-strength": k} for k in (0.5, 1.0, 2.0, 4.0)},
    **{f"partial-garbage {k:g}": {"fault": f"partial-garbage:{BAD}", "fault-strength": k} for k in (0.25, 0.5)},
    "garbage": FAULTS["garbage"],
    **{f"label-noise {k:g}": {"fault": f"label-noise:{BAD}", "fault-strength": k} for k in (0.25, 0.5)},
    "label-flip": FAULTS["label-flip"],
    **{f"label-target {k:g}": {"fault": f"label-target:{BAD}", "fault-strength": k} for k in (0.5, 1.0)},
    "replay": FAULTS["replay"],
}
# tau 1 on the quick start's digits; tau 1e-3 where mixup-union learns at all (in pixels it trains to chance
# below tau = 0.1): CIFAR-10 EfficientNet-Lite0 features at 64 px, a 20,000-image subset, 10 epochs
FEATURES = {"dataset": "cifar10", "backbone": "efficientnet-lite0", "image-size": 64, "train-subset": 20000,
            "epochs": 10}
FAMILY_VARIANTS = {  # overrides, and the faults each runs (the features run only each family's strongest)
    "digits, tau 1": ({"strategies": "mixup-union", "tau": 1.0}, ("clean", *FAMILIES)),
    "cifar10 features, tau 1e-3": ({"strategies": "mixup-union", "tau": 1e-3, **FEATURES},
                                   ("clean", "scale x3", "scale-report x3", "shift 4", "partial-garbage 0.5", "garbage",
                                    "label-noise 0.5", "label-flip", "label-target 0.5", "label-target 1", "replay")),
}

LIAR_SETTINGS = {
    "digits, tau 1": {"strategies": "mixup-union", "tau": 1.0},
    "cifar10 features, tau 1e-3": {"strategies": "mixup-union", "tau": 1e-3, **FEATURES},
    "cifar10 features, tau 1e-2": {"strategies": "mixup-union", "tau": 1e-2, **FEATURES},
    "mnist, tau 1": {"strategies": "mixup-union", "tau": 1.0, "dataset": "mnist", "train-subset": 12000, "epochs": 10},
}
LIARS = {"clean": {}, "relabel-target 1": {"fault": f"relabel-target:{BAD}", "fault-strength": 1.0},
         "relabel-flip": {"fault": f"relabel-flip:{BAD}"}, "vote-invert": {"fault": f"vote-invert:{BAD}"}}
# the rules each liar meets: the class prior the trainers learn, and how the voters' counts score a candidate
ARMS = {
    "class-prior uploads": {"class-prior": "uploads"},
    "class-prior uniform": {"class-prior": "uniform"},
    "class-prior uploads; selection-score trimmed": {"class-prior": "uploads", "selection-score": "trimmed"},
    "class-prior uniform; selection-score trimmed": {"class-prior": "uniform", "selection-score": "trimmed"},
    # the same liar inside federated training, tuned alike (the party trains on its relabelled data): what the lie
    # costs when the parties send no data at all
    "fedavg": {"strategies": "fedavg"},
}
BASE_ARM, SEEDS = "class-prior uploads", (1, 2, 3)
# arms whose clean line is their own accuracy, not a change from the base arm's (the base, another strategy)
OWN_BASELINE = {BASE_ARM, "fedavg"}
# FedAvg reads no tau: it runs once per data set (on the features under the tau 1e-3 setting, the one the liar
# rows' mixup-union arms are read against)
SKIP = {("cifar10 features, tau 1e-2", "fedavg")}
LIAR_VARIANTS = {f"{setting}; {arm}; seed {seed}": ({**base, **rules, "seed": seed}, tuple(LIARS))
                 for setting, base in LIAR_SETTINGS.items() for seed in SEEDS for arm, rules in ARMS.items()
                 if (setting, arm) not in SKIP}


def run_row(variant: str, fault: str) -> dict:
    if variant in LIAR_VARIANTS:
        return run_settings(variant, fault, {**LIAR_VARIANTS[variant][0], **LIARS[fault]})
    if variant in FAMILY_VARIANTS:
        return run_settings(variant, fault, {**FAMILY_VARIANTS[variant][0], **FAMILIES.get(fault, {})})
    overrides, _ = VARIANTS[variant]
    return run_settings(variant, fault, {**overrides, **FAULTS[fault]})


def run_settings(variant: str, fault: str, overrides: dict) -> dict:
    settings = load_settings({"preset": "configs/quickstart.yaml", **overrides,
                              "runs-dir": str(PROJECT / "benchmarks" / "runs"), "run-name": "robustness"})
    t0 = time.perf_counter()
    (name, res), = inprocess.run(settings, PARTIES)["strategies"].items()
    return {
        "variant": variant, "fault": fault, "strategy": name, "accuracy": res["accuracy"],
        "quarantined": res.get("quarantined", []), "parties-used": res.get("parties-used"),
        "trainer": res.get("trainer"), "chosen": res.get("chosen"), "seconds": time.perf_counter() - t0,
    }


def named_bad(row: dict) -> list[dict]:
    """The quarantines of a row that name the bad party; of a replay, either copy (content cannot tell which is the
    original, and the later arrival is the one quarantined)."""
    return [q for q in row["quarantined"] if q["party"] == BAD
            or row["fault"] == "replay" and q["party"] == BAD - 1 and q["check"] == "replay"]


def table(rows: list[dict]) -> str:
    """One line per variant, one column per fault: accuracy % (change from the variant's clean run, points),
    and the check that named the bad party where one did."""
    clean = {r["variant"]: r["accuracy"] for r in rows if r["fault"] == "clean"}
    clean["mixup-union (checks off)"] = clean.get("mixup-union (checks on)")  # no check fires on clean uploads
    cells: dict[str, dict] = {}
    for r in rows:
        base, line = clean.get(r["variant"]), cells.setdefault(r["variant"], {"variant": r["variant"]})
        text = fmt(100 * r["accuracy"], ".2f")
        if r["fault"] != "clean" and base is not None:
            text += f" ({100 * (r['accuracy'] - base):+.2f})"
        named = named_bad(r)
        if named:
            text += f", caught: {named[0]['check']}"
        elif r["fault"] != "clean" and r["variant"] == "mixup-union (checks on)":
            text += ", not caught"
        line[r["fault"]] = text
    if "mixup-union (checks off)" in cells:  # its clean run is the checked one's: no check fires on clean uploads
        checked = cells.get("mixup-union (checks on)", {})
        cells["mixup-union (checks off)"].setdefault("clean", checked.get("clean", "-"))
    columns = [("variant", "strategy (server side)")] + [(f, f) for f in FAULTS]
    return markdown(list(cells.values()), columns, "l" + "r" * len(FAULTS))


def family_table(rows: list[dict]) -> str:
    """One line per fault family and strength, one column per tau: accuracy % (change from that tau's clean run,
    points) and the check that quarantined the bad party, if one did."""
    clean = {r["variant"]: r["accuracy"] for r in rows if r["fault"] == "clean"}
    cells: dict[str, dict] = {}
    for r in rows:
        if r["variant"] not in FAMILY_VARIANTS:
            continue
        line = cells.setdefault(r["fault"], {"fault": r["fault"]})
        text = fmt(100 * r["accuracy"], ".2f")
        if r["fault"] != "clean" and r["variant"] in clean:
            text += f" ({100 * (r['accuracy'] - clean[r['variant']]):+.2f})"
            named = named_bad(r)
            text += f", caught: {named[0]['check']}" if named else ", not caught"
        line[r["variant"]] = text
    columns = [("fault", "fault family, strength")] + [(v, v) for v in FAMILY_VARIANTS]
    return markdown(list(cells.values()), columns, "l" + "r" * len(FAMILY_VARIANTS))


def liar_table(rows: list[dict]) -> str:
    """One line per setting and fault, a column per arm (class prior, selection score): the accuracy the liar costs
    against the same seed's clean run of the same arm (points, mean and 95 % interval over seeds), and who
    quarantined party 3; the clean line gives the accuracy, and each other arm's change from it on the same seed."""
    acc = {(r["variant"], r["fault"]): r for r in rows if r["variant"] in LIAR_VARIANTS}
    lines, counts = [], []
    for setting in LIAR_SETTINGS:
        for fault in LIARS:
            line = {"setting": setting, "fault": fault}
            for arm in ARMS:
                deltas, named, n, own = [], 0, 0, arm in OWN_BASELINE
                for seed in SEEDS:
                    row = acc.get((f"{setting}; {arm}; seed {seed}", fault))
                    if fault == "clean":
                        base = acc.get((f"{setting}; {BASE_ARM}; seed {seed}", "clean")) or {}
                        ref = 0.0 if own else base.get("accuracy")
                        if row and ref is not None:
                            deltas.append(100 * (row["accuracy"] - ref))
                        continue
                    base = acc.get((f"{setting}; {arm}; seed {seed}", "clean"))
                    if row and base:
                        deltas.append(100 * (row["accuracy"] - base["accuracy"]))
                        n += 1
                        named += bool(named_bad(row))
                counts.append(len(deltas))
                text = ci(interval(deltas), ".2f" if own and fault == "clean" else "+.2f")
                if fault != "clean" and n:
                    text += f" (caught {named}/{n})"
                line[arm] = text
            lines.append(line)
    return markdown(lines, [("setting", "setting"), ("fault", "party 3"), *[(a, a) for a in ARMS]],
                    "ll" + "r" * len(ARMS)) + "\n\n" + ci_caption(counts, seeds=SEEDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the variants whose name starts with this")
    parser.add_argument("--fresh", action="store_true", help="forget earlier rows")
    parser.add_argument("--families", action="store_true", help="fault families by strength at tau 1 and 1e-3")
    parser.add_argument("--liars", action="store_true", help="consistent liars against the class prior, 3 seeds")
    args = parser.parse_args()
    path = RESULTS / "robustness.json"
    done = [] if args.fresh or not path.exists() else json.loads(path.read_text()).get("rows", [])
    have = {(r["variant"], r["fault"]) for r in done}
    groups = LIAR_VARIANTS if args.liars else FAMILY_VARIANTS if args.families else VARIANTS
    plan = {v: faults for v, (_, faults) in groups.items()}
    for variant, faults in plan.items():
        if not variant.startswith(args.only):
            continue
        for fault in faults:
            if (variant, fault) in have:
                continue
            row = run_row(variant, fault)
            done.append(row)
            print(f"{variant:34s} {fault:11s} {100 * row['accuracy']:6.2f} % "
                  f"quarantined {[q['party'] for q in row['quarantined']]} ({row['seconds']:.0f} s)", flush=True)
            every = {v: fs for v, (_, fs) in (VARIANTS | FAMILY_VARIANTS | LIAR_VARIANTS).items()}
            order = {(v, f): i for i, (v, fs) in enumerate(every.items()) for f in fs}
            done.sort(key=lambda r: order.get((r["variant"], r["fault"]), 1e9))
            write("robustness", {"command": "benchmarks/robustness.py [--families | --liars]",
                                 "engine": "in-process transport (the fault-by-defence table: the former direct one)",
                                 "bad-party": BAD, "parties": PARTIES, "preset": "configs/quickstart.yaml",
                                 "rows": done, "table": table([r for r in done if r["variant"] in VARIANTS]),
                                 "families-table": family_table(done), "liars-table": liar_table(done)})
    print(liar_table(done) if args.liars else family_table(done) if args.families else table(done))


if __name__ == "__main__":
    main()
