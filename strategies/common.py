"""Small helpers the strategies share: message building and the dropped-party report."""

from __future__ import annotations

from flwr.app import ConfigRecord, Message

from server.context import RunAborted, RunContext


def settings_config(ctx: RunContext, **extra) -> ConfigRecord:
    return ConfigRecord({"settings": ctx.settings.to_json(), **extra})


def split_replies(
    replies: list[Message], expected_nodes: list[int], timeout: float, node_party: dict[int, int] | None = None
) -> tuple[list[Message], list[dict]]:
    """Replies with content, and one record per node that raised or never answered.

    `node_party` (node id -> party, learnt from earlier replies) names the party when known.
    """
    node_party = {} if node_party is None else node_party
    ok, dropped, answered = [], [], set()
    for reply in replies:
        node = reply.metadata.src_node_id
        answered.add(node)
        if reply.has_error():
            dropped.append(dropped_record(node, reply.error.reason, node_party))
        else:
            ok.append(reply)
    for node in expected_nodes:
        if node not in answered:
            dropped.append(dropped_record(node, f"no reply within {timeout:g}s (timeout)", node_party))
    return ok, dropped


def dropped_record(node: int, reason: str, node_party: dict[int, int]) -> dict:
    return {"node": node, "party": node_party.get(node), "reason": _short(reason)}


def node_error(ctx: RunContext, node: int, reason: str) -> dict:
    return dropped_record(node, reason, ctx.node_party)


def require_parties(ctx: RunContext, valid: int, what: str, **details) -> None:
    """Abort below min-parties; `details` (dropped, rejected) reach results.json with the error."""
    if valid < ctx.settings.min_parties:
        raise RunAborted(f"{what}: only {valid} valid parties remain; min-parties is {ctx.settings.min_parties}", details)


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
