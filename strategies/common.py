"""Small helpers the strategies share: message building and the dropped-party report."""

from __future__ import annotations

import time

from flwr.app import ConfigRecord, Message

from server.context import RunAborted, RunContext


def settings_config(ctx: RunContext, **extra) -> ConfigRecord:
    return ConfigRecord({"settings": ctx.settings.to_json(), **extra})


def split_replies(
    replies: list[Message], expected_nodes: list[int], timeout: float, destinations: dict[str, int] | None = None
) -> tuple[list[Message], list[dict]]:
    """Replies with content, and one record per node that raised or never answered (with the time).

    When a SuperNode stops sending heartbeats, the SuperLink answers for it with an error whose
    sender is the SuperLink itself; `destinations` (message id -> node) names the node it stands for.
    """
    ok, dropped, answered = [], [], set()
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for reply in replies:
        node = reply.metadata.src_node_id
        if node not in expected_nodes and destinations:
            node = destinations.get(reply.metadata.reply_to_message_id, node)
        answered.add(node)
        if reply.has_error():
            reason = reply.error.reason
            dropped.append({"node": node, "reason": _short(reason), "time": now})
        else:
            ok.append(reply)
    for node in expected_nodes:
        if node not in answered:
            dropped.append({"node": node, "reason": f"no reply within {timeout:.0f}s (timeout)", "time": now})
    return ok, dropped


def require_parties(ctx: RunContext, valid: int, what: str) -> None:
    if valid < ctx.settings.min_parties:
        raise RunAborted(f"{what}: only {valid} valid parties remain; min-parties is {ctx.settings.min_parties}")


def bytes_summary(ctx: RunContext, nodes: list[int]) -> dict:
    up = {str(n): ctx.traffic.from_node.get(n, 0) for n in nodes}
    down = {str(n): ctx.traffic.to_node.get(n, 0) for n in nodes}
    return {
        "bytes-up-per-node": up,
        "bytes-down-per-node": down,
        "mean-bytes-up-per-party": sum(up.values()) / max(len(up), 1),
        "mean-bytes-down-per-party": sum(down.values()) / max(len(down), 1),
    }


def _short(reason: str, limit: int = 400) -> str:
    """Error replies carry a whole remote traceback; keep the message that says what failed."""
    for marker in ("InjectedFault:", "Message:", "Error:"):
        if marker in reason:
            tail = reason[reason.rindex(marker) + len(marker) :].strip().splitlines()
            if tail:
                return tail[0][:limit]
    return reason[-limit:]
