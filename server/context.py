"""What a strategy needs from the server: settings, grid, run dir, test split, accounting."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import Message
from flwr.serverapp import Grid

from fedsmix.config import Settings
from fedsmix.pipeline import load_test
from server.traffic import CountingGrid


class RunAborted(RuntimeError):
    """The run cannot go on (too few parties); the message says why."""


@dataclass
class Traffic:
    """Bytes per node, in each direction, from the real messages."""

    to_node: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    from_node: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    destinations: dict[str, int] = field(default_factory=dict)  # message id -> node it was sent to


@dataclass
class RunContext:
    settings: Settings
    grid: Grid
    run_dir: Path
    device: str
    run_id: int = 0
    traffic: Traffic = field(default_factory=Traffic)
    _test: tuple | None = None

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
                    f"only {len(nodes)} parties connected after {wait_seconds:.0f}s; min-parties is {self.settings.min_parties}"
                )
            time.sleep(1.0)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        return list(self.counting_grid().send_and_receive(messages, timeout=timeout or self.settings.reply_timeout))

    def counting_grid(self) -> CountingGrid:
        """The grid to hand to Flower strategies: it books every byte into `traffic`."""
        return CountingGrid(self.grid, self.traffic.to_node, self.traffic.from_node, self.traffic.destinations)

    def reset_traffic(self) -> Traffic:
        old, self.traffic = self.traffic, Traffic()
        return old
