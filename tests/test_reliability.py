"""Reliability through the real apps: reproducible runs, resume after a crash, parties that time out.

Every run here is an in-process Flower simulation (Ray) of the real ServerApp and ClientApp on
scikit-learn digits, 3 parties, a few epochs.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from rich.console import Console

from clients.app import app as client_app
from commands.simulate import simulate
from fedsmix.config import load_settings
from server.results import render

PARTIES = 3
BASE = {
    "preset": "configs/quickstart.yaml",
    "strategies": "mixup-union,local-only,fedavg",
    "epochs": 4,
    "rounds": 1,
    "checkpoint-every": 1,
    "trainer": "mlp",  # the checkpointed, resumable loop (a selection's candidates are retrained on resume)
}


def manifest(results: dict) -> dict[str, tuple[str, str]]:
    entries = json.loads((Path(results["run-dir"]) / "uploads" / "manifest.json").read_text())
    return {party: (e["x"]["sha256"], e["y"]["sha256"]) for party, e in entries.items()}


def outcome(results: dict) -> dict:
    """Everything a run computes, without wall-clock times and node ids (both differ per run)."""
    mix, local, fedavg = (results["strategies"][k] for k in ("mixup-union", "local-only", "fedavg"))
    timeless = ("encode-seconds", "node", "upload-bytes")
    return {
        "mixup-union": (mix["accuracy"], mix["test-loss"], mix["weights-sha256"], mix["union-size"]),
        "parties": {p: {k: v for k, v in m.items() if k not in timeless} for p, m in mix["parties"].items()},
        "local-only": local["per-party-accuracy"],
        "fedavg": [(point["round"], point["accuracy"]) for point in fedavg["curve"]],
    }


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    runs = tmp_path_factory.mktemp("baseline")
    return simulate({**BASE, "runs-dir": str(runs)}, num_parties=PARTIES)


@pytest.mark.sim  # starts Ray
def test_same_seed_is_bit_identical(baseline, runs_dir):
    again = simulate({**BASE, "runs-dir": runs_dir}, num_parties=PARTIES)
    assert manifest(again) == manifest(baseline)  # every party's upload: same sha256
    assert outcome(again) == outcome(baseline)  # accuracy, loss, weights, per-party and per-round metrics


@pytest.mark.sim  # starts Ray
def test_another_seed_gives_other_encodings(baseline, runs_dir):
    other = simulate({**BASE, "strategies": "mixup-union", "seed": 1, "runs-dir": runs_dir}, num_parties=PARTIES)
    ours, theirs = manifest(baseline), manifest(other)
    assert set(ours) == set(theirs) == {str(p) for p in range(PARTIES)}
    for party in ours:
        assert ours[party][0] != theirs[party][0], party  # encoded inputs differ for every party


@pytest.mark.sim  # starts Ray
def test_interrupted_training_resumes_to_the_same_model(baseline, tmp_path):
    runs = str(tmp_path / "runs")
    settings = {**BASE, "strategies": "mixup-union", "runs-dir": runs}
    with pytest.raises(Exception, match="interruption of central training after epoch 2"):
        simulate({**settings, "fault": "interrupt:2"}, num_parties=PARTIES)
    crashed = json.loads((Path(runs) / "latest" / "results.json").read_text())
    run_dir = Path(crashed["run-dir"])
    assert "error" in crashed["strategies"]["mixup-union"]
    assert torch.load(run_dir / "checkpoints" / "central.pt", weights_only=False)["epoch"] == 2
    stored = manifest(crashed)
    assert stored == manifest(baseline)  # the uploads survived the crash, sha256 and all

    resumed = simulate({**settings, "resume": str(run_dir)}, num_parties=PARTIES)
    assert resumed["run-dir"] == str(run_dir)
    mix = resumed["strategies"]["mixup-union"]
    assert mix["resumed-from-epoch"] == 2 and mix["epochs"] == BASE["epochs"]
    assert all(p.get("from-store") for p in mix["parties"].values())  # no party encoded again
    assert mix["mean-bytes-up-per-party"] < 10_000  # stubs, not uploads
    assert manifest(resumed) == stored
    reference = baseline["strategies"]["mixup-union"]
    assert (mix["accuracy"], mix["test-loss"], mix["weights-sha256"]) == (
        reference["accuracy"], reference["test-loss"], reference["weights-sha256"],
    )
    weights = torch.load(run_dir / "models" / "mixup-union.pt")
    expected = torch.load(Path(baseline["run-dir"]) / "models" / "mixup-union.pt")
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in weights)


@pytest.mark.sim  # starts Ray
def test_resume_reverifies_uploads_and_asks_only_for_the_damaged_one(baseline, tmp_path):
    runs = str(tmp_path / "runs")
    settings = {**BASE, "strategies": "mixup-union", "runs-dir": runs}
    with pytest.raises(Exception, match="interruption"):
        simulate({**settings, "fault": "interrupt:1"}, num_parties=PARTIES)
    run_dir = (Path(runs) / "latest").resolve()
    damaged = run_dir / "uploads" / "party-001.x.npy"
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"\0" * 8)  # bit rot in party 1's file

    resumed = simulate({**settings, "resume": "latest"}, num_parties=PARTIES)
    mix = resumed["strategies"]["mixup-union"]
    assert [d["party"] for d in mix["discarded-uploads"]] == ["1"]
    assert not mix["parties"]["1"].get("from-store") and mix["parties"]["0"]["from-store"]
    assert manifest(resumed) == manifest(baseline)  # party 1 re-encoded the same bytes from its seed
    assert mix["weights-sha256"] == baseline["strategies"]["mixup-union"]["weights-sha256"]


@pytest.mark.sim  # starts Ray
def test_resume_refuses_other_settings(baseline):
    with pytest.raises(Exception, match=r"resume: .* other settings \(epochs: 4 -> 5"):
        simulate(
            {**BASE, "epochs": 5, "runs-dir": str(Path(baseline["run-dir"]).parent), "resume": "latest"},
            num_parties=PARTIES,
        )


@pytest.mark.sim  # starts Ray
def test_a_party_that_times_out_is_dropped_in_every_strategy(runs_dir):
    """Party 2 stalls past the reply timeout in mixup-union, local-only and FedProx (FedAvg is the
    same class with mu = 0). One actor per party, so the stalled one holds up nobody."""
    timeout = 30.0
    results = simulate(
        {
            **BASE,
            "strategies": "mixup-union,local-only,fedprox",
            "fault": "timeout:2",
            "reply-timeout": timeout,
            "tuning-budget": 2,  # the stalled party times out in each setting's rounds: two settings show it
            "runs-dir": runs_dir,
        },
        num_parties=PARTIES,
        federation={"init-args-num-cpus": PARTIES},
    )
    for name, res in results["strategies"].items():
        assert "error" not in res, (name, res)
        assert res["parties-used"] == PARTIES - 1, name
        assert len(res["dropped"]) == 1, (name, res["dropped"])
        assert f"no reply within {timeout:g}s (timeout)" in res["dropped"][0]["reason"], name
        assert res["dropped"][0]["party"] == 2, name  # named: it answered the server's hello
    assert results["strategies"]["fedprox"]["dropped"][0]["round"] == 1
    assert sorted(results["strategies"]["mixup-union"]["parties"]) == ["0", "1"]

    printed = io.StringIO()
    render(results, Console(file=printed, width=250))
    rows = [line for line in printed.getvalue().splitlines() if "timeout" in line]
    for name in results["strategies"]:  # the printed table lists the dropped party of every strategy
        assert any(name in row and "dropped" in row for row in rows), (name, printed.getvalue())


def ask(message_type: str, config: dict, party: int = 1) -> Message:
    msg = Message(RecordDict({"config": ConfigRecord(config)}), dst_node_id=7, message_type=message_type)
    context = Context(
        run_id=1, node_id=7, node_config={"partition-id": party, "num-partitions": 3}, state=RecordDict(), run_config={}
    )
    return client_app(msg, context)


def test_hello_and_stored_stub_replies_carry_only_the_party(task_identity):
    """The two small replies a party sends besides its upload: no arrays, no secrets."""
    settings = load_settings({"preset": "configs/quickstart.yaml"}).to_json()
    hello = ask("query.hello", {"settings": settings})
    assert set(hello.content.keys()) == {"metrics"}
    assert dict(hello.content["metrics"]) == {"party": 1, "num-examples": hello.content["metrics"]["num-examples"]}
    stub = ask("query.encode", {"settings": settings, "stored-parties": "0,1"})
    assert set(stub.content.keys()) == {"metrics"} and dict(stub.content["metrics"]) == {"party": 1, "stored": 1}
    fresh = ask("query.encode", {"settings": settings, "stored-parties": "0,2"})
    assert set(fresh.content.keys()) == {"upload", "metrics"}  # not stored: it encodes and uploads


def test_the_wait_ends_a_reply_timeout_after_the_last_reply_not_after_the_push(task_identity):
    """The counting grid's one wait rule: replies that come in turn, each within the timeout, are all received
    however long the round; a node that never answers ends the wait one timeout after the last reply."""
    from collections import defaultdict

    from server.traffic import CountingGrid

    class InTurn:  # node k answers 0.3 s after node k-1; node 13 never
        def push_messages(self, messages):
            self.start, self.ids = time.monotonic(), [f"id-{m.metadata.dst_node_id}" for m in messages]
            return self.ids

        def pull_messages(self, ids):
            due = int((time.monotonic() - self.start) / 0.3)
            ready = [i for i in self.ids[:due] if i in ids and i != "id-13"]
            return [Message(RecordDict(), reply_to=asked[i]) for i in ready]

    asked = {}

    messages = [Message(RecordDict(), dst_node_id=node, message_type="query.x") for node in (10, 11, 12, 13)]
    grid = CountingGrid(InTurn(), defaultdict(int), defaultdict(int))
    for msg, message_id in zip(messages, [f"id-{n}" for n in (10, 11, 12, 13)]):
        msg.metadata.__dict__["_message_id"] = message_id
        asked[message_id] = msg
    started = time.monotonic()
    replies = list(grid.stream(messages, timeout=0.5))
    waited = time.monotonic() - started
    assert [r.metadata.reply_to_message_id for r in replies] == ["id-10", "id-11", "id-12"]  # 0.9 s, past 0.5
    assert 1.3 <= waited < 3.0  # the last reply at about 0.9 s, then one timeout of silence


def test_pushed_messages_name_their_node_for_the_superlinks_stand_in_replies(task_identity):
    """Streamed uploads go through push_messages: a reply the SuperLink makes for a dead node names only
    the message id, so the counting grid must remember each pushed id's destination."""
    from collections import defaultdict

    from server.traffic import CountingGrid

    class PushOnly:
        def push_messages(self, messages):
            return [f"id-{msg.metadata.dst_node_id}" for msg in messages]

    config = ConfigRecord({"settings": "{}"})
    messages = [
        Message(RecordDict({"config": config}), dst_node_id=node, message_type="query.encode") for node in (11, 12)
    ]
    to_node, from_node, destinations = defaultdict(int), defaultdict(int), {}
    ids = CountingGrid(PushOnly(), to_node, from_node, destinations).push_messages(messages)
    assert ids == ["id-11", "id-12"]
    assert destinations == {"id-11": 11, "id-12": 12}
    assert to_node[11] > 0 and to_node[12] > 0


