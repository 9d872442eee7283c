"""ClientApp: each party encodes its partition once (query "encode"), or trains locally.

Handlers only parse the message, call the party module (`fedsmix.party`) and build the reply.
The reply to "encode" carries the encoded inputs, soft labels and a few scalars; never indices,
the permutation, the seed or a raw sample.
"""

from __future__ import annotations

import hashlib
import sys

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable

from fedsmix import messages as wire
from fedsmix import tuning
from fedsmix.config import Settings
from fedsmix.defences import active
from fedsmix.device import select_device
from fedsmix.faults import maybe_fail, vote
from fedsmix.party import (
    load_partition,
    personalize,
    prepare_upload,
    score_candidates,
    score_model,
    train_local,
    tune_local,
)
from fedsmix.progress import Progress
from fedsmix.space import returned_test
from fedsmix.trainers import test_accuracy
from fedsmix.training import warm_up

app = ClientApp()
CLIPPING_NORM = "clipping_norm"  # the key Flower's DifferentialPrivacyClientSideFixedClipping sends


def dp_clipping_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's `fixedclipping_mod` on the rounds whose server wraps its strategy in client-side DP clipping
    (their config carries the clipping norm); local-only training passes through untouched."""
    config = msg.content.config_records.get("config")
    if config is not None and CLIPPING_NORM in config:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


def _settings(msg: Message, context: Context) -> tuple[Settings, int, int]:
    """Settings come from the server (one place reads the run config); the data dir may be the node's own."""
    settings = Settings.from_json(str(msg.content[wire.CONFIG][wire.SETTINGS]))
    node = context.node_config
    if node.get("data-dir"):
        settings = settings.replace(data_dir=str(node["data-dir"]))
    return settings, int(node["partition-id"]), int(node["num-partitions"])


def _reply(msg: Message, metrics: dict, **records) -> Message:
    numbers = MetricRecord({k: v for k, v in metrics.items() if isinstance(v, int | float) or _numbers(v)})
    return Message(RecordDict({**records, wire.METRICS: numbers}), reply_to=msg)


def _numbers(value) -> bool:
    """A non-empty list of numbers of one type (what a MetricRecord holds besides a number)."""
    return isinstance(value, list) and bool(value) and len({type(v) for v in value}) == 1 \
        and isinstance(value[0], int | float)


def ray_node() -> dict[str, str]:
    """The Ray node this ClientApp runs on, when the simulation engine placed it in a Ray actor (else nothing:
    a SuperNode of the deployment runtime says nothing about its machine)."""
    ray = sys.modules.get("ray")  # never import Ray here: a SuperNode of the deployment runtime has none
    if ray is not None and ray.is_initialized():
        return {"ray-node-id": ray.get_runtime_context().get_node_id()}
    return {}


@app.query(wire.HELLO)
def hello(msg: Message, context: Context) -> Message:
    """Say which party this node is (and, under Ray, on which Ray node it runs); load the partition and warm up
    training now (a cold start happens here, within start-timeout, not in a phase timed by reply-timeout)."""
    settings, party, num_parties = _settings(msg, context)
    part = load_partition(settings, party, num_parties)
    warm_up()
    where = {wire.NODE: ConfigRecord(node)} if (node := ray_node()) else {}
    return _reply(msg, {wire.PARTY: party, "num-examples": len(part.labels)}, **where)


@app.query(wire.ENCODE)
def encode(msg: Message, context: Context) -> Message:
    settings, party, num_parties = _settings(msg, context)
    maybe_fail(settings.fault, party, "encode", settings.reply_timeout)
    stored = str(msg.content[wire.CONFIG].get(wire.STORED_PARTIES, ""))
    if str(party) in stored.split(","):  # a resumed run holds this party's upload already
        return _reply(msg, {wire.PARTY: party, wire.STORED: 1})
    shipped = msg.content.get(wire.ARRAYS)  # encoder=mixcon: the cut-layer weights h the server trained
    encoder_state = shipped.to_torch_state_dict() if isinstance(shipped, ArrayRecord) else None
    upload = prepare_upload(settings, party, num_parties, encoder_state=encoder_state)
    arrays = ArrayRecord({key: Array(value) for key, value in upload.arrays.items()})
    return _reply(msg, upload.metrics, **{wire.UPLOAD: arrays})


class QueryRefused(RuntimeError):
    """A party past its validation-query budget (`tuning.query_cap`, or its node's `max-validation-queries`)."""


def spend_queries(settings: Settings, context: Context, party: int, models: int) -> None:
    """Count `models` scored against the cap, kept in the node's own state; refuse beyond it (a server that keeps
    asking learns nothing more). A deployed party names its own cap in its node config (`max-validation-queries`):
    it counts everything the node scores in the run. Otherwise the cap is what the settings' tuning budget needs,
    counted per experiment (per settings: a frontier runs several in one run); as the settings come from the
    server, only the node's own cap binds a server that lies about them."""
    own = int(context.node_config.get("max-validation-queries", 0))
    cap = own or tuning.query_cap(settings)
    key = "node" if own else hashlib.sha256(settings.to_json().encode()).hexdigest()[:16]
    record = context.state.get("validation-queries")
    counts = dict(record) if isinstance(record, MetricRecord) else {}
    used = int(counts.get(key, 0))
    if used + models > cap:
        raise QueryRefused(f"party {party}: scored {used} models of its {cap} this run; refuses {models} more")
    context.state["validation-queries"] = MetricRecord({**counts, key: used + models})


