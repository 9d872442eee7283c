"""The strategies without Flower: the party's own steps (`fedsmix.party`), in party order, here.

For machines that have PyTorch and an accelerator but no Flower/Ray (`python -m fedsmix grid --engine
direct`), and the reference for what the federation costs (benchmarks/flower_overhead.py). Each
party's step is the very function the ClientApp calls, and FedAvg/FedProx aggregate as Flower's
FedAvg does (example-weighted mean of every array), so a run here reproduces a simulation's numbers
up to floating-point order (tests/test_runner.py checks that on digits). What it cannot give is wire
bytes: it reports the payload bytes of the arrays each message would carry (each distinct array once, as
Flower ships them), and says so. It has no
message validation, store or adversary; the plausibility checks of well-formed uploads run as in the
ServerApp (server/plausibility.py: numpy only).
"""

from __future__ import annotations

import hashlib
import math
import time

import numpy as np
import torch

from fedsmix import data as datalib
from fedsmix.central import (
    Union,
    party_summary,
    server_public,
    test_accuracy,
    train_classifier,
    train_union,
    union_statistics,
)
from fedsmix.config import Settings, dump_settings
from fedsmix.device import select_device
from fedsmix.models import new_classifier, represent
from fedsmix.partition import check_poor_party
from fedsmix.party import load_partition, personalize, prepare_upload, score_candidates, train_local
from fedsmix.progress import FILE as PROGRESS_FILE
from fedsmix.progress import SILENT, Progress
from fedsmix.runs import atomic_write_json, new_run_dir
from fedsmix.space import load_test, load_train_all, mixing_shape, upload_shape
from fedsmix.training import state_digest, state_sketch
from server.plausibility import examine, quarantine

PAYLOAD = "array payload (direct engine, no wire framing)"


def _nbytes(*states: dict[str, torch.Tensor]) -> int:
    """The payload of one message carrying `states`: Flower ships a message's arrays content-addressed, each
    distinct array once (candidates that share weights, such as `mlp` and `mlp-recal`, share them on the wire)."""
    distinct = {}
    for state in states:
        for t in state.values():
            data = t.detach().cpu().contiguous().numpy().tobytes()
            distinct[hashlib.sha256(data).digest()] = len(data)
    return sum(distinct.values())


def _initial(settings: Settings) -> torch.nn.Module:
    return new_classifier(settings, mixing_shape(settings), datalib.dataset_spec(settings).num_classes)


def epoch_reporter(settings: Settings, progress: Progress, test, device: str, curve: list[dict], t0: float,
                   phase: str = "central training"):
    """The ServerApp's epoch hook (strategies/common.py), here: accuracy every `eval-every` epochs, one line."""
    report = progress.epochs(settings.epochs, phase=phase)

    def on_epoch(model: torch.nn.Module, epoch: int, loss: float) -> None:
        accuracy = None
        if settings.eval_every and epoch % settings.eval_every == 0:
            accuracy = test_accuracy(model, test, device)["accuracy"]
            curve.append({"epoch": epoch, "accuracy": accuracy, "seconds": time.perf_counter() - t0})
        report(epoch, loss, accuracy)

    return on_epoch


