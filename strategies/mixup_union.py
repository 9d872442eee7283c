"""Mixup-union: every party encodes once and uploads; the server trains on the union.

query "encode" to every node -> validate each upload as it arrives -> store it (sha256
manifest) and drop it from memory -> train centrally on the memory-mapped union with soft
labels -> evaluate on the clean test split. A resumed run re-verifies the stored uploads, asks
only the parties it has none for, and continues training from the checkpoint.

encoder=mixcon (docs/mixcon.md) first trains the split LeNet-5 by FedAvg with the MixCon
term (`mixcon-rounds` rounds), keeps it in models/mixcon-split.pt, ships h (the layers up to the cut)
with the encode query, and each party uploads h(x) of its partition once; the server then trains
LeNet-5's head on the union of representations and tests head(h(x)) on the test split.
"""

from __future__ import annotations

import io
import math
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, RecordDict

from fedsmix import data as datalib
from fedsmix import messages as wire
from fedsmix import tuning
from fedsmix.faults import interrupt_after
from fedsmix.models import SPLIT_MODEL_FILE, new_classifier, represent
from fedsmix.runs import atomic_write_bytes
from fedsmix.space import mixing_shape, upload_shape
from fedsmix.trainers import (
    Selection,
    Union,
    party_summary,
    sample_parties,
    server_public,
    test_accuracy,
    train_union,
    union_statistics,
)
from fedsmix.training import CheckpointMismatch
from server.context import RunContext
from server.plausibility import Evidence, examine, quarantine
from server.store import UploadStore
from server.validation import Expectation, UploadRejected, validate_upload, vote_problem
from strategies.common import (
    bytes_summary,
    dropped_record,
    epoch_hook,
    require_parties,
    settings_config,
    source_node,
    unanswered,
    weights_record,
)


def expectation(ctx: RunContext) -> Expectation:
    s = ctx.settings
    return Expectation(
        sample_shape=upload_shape(s),
        num_classes=datalib.dataset_spec(s).num_classes,
        max_samples=s.max_upload_samples,
        max_bytes=int(s.max_upload_mb * 2**20),
    )


def collect_uploads(
    ctx: RunContext, replies, store: UploadStore, nodes: list[int]
) -> tuple[dict, list[dict], list[dict], list[dict]]:
    """Validate and store each reply as it arrives; a bad upload is rejected with its reason, the rest go on.
    Then the plausibility checks (server/plausibility.py): a well-formed upload that fails one is quarantined
    (kept on disk, not used) with the check and the reason.

    A party whose upload the store already holds (resumed run) answers with a stub; it is used
    from disk. Each reply is dropped once stored, so the server never holds more than one.
    """
    expect, parties, rejected, dropped = expectation(ctx), {}, [], []
    evidence: dict[int, Evidence] = {}
    stored, seen, answered, expected = set(store.parties()), set(store.parties()), set(), set(nodes)
    for reply in replies:
        node = source_node(ctx, reply, expected)
        answered.add(node)
        if reply.has_error():
            dropped.append(dropped_record(ctx, node, reply.error.reason))
            ctx.progress.emit("dropped", **dropped[-1])
            continue
        metrics = reply.content.get(wire.METRICS)
        if metrics is not None and wire.STORED in metrics and wire.UPLOAD not in reply.content:
            party = int(metrics[wire.PARTY])
            if party in stored:
                ctx.node_party[node] = party
                parties[party] = {
                    **store.manifest[str(party)]["metrics"],
                    "node": node,
                    "upload-bytes": 0,
                    "from-store": True,
                }
                ctx.progress.emit("upload", party=party, done=len(parties), of=len(nodes), stored=True)
            else:
                rejected.append(
                    {
                        "node": node,
                        "party": str(party),
                        "field": "metrics.stored",
                        "reason": "claims an upload the server does not hold",
                    }
                )
            continue
        try:
            upload = validate_upload(reply.content, f"node {node}", expect, seen)
        except UploadRejected as err:
            rejected.append({"node": node, "party": err.party, "field": err.field, "reason": err.reason})
            ctx.progress.emit("upload-rejected", **rejected[-1])
            continue
        finally:
            del reply  # the message holds the upload's bytes: release them before the next arrives
        seen.add(upload.party)
        ctx.node_party[node] = upload.party
        store.save(upload.party, upload.x, upload.y, upload.metrics)
        parties[upload.party] = {**upload.metrics, "node": node, "upload-bytes": upload.nbytes}
        ctx.progress.emit("upload", party=upload.party, done=len(parties), of=len(nodes), rows=len(upload.x),
                          **{"encode-seconds": upload.metrics.get("encode-seconds")})
        if ctx.settings.plausibility:
            evidence[upload.party] = examine(upload.party, upload.x, upload.y, upload.metrics, ctx.settings)
        del upload
    dropped += unanswered(ctx, nodes, answered)
    store.flush()  # manifest.json once for the phase; each upload only appended its journal line
    for party in stored - set(parties):  # stored, but its node did not answer this time: still used
        parties[party] = {**store.manifest[str(party)]["metrics"], "from-store": True}
    quarantined = plausibility(ctx, store, parties, evidence) if ctx.settings.plausibility else []
    return parties, rejected, dropped, quarantined


