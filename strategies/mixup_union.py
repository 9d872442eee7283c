"""Mixup-union: every party encodes once and uploads; the server trains on the union.

query "encode" to every node -> validate each upload -> store it (sha256 manifest) ->
train centrally on the memory-mapped union with soft labels -> evaluate on the clean test split.
"""

from __future__ import annotations

import time

from flwr.app import Message, RecordDict

from fedsmix import data as datalib
from fedsmix.pipeline import mixing_shape, test_accuracy, train_classifier
from server.context import RunContext
from server.store import UploadStore
from server.validation import Expectation, UploadRejected, validate_upload
from strategies.common import bytes_summary, require_parties, settings_config, split_replies


def expectation(ctx: RunContext) -> Expectation:
    s = ctx.settings
    return Expectation(
        sample_shape=mixing_shape(s),
        num_classes=datalib.spec(s.dataset).num_classes,
        max_samples=s.max_upload_samples,
        max_bytes=int(s.max_upload_mb * 2**20),
    )


def collect_uploads(ctx: RunContext, replies: list[Message], store: UploadStore) -> tuple[dict, list[dict]]:
    """Validate and store every reply; a bad upload is rejected with its reason, the rest go on."""
    expect, parties, rejected, seen = expectation(ctx), {}, [], set(store.parties())
    for reply in replies:
        node = reply.metadata.src_node_id
        try:
            upload = validate_upload(reply.content, f"node {node}", expect, seen)
        except UploadRejected as err:
            rejected.append({"node": node, "party": err.party, "field": err.field, "reason": err.reason})
            continue
        seen.add(upload.party)
        store.save(upload.party, upload.x, upload.y, upload.metrics)
        parties[upload.party] = {**upload.metrics, "node": node, "upload-bytes": upload.nbytes}
    return parties, rejected


def run(ctx: RunContext) -> dict:
    s, t0 = ctx.settings, time.perf_counter()
    nodes = ctx.nodes()
    messages = [
        Message(RecordDict({"config": settings_config(ctx)}), dst_node_id=node, message_type="query.encode") for node in nodes
    ]
    ok, dropped = split_replies(ctx.send_and_receive(messages), nodes, s.reply_timeout, ctx.traffic.destinations)
    t_upload = time.perf_counter() - t0
    store = UploadStore(ctx.run_dir / "uploads")
    parties, rejected = collect_uploads(ctx, ok, store)
    require_parties(ctx, len(parties), "mixup-union")
    x, y = store.union(sorted(parties))
    model, report = train_classifier(
        s, x, y, expectation(ctx).sample_shape, datalib.spec(s.dataset).num_classes, ctx.device,
        checkpoint_path=ctx.run_dir / "checkpoints" / "central.pt" if s.checkpoint_every else None,
    )
    metrics = test_accuracy(model, ctx.test_set(), ctx.device)
    result = {
        "accuracy": metrics["accuracy"],
        "test-loss": metrics["loss"],
        "parties-used": len(parties),
        "union-size": len(x),
        "radius-mode": s.radius_mode,  # how each party chose r: see the per-party radius, m-f, snr-bound
        "tau": s.tau,
        "parties": {str(p): v for p, v in sorted(parties.items())},
        "dropped": dropped,
        "rejected": rejected,
        "upload-seconds": t_upload,
        "train-seconds": report.seconds,
        "epochs": report.epochs_run,
        "resumed-from-epoch": report.resumed_from,
        "wall-seconds": time.perf_counter() - t0,
        **bytes_summary(ctx, nodes),
    }
    if s.adversary:
        from server.adversary.runner import attack_uploads

        result["adversary"] = attack_uploads(ctx, store, sorted(parties), len(nodes))
    return result
