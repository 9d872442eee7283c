"""What a strategy needs from the server: settings, grid, run dir, test split, accounting."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedsmix import messages as wire
from fedsmix.config import Settings
from fedsmix.progress import SILENT, Progress
from fedsmix.space import load_test
from server.traffic import CountingGrid


class RunAborted(RuntimeError):
    """The run cannot go on (too few parties); the message says why, `details` who dropped out."""

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.details = details or {}


@dataclass
class Traffic:
    """Bytes per node, in each direction, from the real messages."""

    to_node: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    from_node: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    destinations: dict[str, int] = field(default_factory=dict)  # message id -> node it was sent to
    rounds: list[dict] = field(default_factory=list)  # each push: kind, messages, replies, bytes each way, seconds
    round_of: dict[str, dict] = field(default_factory=dict)  # message id -> its round (until its reply came)


@dataclass
class RunContext:
    settings: Settings
    grid: Grid
    run_dir: Path
    device: str
    run_id: int = 0
    traffic: Traffic = field(default_factory=Traffic)
    node_party: dict[int, int] = field(default_factory=dict)  # learnt from replies, for reports
    node_ray: dict[int, str] = field(default_factory=dict)  # node -> Ray node id, when its ClientApp runs under Ray
    progress: Progress = SILENT  # the run's progress log, bound to the running strategy
    _test: tuple | None = None
    _hello: set[str] = field(default_factory=set)  # hello messages not answered yet
    _hello_errors: dict[int, str] = field(default_factory=dict)  # node -> why its hello failed

    def test_set(self):
        if self._test is None:
            self._test = load_test(self.settings)
        return self._test

    def nodes(self, wait_seconds: float = 60.0) -> list[int]:
        """Connected nodes; waits (bounded, never forever) until the minimum is online."""
        deadline = time.monotonic() + wait_seconds
        while True:
            nodes = sorted(self.grid.get_node_ids())
            if len(nodes) >= self.settings.min_parties:
                return nodes
            if time.monotonic() > deadline:
                raise RunAborted(
                    f"only {len(nodes)} parties connected after {wait_seconds:.0f}s; "
                    f"min-parties is {self.settings.min_parties}"
                )
            time.sleep(1.0)

    def introduce(self) -> dict[int, int]:
        """Ask every node which party it is ("query.hello", a few bytes each way), once per run.

        Reports can then name the party of a node that later raises or times out, and each party loads
        its data and warms up here, so a cold start does not eat the first strategy's reply-timeout: waits
        until every node answered or start-timeout passed (a loaded machine can take minutes to start its
        Ray actors and import torch; a dead node's stand-in error reply ends the wait for it). Later answers
        are picked up by `learn_parties()`. When every node answered and every answer is an error (a
        setting no party can run with, e.g. a hand-run `flwr run` whose run config the CLI never checked),
        every strategy would fail the same way: RunAborted, naming why.
        """
        config = ConfigRecord({wire.SETTINGS: self.settings.to_json()})
        messages = [
            Message(RecordDict({wire.CONFIG: config}), dst_node_id=node, message_type=wire.query(wire.HELLO))
            for node in self.nodes()
        ]
        self._hello = set(self.grid.push_messages(messages))  # not booked as any strategy's traffic
        parties = self.learn_parties(wait=self.settings.start_timeout)
        if parties or self._hello or not self._hello_errors:
            return parties
        reasons = sorted(set(self._hello_errors.values()))
        shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} other reasons" if len(reasons) > 3 else "")
        failed = len(self._hello_errors)
        raise RunAborted(f"every party failed to start (all {failed} hello replies are errors): {shown}",
                         {"hello-errors": {str(node): why for node, why in sorted(self._hello_errors.items())}})

    def learn_parties(self, wait: float = 0.0) -> dict[int, int]:
        """Record node -> party from the hello replies that arrived, waiting up to `wait` s for the rest."""
        deadline = time.monotonic() + wait
        reported, expected = len(self.node_party), len(self.node_party) + len(self._hello)
        while self._hello:
            for reply in self.grid.pull_messages(self._hello):
                self._hello.discard(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    self._hello_errors[reply.metadata.src_node_id] = str(reply.error.reason)
                elif wire.METRICS in reply.content:
                    self.node_party[reply.metadata.src_node_id] = int(reply.content[wire.METRICS][wire.PARTY])
                    where = reply.content.get(wire.NODE)
                    if where is not None and "ray-node-id" in where:
                        self.node_ray[reply.metadata.src_node_id] = str(where["ray-node-id"])
            if len(self.node_party) != reported:
                reported = len(self.node_party)
                self.progress.emit("parties", answered=reported, of=expected)
            if not self._hello or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return dict(self.node_party)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None,
                         phase: str = "") -> list[Message]:
        """Every reply (or the error replies of nodes that failed) within `timeout`; a named `phase` reports how many
        parties answered, at most every `progress-interval` seconds and once at the end."""
        messages = list(messages)
        replies, last = [], time.monotonic()
        for reply in self.stream_replies(messages, timeout):
            replies.append(reply)
            if phase and (time.monotonic() - last >= self.settings.progress_interval or len(replies) == len(messages)):
                self.progress.emit("answers", phase=phase, answered=len(replies), of=len(messages))
                last = time.monotonic()
        return replies

    def stream_replies(self, messages: Iterable[Message], timeout: float | None = None) -> Iterator[Message]:
        """Yield replies as they arrive, so a caller can store and drop each large one before the next.

        Stops once `timeout` (default: reply-timeout) seconds pass with no reply (`CountingGrid.stream`);
        nodes that never answered are the caller's to report (compare the replies' source nodes with the
        destinations).
        """
        yield from self.counting_grid().stream(messages, timeout or self.settings.reply_timeout)

    def counting_grid(self) -> CountingGrid:
        """The grid to hand to Flower strategies: it books every byte into `traffic`."""
        t = self.traffic
        return CountingGrid(self.grid, t.to_node, t.from_node, t.destinations, t.rounds, t.round_of)

    def reset_traffic(self) -> Traffic:
        old, self.traffic = self.traffic, Traffic()
        return old