def test_the_hello_waits_for_a_slow_cold_start_past_the_reply_timeout(task_identity):
    """A loaded machine can take minutes to start the Ray actors and import torch. The hello waits up to
    start-timeout for every party, so the first strategy's reply-timeout starts with warm parties."""
    from types import SimpleNamespace

    from server.context import RunContext

    class SlowStart:  # three nodes whose hello replies arrive 1.5 s after they were sent
        def get_node_ids(self):
            return [11, 12, 13]

        def push_messages(self, messages):
            self.sent, self.ids = time.monotonic(), [f"hello-{msg.metadata.dst_node_id}" for msg in messages]
            return list(self.ids)

        def pull_messages(self, ids):
            if time.monotonic() - self.sent < 1.5:
                return []
            return [answer(message_id) for message_id in self.ids if message_id in ids]

    def answer(message_id: str):
        node = int(message_id.split("-")[1])
        metadata = SimpleNamespace(reply_to_message_id=message_id, src_node_id=node)
        return SimpleNamespace(metadata=metadata, has_error=lambda: False, content={"metrics": {"party": node - 11}})

    def introduce(reply: float, start: float) -> dict[int, int]:
        settings = load_settings({"preset": "configs/quickstart.yaml", "reply-timeout": reply, "start-timeout": start})
        return RunContext(settings=settings, grid=SlowStart(), run_dir=None, device="cpu").introduce()

    assert introduce(reply=0.5, start=5.0) == {11: 0, 12: 1, 13: 2}
    assert introduce(reply=5.0, start=0.5) == {}  # the start, not the reply, timeout


def test_the_hello_pays_for_the_first_training_steps_lazy_imports():
    """The first torch optimizer of a process imports torch._dynamo (a minute per Ray actor on a loaded machine):
    after a party's hello, building one imports nothing more, so no reply-timeout pays for the cold start."""
    code = (
        "import sys, torch\n"
        "from flwr.supercore.task_identity import TaskIdentity\n"
        "from tests.test_reliability import ask\n"
        "TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = 1, 1, 0\n"
        "from fedsmix.config import load_settings\n"
        "ask('query.hello', {'settings': load_settings({'preset': 'configs/quickstart.yaml'}).to_json()})\n"
        "before = set(sys.modules)\n"
        "torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())\n"
        "print(sorted(set(sys.modules) - before)[:5])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
