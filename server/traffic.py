"""Bytes on the wire, counted from the actual Flower messages (every object Flower ships)."""

from __future__ import annotations

import time

from flwr.app import Message
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects


def message_nbytes(msg: Message) -> int:
    """Sum of the serialised sizes of the message and all objects nested in it."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(msg).values())


class CountingGrid:
    """A Grid that counts the bytes of every message it sends and receives, per node.

    Flower's strategies call `grid.send_and_receive` themselves; wrapping the grid is the
    one place that sees all traffic, whatever the strategy. Each push (or send-and-receive) is a round: `rounds`
    gets its message kind, how many messages went and came back, their bytes each way and the seconds from the
    push to the last reply.
    """

    def __init__(
        self, grid, to_node: dict[int, int], from_node: dict[int, int], destinations: dict[str, int] | None = None,
        rounds: list[dict] | None = None, round_of: dict[str, dict] | None = None,
    ):
        self._grid = grid
        self.to_node = to_node
        self.from_node = from_node
        self.destinations = {} if destinations is None else destinations
        self.rounds = [] if rounds is None else rounds
        self.round_of = {} if round_of is None else round_of  # message id -> its round's entry

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def push_messages(self, messages):
        messages, entry = self._count_out(messages)
        ids = list(self._grid.push_messages(messages))
        for message_id, msg in zip(ids, messages):  # SuperLink-made error replies name only these ids
            self.destinations[message_id] = msg.metadata.dst_node_id
            self.round_of[message_id] = entry
        return ids

    def pull_messages(self, message_ids):
        return self._count_in(self._grid.pull_messages(message_ids))

    def send_and_receive(self, messages, *, timeout=None):
        """Flower's Grid call (its strategies' rounds), under the same wait rule as `stream`."""
        return list(self.stream(messages, timeout))

    def stream(self, messages, timeout=None):
        """Push `messages`, then yield each reply as it arrives.

        The wait ends when every message is answered, or after `timeout` seconds in which no reply came (None:
        never). Parties that share the machine's cores answer in turn (the in-process transport's one worker,
        Ray with fewer actors than parties), so each of them gets `timeout` seconds of its own, as parties that
        run side by side do; a party that stalls is still caught `timeout` seconds after the last reply.
        """
        pending = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending and (deadline is None or time.monotonic() < deadline):
            replies = self.pull_messages(pending)
            if replies and timeout is not None:
                deadline = time.monotonic() + timeout
            for reply in replies:
                pending.discard(reply.metadata.reply_to_message_id)
            while replies:
                yield replies.pop(0)  # hand over the only reference
            if pending:
                time.sleep(0.1)

    def _count_out(self, messages) -> tuple[list, dict]:
        messages = list(messages)
        entry = {"kind": messages[0].metadata.message_type if messages else "", "messages": len(messages),
                 "replies": 0, "bytes-down": 0, "bytes-up": 0, "seconds": 0.0, "_started": time.monotonic()}
        for msg in messages:
            size = message_nbytes(msg)
            self.to_node[msg.metadata.dst_node_id] += size
            entry["bytes-down"] += size
        if messages:
            self.rounds.append(entry)
        return messages, entry

    def _count_in(self, replies) -> list:
        replies = list(replies)
        for reply in replies:
            size = message_nbytes(reply)
            self.from_node[reply.metadata.src_node_id] += size
            entry = self.round_of.pop(reply.metadata.reply_to_message_id, None)
            if entry is not None:
                entry["replies"] += 1
                entry["bytes-up"] += size
                entry["seconds"] = round(time.monotonic() - entry["_started"], 3)
        return replies


def round_costs(rounds: list[dict]) -> list[dict]:
    """The rounds as results.json keeps them (without the clock they were timed by)."""
    return [{k: v for k, v in entry.items() if not k.startswith("_")} for entry in rounds]
