"""ClientApp: each party encodes its partition once (query "encode"), or trains locally.

Handlers only parse the message, call the fedsmix library and build the reply. The reply to
"encode" carries the encoded inputs, soft labels and a few scalars; never indices, the
permutation, the seed or a raw sample.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.faults import corrupt, corruption, maybe_fail
from fedsmix.config import Settings
from fedsmix.device import select_device
from fedsmix.encoders import empirical_snr
from fedsmix.pipeline import encode_partition, load_partition, new_classifier, train_config, upload_inputs
from fedsmix.seeding import generator
from fedsmix.training import train as train_loop

app = ClientApp()


def _settings(msg: Message, context: Context) -> tuple[Settings, int, int]:
    """Settings come from the server (one place reads the run config); the data dir may be the node's own."""
    settings = Settings.from_json(str(msg.content["config"]["settings"]))
    node = context.node_config
    if node.get("data-dir"):
        settings = settings.replace(data_dir=str(node["data-dir"]))
    return settings, int(node["partition-id"]), int(node["num-partitions"])


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    """Say which party this node is; load the partition now (a cold start happens here, not in a timed phase)."""
    settings, party, num_parties = _settings(msg, context)
    part = load_partition(settings, party, num_parties)
    return Message(RecordDict({"metrics": MetricRecord({"party": party, "num-examples": len(part.labels)})}), reply_to=msg)


@app.query("encode")
def encode(msg: Message, context: Context) -> Message:
    settings, party, num_parties = _settings(msg, context)
    maybe_fail(settings.fault, party, "encode", settings.reply_timeout)
    stored = str(msg.content["config"].get("stored-parties", ""))
    if str(party) in stored.split(","):  # a resumed run holds this party's upload already
        return Message(RecordDict({"metrics": MetricRecord({"party": party, "stored": 1})}), reply_to=msg)
    t0 = time.perf_counter()
    part = load_partition(settings, party, num_parties)
    enc, cal = encode_partition(settings, part)
    seconds = time.perf_counter() - t0
    arrays = {"x": upload_inputs(enc.x, settings.upload_dtype), "y": enc.y.numpy().astype(np.float32, copy=False)}
    metrics = {
        "party": party,
        "num-examples": len(enc),
        "tau": cal.tau,
        "alpha": cal.alpha,
        "radius": cal.radius,
        "m-f": cal.m_f,
        "D": cal.D,
        "V": cal.V,
        "c": cal.c,
        "snr-bound": cal.snr_bound,
        "snr-empirical": empirical_snr(part.x, enc),
        "encode-seconds": seconds,
    }
    if kind := corruption(settings.fault, party):  # fault injection: a dishonest party
        arrays, metrics = corrupt(kind, arrays, metrics)
    upload = ArrayRecord({key: Array(value) for key, value in arrays.items()})
    metrics = MetricRecord({k: v for k, v in metrics.items() if isinstance(v, int | float)})
    return Message(RecordDict({"upload": upload, "metrics": metrics}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local-only training, or one FedAvg/FedProx round (proximal term when proximal-mu > 0)."""
    settings, party, num_parties = _settings(msg, context)
    config = msg.content["config"]
    mode = str(config.get("mode", "federated"))
    maybe_fail(settings.fault, party, mode, settings.reply_timeout)
    device = select_device(settings.device)
    part = load_partition(settings, party, num_parties)
    model = new_classifier(settings, part.sample_shape, part.num_classes)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    if mode == "local-only":
        cfg = train_config(settings, device)
        purpose = ("local-only", party)
        reference = None
    else:
        mu = float(config.get("proximal-mu", 0.0))
        cfg = train_config(settings, device, federated_client=True, proximal_mu=mu)
        purpose = ("federated", party, int(config.get("server-round", 0)))
        reference = [p.detach().clone() for p in model.parameters()]  # global weights, before training
    torch.manual_seed(settings.seed + party)
    report = train_loop(model, part.x, part.one_hot(), cfg, generator(settings.seed, *purpose), proximal_reference=reference)
    metrics = MetricRecord(
        {
            "party": party,
            "num-examples": len(part.labels),
            "train-loss": report.losses[-1],
            "train-seconds": report.seconds,
            "on-cuda": int(device.startswith("cuda")),
        }
    )
    arrays = ArrayRecord(model.cpu().state_dict())
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
