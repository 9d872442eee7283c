"""The strategies without Flower: the same library calls, seeds and order as the ClientApp and strategies.

For machines that have PyTorch and an accelerator but no Flower/Ray (`python -m fedsmix grid --engine
direct`). Each party's step is the ClientApp's handler body, and FedAvg/FedProx aggregate as Flower's
FedAvg does (example-weighted mean of every array), so a grid run here reproduces a simulation's
numbers up to floating-point order (tests/test_runner.py checks that on digits). What it cannot give is
wire bytes: it reports the payload bytes of the arrays each message would carry, and says so.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from . import data as datalib
from .config import Settings, dump_settings
from .device import select_device
from .encoders import empirical_snr
from .pipeline import (
    encode_partition, load_partition, load_test, load_train_all, mixing_shape, new_classifier, test_accuracy,
    train_classifier, train_config,
)
from .runs import atomic_write_json, new_run_dir
from .seeding import generator
from .training import train as train_loop


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _party_train(settings: Settings, party: int, num_parties: int, state: dict, mode: str, device: str, server_round: int = 0):
    """The ClientApp's train handler, minus the message."""
    part = load_partition(settings, party, num_parties)
    model = new_classifier(settings, part.sample_shape, part.num_classes)
    model.load_state_dict(state)
    if mode == "local-only":
        cfg, purpose, reference = train_config(settings, device), ("local-only", party), None
    else:
        mu = settings.proximal_mu if mode == "fedprox" else 0.0
        cfg = train_config(settings, device, federated_client=True, proximal_mu=mu)
        purpose = ("federated", party, server_round)
        reference = [p.detach().clone() for p in model.parameters()]
    torch.manual_seed(settings.seed + party)
    train_loop(model, part.x, part.one_hot(), cfg, generator(settings.seed, *purpose), proximal_reference=reference)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}, len(part.labels)


def mixup_union(settings: Settings, num_parties: int, test, device: str) -> dict:
    t0 = time.perf_counter()
    xs, ys, parties = [], [], {}
    for party in range(num_parties):
        t1 = time.perf_counter()
        part = load_partition(settings, party, num_parties)
        enc, cal = encode_partition(settings, part)
        dtype = np.float16 if settings.upload_dtype == "float16" else np.float32
        x, y = enc.x.numpy().astype(dtype), enc.y.numpy().astype(np.float32)
        xs.append(x)
        ys.append(y)
        parties[str(party)] = {
            "party": party, "num-examples": len(enc), "tau": cal.tau, "alpha": cal.alpha, "radius": cal.radius,
            "m-f": cal.m_f, "D": cal.D, "V": cal.V, "c": cal.c, "snr-bound": cal.snr_bound,
            "snr-empirical": empirical_snr(part.x, enc), "encode-seconds": time.perf_counter() - t1,
            "upload-bytes": x.nbytes + y.nbytes,
        }
    t_upload = time.perf_counter() - t0
    x, y = np.concatenate(xs), np.concatenate(ys)
    model, report = train_classifier(settings, x, y, mixing_shape(settings), datalib.spec(settings.dataset).num_classes, device)
    metrics = test_accuracy(model, test, device)
    up = [p["upload-bytes"] for p in parties.values()]
    return {
        "accuracy": metrics["accuracy"], "test-loss": metrics["loss"], "parties-used": num_parties, "union-size": len(x),
        "radius-mode": settings.radius_mode, "tau": settings.tau, "parties": parties, "dropped": [], "rejected": [],
        "upload-seconds": t_upload, "train-seconds": report.seconds, "epochs": report.epochs_run,
        "wall-seconds": time.perf_counter() - t0, "mean-bytes-up-per-party": sum(up) / len(up),
        "mean-bytes-down-per-party": 0, "bytes": "array payload (direct engine, no wire framing)",
    }


