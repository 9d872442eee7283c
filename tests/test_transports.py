"""One protocol body, two transports: the ServerApp's strategies run unchanged over Flower's runtime (here its
simulation engine) and over the in-process transport (commands/inprocess.py: the same ClientApp, real Messages,
no Ray, no SuperLink), and train the same weights from the same seed."""

from __future__ import annotations

import pytest

from commands import inprocess
from server.context import RunAborted

STRATEGIES = "mixup-union,fedavg,fedprox,centralized,local-only"


def _overrides(data_dir: str, runs_dir: str, **extra) -> dict:
    return {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir, "strategies": STRATEGIES,
            "epochs": 2, "rounds": 2, "head-penalties": "1.0", "seed": 5, **extra}


def test_the_inprocess_transport_runs_every_strategy_through_the_real_apps(data_dir, runs_dir, one_thread):
    results = inprocess.run(_overrides(data_dir, runs_dir), 3)
    assert results["transport"] == "in-process" and results["num-parties"] == 3
    assert results["node-party"] == {str(inprocess.FIRST_NODE_ID + p): p for p in range(3)}  # learnt from hellos
    mix = results["strategies"]["mixup-union"]
    assert set(mix["parties"]) == {"0", "1", "2"} and mix["trainer"] in mix["selection"]["validation-accuracy"]
    assert set(mix["returned"]["per-party-accuracy"]) == {"0", "1", "2"}  # the model went back to every party
    assert mix["mean-bytes-up-per-party"] > mix["parties"]["0"]["upload-bytes"] > 0  # counted from the messages
    for name in ("mixup-union", "fedavg", "fedprox", "local-only"):  # every round's cost, together the strategy's
        rounds, res = results["strategies"][name]["round-costs"], results["strategies"][name]
        assert sum(r["bytes-up"] for r in rounds) == sum(res["bytes-up-per-node"].values()), name
        assert sum(r["bytes-down"] for r in rounds) == sum(res["bytes-down-per-node"].values()), name
        assert all(r["replies"] == r["messages"] and r["seconds"] >= 0 for r in rounds), name
    assert [r["kind"] for r in mix["round-costs"]] == ["query.encode", "query.validate", "query.personalize"]
    assert [r["messages"] for r in mix["round-costs"]] == [3, 3, 3]
    assert results["strategies"]["fedavg"]["rounds"] == 2  # the round count keeps its own key
    for name in ("fedavg", "fedprox"):
        assert [p["round"] for p in results["strategies"][name]["curve"]] == [0, 1, 2], name
    assert set(results["strategies"]["local-only"]["per-party-accuracy"]) == {"0", "1", "2"}
    assert all(0.3 < results["strategies"][name]["accuracy"] <= 1 for name in STRATEGIES.split(","))


def test_a_party_that_raises_is_dropped_and_the_round_goes_on(data_dir, runs_dir, one_thread):
    """Party 1 raises in every round: dropped, named and explained (the ClientApp's exception, as Flower's
    runtime reports it); the rounds go on with the two parties left (min-parties 2)."""
    overrides = _overrides(data_dir, runs_dir, strategies="fedavg", fault="raise:1", rounds=1)
    fedavg = inprocess.run(overrides, 3)["strategies"]["fedavg"]
    assert [(d["party"], d["round"]) for d in fedavg["dropped"]] == [(1, 1)] and fedavg["parties-used"] == 2
    assert "party 1: injected fault during federated" in fedavg["dropped"][0]["reason"]


def test_a_party_that_stalls_past_the_reply_timeout_is_reported_as_timed_out(data_dir, runs_dir, one_thread):
    """Parties answer one at a time (as one Ray actor would): a stalled party also delays those queued behind it,
    so with two parties the round falls below min-parties, and the error names the stalled party's timeout."""
    overrides = _overrides(data_dir, runs_dir, strategies="fedavg", fault="timeout:1", rounds=1,
                           **{"reply-timeout": 2.0})
    with pytest.raises(RunAborted, match=r"party 1 \(node 1001\) at \S+: no reply within 2s \(timeout\)"):
        inprocess.run(overrides, 2)


