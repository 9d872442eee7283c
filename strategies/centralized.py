"""Non-private upper bound: the server trains on the raw union of the training split (under feature skew, of
what the parties hold: each party's rows as its acquisition records them).

No party is involved; it answers "what would pooling the data in the clear give?".
"""

from __future__ import annotations

import time

from fedsmix import data as datalib
from fedsmix.party import pooled_data
from fedsmix.space import mixing_shape
from fedsmix.trainers import test_accuracy, train_classifier
from server.context import RunContext
from strategies.common import epoch_hook, weights_record


def run(ctx: RunContext) -> dict:
    s, t0 = ctx.settings, time.perf_counter()
    x, labels = pooled_data(s, len(ctx.nodes()) if s.feature_skew > 0 else 0)
    num_classes = datalib.dataset_spec(s).num_classes
    curve: list[dict] = []
    model, report = train_classifier(
        s, x, datalib.one_hot(labels, num_classes), mixing_shape(s), num_classes, ctx.device, purpose="centralized",
        on_epoch=epoch_hook(ctx, t0, curve),
    )
    metrics = test_accuracy(model, ctx.test_set(), ctx.device)
    return {
        **({"curve": curve} if curve else {}),
        "accuracy": metrics["accuracy"],
        "test-loss": metrics["loss"],
        "train-size": len(labels),
        # the bound is not tuned: it runs its configured setting (no party holds its validation split here)
        "tuning-budget": 1, "tried": [{"lr": s.lr, "epochs": s.epochs}], "chosen": {"lr": s.lr, "epochs": s.epochs},
        "train-seconds": report.seconds,
        "wall-seconds": time.perf_counter() - t0,
        **weights_record(model),
        "dropped": [],
        "rejected": [],
    }
