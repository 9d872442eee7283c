"""Shared fixtures: small slices of real data, temporary run dirs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SHARED_DATA = PROJECT.parent / "shared" / "data"
TOYS = Path(__file__).resolve().parent / "toys"  # plugin modules of toy extensions (`plugins` setting)

# importable here and in every process a run starts (Ray's workers, a SuperNode): plugins load on both sides
sys.path.insert(0, str(TOYS))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOYS), os.environ.get("PYTHONPATH", "")]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture(scope="session")
def data_dir() -> str:
    if not (SHARED_DATA / "mnist.npz").exists():
        pytest.fail(f"real data expected in {SHARED_DATA} (see ../shared/data/README.md)")
    return str(SHARED_DATA)


@pytest.fixture
def runs_dir(tmp_path) -> str:
    return str(tmp_path / "runs")


@pytest.fixture(scope="module")
def one_thread():
    """Small tensors on a busy shared CPU: OpenMP threads only spin against each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def task_identity():
    """Messages are stamped with the sender's task identity, as inside a Flower process."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old


@pytest.fixture
def client_reply(task_identity):
    """The ClientApp's reply to an "encode" query, as a SuperNode of `parties` partitions would get it."""
    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from clients.app import app as client_app

    def reply(settings, party: int = 0, parties: int = 3) -> Message:
        msg = Message(
            RecordDict({"config": ConfigRecord({"settings": settings.to_json()})}),
            dst_node_id=7,
            message_type="query.encode",
        )
        context = Context(
            run_id=1,
            node_id=7,
            node_config={"partition-id": party, "num-partitions": parties},
            state=RecordDict(),
            run_config={},
        )
        return client_app(msg, context)

    return reply


# Under `make test` (pytest-xdist, one file per worker at a time, in collection order) these files start
# first: each runs for a quarter of an hour, mostly waiting, while the other workers share the rest.
LONGEST_FIRST = ("test_containers.py", "test_deployment.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True, scope="module")
def forget_toys():
    """A toy plugin (tests/toys/, names `toy-*`) registers itself in this process for good: after each test module
    its entries and modules go, so no other module sees them in its registries' lists."""
    yield
    from fedsmix import registry

    for table in (registry.STRATEGIES, registry.TRAINERS, registry.ATTACKS, registry.DEFENCES):
        for name in [name for name in table._entries if name.startswith("toy-")]:
            table.remove(name)
    for module in [name for name in sys.modules if name.startswith("toy_")]:
        del sys.modules[module]
