"""Local-only baseline: each party trains the same initial model on its own data alone."""

from __future__ import annotations

import time

from flwr.app import ArrayRecord, Message, MessageType, RecordDict

from fedsmix import data as datalib
from fedsmix import messages as wire
from fedsmix import tuning
from fedsmix.models import new_classifier
from fedsmix.space import mixing_shape
from fedsmix.trainers import test_accuracy
from server.context import RunContext
from strategies.common import bytes_summary, require_parties, settings_config, split_replies


def run(ctx: RunContext) -> dict:
    s, t0 = ctx.settings, time.perf_counter()
    nodes = ctx.nodes()
    num_classes = datalib.dataset_spec(s).num_classes
    model = new_classifier(s, mixing_shape(s), num_classes)
    initial = ArrayRecord(model.state_dict())
    config = settings_config(ctx, **{wire.MODE: "local-only"})
    messages = [
        Message(RecordDict({wire.ARRAYS: initial, wire.CONFIG: config}), dst_node_id=node,
                message_type=MessageType.TRAIN)
        for node in nodes
    ]
    accuracy, on_cuda, replies, chosen = {}, 0, [], {}
    tried = tuning.draw(s, "local-only")
    for reply in ctx.stream_replies(messages):  # each party's model is scored (and reported) as it arrives
        replies.append(reply)
        if reply.has_error():
            continue  # reported with the dropped parties below
        metrics = reply.content[wire.METRICS]
        party = int(metrics[wire.PARTY])
        on_cuda += int(metrics.get("on-cuda", 0))
        index = int(metrics.get("chosen", 0))  # each party chose alone, on its own validation split
        chosen[party] = {**tried[index], **({"validation-accuracy": metrics[f"tried-{index}-accuracy"]}
                                            if f"tried-{index}-accuracy" in metrics else {})}
        model.load_state_dict(reply.content[wire.ARRAYS].to_torch_state_dict())
        accuracy[party] = test_accuracy(model, ctx.test_set(), ctx.device)["accuracy"]
        ctx.progress.emit("party", party=party, done=len(accuracy), of=len(nodes), accuracy=accuracy[party],
                          **{"train-seconds": metrics.get("train-seconds"), "train-loss": metrics.get("train-loss")})
    _, dropped = split_replies(ctx, replies, nodes)
    require_parties(ctx, len(accuracy), "local-only", dropped=dropped)
    values = list(accuracy.values())
    return {
        "accuracy": accuracy.get(0),  # the paper's baseline is party 0
        "party0-accuracy": accuracy.get(0),
        "per-party-accuracy": {str(p): a for p, a in sorted(accuracy.items())},
        "mean-party-accuracy": sum(values) / len(values),
        "min-party-accuracy": min(values),
        "max-party-accuracy": max(values),
        "tuning-budget": s.tuning_budget,
        "tried": tried,
        "chosen-per-party": {str(p): c for p, c in sorted(chosen.items())},
        "parties-used": len(accuracy),
        "parties-on-cuda": on_cuda,
        "dropped": dropped,
        "rejected": [],
        "wall-seconds": time.perf_counter() - t0,
        **bytes_summary(ctx, nodes),
    }
