"""Can the server bound one party's influence from the uploads and the parties' validation scores? Two audits.

Every party's upload is prepared exactly as the ClientApp does (fedsmix.party.prepare_upload) and every party's
clean validation split loaded as it keeps it (fedsmix.party.load_partition(..., "validation")); no Flower.

1. Leave one party out: the closed-form `lda` head (fedsmix.trainers.linear_heads, the union's moments without
   party p) against the head on the whole union, scored on the *other* parties' validation splits (what the
   `validate` round can return: counts). Effect = accuracy without p minus with p, in points, pooled and
   class-balanced (the balanced head drops the log-prior term, so that a party holding unusual classes does not
   look harmful because the others' validation splits lack them), with a McNemar z. A party whose removal helps
   the others is a candidate for a lower weight.
2. Class means: each party's class means recovered from its soft labels (as `lda` does for the union) and its
   acquisition offset removed, against the other parties' class means, noise bias subtracted (the reported radii
   give it): the share of a party's rows whose class mean is nearest to another class's mean.

Settings: digits at tau 1 and CIFAR-10 EfficientNet-Lite0 features (64 px, 20,000 images) at tau 1e-3, Dirichlet
0.5, 10 parties; clean, every party honest under its own acquisition (feature skew 1; party 3 the darkest),
party 3 dishonest (label-target 1, label-flip).
Results in benchmarks/results/influence.json; about 4 min on 2 cores with the feature cache warm.

3. `--caps`: rules that would bound one party's influence on the class statistics, on the closed-form `lda@1` head
   (what `trainer: auto` chooses there) at tau 1e-3 on the CIFAR-10 features, one seed: each party's label mass in
   a class capped (at the second-largest party's, `top-2`; at 30 % of the class, `share-0.3`), and the log-prior
   term replaced by the median or the trimmed mean (largest and smallest party dropped) of the parties' class
   shares, or a uniform prior. Scored on the test split, as an analysis of the rules, never to choose among them in
   a run. Cases: clean, every party under its own acquisition (honest), party 3 a consistent liar (relabel-target 1,
   relabel-flip). Results in benchmarks/results/influence_caps.json, about 3 min.

    .venv/bin/python benchmarks/influence.py [--caps]
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
import torch
from common import DATA_DIR, PROJECT, write

from fedsmix.config import load_settings
from fedsmix.party import load_partition, prepare_upload
from fedsmix.space import load_test
from fedsmix.trainers import Moments, linear_heads, union_statistics

PARTIES, BAD = 10, 3
FEATURES = {"dataset": "cifar10", "backbone": "efficientnet-lite0", "image-size": 64, "train-subset": 20000}
CASES = {"clean": {}, "feature skew 1 (honest)": {"feature-skew": 1.0},
         "label-target 1": {"fault": f"label-target:{BAD}", "fault-strength": 1.0},
         "label-flip": {"fault": f"label-flip:{BAD}"}}
SETTINGS = {"digits, tau 1": {"tau": 1.0}, "cifar10 features, tau 1e-3": {**FEATURES, "tau": 1e-3}}
GAMMA = 100.0  # the lda penalty: near the nearest class mean, the steadiest head at small tau


def leave_one_out(settings, uploads, validation) -> dict[str, list[tuple[float, float]]]:
    """(effect in points, McNemar z) of leaving each party out, pooled and class-balanced, on the others' splits."""
    x = [np.asarray(u.arrays["x"], dtype=np.float32) for u in uploads]
    y = [u.arrays["y"] for u in uploads]
    dim = x[0][0].size
    heads, priors = {}, {}
    for leave in [None, *range(PARTIES)]:
        keep = [p for p in range(PARTIES) if p != leave]
        m = Moments.of(np.concatenate([x[p] for p in keep]), np.concatenate([y[p] for p in keep]))
        noise, mix = union_statistics([uploads[p].metrics for p in keep], dim, settings.encoder)
        heads[leave] = linear_heads("lda", m, (GAMMA,), noise, mix)[f"lda@{GAMMA:g}"]
        priors[leave] = m.mean_y.float().clamp_min(1e-12).log()
    out = {}
    for balanced in (False, True):
        right = {}
        with torch.no_grad():
            for leave, head in heads.items():
                shift = priors[leave] if balanced else 0.0
                right[leave] = [(head(v.x.float()) - shift).argmax(1) == v.labels for v in validation]
        rows = []
        for p in range(PARTIES):
            k = validation[0].num_classes
            better, worse, n = torch.zeros(k), torch.zeros(k), torch.zeros(k)
            for q in (q for q in range(PARTIES) if q != p):
                with_p, without_p, labels = right[None][q], right[p][q], validation[q].labels
                better += torch.bincount(labels[without_p & ~with_p], minlength=k)
                worse += torch.bincount(labels[with_p & ~without_p], minlength=k)
                n += torch.bincount(labels, minlength=k)
            if balanced:
                held = n > 0
                effect = float(((better - worse)[held] / n[held]).mean())
                var = float(((better + worse)[held] / n[held] ** 2).sum()) / int(held.sum()) ** 2
            else:
                effect = float((better - worse).sum() / n.sum())
                var = float((better + worse).sum()) / float(n.sum()) ** 2
            rows.append((round(100 * effect, 2), round(effect / math.sqrt(var), 2) if var else 0.0))
        out["balanced" if balanced else "pooled"] = rows
    return out


