"""FedProx (and FedAvg = FedProx with mu = 0) through Flower's own strategy.

Flower's FedProx sends `proximal-mu` to the parties; the client adds (mu/2)||w - w_global||^2.
The subclass only adds what a long run needs: a bounded wait instead of Flower's endless one,
a record of parties that dropped (and in which round), and an abort when too few remain.

The server side is any of Flower's aggregators (`aggregation`: fedavg, fedmedian, fedtrimmedavg,
krum, multikrum, bulyan; issue 21). FedProx's client side is the proximal term, its server side only
sends mu: `strategy_class` puts Flower's aggregator after FedProx in the class order, so FedProx's
configure_train (mu) and the aggregator's aggregate_train (median, trimmed mean, Krum selection, ...)
both run unchanged. Krum/MultiKrum/Bulyan assume `malicious-parties` = f; MultiKrum averages the n - f
best-scored updates; FedTrimmedAvg cuts `trimmed-beta` at each end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import Bulyan, FedAvg, FedMedian, FedProx, FedTrimmedAvg, Krum, MultiKrum

from fedsmix import data as datalib
from fedsmix.central import test_accuracy
from fedsmix.config import Settings
from fedsmix.models import new_classifier
from fedsmix.space import mixing_shape
from server.context import RunAborted, RunContext
from strategies.common import bytes_summary, split_replies

AGGREGATORS = {
    "fedavg": FedAvg, "fedmedian": FedMedian, "fedtrimmedavg": FedTrimmedAvg,
    "krum": Krum, "multikrum": MultiKrum, "bulyan": Bulyan,
}


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


def strategy_class(aggregation: str) -> type[ReportingFedProx]:
    """ReportingFedProx with Flower's `aggregation` aggregator as its server side."""
    if aggregation not in AGGREGATORS:
        raise ValueError(f"aggregation: unknown {aggregation!r}; allowed: {', '.join(AGGREGATORS)}")
    if aggregation == "fedavg":
        return ReportingFedProx
    aggregator = AGGREGATORS[aggregation]
    return type(f"ReportingFedProx{aggregator.__name__}", (ReportingFedProx, aggregator), {})


def aggregator_options(settings: Settings, sampled: int) -> dict:
    """The aggregator's own parameters (set after construction: FedProx's __init__ passes only the shared ones)."""
    if settings.aggregation == "fedtrimmedavg":
        return {"beta": settings.trimmed_beta}
    if settings.aggregation in ("krum", "bulyan"):
        return {"num_malicious_nodes": settings.malicious_parties}
    if settings.aggregation == "multikrum":
        f = settings.malicious_parties
        return {"num_malicious_nodes": f, "num_nodes_to_select": max(1, sampled - f)}
    return {}


def sampled_parties(settings: Settings, available: int) -> int:
    """How many parties Flower samples each round (FedAvg.configure_train's rule)."""
    return max(int(available * settings.fraction_train), settings.min_parties)


def run(ctx: RunContext, mu: float | None = None) -> dict:
    s, t0 = ctx.settings, time.perf_counter()
    mu = s.proximal_mu if mu is None else mu
    nodes = ctx.nodes()
    num_classes = datalib.spec(s.dataset).num_classes
    model = new_classifier(s, mixing_shape(s), num_classes)
    strategy = strategy_class(s.aggregation)(
        ctx,
        fraction_train=s.fraction_train,
        fraction_evaluate=0.0,
        min_train_nodes=s.min_parties,
        min_available_nodes=s.min_parties,
        proximal_mu=mu,
    )
    for name, value in aggregator_options(s, sampled_parties(s, len(nodes))).items():
        setattr(strategy, name, value)
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
        num_rounds=s.rounds,
        timeout=s.reply_timeout,
        train_config=ConfigRecord({"settings": s.to_json(), "mode": "federated"}),
        evaluate_fn=evaluate,
    )
    nodes = sorted(set(ctx.traffic.to_node))
    final = curve[-1]["accuracy"] if curve else None
    return {
        "accuracy": final,
        "proximal-mu": mu,
        "aggregation": s.aggregation,
        "rounds": s.rounds,
        "local-epochs": s.local_epochs,
        "curve": curve,
        "parties-used": len(strategy.parties_used),
        "dropped": strategy.dropped,
        "rejected": [],
        "wall-seconds": time.perf_counter() - t0,
        "train-metrics": {str(k): dict(v) for k, v in result.train_metrics_clientapp.items()},
        **bytes_summary(ctx, nodes),
    }


def run_fedavg(ctx: RunContext) -> dict:
    return run(ctx, mu=0.0)


class _Reply:
    """What Flower's aggregate_train reads of a reply: its content, and that it is no error."""

    def __init__(self, content: RecordDict):
        self.content = content

    def has_error(self) -> bool:
        return False


def aggregate_states(settings: Settings, replies: list[tuple[dict, int]], previous: dict) -> dict:
    """Flower's `aggregation` aggregator on (state dict, num-examples) pairs in party order, outside a run
    (the Flower-free engine's FedAvg/FedProx with a robust aggregator); `previous` when it declines (Bulyan
    with fewer than 4f + 3 replies)."""
    strategy = AGGREGATORS[settings.aggregation]()
    for name, value in aggregator_options(settings, len(replies)).items():
        setattr(strategy, name, value)
    contents = [
        _Reply(RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": n})}))
        for state, n in replies
    ]
    flower = logging.getLogger("flwr")
    level, _ = flower.level, flower.setLevel(logging.WARNING)  # no per-round INFO lines outside a Flower run
    try:
        arrays, _ = strategy.aggregate_train(0, contents)
    finally:
        flower.setLevel(level)
    if arrays is None:
        return previous
    return {key: value.to(previous[key].dtype) for key, value in arrays.to_torch_state_dict().items()}