def mixup_union(settings: Settings, num_parties: int, test, device: str, progress: Progress = SILENT) -> dict:
    t0 = time.perf_counter()
    xs, ys, parties, partitions, evidence = {}, {}, {}, {}, []
    encoder_state, phase, rounds_bytes = None, {}, 0
    if settings.encoder == "mixcon":  # FedAvg rounds of the split model with the MixCon term, then h ships
        model, curve = fedavg_rounds(settings, num_parties, test, device, 0.0, settings.mixcon_rounds, progress)
        encoder_state = model.encoder.state_dict()
        phase = {"mixcon-phase": {"accuracy": curve[-1]["accuracy"], "rounds": settings.mixcon_rounds, "curve": curve},
                 "encoder": "mixcon"}
        test = (represent(model.encoder, test[0], device), test[1])
        rounds_bytes = _nbytes(model.state_dict()) * settings.mixcon_rounds
    for party in range(num_parties):
        upload = prepare_upload(settings, party, num_parties, encoder_state=encoder_state)
        xs[party], ys[party] = upload.arrays["x"], upload.arrays["y"]
        parties[party] = {**upload.metrics, "upload-bytes": upload.nbytes}
        partitions[party] = upload.partition
        progress.emit("upload", party=party, done=party + 1, of=num_parties, rows=len(upload.arrays["y"]),
                      **{"encode-seconds": upload.metrics.get("encode-seconds")})
        if settings.plausibility:
            evidence.append(examine(party, xs[party], ys[party], upload.metrics, settings))
        del upload
    quarantined = quarantine(evidence, settings) if settings.plausibility else []
    for verdict in quarantined:  # not used: the run goes on without them
        for held in (xs, ys, parties, partitions):
            held.pop(verdict["party"])
    if len(parties) < settings.min_parties:
        raise ValueError(
            f"mixup-union: only {len(parties)} valid parties remain; min-parties is {settings.min_parties} "
            f"(quarantined: {quarantined})"
        )
    t_upload = time.perf_counter() - t0
    used = sorted(parties)
    x, y = np.concatenate([xs[p] for p in used]), np.concatenate([ys[p] for p in used])
    rows = np.repeat(np.array(used), [len(ys[p]) for p in used])
    del xs, ys
    shape, num_classes = upload_shape(settings), datalib.dataset_spec(settings).num_classes
    union = Union(x, y, rows, *union_statistics(list(parties.values()), math.prod(shape), settings.encoder))

    sent = dict.fromkeys(parties, 0)  # bytes down per party after the upload: candidates to score, the model back

    def score(models, held):  # each party scores the candidates on its own clean samples, as the ClientApp does
        states = {name: model.state_dict() for name, model in models.items()}
        payload = _nbytes(*states.values())
        for p in held:
            sent[p] += payload
        return {p: score_candidates(settings, partitions[p], r, states, device) for p, r in held.items()}

    public = server_public(settings, progress)
    curve: list[dict] = []
    selection = train_union(settings, union, shape, num_classes, device, score=score, public=public,
                            progress=progress, on_epoch=epoch_reporter(settings, progress, test, device, curve, t0))
    metrics = test_accuracy(selection.model, test, device)
    up = [p["upload-bytes"] for p in parties.values()]
    result = {
        "accuracy": metrics["accuracy"], "test-loss": metrics["loss"], "trainer": selection.chosen,
        "selection": {"validation-accuracy": selection.validation, "held-out-rows": selection.held_out,
                      "noise-var": union.noise_var, "mix-scale": union.mix_scale},
        "parties-used": len(parties), "union-size": len(x), "radius-mode": settings.radius_mode, "tau": settings.tau,
        "parties": {str(p): v for p, v in parties.items()}, "dropped": [], "rejected": [], "quarantined": quarantined,
        "upload-seconds": t_upload, "train-seconds": selection.report.get("seconds"),
        "epochs": selection.report.get("epochs", 0), "weights-sha256": state_digest(selection.model),
        "weights-sketch": state_sketch(selection.model),
    }
    if settings.return_model and encoder_state is None:  # mixcon: the head reads h(x), has no BatchNorm
        state = {k: v.detach().cpu() for k, v in selection.model.state_dict().items()}
        payload = _nbytes(state)
        for p in partitions:
            sent[p] += payload
        accuracy = {
            p: test_accuracy(personalize(settings, part, selection.chosen, state, device), test, device)["accuracy"]
            for p, part in partitions.items()
        }
        result["returned"] = party_summary(accuracy)
        progress.emit("returned", parties=len(accuracy), mean=result["returned"]["mean"])
    if curve:
        result["curve"] = curve
    # mixcon: the FedAvg rounds that trained h count both ways, and h itself travels down once
    down = rounds_bytes + (_nbytes(encoder_state) if encoder_state is not None else 0) + sum(sent.values()) / len(sent)
    return {**result, "wall-seconds": time.perf_counter() - t0, "mean-bytes-up-per-party": sum(up) / len(up)
            + rounds_bytes, "mean-bytes-down-per-party": down, "bytes": PAYLOAD, **phase}


