"""FedProx (and FedAvg = FedProx with mu = 0) through Flower's own strategy.

Flower's FedProx sends `proximal-mu` to the parties; the client adds (mu/2)||w - w_global||^2.
The subclass only adds what a long run needs: a bounded wait instead of Flower's endless one,
a record of parties that dropped (and in which round), and an abort when too few remain.

The server side is any of Flower's aggregators (`aggregation`: fedavg, fedmedian, fedtrimmedavg,
krum, multikrum, bulyan). FedProx's client side is the proximal term, its server side only
sends mu: `strategy_class` puts Flower's aggregator after FedProx in the class order, so FedProx's
configure_train (mu) and the aggregator's aggregate_train (median, trimmed mean, Krum selection, ...)
both run unchanged. Krum/MultiKrum/Bulyan assume `malicious-parties` = f; MultiKrum averages the n - f
best-scored updates; FedTrimmedAvg cuts `trimmed-beta` at each end.
Active defences with a part on the server (fedsmix/defences.py) wrap the strategy; those parts are written
against Flower's strategy API, so they are registered here, under the defence's name (`SERVER_SIDES`). With
`dp-fedavg` it runs inside Flower's own DP wrapper (strategies/dp_fedavg.py): every sampled party must then
reply, and the rounds it aggregated are the releases the accountant counts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import Bulyan, FedAvg, FedMedian, FedProx, FedTrimmedAvg, Krum, MultiKrum, Strategy

from fedsmix import data as datalib
from fedsmix import messages as wire
from fedsmix import tuning
from fedsmix.config import Settings
from fedsmix.defences import active
from fedsmix.models import new_classifier
from fedsmix.registry import Registry
from fedsmix.space import mixing_shape
from fedsmix.trainers import sample_parties, test_accuracy
from server.context import RunAborted, RunContext
from server.plausibility import validation_rows
from server.validation import vote_problem
from strategies import dp_fedavg
from strategies.common import bytes_summary, split_replies, weights_record

AGGREGATORS = {
    "fedavg": FedAvg, "fedmedian": FedMedian, "fedtrimmedavg": FedTrimmedAvg,
    "krum": Krum, "multikrum": MultiKrum, "bulyan": Bulyan,
}


class ReportingFedProx(FedProx):
    def __init__(self, ctx: RunContext, dp_sample: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.ctx = ctx
        self.dp_sample = dp_sample  # DP-FedAvg: the noise is sized for exactly this many parties each round
        self.sampled: dict[int, list[int]] = {}
        self.dropped: list[dict] = []
        self.parties_used: set[int] = set()
        self.released: list[int] = []  # rounds whose aggregate went out
        self.answered: dict[int, int] = {}  # round -> parties whose update was aggregated
        self.train_loss: dict[int, float] = {}  # round -> the aggregated parties' mean local training loss
        self.voters: list[int] = []  # tuned runs: the parties that score each round's model on their validation
        self.validation: dict[int, float] = {}  # round -> pooled validation accuracy of its global model
        self.vote_splits: dict[int, set[int]] = {}  # party -> the validation split size of its first answer
        self.train_rows: dict[int, int] = {}  # party -> the training rows its updates report (num-examples)
        self.refused_votes: list[dict] = []  # answers not counted, with the party and the reason

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid) -> Iterable[Message]:
        available = len(list(grid.get_node_ids()))
        if available < self.min_available_nodes:  # Flower would wait forever here
            raise RunAborted(
                f"round {server_round}: {available} parties connected; min-parties is {self.min_available_nodes}"
            )
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if self.dp_sample and len(messages) != self.dp_sample:
            raise RunAborted(f"round {server_round}: sampled {len(messages)} parties, DP-FedAvg's noise is sized for "
                             f"{self.dp_sample}")
        self.sampled[server_round] = [m.metadata.dst_node_id for m in messages]
        return messages

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid) -> Iterable[Message]:
        """Tuned runs only: the round's global model to the seeded voters (`vote-parties`), to score on their own
        validation splits."""
        if not self.voters:
            return []
        nodes = {party: node for node, party in self.ctx.node_party.items()}
        config["server-round"] = server_round
        record = RecordDict({"arrays": arrays, "config": config})
        return [Message(record, dst_node_id=nodes[p], message_type=MessageType.EVALUATE)
                for p in self.voters if p in nodes]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The parties' counts scored by the one selection rule (`tuning.score`: pooled correct / n, or
        trimmed); a party that refuses or fails does not vote, nor one whose counts are not whole, exceed n, or
        are of another split than the one its training rows imply (`validation_rows` of its reported num-examples;
        a party that has not trained yet: its first answer's), listed in `refused_votes`."""
        counts = []
        for reply in replies:
            if reply.has_error():
                continue
            m, node = reply.content[wire.METRICS], reply.metadata.src_node_id
            party = self.ctx.node_party.get(node, int(m.get(wire.PARTY, -1)))
            vote = (m.get(wire.CORRECT), m.get(wire.COUNT))
            sizes = (validation_rows(self.train_rows[party], self.ctx.settings.validation_fraction)
                     if party in self.train_rows else self.vote_splits.get(party))
            if (problem := vote_problem({"model": vote}, sizes)) is not None:
                self.refused_votes.append({"round": server_round, "party": party, "field": problem[0],
                                           "reason": problem[1]})
                self.ctx.progress.emit("vote-refused", **self.refused_votes[-1])
                continue
            self.vote_splits.setdefault(party, {int(vote[1])})  # held to the split of its first answer
            counts.append({"correct": int(vote[0]), "n": int(vote[1])})
        score = tuning.score(counts, self.ctx.settings.selection_score)
        if math.isnan(score):
            return None
        self.validation[server_round] = score
        return MetricRecord({"validation-accuracy": self.validation[server_round], "voters": len(counts)})

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        ok, dropped = split_replies(self.ctx, replies, self.sampled.get(server_round, []))
        self.dropped.extend({**record, "round": server_round} for record in dropped)
        for reply in ok:
            self.parties_used.add(int(reply.content["metrics"]["party"]))
            self.train_rows[int(reply.content["metrics"]["party"])] = int(reply.content["metrics"]["num-examples"])
        # replies arrive in whatever order the parties finish; summing in party order makes the
        # aggregate (floating-point addition is not associative) the same in every run
        ok.sort(key=lambda reply: int(reply.content["metrics"]["party"]))
        if self.dp_sample and len(ok) < len(self.sampled.get(server_round, [])):
            raise RunAborted(
                f"round {server_round}: {len(ok)} of {len(self.sampled[server_round])} sampled parties replied; "
                "DP-FedAvg's noise is sized for all of them, so no aggregate is released",
                {"dropped": self.dropped},
            )
        self.answered[server_round] = len(ok)
        if len(ok) < self.min_train_nodes:
            lost = "; ".join(f"party {d['party']} (node {d['node']}) at {d['time']}: {d['reason']}" for d in dropped)
            raise RunAborted(
                f"round {server_round}: only {len(ok)} parties replied; min-parties is {self.min_train_nodes}"
                + (f"; dropped {lost}" if lost else ""),
                {"dropped": self.dropped},
            )
        arrays, metrics = super().aggregate_train(server_round, ok)
        if arrays is not None:
            self.released.append(server_round)
        if metrics is not None and "train-loss" in metrics:
            self.train_loss[server_round] = float(metrics["train-loss"])
        return arrays, metrics