def class_means(settings, uploads, min_weight: float = 20.0) -> list[float]:
    """Per party: the share of its rows whose class mean is nearest to another class's mean of the others."""
    x = [torch.from_numpy(np.asarray(u.arrays["x"], dtype=np.float64)).flatten(1) for u in uploads]
    y = [torch.from_numpy(u.arrays["y"]).double() for u in uploads]
    dim = x[0].shape[1]
    noise, mix = union_statistics([u.metrics for u in uploads], dim, settings.encoder)

    def means(xs, ys):  # class means from soft labels, and the per-coordinate variance of each estimate
        weight = ys.sum(0).clamp_min(1e-9)
        offset = (xs - xs.mean(0)).T @ (ys - ys.mean(0)) / weight / mix
        return xs.mean(0).unsqueeze(1) + offset, noise * (ys * ys).sum(0) / weight**2 / mix**2, weight

    shares = []
    for p in range(PARTIES):
        others = [q for q in range(PARTIES) if q != p]
        mine, var_mine, weight = means(x[p], y[p])
        theirs, var_theirs, _ = means(torch.cat([x[q] for q in others]), torch.cat([y[q] for q in others]))
        mine = mine - (x[p].mean(0) - theirs @ y[p].mean(0)).unsqueeze(1)  # the party's acquisition offset
        dist = ((mine.unsqueeze(2) - theirs.unsqueeze(1)) ** 2).sum(0) - dim * (var_mine.unsqueeze(1) + var_theirs)
        held = weight > min_weight
        wrong = (dist.argmin(1) != torch.arange(len(weight))) & held
        shares.append(round(float(weight[wrong].sum() / weight[held].sum()), 3))
    return shares


CAP_CASES = {"clean": {}, "feature skew 1 (honest)": {"feature-skew": 1.0},
             "relabel-target 1": {"fault": f"relabel-target:{BAD}", "fault-strength": 1.0},
             "relabel-flip": {"fault": f"relabel-flip:{BAD}"}}
MASS_CAPS = ("none", "top-2", "share-0.3")
PRIORS = ("pooled", "median", "trimmed", "uniform")


