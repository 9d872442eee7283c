"""Shared fixtures: small slices of real data, temporary run dirs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
SLICES = Path(__file__).resolve().parent / "data" / "slices"  # committed; cut by tests/data/make_slices.py
FULL_DATA = ("mnist.npz", "cifar10.npz", "tinyimagenet32.npz")  # the whole archives the slices are cut from
TOYS = Path(__file__).resolve().parent / "toys"  # plugin modules of toy extensions (`plugins` setting)

# importable here and in every process a run starts (Ray's workers, a SuperNode): plugins load on both sides
sys.path.insert(0, str(TOYS))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TOYS), os.environ.get("PYTHONPATH", "")]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

# The tests read the committed slices, also where a test names no data-dir: the tool's own default ($FEDSMIX_DATA_DIR)
# points at them here and in every process a test starts (a CLI, Ray's workers, a SuperNode). The user's own value
# is kept for `full_data_dir`, which finds the whole archives by the tool's rules without this override.
DATA_DIR_BEFORE_TESTS = "FEDSMIX_DATA_DIR_BEFORE_TESTS"
os.environ.setdefault(DATA_DIR_BEFORE_TESTS, os.environ.get("FEDSMIX_DATA_DIR", ""))  # xdist workers inherit it
os.environ["FEDSMIX_DATA_DIR"] = str(SLICES)


@pytest.fixture(scope="session")
def data_dir() -> str:
    """The small real slices committed under tests/data/slices (a valid `data-dir`): every test that does not need
    whole data sets reads these, in CI and in a bare clone alike, so both see the same data and the same numbers."""
    missing = [name for name in FULL_DATA if not (SLICES / name).is_file()]
    if missing:
        pytest.fail(f"{SLICES}: {', '.join(missing)} missing; they are committed (git checkout tests/data/slices) "
                    "and `python tests/data/make_slices.py` cuts them again from the full archives")
    return str(SLICES)


@pytest.fixture(scope="session")
def full_data_dir() -> str:
    """The whole data sets, for a test whose point needs them: found by the tool's own data-dir rules
    (fedsmix.data.default_data_dir: $FEDSMIX_DATA_DIR, else ../shared/data beside the project, else
    ~/.cache/fedsmix/data); a clone without them fails here saying what to fetch and where to put it."""
    from fedsmix.data import DATA_DIR_ENV, default_data_dir

    with pytest.MonkeyPatch.context() as env:  # the rules as the user has them, without the slices' override
        env.delenv(DATA_DIR_ENV, raising=False)
        root = default_data_dir(os.environ[DATA_DIR_BEFORE_TESTS])
    missing = [name for name in FULL_DATA if not (root / name).is_file()]
    if missing:
        pytest.fail(
            f"this test needs the whole data sets: {', '.join(missing)} not found in {root} (the tool's data dir: "
            f"${DATA_DIR_ENV}, else ../shared/data beside the project, where this repository's CI keeps them, else "
            "~/.cache/fedsmix/data). Fetch the published uint8 archives into that folder, or point "
            f"${DATA_DIR_ENV} at a folder holding them: mnist.npz and cifar10.npz (x_train, y_train, x_test, "
            "y_test), tinyimagenet32.npz (x, y, wnids, words: the 10,000 Tiny-ImageNet validation images at 32 px); "
            "README.md, section Data, describes them, tests/data/make_slices.py lists their sha256",
            pytrace=False,
        )
    return str(root)


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


@pytest.fixture
def both_transports(one_thread):
    """Run the same overrides through the in-process transport and Flower's simulation engine: (ours, Flower's)
    `strategies` results."""
    def run(overrides: dict, parties: int) -> tuple[dict, dict]:
        from commands import inprocess
        from commands.simulate import simulate

        return inprocess.run(overrides, parties)["strategies"], simulate(overrides, parties)["strategies"]

    return run
