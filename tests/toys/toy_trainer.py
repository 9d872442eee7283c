"""A toy central trainer, as a researcher would add one: one definition plus one registry line.

`toy-nearest-mean`: the nearest class mean, each class's mean the soft-label-weighted mean of the uploaded rows
(one candidate, no penalty to choose; a linear head, so a party loads and scores it like `ridge`)."""

from __future__ import annotations

from fedsmix.registry import TRAINERS
from fedsmix.trainers import LinearHead, Moments, Trainer, empty_head


def fit(job, names):
    m = Moments.of(job.union.x, job.union.y)
    means = m.mean_x.unsqueeze(1) + m.xy / m.mean_y.clamp_min(1e-12)  # (d, C): sum_i y_ic x_i / sum_i y_ic
    return {"toy-nearest-mean": (LinearHead(means, -0.5 * (means * means).sum(0)), {"rows": m.n})}


TRAINERS.add("toy-nearest-mean", Trainer(candidates=lambda settings: ["toy-nearest-mean"], fit=fit, build=empty_head))