def plausibility(ctx: RunContext, store: UploadStore, parties: dict, evidence: dict[int, Evidence]) -> list[dict]:
    """Run the cross-party checks on every valid upload, in the order the uploads arrived (the manifest's:
    a resumed run reads the stored ones back), and take the quarantined parties out of `parties`."""
    order = [int(p) for p in store.manifest if int(p) in parties]
    for party in order:
        if party not in evidence:  # from the store (resumed run): memory-mapped, read once
            entry = store.manifest[str(party)]
            x = np.load(store.root / entry["x"]["file"], mmap_mode="r")
            y = np.load(store.root / entry["y"]["file"])
            evidence[party] = examine(party, x, y, entry["metrics"], ctx.settings)
    verdicts = quarantine([evidence[p] for p in order], ctx.settings)
    for verdict in verdicts:
        node = parties.pop(verdict["party"]).get("node")
        verdict.update({"node": node} if node is not None else {})
    return verdicts


def reopen_store(ctx: RunContext) -> tuple[UploadStore, list[dict]]:
    """The run's upload store; files that no longer match their sha256 are discarded (asked again)."""
    store = UploadStore(ctx.run_dir / "uploads")
    discarded = []
    for party in store.verify():
        store.discard(party)
        discarded.append(
            {"party": str(party), "reason": "stored files do not match the manifest's sha256; asked again"}
        )
    return store, discarded


def cut_layer(ctx: RunContext) -> tuple[torch.nn.Module, dict]:
    """encoder=mixcon: h, trained by `mixcon-rounds` FedAvg rounds of the split model with the MixCon term
    (each party's `train_local`), saved beside the uploads; a resumed run reuses the saved one."""
    from strategies.fedprox import federate

    s = ctx.settings
    path = ctx.run_dir / "models" / SPLIT_MODEL_FILE
    model = new_classifier(s, mixing_shape(s), datalib.dataset_spec(s).num_classes)
    if path.is_file():
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model.encoder, {"resumed": str(path)}
    model, report = federate(ctx, mu=0.0, rounds=s.mixcon_rounds, label="mixcon-split")
    buffer = io.BytesIO()
    torch.save(model.cpu().state_dict(), buffer)
    atomic_write_bytes(path, buffer.getvalue())
    report["mixcon"] = {"lambda": s.mixcon_lambda, "beta": s.mixcon_beta, "eps": s.mixcon_eps, "pairs": s.mixcon_pairs}
    return model.encoder, report


