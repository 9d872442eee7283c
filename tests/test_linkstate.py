"""The per-node message index (server/linkstate.py) answers Flower's simulation engine exactly as Flower's own
in-memory LinkState does, and a poll checks only its own node's messages. The pinned Flower is the release the
index mirrors: after an upgrade these tests fail until the index is re-checked against the new methods."""

from __future__ import annotations

import time

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from commands.inprocess import server_identity
from server import linkstate

RUN_ID = 7


def federation(nodes: int):
    """Flower's own simulation set-up (flwr/simulation/run_simulation.py): a state, a run, `nodes` nodes, a grid."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    state = factory.state()
    run = Run.create_empty(RUN_ID)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    state.run_ids[RUN_ID] = RunRecord(run=run)
    state.task_store[1] = Task(task_id=1, run_id=RUN_ID)
    node_ids = list(_register_nodes(nodes, factory))
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    return state, grid, node_ids


def push(grid, destinations: list[int], ttl: float | None = None) -> list[str]:
    messages = []
    for i, node in enumerate(destinations):
        message = Message(RecordDict({"config": ConfigRecord({"i": i})}), dst_node_id=node, message_type="query.hello",
                          **({"ttl": ttl} if ttl else {}))
        messages.append(message)
    return list(grid.push_messages(messages))


def poll(state, node_ids: list[int], run_id: int | None = None) -> list[tuple[int, int]]:
    """One pass of the engine's loop (`add_messages_to_queue`): each node's next message, as (node, i)."""
    got = []
    for node in node_ids:
        for message in state.get_message_ins(node_id=node, limit=1, **({"run_id": run_id} if run_id else {})):
            assert message.metadata.delivered_at != ""
            got.append((node, int(message.content["config"]["i"])))
    return got


@pytest.fixture
def flower_state(monkeypatch):
    """Flower's own LinkState methods for the test (whatever this process installed is back afterwards)."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    for name, method in linkstate.flower_methods().items():
        monkeypatch.setattr(InMemoryLinkState, name, method)


def scenario(indexed: bool) -> list:
    """Messages to some nodes (two to one of them), polled pass by pass; then more messages, and expired ones."""
    if indexed:
        assert linkstate.index_messages_by_node()
    with server_identity(RUN_ID):
        state, grid, node_ids = federation(6)
        node_ids.sort()
        log = []
        push(grid, [node_ids[0], node_ids[2], node_ids[2], node_ids[5]])
        log.append(poll(state, node_ids, run_id=RUN_ID + 1))  # another run asks: nothing of this run
        for _ in range(3):
            log.append(poll(state, node_ids))
        push(grid, [node_ids[1], node_ids[0]])
        log.append(poll(state, node_ids, run_id=RUN_ID))
        push(grid, [node_ids[3], node_ids[4]], ttl=0.05)  # expire before they are polled: deleted, never sent
        time.sleep(0.1)
        log.append(poll(state, node_ids))
        log.append(sorted(len(m.metadata.delivered_at) > 0 for m in state.message_ins_store.values()))
        return [[(node_ids.index(n), i) for n, i in step] if isinstance(step, list) and step
                 and isinstance(step[0], tuple) else step for step in log]


def test_the_index_answers_every_poll_as_flower_does(flower_state):
    flower, ours = scenario(indexed=False), scenario(indexed=True)
    assert flower == ours
    assert flower[0] == []  # asked for another run
    assert flower[1] == [(0, 0), (2, 1), (5, 3)]  # one message per node and pass, oldest first
    assert flower[2] == [(2, 2)] and flower[3] == []
    assert flower[4] == [(0, 1), (1, 0)]
    assert flower[5] == []  # the expired messages were dropped, not delivered


def test_an_other_flower_release_keeps_its_own_methods(flower_state, monkeypatch):
    monkeypatch.setattr(linkstate.flwr, "__version__", "9.0.0")
    assert not linkstate.index_messages_by_node()
    assert not linkstate.installed()


@pytest.mark.parametrize("indexed", [False, True])
def test_a_poll_checks_only_its_own_nodes_messages(indexed, flower_state, monkeypatch):
    """A round of one message per party, 300 parties: each node's poll checks its own message only (Flower's walk
    checks every stored message before it: the cost of a pass grows with the square of the parties)."""
    if indexed:
        linkstate.index_messages_by_node()
    with server_identity(RUN_ID):
        state, grid, node_ids = federation(300)
        push(grid, node_ids)
        checked = []
        original = type(state)._check_stored_messages
        monkeypatch.setattr(type(state), "_check_stored_messages",
                            lambda self, ids, run_id=None: (checked.append(len(ids)), original(self, ids, run_id)))
        assert len(poll(state, node_ids)) == 300
        first_pass = sum(checked)
        checked.clear()
        assert poll(state, node_ids) == []  # delivered, waiting for replies
        assert (first_pass, sum(checked)) == ((300, 0) if indexed else (300 * 301 // 2, 300 * 300))