@dataclass(frozen=True)
class ServerSide:
    """The part of a defence that runs on the server (`Defence.server`), around the run's strategy."""

    wrap: Callable[[Strategy, Settings, int], Strategy]  # (strategy, settings, parties sampled a round) -> strategy
    report: Callable[[Settings, int, int, list[int]], dict]  # (settings, sampled, parties, released rounds) -> block
    exact: bool = False  # it releases the unweighted mean of exactly the sampled parties (each weighs 1, all reply)


SERVER_SIDES: Registry[ServerSide] = Registry("server side of a defence", "defences", home="strategies")
SERVER_SIDES.add("dp-fedavg", ServerSide(dp_fedavg.wrap, dp_fedavg.report, exact=True))


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


def federate(ctx: RunContext, mu: float, rounds: int, label: str = "", settings: Settings | None = None,
             voters: list[int] | None = None, phase: str = "", save: bool = True) -> tuple[torch.nn.Module, dict]:
    """`rounds` of FedProx (FedAvg: mu = 0) from the run's initial model; the global model and the report.
    The global model is saved as global-model-<label>.pt (default: fedprox or fedavg) for the attacker.

    `settings`: one setting a tuned run tries (default: the run's). With `voters`, each round's global model
    is scored by those parties on their validation splits, and the model kept is the round they score best
    (its round is `stopped-at`); without, the last round's. `save=False`: no model file (a tuned run saves only
    the setting it keeps).

    Also the first phase of encoder=mixcon (strategies/mixup_union.py): the split model, trained with the
    MixCon term by the parties' `train_local`, before each party uploads h(x) once.
    """
    s, t0 = settings or ctx.settings, time.perf_counter()
    parties = len(ctx.nodes())
    num_classes = datalib.dataset_spec(s).num_classes
    model = new_classifier(s, mixing_shape(s), num_classes)
    defences = active(s)
    servers = [(name, SERVER_SIDES[name]) for name, defence in defences if defence.server]
    exact = any(side.exact for _, side in servers)
    sampled = dp_fedavg.sampled_per_round(s, parties)
    strategy = strategy_class(s.aggregation)(
        ctx,
        dp_sample=sampled if exact else 0,
        fraction_train=s.fraction_train,
        fraction_evaluate=0.0,
        min_train_nodes=s.min_parties,
        min_available_nodes=s.min_parties,
        proximal_mu=mu,
        weighted_by_key="equal-weight" if exact else "num-examples",
    )
    for name, value in aggregator_options(s, sampled).items():
        setattr(strategy, name, value)
    strategy.voters = list(voters or [])
    kept: dict = {}  # tuned: the state of the round the voters score best so far
    runner = strategy
    for _, side in servers:
        runner = side.wrap(runner, s, sampled)
    curve: list[dict] = []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        metrics = test_accuracy(model, ctx.test_set(), ctx.device)  # reported; the choice reads `validation`
        elapsed = time.perf_counter() - t0
        point = {"round": server_round, "accuracy": metrics["accuracy"], "seconds": elapsed}
        if (score := strategy.validation.get(server_round)) is not None:
            point["validation-accuracy"] = score
            if not kept or score > kept["score"]:
                state = {k: v.clone() for k, v in model.state_dict().items()}
                kept.update(score=score, round=server_round, state=state)
        curve.append(point)
        ctx.progress.emit(
            "round", round=server_round, rounds=rounds, accuracy=metrics["accuracy"], elapsed=round(elapsed, 3),
            answered=strategy.answered.get(server_round), sampled=len(strategy.sampled.get(server_round, [])) or None,
            eta=round(elapsed / server_round * (rounds - server_round), 3) if server_round else None,
            **({"train-loss": strategy.train_loss[server_round]} if server_round in strategy.train_loss else {}),
            **({"validation-accuracy": score} if score is not None else {}),
            **({"phase": phase or label} if phase or label else {}),  # mixcon-split's rounds, a tuned setting
        )
        return MetricRecord(metrics)

    grid = ctx.counting_grid()
    result = runner.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=rounds,
        timeout=s.reply_timeout,
        train_config=ConfigRecord({"settings": s.to_json(), "mode": "federated"}),
        evaluate_config=ConfigRecord({"settings": s.to_json()}),
        evaluate_fn=evaluate,
    )
    stopped = kept.get("round", rounds)
    model.load_state_dict(kept["state"] if kept else result.arrays.to_torch_state_dict())
    nodes = sorted(set(ctx.traffic.to_node))
    final = next((p["accuracy"] for p in curve if p["round"] == stopped), None)
    path = ctx.run_dir / f"global-model-{label or ('fedprox' if mu > 0 else 'fedavg')}.pt"
    if save:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)  # a trained round to attack
    train_metrics = {str(k): dict(v) for k, v in result.train_metrics_clientapp.items()}
    last = train_metrics[max(train_metrics, key=int)] if train_metrics else {}  # the parties' mean, last round
    extra = {name: side.report(s, sampled, parties, strategy.released) for name, side in servers}
    for name, defence in defences:
        if defence.results is not None and (block := defence.results(s, last)) is not None:
            extra[name] = block
    return model, {
        "accuracy": final,
        "proximal-mu": mu,
        "aggregation": s.aggregation,
        "rounds": rounds,
        "stopped-at": stopped,
        "client-lr": s.client_lr,
        "local-epochs": s.local_epochs,
        "curve": curve,
        "parties-used": len(strategy.parties_used),
        "dropped": strategy.dropped,
        "rejected": [],
        "refused-votes": strategy.refused_votes,
        "wall-seconds": time.perf_counter() - t0,
        "train-metrics": train_metrics,
        "local-train-seconds": sum(float(m.get("train-seconds", 0.0)) for m in train_metrics.values()),
        **({"global-model": str(path)} if save else {}),
        **weights_record(model),
        **extra,
        **bytes_summary(ctx, nodes),
    }