def test_parties_that_answer_in_turn_each_get_their_own_reply_timeout(data_dir, runs_dir, one_thread):
    """Three honest parties that take 2 s each answer one after another (as parties sharing a machine's cores do):
    the round takes past 6 s against a reply-timeout of 4 s, and every party counts, in FedAvg's rounds (Flower's
    strategy waiting on the grid) and in local-only's streamed replies alike."""
    import time

    from clients.app import app as client_app
    from fedsmix.config import load_settings
    from server.app import run_experiment

    def slow_party(msg, context):
        if msg.metadata.message_type != "query.hello":  # the hello waits on start-timeout
            time.sleep(2.0)
        return client_app(msg, context)

    overrides = _overrides(data_dir, runs_dir, strategies="fedavg,local-only", rounds=1, epochs=1,
                           **{"reply-timeout": 4.0, "tuning-budget": 1})
    with inprocess.server_identity(), inprocess.InProcessGrid(3, client_app=slow_party) as grid:
        results = run_experiment(grid, load_settings(overrides))
    fedavg, local = results["strategies"]["fedavg"], results["strategies"]["local-only"]
    assert fedavg["dropped"] == [] and fedavg["parties-used"] == 3, fedavg["dropped"]
    assert local["dropped"] == [] and set(local["per-party-accuracy"]) == {"0", "1", "2"}, local["dropped"]
    assert max(r["seconds"] for r in fedavg["round-costs"] + local["round-costs"]) > 6.0  # past one reply-timeout


def test_the_raw_inprocess_grid_waits_a_reply_timeout_after_the_last_reply():
    """The transport's own send_and_receive (outside CountingGrid) keeps the same wait rule: three parties that take
    0.6 s each, answering in turn, all count against a timeout of 1 s; a fourth that stalls is given up 1 s after the
    last reply, not after the push."""
    import time

    from flwr.app import Message, RecordDict

    def party(msg, context):
        time.sleep(4.0 if context.node_config["partition-id"] == 3 else 0.6)
        return Message(RecordDict(), reply_to=msg)

    with inprocess.server_identity(), inprocess.InProcessGrid(4, client_app=party) as grid:
        nodes = sorted(grid.get_node_ids())
        messages = [grid.create_message(RecordDict(), "query.ping", node, "0") for node in nodes]
        t0 = time.monotonic()
        replies = list(grid.send_and_receive(messages, timeout=1.0))
        waited = time.monotonic() - t0
    assert sorted(r.metadata.src_node_id for r in replies) == nodes[:3]  # all three slow ones, not the first only
    assert 1.8 + 1.0 <= waited < 1.8 + 4.0  # ended by the stalled party's timeout after the third reply


@pytest.mark.sim
def test_both_transports_train_the_same_weights_from_the_same_seed(data_dir, tmp_path, one_thread):
    """digits, 3 parties, every strategy (trainer selection and the model's return included), one thread on both
    sides (Ray's actors run one): equal weight digests, choices and accuracies; the same messages' bytes."""
    from commands.simulate import simulate

    overrides = _overrides(data_dir, str(tmp_path / "runs"))
    ours = inprocess.run(overrides, 3)["strategies"]
    flower = simulate(overrides, 3)["strategies"]
    for name in ("mixup-union", "fedavg", "fedprox", "centralized"):
        assert ours[name]["weights-sha256"] == flower[name]["weights-sha256"], name
        assert ours[name]["accuracy"] == flower[name]["accuracy"], name
    assert ours["mixup-union"]["trainer"] == flower["mixup-union"]["trainer"]
    assert ours["mixup-union"]["returned"] == flower["mixup-union"]["returned"]
    assert ours["local-only"]["per-party-accuracy"] == flower["local-only"]["per-party-accuracy"]
    for name in ("mixup-union", "fedprox"):  # node ids differ in size on the wire, nothing else
        for key in ("mean-bytes-up-per-party", "mean-bytes-down-per-party"):
            assert ours[name][key] == pytest.approx(flower[name][key], rel=1e-3), (name, key)
