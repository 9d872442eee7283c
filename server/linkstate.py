"""A per-node index for Flower's in-memory LinkState, so that a round's cost grows with the parties, not their square.

Flower 1.42's simulation engine (`flwr/server/superlink/fleet/vce/vce_api.py`, `add_messages_to_queue`) asks its
in-memory LinkState, every 0.1 s and for every node, for that node's next undelivered message; the LinkState
(`InMemoryLinkState.get_message_ins`) answers by walking its whole message store in insertion order, running
its validity check (`_check_stored_messages`) on each message on the way, until one is for that node. A round
that sends one message to each of N parties thus costs about N x N checks every 0.1 s, under the LinkState's
lock and Python's GIL, in the process where the ServerApp runs: at 1,000 parties half of that process's time
while uploads arrive, and at 10,000 parties a pass takes longer than the round (docs/results/performance.md).

`index_messages_by_node()` replaces those two methods with versions that keep, per destination node, the ids of
its stored messages not yet delivered: `get_message_ins(node)` then checks only that node's messages. The
answers are the same (the node's undelivered messages, oldest first, checked for expiry and federation and
marked delivered); what no longer happens is the side effect of the full walk, which checked every *other*
node's stored messages too (an expired message is now dropped when its own node is polled, every 0.1 s,
or when its reply is pulled). Installed once per process, for the Flower version whose bodies it mirrors; on
any other version it does nothing and says so (`installed()` is False), and Flower's own methods run.
"""

from __future__ import annotations

import flwr
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now

MIRRORED_VERSION = "1.42."  # the Flower release whose store_message_ins / get_message_ins these wrap
_INDEX = "_fedsmix_pending_by_node"  # node id -> {message id: None} (a dict: insertion-ordered set)
_ORIGINAL = {"store": InMemoryLinkState.store_message_ins, "get": InMemoryLinkState.get_message_ins}


def _index(state: InMemoryLinkState) -> dict[int, dict[str, None]]:
    """The state's index, built from its store on first use (messages stored before the install count too).
    Call with the state's lock held."""
    index = state.__dict__.get(_INDEX)
    if index is None:
        index = {}
        for message_id, message in state.message_ins_store.items():
            if message.metadata.delivered_at == "":
                index.setdefault(message.metadata.dst_node_id, {})[message_id] = None
        state.__dict__[_INDEX] = index
    return index


def _store_message_ins(self: InMemoryLinkState, message) -> str | None:
    message_id = _ORIGINAL["store"](self, message)
    if message_id is not None:
        with self.lock:
            _index(self).setdefault(message.metadata.dst_node_id, {})[message_id] = None
    return message_id


def _get_message_ins(self: InMemoryLinkState, node_id: int, limit: int | None, *, run_id: int | None = None) -> list:
    """Flower's `get_message_ins`, looking only at `node_id`'s own undelivered messages."""
    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found = []
    with self.lock:
        pending = _index(self).get(node_id)
        for message_id in list(pending or ()):
            self._check_stored_messages({message_id})  # expired, or a node left the federation: deleted
            message = self.message_ins_store.get(message_id)
            if message is None or message.metadata.delivered_at != "":
                del pending[message_id]  # deleted, or delivered through another path: no longer pending
                continue
            if run_id is not None and message.metadata.run_id != run_id:
                continue
            found.append(message)
            del pending[message_id]  # marked delivered below
            if limit and len(found) == limit:
                break
        if pending is not None and not pending:
            del _index(self)[node_id]
    delivered_at = now().isoformat()
    for message in found:
        message.metadata.delivered_at = delivered_at
    return found


def installed() -> bool:
    return InMemoryLinkState.get_message_ins is _get_message_ins


def index_messages_by_node() -> bool:
    """Install the index in this process (idempotent); False when this Flower is not the mirrored version."""
    if installed():
        return True
    if not flwr.__version__.startswith(MIRRORED_VERSION):
        return False
    InMemoryLinkState.store_message_ins = _store_message_ins
    InMemoryLinkState.get_message_ins = _get_message_ins
    return True


def flower_methods() -> dict:
    """Flower's own methods, by name (tests compare both)."""
    return {"store_message_ins": _ORIGINAL["store"], "get_message_ins": _ORIGINAL["get"]}
