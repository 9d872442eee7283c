"""The in-process transport: the real ServerApp body (`server.app.run_experiment`) and the real ClientApp
(`clients.app.app`) exchanging real Flower Messages in one process, with no Ray, no SuperLink and no `flwr` CLI.

Every protocol is written once, against Flower's `Grid` (send queries to parties, receive their replies); this
module is the second implementation of that interface beside Flower's own (the simulation engine and the
deployment runtime). A run here executes the very code a Flower run executes, on both sides of the wire, so
its results are a Flower run's results (tests/test_transports.py compares the weights' digests); what it saves is
Ray's and the SuperLink's start-up and polling, and the ClientApp processes. `--engine inprocess` in the grid.

Parties answer one message at a time, in the order the server sent them (one worker thread, as one Ray actor:
a party's training seeds PyTorch's global generator, so parties in threads side by side would draw from each
other's streams), each with its own Flower `Context` (node config `partition-id`, `num-partitions`), kept
between messages as a SuperNode keeps it. A handler that raises becomes an error reply, as Flower's runtime
sends it; a handler that stalls past the server's timeout is reported by the server as a timeout, and delays
the parties queued behind it.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from contextlib import contextmanager

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedsmix.config import Settings, load_settings
from fedsmix.data import describe_dataset
from fedsmix.partition import check_poor_party

FIRST_NODE_ID = 1000  # node ids of parties 0, 1, ... (Flower's SuperLink is node 1)


class InProcessGrid(Grid):
    """Flower's Grid over `num_parties` in-process nodes that run `client_app` (default the fedsmix ClientApp)."""

    transport = "in-process"  # results.json names the transport a run went through

    def __init__(self, num_parties: int, client_app: Callable[[Message, Context], Message] | None = None,
                 run_id: int = 0, node_config: dict | None = None):
        if client_app is None:
            from clients.app import app as client_app
        self._app = client_app
        self._run = Run.create_empty(run_id)
        self._contexts = {
            FIRST_NODE_ID + party: Context(
                run_id=run_id, node_id=FIRST_NODE_ID + party, state=RecordDict(), run_config={},
                node_config={"partition-id": party, "num-partitions": num_parties, **(node_config or {})},
            )
            for party in range(num_parties)
        }
        self._inbox: queue.Queue[Message | None] = queue.Queue()
        self._replies: dict[str, Message] = {}
        self._arrived = threading.Condition()
        self._worker = threading.Thread(target=self._serve, name="in-process parties", daemon=True)
        self._worker.start()

    # --------------------------------------------------------------------- Grid
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            if msg.metadata.dst_node_id not in self._contexts:
                raise ValueError(f"message to node {msg.metadata.dst_node_id}: no such node in this federation")
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # as Flower's grids number them
            ids.append(msg.metadata.message_id)
            self._inbox.put(msg)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        with self._arrived:
            return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """The replies that came, under server/traffic.py's wait rule: every message answered, or `timeout`
        seconds after the last reply (the parties answer one at a time here, each gets a timeout of its own)."""
        pending = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        with self._arrived:
            while pending:
                arrived = [i for i in self._replies if i in pending]  # in the order they arrived
                replies += [self._replies.pop(i) for i in arrived]
                pending.difference_update(arrived)
                if arrived and timeout is not None:
                    deadline = time.monotonic() + timeout
                left = None if deadline is None else deadline - time.monotonic()
                if not pending or (left is not None and left <= 0):
                    break
                self._arrived.wait(left)
        return replies

    # ----------------------------------------------------------------- parties
    def _serve(self) -> None:
        while (msg := self._inbox.get()) is not None:
            try:
                reply = self._app(msg, self._contexts[msg.metadata.dst_node_id])
            except Exception as err:  # as Flower's runtime: the party's exception becomes an error reply
                reason = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            with self._arrived:
                self._replies[msg.metadata.message_id] = reply
                self._arrived.notify_all()

    def close(self) -> None:
        """Stop the parties' worker once it is done with what it holds (a stalled party is left to end alone)."""
        self._inbox.put(None)
        self._worker.join(timeout=5.0)

    def __enter__(self) -> InProcessGrid:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def server_identity(run_id: int = 0):
    """The task identity Flower stamps on the server's messages (as `flwr.simulation.run_simulation` sets it)."""
    from flwr.common.constant import SUPERLINK_NODE_ID

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old


def run(settings: Settings | dict, num_parties: int, run_id: int = 0) -> dict:
    """One experiment (every strategy of `settings`) through the in-process transport; returns results.json."""
    from server.app import run_experiment

    settings = settings if isinstance(settings, Settings) else load_settings(settings)
    describe_dataset(settings)  # a bad data set of your own fails here, before any run directory exists
    check_poor_party(settings.partitioner, settings.poor_party, num_parties)  # and a party the federation lacks
    with server_identity(run_id), InProcessGrid(num_parties, run_id=run_id) as grid:
        return run_experiment(grid, settings, run_id=run_id)