@app.query(wire.VALIDATE)
def validate(msg: Message, context: Context) -> Message:
    """Selection of the central trainer: score each candidate on this party's own validation split (clean rows
    it never encoded or uploaded); only counts go back, for at most its query budget of models a run."""
    settings, party, num_parties = _settings(msg, context)
    names = str(msg.content[wire.CONFIG][wire.CANDIDATES]).split(",")
    spend_queries(settings, context, party, len(names))
    states = {name: msg.content[wire.candidate(i)].to_torch_state_dict() for i, name in enumerate(names)}
    scores = score_candidates(settings, states, load_partition(settings, party, num_parties, "validation"))
    metrics = {wire.PARTY: party}
    for i, name in enumerate(names):
        counts = vote(settings.fault, party, scores[name], settings.fault_scale)
        metrics[f"{i}-correct"], metrics[f"{i}-n"] = counts["correct"], counts["n"]
    return _reply(msg, metrics)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """A FedAvg/FedProx global model scored on this party's own validation split (the round and setting to keep
    are chosen on these counts); counted against the same query budget."""
    settings, party, num_parties = _settings(msg, context)
    spend_queries(settings, context, party, 1)
    validation = load_partition(settings, party, num_parties, "validation")
    counts = score_model(settings, msg.content[wire.ARRAYS].to_torch_state_dict(), validation,
                         select_device(settings.device))
    counts = vote(settings.fault, party, counts, settings.fault_scale)
    return _reply(msg, {wire.PARTY: party, wire.CORRECT: counts["correct"], wire.COUNT: counts["n"],
                        "num-examples": counts["n"]})


@app.query(wire.PERSONALIZE)
def personalize_model(msg: Message, context: Context) -> Message:
    """The central model comes back: recalibrate it on this party's own data. The accuracy reported is a
    simulation measurement (the party's model on `return-test-rows` of the server's test split, the same rows
    for every party), not something a party has."""
    settings, party, num_parties = _settings(msg, context)
    device = select_device(settings.device)
    chosen = str(msg.content[wire.CONFIG][wire.TRAINER])
    model = personalize(settings, load_partition(settings, party, num_parties), chosen,
                        msg.content[wire.ARRAYS].to_torch_state_dict(), device)
    accuracy = test_accuracy(model, returned_test(settings), device)["accuracy"]
    return _reply(msg, {wire.PARTY: party, "accuracy": accuracy})


@app.train(mods=[dp_clipping_mod])
def train(msg: Message, context: Context) -> Message:
    """Local-only training, or one FedAvg/FedProx round (proximal term when proximal-mu > 0)."""
    settings, party, num_parties = _settings(msg, context)
    config = msg.content["config"]
    mode = str(config.get("mode", "federated"))
    maybe_fail(settings.fault, party, mode, settings.reply_timeout)
    device = select_device(settings.device)
    server_round = int(config.get("server-round", 0))
    # a party's long local-only training prints its epochs (Flower streams a ClientApp's stdout through Ray,
    # seconds late); the server's progress.jsonl records the party when its model arrives
    report = Progress(None, interval=settings.progress_interval).epochs(
        settings.epochs, phase=f"party {party} local training", strategy=mode) if mode == "local-only" else None
    part, initial = load_partition(settings, party, num_parties), msg.content["arrays"].to_torch_state_dict()
    chosen = {}
    if mode == "local-only":  # the party tunes alone, on its own validation split
        validation = load_partition(settings, party, num_parties, "validation")
        result, index, scores = tune_local(settings, part, validation, initial, device, on_epoch=report)
        chosen = {"chosen": index, **{f"tried-{i}-accuracy": a for i, a in enumerate(scores)}}
    else:
        result = train_local(settings, part, initial, mode=mode, server_round=server_round,
                             proximal_mu=float(config.get("proximal-mu", 0.0)), device=device, on_epoch=report)
    metrics = {
        **chosen,
        "party": party,
        "num-examples": result.num_examples,
        "equal-weight": 1,  # DP-FedAvg aggregates by this key: every party counts the same
        "train-loss": result.report.losses[-1],
        "train-seconds": result.report.seconds,
        "on-cuda": int(device.startswith("cuda")),
    }
    for _, defence in (active(settings) if mode == "federated" else []):  # DP-SGD: the epsilon spent
        if defence.metrics is not None:
            metrics.update(defence.metrics(settings, result.report, server_round))
    return _reply(msg, metrics, arrays=ArrayRecord(result.model.cpu().state_dict()))