def capped_mass(mass: np.ndarray, rule: str) -> np.ndarray:
    """(parties, C) label mass -> the factor each party's mass in each class is multiplied by under `rule`."""
    factor = np.ones_like(mass)
    for c in range(mass.shape[1]):
        m = mass[:, c]
        if rule == "top-2":  # no party above the second-largest holder of the class
            cap = np.sort(m)[-2]
        elif rule == "share-0.3":  # water-filling: the top k parties at c = 0.3 (c k + the rest's mass)
            order, cap = np.sort(m)[::-1], np.inf
            for k in range(1, len(m)):
                if 1 - 0.3 * k <= 0 or order[0] <= 0.3 * m.sum():
                    break
                level = 0.3 * order[k:].sum() / (1 - 0.3 * k)
                if order[k] <= level < order[k - 1]:
                    cap = level
                    break
        else:
            continue
        factor[:, c] = np.where(m > cap, cap / np.maximum(m, 1e-12), 1.0)
    return factor


def robust_prior(mass: np.ndarray, rule: str) -> np.ndarray:
    shares = mass / mass.sum(axis=1, keepdims=True)
    prior = {"pooled": lambda: mass.sum(0), "median": lambda: np.median(shares, 0),
             "trimmed": lambda: np.sort(shares, 0)[1:-1].mean(0), "uniform": lambda: np.ones(mass.shape[1])}[rule]()
    return prior / prior.sum()


def caps() -> None:
    base = {"preset": "configs/quickstart.yaml", "data-dir": DATA_DIR, **FEATURES, "tau": 1e-3}
    test_x, test_y = load_test(load_settings(base))
    rows = []
    for case, fault in CAP_CASES.items():
        t0 = time.perf_counter()
        settings = load_settings({**base, **fault})
        uploads = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
        x = np.concatenate([np.asarray(u.arrays["x"], dtype=np.float32).reshape(len(u.arrays["x"]), -1)
                            for u in uploads])
        ys = [u.arrays["y"].astype(np.float64) for u in uploads]
        mass = np.stack([y.sum(0) for y in ys])
        noise, mix = union_statistics([u.metrics for u in uploads], x.shape[1], settings.encoder)
        row = {"case": case}
        for cap in MASS_CAPS:
            factor = capped_mass(mass, cap)
            m = Moments.of(x, np.concatenate([y * f for y, f in zip(ys, factor)]))
            head = linear_heads("lda", m, (1.0,), noise, mix)["lda@1"]
            learned = m.mean_y.clamp_min(1e-12).log()
            with torch.no_grad():
                logits = head(test_x.float()).double()
            for prior in PRIORS:
                shift = torch.from_numpy(np.log(robust_prior(mass * factor, prior))) - learned
                row[f"{cap}, {prior}"] = round(100 * float(((logits + shift).argmax(1) == test_y).float().mean()), 2)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(row, flush=True)
        write("influence_caps", {"command": "benchmarks/influence.py --caps", "head": "lda@1", "bad-party": BAD,
                                 "parties": PARTIES, "setting": {**FEATURES, "tau": 1e-3}, "seed": 0, "rows": rows})


def main() -> None:
    rows = []
    for setting, base in SETTINGS.items():
        for case, fault in CASES.items():
            t0 = time.perf_counter()
            settings = load_settings({"preset": "configs/quickstart.yaml", "data-dir": DATA_DIR, **base, **fault})
            uploads = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
            validation = [load_partition(settings, p, PARTIES, "validation") for p in range(PARTIES)]
            row = {"setting": setting, "case": case, **leave_one_out(settings, uploads, validation),
                   "wrong-class-share": class_means(settings, uploads),
                   "validation-rows": sum(len(v.labels) for v in validation)}
            row["seconds"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(f"{setting:28s} {case:24s} pooled {row['pooled']}\n{'':53s} balanced {row['balanced']}\n"
                  f"{'':53s} wrong-class {row['wrong-class-share']}", flush=True)
            write("influence", {"command": "benchmarks/influence.py", "bad-party": BAD, "parties": PARTIES,
                                "head": f"lda@{GAMMA:g}", "preset": "configs/quickstart.yaml", "rows": rows})


if __name__ == "__main__":
    import os

    os.chdir(PROJECT)
    caps() if "--caps" in sys.argv else main()