def local_only(settings: Settings, num_parties: int, test, device: str, progress: Progress = SILENT) -> dict:
    t0 = time.perf_counter()
    model = _initial(settings)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    accuracy = {}
    for party in range(num_parties):
        # the party's own epochs: printed, not recorded, as the ClientApp does (clients/app.py)
        report = Progress(None, echo=progress.echo, interval=progress.interval).epochs(
            settings.epochs, phase=f"party {party} local training", strategy="local-only")
        result = train_local(settings, load_partition(settings, party, num_parties), initial, mode="local-only",
                             device=device, on_epoch=report)
        accuracy[party] = test_accuracy(result.model, test, device)["accuracy"]
        progress.emit("party", party=party, done=party + 1, of=num_parties, accuracy=accuracy[party],
                      **{"train-seconds": result.report.seconds})
    values, model_bytes = list(accuracy.values()), _nbytes(initial)  # the model out, and back
    return {
        "accuracy": accuracy[0],
        "party0-accuracy": accuracy[0],
        "per-party-accuracy": {str(p): a for p, a in accuracy.items()},
        "mean-party-accuracy": sum(values) / len(values),
        "min-party-accuracy": min(values),
        "max-party-accuracy": max(values),
        "parties-used": num_parties,
        "dropped": [],
        "rejected": [],
        "wall-seconds": time.perf_counter() - t0,
        "mean-bytes-up-per-party": model_bytes,
        "mean-bytes-down-per-party": model_bytes,
        "bytes": PAYLOAD,
    }


def fedavg_rounds(settings: Settings, num_parties: int, test, device: str, mu: float, rounds: int,
                  progress: Progress = SILENT) -> tuple[torch.nn.Module, list[dict]]:
    """`rounds` FedAvg/FedProx rounds from the run's initial model; every party trains each round
    (fraction-train is not sampled here): the final model and its test curve."""
    if settings.fraction_train < 1:
        raise ValueError("fraction-train < 1 needs Flower's sampling: use --engine simulate or flwr")
    if settings.dp_fedavg != "off":
        raise ValueError("dp-fedavg runs through Flower's DP wrappers and accountant: use --engine simulate or flwr")
    t0 = time.perf_counter()
    model = _initial(settings)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    curve = [{"round": 0, "accuracy": test_accuracy(model, test, device)["accuracy"], "seconds": 0.0}]
    progress.emit("round", round=0, rounds=rounds, accuracy=curve[0]["accuracy"], elapsed=0.0)
    for server_round in range(1, rounds + 1):
        replies = []
        for party in range(num_parties):
            result = train_local(
                settings,
                load_partition(settings, party, num_parties),
                state,
                mode="federated",
                server_round=server_round,
                proximal_mu=mu,
                device=device,
            )
            replies.append((result.state(), result.num_examples))
        state = aggregate(settings, state, replies)
        model.load_state_dict(state)
        accuracy = test_accuracy(model, test, device)["accuracy"]
        elapsed = time.perf_counter() - t0
        curve.append({"round": server_round, "accuracy": accuracy, "seconds": elapsed})
        progress.emit("round", round=server_round, rounds=rounds, answered=len(replies), sampled=num_parties,
                      accuracy=accuracy, elapsed=round(elapsed, 3),
                      eta=round(elapsed / server_round * (rounds - server_round), 3))
    return model, curve


def federated(
    settings: Settings, num_parties: int, test, device: str, mode: str, progress: Progress = SILENT
) -> dict:
    """FedAvg (mu = 0) / FedProx rounds (`fedavg_rounds`) and their report."""
    t0 = time.perf_counter()
    mu = settings.proximal_mu if mode == "fedprox" else 0.0
    model, curve = fedavg_rounds(settings, num_parties, test, device, mu, settings.rounds, progress)
    per_round = _nbytes(model.state_dict())
    return {
        "accuracy": curve[-1]["accuracy"],
        "proximal-mu": mu,
        "aggregation": settings.aggregation,
        "rounds": settings.rounds,
        "local-epochs": settings.local_epochs,
        "curve": curve,
        "parties-used": num_parties,
        "dropped": [],
        "rejected": [],
        "weights-sha256": state_digest(model),
        "weights-sketch": state_sketch(model),
        "wall-seconds": time.perf_counter() - t0,
        "mean-bytes-up-per-party": per_round * settings.rounds,
        "mean-bytes-down-per-party": per_round * settings.rounds,
        "bytes": PAYLOAD,
    }


