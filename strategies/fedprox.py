"""FedProx (and FedAvg = FedProx with mu = 0) through Flower's own strategy.

Flower's FedProx sends `proximal-mu` to the parties; the client adds (mu/2)||w - w_global||^2.
The subclass only adds what a long run needs: a bounded wait instead of Flower's endless one,
a record of parties that dropped (and in which round), and an abort when too few remain.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedProx

from fedsmix import data as datalib
from fedsmix.central import test_accuracy
from fedsmix.models import new_classifier
from fedsmix.space import mixing_shape
from server.context import RunAborted, RunContext
from strategies.common import bytes_summary, split_replies


class ReportingFedProx(FedProx):
    def __init__(self, ctx: RunContext, **kwargs):
        super().__init__(**kwargs)
        self.ctx = ctx
        self.sampled: dict[int, list[int]] = {}
        self.dropped: list[dict] = []
        self.parties_used: set[int] = set()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid) -> Iterable[Message]:
        available = len(list(grid.get_node_ids()))
        if available < self.min_available_nodes:  # Flower would wait forever here
            raise RunAborted(
                f"round {server_round}: {available} parties connected; min-parties is {self.min_available_nodes}"
            )
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.sampled[server_round] = [m.metadata.dst_node_id for m in messages]
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        ok, dropped = split_replies(self.ctx, replies, self.sampled.get(server_round, []))
        self.dropped.extend({**record, "round": server_round} for record in dropped)
        for reply in ok:
            self.parties_used.add(int(reply.content["metrics"]["party"]))
        # replies arrive in whatever order the parties finish; summing in party order makes the
        # aggregate (floating-point addition is not associative) the same in every run
        ok.sort(key=lambda reply: int(reply.content["metrics"]["party"]))
        if len(ok) < self.min_train_nodes:
            lost = "; ".join(f"party {d['party']} (node {d['node']}) at {d['time']}: {d['reason']}" for d in dropped)
            raise RunAborted(
                f"round {server_round}: only {len(ok)} parties replied; min-parties is {self.min_train_nodes}"
                + (f"; dropped {lost}" if lost else ""),
                {"dropped": self.dropped},
            )
        return super().aggregate_train(server_round, ok)


def federate(ctx: RunContext, mu: float, rounds: int) -> tuple[torch.nn.Module, dict]:
    """`rounds` of FedProx (FedAvg: mu = 0) from the run's initial model; the final global model and the report.

    Also the first phase of encoder=mixcon (strategies/mixup_union.py): the split model, trained with the
    MixCon term by the parties' `train_local`, before each party uploads h(x) once.
    """
    s, t0 = ctx.settings, time.perf_counter()
    ctx.nodes()
    num_classes = datalib.spec(s.dataset).num_classes
    model = new_classifier(s, mixing_shape(s), num_classes)
    strategy = ReportingFedProx(
        ctx,
        fraction_train=s.fraction_train,
        fraction_evaluate=0.0,
        min_train_nodes=s.min_parties,
        min_available_nodes=s.min_parties,
        proximal_mu=mu,
    )
    curve: list[dict] = []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        metrics = test_accuracy(model, ctx.test_set(), ctx.device)
        curve.append({"round": server_round, "accuracy": metrics["accuracy"], "seconds": time.perf_counter() - t0})
        return MetricRecord(metrics)

    grid = ctx.counting_grid()
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=rounds,
        timeout=s.reply_timeout,
        train_config=ConfigRecord({"settings": s.to_json(), "mode": "federated"}),
        evaluate_fn=evaluate,
    )
    model.load_state_dict(result.arrays.to_torch_state_dict())
    nodes = sorted(set(ctx.traffic.to_node))
    final = curve[-1]["accuracy"] if curve else None
    return model, {
        "accuracy": final,
        "proximal-mu": mu,
        "rounds": rounds,
        "local-epochs": s.local_epochs,
        "curve": curve,
        "parties-used": len(strategy.parties_used),
        "dropped": strategy.dropped,
        "rejected": [],
        "wall-seconds": time.perf_counter() - t0,
        "train-metrics": {str(k): dict(v) for k, v in result.train_metrics_clientapp.items()},
        **bytes_summary(ctx, nodes),
    }


def run(ctx: RunContext, mu: float | None = None) -> dict:
    s = ctx.settings
    return federate(ctx, s.proximal_mu if mu is None else mu, s.rounds)[1]


def run_fedavg(ctx: RunContext) -> dict:
    return run(ctx, mu=0.0)
