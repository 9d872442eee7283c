"""A toy strategy, as a researcher would add one: one definition plus one registry line.

`toy-one-round`: one round of unweighted model averaging written directly against the Grid; the ClientApp's
"train" handler does the parties' work."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Message, MessageType, RecordDict

from fedsmix import data as datalib
from fedsmix.models import new_classifier
from fedsmix.registry import STRATEGIES
from fedsmix.space import mixing_shape
from fedsmix.trainers import test_accuracy
from strategies.common import Protocol, settings_config, weights_record


def one_round(ctx) -> dict:
    s = ctx.settings
    model = new_classifier(s, mixing_shape(s), datalib.dataset_spec(s).num_classes)
    messages = [Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                    "config": settings_config(ctx, mode="federated", **{"server-round": 1})}),
                        dst_node_id=node, message_type=MessageType.TRAIN) for node in ctx.nodes()]
    replies = ctx.counting_grid().send_and_receive(messages, timeout=s.reply_timeout)
    states = [reply.content["arrays"].to_torch_state_dict() for reply in replies if not reply.has_error()]
    model.load_state_dict({key: torch.stack([state[key].double() for state in states]).mean(0).to(value.dtype)
                           for key, value in model.state_dict().items()})
    return {"accuracy": test_accuracy(model, ctx.test_set(), ctx.device)["accuracy"], "parties-used": len(states),
            **weights_record(model)}


STRATEGIES.add("toy-one-round", Protocol(one_round))