def tuned(ctx: RunContext, strategy: str) -> dict:
    """FedAvg/FedProx under the tuning budget (fedsmix/tuning.py): each drawn setting (client lr, local epochs,
    FedProx's mu) federated from the same initial model, each round's model scored by the voters on their
    validation splits; the setting and round they score best is the result (its global model saved for the
    attacker). Budget 1: the configured setting's last round, no evaluation round."""
    s = ctx.settings
    tried = tuning.draw(s, strategy)
    mu = (lambda settings: settings.proximal_mu) if strategy == "fedprox" else (lambda settings: 0.0)
    if len(tried) == 1:
        return {**federate(ctx, mu(s), s.rounds)[1], **tuning.report(s, tried, 0)}
    voters = sample_parties(ctx.node_party.values(), s.vote_parties, s.seed, "vote")
    results, models, t0 = [], [], time.perf_counter()
    for i, setting in enumerate(tried):
        settings = tuning.apply(s, setting)
        model, result = federate(ctx, mu(settings), s.rounds, settings=settings, voters=voters,
                                 phase=f"setting {i + 1}/{len(tried)}", save=False)
        results.append(result)
        models.append(model)
    scores = {i: max((p.get("validation-accuracy", -1.0) for p in r["curve"]), default=-1.0)
              for i, r in enumerate(results)}
    best = max(scores, key=lambda i: (scores[i], -i))
    path = ctx.run_dir / f"global-model-{strategy}.pt"
    torch.save({k: v.detach().cpu() for k, v in models[best].state_dict().items()}, path)
    return {
        **results[best],
        **tuned_privacy(tuning.apply(s, tried[best]), results, best),  # the kept setting's clipping norm
        **tuning.report(s, tried, best),
        "validation-accuracy": scores[best],
        "tried-validation-accuracy": [scores[i] for i in range(len(tried))],
        "tried-accuracy": [r["accuracy"] for r in results],  # reported, never read to choose
        "global-model": str(path),
        "wall-seconds": time.perf_counter() - t0,
        **bytes_summary(ctx, sorted(set(ctx.traffic.to_node))),
    }