def aggregate(settings: Settings, state: dict[str, torch.Tensor], replies: list[tuple[dict, int]]) -> dict:
    """Flower's FedAvg: the example-weighted mean of every array, in party order. Another `aggregation`
    runs Flower's own aggregator (strategies/fedprox.py: this needs Flower installed)."""
    if settings.aggregation != "fedavg":
        from strategies.fedprox import aggregate_states

        return aggregate_states(settings, replies, state)
    total = sum(n for _, n in replies)
    return {key: sum(r[key].double() * (n / total) for r, n in replies).to(value.dtype) for key, value in state.items()}


def centralized(settings: Settings, num_parties: int, test, device: str, progress: Progress = SILENT) -> dict:
    t0 = time.perf_counter()
    curve: list[dict] = []
    x, labels = load_train_all(settings)
    num_classes = datalib.dataset_spec(settings).num_classes
    model, report = train_classifier(
        settings,
        x,
        datalib.one_hot(labels, num_classes),
        mixing_shape(settings),
        num_classes,
        device,
        purpose="centralized",
        on_epoch=epoch_reporter(settings, progress, test, device, curve, t0),
    )
    metrics = test_accuracy(model, test, device)
    return {
        **({"curve": curve} if curve else {}),
        "accuracy": metrics["accuracy"],
        "test-loss": metrics["loss"],
        "train-size": len(labels),
        "train-seconds": report.seconds,
        "weights-sha256": state_digest(model),
        "weights-sketch": state_sketch(model),
        "wall-seconds": time.perf_counter() - t0,
        "dropped": [],
        "rejected": [],
    }


STRATEGIES = {
    "mixup-union": mixup_union,
    "local-only": local_only,
    "fedavg": lambda s, n, t, d, progress=SILENT: federated(s, n, t, d, "fedavg", progress),
    "fedprox": lambda s, n, t, d, progress=SILENT: federated(s, n, t, d, "fedprox", progress),
    "centralized": centralized,
}


def run(settings: Settings, num_parties: int) -> dict:
    """Like the ServerApp's run_experiment: one run directory, results.json after every strategy."""
    dataset = datalib.describe_dataset(settings)  # a path data set is checked before anything is written
    check_poor_party(settings.partitioner, settings.poor_party, num_parties)  # and a party the run lacks
    run_dir = new_run_dir(settings.runs_dir, settings.run_name, "direct")
    progress = Progress(run_dir / PROGRESS_FILE, interval=settings.progress_interval)
    progress.emit("run-start", **{"run-dir": str(run_dir), "strategies": list(settings.strategies),
                                  "dataset": settings.dataset, "parties": num_parties, "engine": "direct"})
    progress.emit("dataset", **dataset)
    device = select_device(settings.device)
    test = load_test(settings)
    results = {
        "run-id": "direct",
        "run-dir": str(run_dir),
        "engine": "direct",
        "settings": dump_settings(settings),
        "dataset": dataset,
        "num-parties": num_parties,
        "device": device,
        "strategies": {},
    }
    for index, name in enumerate(settings.strategies, start=1):
        bound, started = progress.bind(strategy=name), time.perf_counter()
        bound.emit("strategy-start", index=index, total=len(settings.strategies))
        try:
            with bound.watch():
                results["strategies"][name] = STRATEGIES[name](settings, num_parties, test, device, progress=bound)
        except Exception as err:
            bound.emit("strategy-failed", error=f"{type(err).__name__}: {err}",
                       seconds=round(time.perf_counter() - started, 3))
            progress.emit("run-end", failures=[f"{name}: {type(err).__name__}: {err}"])
            raise
        bound.emit("strategy-end", accuracy=results["strategies"][name].get("accuracy"),
                   seconds=round(time.perf_counter() - started, 3))
        atomic_write_json(run_dir / "results.json", results)
    progress.emit("run-end", failures=[])
    return results