def local_only(settings: Settings, num_parties: int, test, device: str) -> dict:
    t0 = time.perf_counter()
    model = new_classifier(settings, mixing_shape(settings), datalib.spec(settings.dataset).num_classes)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    accuracy = {}
    for party in range(num_parties):
        state, _ = _party_train(settings, party, num_parties, initial, "local-only", device)
        model.load_state_dict(state)
        accuracy[party] = test_accuracy(model, test, device)["accuracy"]
    values = list(accuracy.values())
    return {
        "accuracy": accuracy[0], "party0-accuracy": accuracy[0], "per-party-accuracy": {str(p): a for p, a in accuracy.items()},
        "mean-party-accuracy": sum(values) / len(values), "min-party-accuracy": min(values),
        "max-party-accuracy": max(values), "parties-used": num_parties, "dropped": [], "rejected": [],
        "wall-seconds": time.perf_counter() - t0, "mean-bytes-up-per-party": _nbytes(initial),
        "mean-bytes-down-per-party": _nbytes(initial), "bytes": "array payload (direct engine, no wire framing)",
    }


def federated(settings: Settings, num_parties: int, test, device: str, mode: str) -> dict:
    """FedAvg (mu = 0) / FedProx rounds; every party trains each round (fraction-train is not sampled here)."""
    if settings.fraction_train < 1:
        raise ValueError("fraction-train < 1 needs Flower's sampling: use --engine simulate or flwr")
    t0 = time.perf_counter()
    model = new_classifier(settings, mixing_shape(settings), datalib.spec(settings.dataset).num_classes)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    curve = [{"round": 0, "accuracy": test_accuracy(model, test, device)["accuracy"], "seconds": 0.0}]
    for server_round in range(1, settings.rounds + 1):
        replies = [_party_train(settings, p, num_parties, state, mode, device, server_round) for p in range(num_parties)]
        total = sum(n for _, n in replies)
        state = {
            key: sum(r[key].double() * (n / total) for r, n in replies).to(value.dtype)
            for key, value in state.items()
        }
        model.load_state_dict(state)
        curve.append({"round": server_round, "accuracy": test_accuracy(model, test, device)["accuracy"], "seconds": time.perf_counter() - t0})
    per_round = _nbytes(state)
    return {
        "accuracy": curve[-1]["accuracy"], "proximal-mu": settings.proximal_mu if mode == "fedprox" else 0.0,
        "rounds": settings.rounds, "local-epochs": settings.local_epochs, "curve": curve, "parties-used": num_parties,
        "dropped": [], "rejected": [], "wall-seconds": time.perf_counter() - t0,
        "mean-bytes-up-per-party": per_round * settings.rounds, "mean-bytes-down-per-party": per_round * settings.rounds,
        "bytes": "array payload (direct engine, no wire framing)",
    }


def centralized(settings: Settings, num_parties: int, test, device: str) -> dict:
    t0 = time.perf_counter()
    x, labels = load_train_all(settings)
    num_classes = datalib.spec(settings.dataset).num_classes
    model, report = train_classifier(settings, x, datalib.one_hot(labels, num_classes), mixing_shape(settings), num_classes, device, purpose="centralized")
    metrics = test_accuracy(model, test, device)
    return {"accuracy": metrics["accuracy"], "test-loss": metrics["loss"], "train-size": len(labels),
            "train-seconds": report.seconds, "wall-seconds": time.perf_counter() - t0, "dropped": [], "rejected": []}


STRATEGIES = {
    "mixup-union": mixup_union,
    "local-only": local_only,
    "fedavg": lambda s, n, t, d: federated(s, n, t, d, "fedavg"),
    "fedprox": lambda s, n, t, d: federated(s, n, t, d, "fedprox"),
    "centralized": centralized,
}


def run(settings: Settings, num_parties: int) -> dict:
    """Like the ServerApp's run_experiment: one run directory, results.json after every strategy."""
    run_dir = new_run_dir(settings.runs_dir, settings.run_name, "direct")
    device = select_device(settings.device)
    test = load_test(settings)
    results = {"run-id": "direct", "run-dir": str(run_dir), "engine": "direct", "settings": dump_settings(settings),
               "num-parties": num_parties, "device": device, "strategies": {}}
    for name in settings.strategies:
        results["strategies"][name] = STRATEGIES[name](settings, num_parties, test, device)
        atomic_write_json(run_dir / "results.json", results)
    return results
