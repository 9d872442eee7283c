"""Bytes on the wire, counted from the actual Flower messages (every object Flower ships)."""

from __future__ import annotations

from flwr.app import Message
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects


def message_nbytes(msg: Message) -> int:
    """Sum of the serialised sizes of the message and all objects nested in it."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(msg).values())


class CountingGrid:
    """A Grid that counts the bytes of every message it sends and receives, per node.

    Flower's strategies call `grid.send_and_receive` themselves; wrapping the grid is the
    one place that sees all traffic, whatever the strategy.
    """

    def __init__(
        self, grid, to_node: dict[int, int], from_node: dict[int, int], destinations: dict[str, int] | None = None
    ):
        self._grid = grid
        self.to_node = to_node
        self.from_node = from_node
        self.destinations = {} if destinations is None else destinations

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def push_messages(self, messages):
        messages = self._count_out(messages)
        ids = list(self._grid.push_messages(messages))
        for message_id, msg in zip(ids, messages):  # SuperLink-made error replies name only these ids
            self.destinations[message_id] = msg.metadata.dst_node_id
        return ids

    def pull_messages(self, message_ids):
        return self._count_in(self._grid.pull_messages(message_ids))

    def send_and_receive(self, messages, *, timeout=None):
        messages = self._count_out(messages)
        replies = self._grid.send_and_receive(messages, timeout=timeout)
        for msg in messages:  # ids exist once pushed; SuperLink-made error replies name only these
            self.destinations[msg.metadata.message_id] = msg.metadata.dst_node_id
        return self._count_in(replies)

    def _count_out(self, messages) -> list:
        messages = list(messages)
        for msg in messages:
            self.to_node[msg.metadata.dst_node_id] += message_nbytes(msg)
        return messages

    def _count_in(self, replies) -> list:
        replies = list(replies)
        for reply in replies:
            self.from_node[reply.metadata.src_node_id] += message_nbytes(reply)
        return replies