def run(ctx: RunContext) -> dict:
    s, t0 = ctx.settings, time.perf_counter()
    nodes = ctx.nodes()
    store, discarded = reopen_store(ctx)
    config = settings_config(
        ctx, **({wire.STORED_PARTIES: ",".join(map(str, store.parties()))} if store.parties() else {})
    )
    records, encoder, encoder_phase = {wire.CONFIG: config}, None, None
    if s.encoder == "mixcon":
        encoder, encoder_phase = cut_layer(ctx)
        records[wire.ARRAYS] = ArrayRecord(encoder.state_dict())  # h goes to every party with the encode query
    messages = [
        Message(RecordDict(dict(records)), dst_node_id=node, message_type=wire.query(wire.ENCODE)) for node in nodes
    ]
    parties, rejected, dropped, quarantined = collect_uploads(ctx, ctx.stream_replies(messages), store, nodes)
    t_upload = time.perf_counter() - t0
    require_parties(
        ctx, len(parties), "mixup-union", dropped=dropped, rejected=rejected, quarantined=quarantined,
        **{"discarded-uploads": discarded},
    )
    used = sorted(parties)
    x, y = store.union(used)
    shape, num_classes = expectation(ctx).sample_shape, datalib.dataset_spec(s).num_classes
    rows = np.repeat(np.array(used), np.diff(x.offsets))
    union = Union(x, y, rows, *union_statistics([parties[p] for p in used], math.prod(shape), s.encoder))
    public = server_public(s, ctx.progress)
    checkpoint = ctx.run_dir / "checkpoints" / "central.pt" if s.checkpoint_every else None
    curve: list[dict] = []
    test = ctx.test_set()
    if encoder is not None:  # the server holds h: its head is tested on h(x) of the test split
        test = (represent(encoder, test[0], ctx.device), test[1])

    voters = sample_parties(used, s.vote_parties, s.seed, "vote")
    # each voter is held to the validation split its upload reported (the label-mix check's counts)
    splits = {p: {int(sum(parties[p]["validation-counts"]))} for p in used if "validation-counts" in parties[p]}
    refused_votes: list[dict] = []

    def train() -> Selection:
        return train_union(
            s, union, shape, num_classes, ctx.device,
            score=lambda models: score_round(ctx, models, voters, splits, refused_votes),
            public=public, checkpoint_path=checkpoint, checkpoint_key=store.union_key(used),
            on_epoch=epoch_hook(ctx, t0, curve, then=interrupt_after(s.fault), test=test), progress=ctx.progress,
        )

    checkpoint_note = None
    try:
        selection = train()
    except CheckpointMismatch as err:  # the uploads changed since the checkpoint: start over, say so
        checkpoint.unlink()
        checkpoint_note = str(err)
        selection = train()
    model, report = selection.model, selection.report
    metrics = test_accuracy(model, test, ctx.device)
    epochs = len(report.get("losses", []))
    if not epochs:
        curve.clear()  # the epochs of a candidate that was not chosen
    if epochs and (not curve or curve[-1]["epoch"] != epochs):
        curve.append({"epoch": epochs, "accuracy": metrics["accuracy"], "seconds": time.perf_counter() - t0})
    weights = _save_model(ctx, model)
    result = {
        "accuracy": metrics["accuracy"],
        "test-loss": metrics["loss"],
        "trainer": selection.chosen,
        **tuning.report(s, selection.tried, selection.tried.index(selection.chosen)),
        "selection": {"validation-accuracy": selection.validation, "voters": selection.voters,
                      "noise-var": union.noise_var, "mix-scale": union.mix_scale},
        "parties-used": len(parties),
        "num-partitions": len(nodes),
        "union-size": len(union),
        "radius-mode": s.radius_mode,  # how each party chose r: see the per-party radius, m-f, snr-bound
        "calibration": s.calibration,  # which bound r was chosen by (per party: calibration-variance, lambda-max)
        "mixing-weights": s.mixing_weights,
        "screen": s.screen,
        "tau": s.tau,
        "parties": {str(p): v for p, v in sorted(parties.items())},
        "dropped": dropped,
        "rejected": rejected,
        "quarantined": quarantined,
        "refused-votes": refused_votes,
        "discarded-uploads": discarded,
        "upload-seconds": t_upload,
        "train-seconds": report.get("seconds"),
        "epochs": epochs,
        "resumed-from-epoch": report.get("resumed-from", 0),
        "checkpoint-discarded": checkpoint_note,
        "curve": curve,
        **weights,
    }
    if encoder_phase is not None:
        result["encoder"] = "mixcon"
        result["mixcon-phase"] = encoder_phase  # the FedAvg rounds that trained h (their bytes are counted below)
    if s.return_model and encoder is None:  # mixcon: the head reads h(x) and has no BatchNorm to recalibrate
        back = sample_parties(used, s.return_parties, s.seed, "return")
        result["returned"] = {**return_round(ctx, selection, back), "sampled": len(back), "of": len(used)}
    result["wall-seconds"] = time.perf_counter() - t0
    result.update(bytes_summary(ctx, nodes))
    return result