def tuned_privacy(settings: Settings, results: list[dict], kept: int = 0) -> dict:
    """A differential-privacy guarantee covers every setting tried: each trained on the parties' data. DP-FedAvg's
    accountant is run again over all their releases; DP-SGD's per-setting epsilons add up (sequential
    composition, an upper bound). The rest of each block (clipping norm, noise) is the kept setting's:
    `settings` are its settings, `kept` its index."""
    out = {}
    for name, _ in active(settings):
        blocks = [r[name] for r in results if isinstance(r.get(name), dict) and "epsilon" in r[name]]
        if len(blocks) != len(results):
            continue
        one = blocks[kept]
        if name in SERVER_SIDES:
            releases = sum(b["releases"] for b in blocks)
            block = SERVER_SIDES[name].report(settings, one["sampled-per-round"], one["parties"], list(range(releases)))
            how = f"the accountant over the {releases} releases of all {len(results)} settings tried"
        else:
            block = {**one, "epsilon": sum(float(b["epsilon"]) for b in blocks if b["epsilon"] is not None)}
            how = f"the sum over the {len(results)} settings tried (sequential composition, an upper bound)"
        out[name] = {**block, "epsilon-one-setting": one["epsilon"], "tuning-composition": how}
    return out


def run(ctx: RunContext) -> dict:
    return tuned(ctx, "fedprox")


def run_fedavg(ctx: RunContext) -> dict:
    return tuned(ctx, "fedavg")


class _Reply:
    """What Flower's aggregate_train reads of a reply: its content, and that it is no error."""

    def __init__(self, content: RecordDict):
        self.content = content

    def has_error(self) -> bool:
        return False


def aggregate_states(settings: Settings, replies: list[tuple[dict, int]], previous: dict) -> dict:
    """Flower's `aggregation` aggregator on (state dict, num-examples) pairs in party order, outside a run (what
    a round's aggregate would be, for tests and benchmarks); `previous` when it declines (Bulyan with fewer than
    4f + 3 replies)."""
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
