"""What the strategies share: the registry entry's shape, message building and the dropped-party report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from flwr.app import ConfigRecord, Message

from fedsmix import messages as wire
from fedsmix.trainers import test_accuracy
from fedsmix.training import state_digest, state_sketch
from server.context import RunAborted, RunContext
from server.traffic import round_costs


@dataclass(frozen=True)
class Protocol:
    """A registry entry (`STRATEGIES.add(name, Protocol(run, ...))`): `run(ctx)` drives the parties over
    `ctx.grid` and returns a JSON-able dict of results (its `accuracy` on the test split, its cost)."""

    run: Callable[[RunContext], dict]
    uploads: bool = False  # parties upload an encoding once: the server's adversary attacks what it stores
    parties: bool = True  # talks to parties (False: the pooled bound, which trains without them)


def settings_config(ctx: RunContext, **extra) -> ConfigRecord:
    return ConfigRecord({wire.SETTINGS: ctx.settings.to_json(), **extra})


def epoch_hook(
    ctx: RunContext, t0: float, curve: list[dict], phase: str = "central training",
    then: Callable[[int, float], None] | None = None, test: tuple | None = None,
):
    """After each central epoch: test accuracy every `eval-every` epochs (a time-to-accuracy curve; on `test`,
    default the run's test split), the progress line (loss, elapsed, ETA, that accuracy), then `then(epoch,
    loss)` (fault injection)."""
    every = ctx.settings.eval_every
    report = ctx.progress.epochs(ctx.settings.epochs, phase=phase)

    def on_epoch(model: torch.nn.Module, epoch: int, loss: float) -> None:
        accuracy = None
        if every and epoch % every == 0:
            accuracy = test_accuracy(model, test or ctx.test_set(), ctx.device)["accuracy"]
            curve.append({"epoch": epoch, "accuracy": accuracy, "seconds": time.perf_counter() - t0})
        report(epoch, loss, accuracy)
        if then is not None:
            then(epoch, loss)

    return on_epoch


def split_replies(
    ctx: RunContext, replies: list[Message], expected_nodes: list[int]
) -> tuple[list[Message], list[dict]]:
    """Replies with content, and one record per node that raised or never answered (with the time).

    Each good reply's party (its metrics name it) is recorded in `ctx.node_party` for the reports.
    """
    ok, dropped, answered, expected = [], [], set(), set(expected_nodes)
    for reply in replies:
        node = source_node(ctx, reply, expected)
        answered.add(node)
        if reply.has_error():
            dropped.append(dropped_record(ctx, node, reply.error.reason))
            ctx.progress.emit("dropped", **dropped[-1])
        else:
            ctx.node_party[node] = int(reply.content[wire.METRICS][wire.PARTY])
            ok.append(reply)
    return ok, dropped + unanswered(ctx, expected_nodes, answered)


def source_node(ctx: RunContext, reply: Message, expected_nodes) -> int:
    """The node a reply speaks for. When a SuperNode stops sending heartbeats, the SuperLink answers
    for it with an error whose sender is the SuperLink itself: the message it replies to names the node."""
    node = reply.metadata.src_node_id
    if node not in expected_nodes:  # a set: a round of 10,000 replies stays linear
        node = ctx.traffic.destinations.get(reply.metadata.reply_to_message_id, node)
    return node


def unanswered(ctx: RunContext, expected_nodes, answered: set[int]) -> list[dict]:
    """A timeout record for every expected node that never answered."""
    reason = f"no reply within {ctx.settings.reply_timeout:g}s (timeout)"
    records = [dropped_record(ctx, node, reason) for node in expected_nodes if node not in answered]
    for record in records:
        ctx.progress.emit("dropped", **record)
    return records


def dropped_record(ctx: RunContext, node: int, reason: str) -> dict:
    """Who dropped out (the party when a reply has named it), why, and when."""
    return {
        "node": node,
        "party": ctx.node_party.get(node),
        "reason": _short(reason),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def require_parties(ctx: RunContext, valid: int, what: str, **details) -> None:
    """Abort below min-parties; `details` (dropped, rejected) reach results.json with the error."""
    if valid < ctx.settings.min_parties:
        raise RunAborted(
            f"{what}: only {valid} valid parties remain; min-parties is {ctx.settings.min_parties}", details
        )


def weights_record(model: torch.nn.Module) -> dict:
    """The trained weights' digest (equal bytes, equal weights) and sketch (comparable across CPUs)."""
    return {"weights-sha256": state_digest(model), "weights-sketch": state_sketch(model)}


def bytes_summary(ctx: RunContext, nodes: list[int]) -> dict:
    up = {str(n): ctx.traffic.from_node.get(n, 0) for n in nodes}
    down = {str(n): ctx.traffic.to_node.get(n, 0) for n in nodes}
    return {
        "bytes-up-per-node": up,
        "bytes-down-per-node": down,
        "mean-bytes-up-per-party": sum(up.values()) / max(len(up), 1),
        "mean-bytes-down-per-party": sum(down.values()) / max(len(down), 1),
        "round-costs": round_costs(ctx.traffic.rounds),  # each round's kind, messages, replies, bytes each way, seconds
    }


def _short(reason: str, limit: int = 400) -> str:
    """Error replies carry a whole remote traceback; keep the message that says what failed."""
    for marker in ("InjectedFault:", "Message:", "Error:"):
        if marker in reason:
            tail = reason[reason.rindex(marker) + len(marker) :].strip().splitlines()
            if tail:
                return tail[0][:limit]
    return reason[-limit:]