def _party_nodes(ctx: RunContext, parties) -> dict[int, int]:
    nodes = {party: node for node, party in ctx.node_party.items()}
    return {party: nodes[party] for party in parties if party in nodes}


def score_round(ctx: RunContext, models: dict[str, torch.nn.Module], voters: list[int],
                splits: dict[int, set[int]], refused: list[dict]) -> dict:
    """query "validate": each voting party scores the candidates on its own validation split. A party whose
    counts are not whole, exceed n, or are of another size than `splits` (party -> the split its upload
    reported) does not vote; it is named in `refused`."""
    names = list(models)
    states = {wire.candidate(i): ArrayRecord(models[name].cpu().state_dict()) for i, name in enumerate(names)}
    config = settings_config(ctx, **{wire.CANDIDATES: ",".join(names)})
    messages = [
        Message(RecordDict({wire.CONFIG: config, **states}), dst_node_id=node, message_type=wire.query(wire.VALIDATE))
        for node in _party_nodes(ctx, voters).values()
    ]
    scores = {}
    for reply in ctx.send_and_receive(messages, phase="trainer selection"):
        if reply.has_error():
            continue  # a party that does not answer (or refuses: past its query budget) does not vote
        m = reply.content[wire.METRICS]
        party = ctx.node_party.get(reply.metadata.src_node_id, int(m[wire.PARTY]))  # the node's, not its claim
        votes = {name: (m.get(f"{i}-correct"), m.get(f"{i}-n")) for i, name in enumerate(names)}
        if (problem := vote_problem(votes, splits.get(party))) is not None:
            refused.append({"party": party, "field": problem[0], "reason": problem[1]})
            ctx.progress.emit("vote-refused", **refused[-1])
            continue
        scores[party] = {name: {"correct": int(c), "n": int(n)} for name, (c, n) in votes.items()}
    return scores


def return_round(ctx: RunContext, selection: Selection, parties: list[int]) -> dict:
    """query "personalize": the model goes back to `parties` (`return-parties` of them), each recalibrates it on
    its own data.
    Each reports the test accuracy of the model it ends up with (a simulation measurement: the party
    scores it on `return-test-rows` of the server's test split)."""
    record = ArrayRecord(selection.model.cpu().state_dict())
    config = settings_config(ctx, **{wire.TRAINER: selection.chosen})
    messages = [
        Message(RecordDict({wire.CONFIG: config, wire.ARRAYS: record}), dst_node_id=node,
                message_type=wire.query(wire.PERSONALIZE))
        for node in _party_nodes(ctx, parties).values()
    ]
    accuracy = {}
    for reply in ctx.send_and_receive(messages, phase="model return"):
        if not reply.has_error():
            accuracy[int(reply.content[wire.METRICS][wire.PARTY])] = float(reply.content[wire.METRICS]["accuracy"])
    rows, available = ctx.settings.return_test_rows, len(ctx.test_set()[1])  # what `returned_test` samples
    summary = {**party_summary(accuracy), "test-rows": min(rows, available) if rows else available}
    ctx.progress.emit("returned", parties=len(accuracy), mean=summary["mean"])
    return summary


def _save_model(ctx: RunContext, model: torch.nn.Module) -> dict:
    """The trained model beside the uploads (atomic write); returns the weights' digest and sketch."""
    buffer = io.BytesIO()
    torch.save(model.cpu().state_dict(), buffer)
    atomic_write_bytes(ctx.run_dir / "models" / "mixup-union.pt", buffer.getvalue())
    return weights_record(model)
