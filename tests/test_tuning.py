"""One selection protocol for every strategy (fedsmix/tuning.py): the parties' validation splits, the tuning
budget each strategy gets, and the cap on what a party answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from clients.app import QueryRefused, spend_queries
from commands import inprocess
from fedsmix import tuning
from fedsmix.config import SettingsError, load_settings
from fedsmix.party import load_partition, prepare_upload
from server.context import RunAborted


def _overrides(data_dir, runs_dir, **extra):
    return {"dataset": "digits", "data-dir": data_dir, "runs-dir": runs_dir, "tau": 1.0, "epochs": 2, "rounds": 3,
            "seed": 5, **extra}


def test_a_partys_validation_split_is_never_encoded_or_uploaded(data_dir):
    settings = load_settings({"dataset": "digits", "data-dir": data_dir, "validation-fraction": 0.2})
    whole = load_settings({"dataset": "digits", "data-dir": data_dir, "validation-fraction": 0.0, "tuning-budget": 1})
    for party in range(3):
        train, held = load_partition(settings, party, 3), load_partition(settings, party, 3, "validation")
        everything = load_partition(whole, party, 3)
        assert not set(train.rows) & set(held.rows)  # disjoint, and together the party's whole partition
        assert sorted([*train.rows, *held.rows]) == sorted(everything.rows)
        assert len(held.rows) == int(np.ceil(0.2 * len(everything.rows)))
        upload = prepare_upload(settings, party, 3)
        assert len(upload.arrays["x"]) == len(train.rows)  # one encoding of each training row, none of the split


def test_the_budget_draws_the_configured_setting_first_and_the_same_draw_every_time():
    settings = load_settings({"tuning-budget": 4, "client-lr": 0.03, "local-epochs": 1})
    tried = tuning.draw(settings, "fedavg")
    assert len(tried) == 4 and tried[0] == {"client-lr": 0.03, "local-epochs": 1}  # off the grid, still first
    assert len({tuple(t.items()) for t in tried}) == 4 and tried == tuning.draw(settings, "fedavg")
    assert tuning.draw(settings.replace(tuning_budget=1), "fedprox") == [
        {"client-lr": 0.03, "local-epochs": 1, "proximal-mu": settings.proximal_mu}]
    names = [f"c{i}" for i in range(10)]
    assert tuning.draw_names(settings, names, "mixup-union")[0] == "c0"
    assert len(tuning.draw_names(settings, names, "mixup-union")) == 4



def test_a_defence_that_is_on_adds_its_clipping_norm_to_the_space_within_the_same_budget():
    """DP's clipping norm is tuned like a learning rate (it moves accuracy, not epsilon); its strength is not."""
    plain = load_settings({"tuning-budget": 6})
    assert all(set(t) == {"client-lr", "local-epochs"} for t in tuning.draw(plain, "fedavg"))
    for keys, knob, field in (({"dp-sgd-epsilon": 8.0}, "dp-sgd-max-grad-norm", "dp_sgd_max_grad_norm"),
                              ({"dp-fedavg": "server"}, "dp-clipping-norm", "dp_clipping_norm")):
        settings = load_settings({"tuning-budget": 6, "model-norm": "group", **keys})
        tried = tuning.draw(settings, "fedavg")
        assert len(tried) == 6 and tried[0][knob] == getattr(settings, field)  # the configured norm first
        assert {t[knob] for t in tried} - {getattr(settings, field)}  # and others drawn beside it
        assert "dp-sgd-epsilon" not in tried[0] and "dp-noise-multiplier" not in tried[0]
        assert getattr(tuning.apply(settings, tried[1]), field) == tried[1][knob]  # what the setting trains with

def test_no_validation_split_means_no_tuning():
    with pytest.raises(SettingsError, match="validation-fraction 0 leaves nothing to choose"):
        load_settings({"validation-fraction": 0, "tuning-budget": 3})


def test_a_party_refuses_queries_beyond_its_budget():
    settings = load_settings({"tuning-budget": 2, "rounds": 3, "strategies": "fedavg"})
    assert tuning.query_cap(settings) == 2 * 4 * 1
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 2}, state=RecordDict(),
                      run_config={})
    spend_queries(settings, context, 0, 6)
    spend_queries(settings, context, 0, 2)
    with pytest.raises(QueryRefused, match="party 0: scored 8 models of its 8 this run; refuses 1 more"):
        spend_queries(settings, context, 0, 1)
    own = Context(run_id=1, node_id=8, node_config={"max-validation-queries": 3}, state=RecordDict(), run_config={})
    with pytest.raises(QueryRefused, match="of its 3 this run"):  # a deployed party names its own cap
        spend_queries(settings, own, 1, 4)


def test_a_server_that_asks_for_more_than_the_cap_gets_no_answer(data_dir, runs_dir, one_thread):
    """Through the real path: six candidates against a cap of five models a run: every party refuses, so nothing
    is chosen and the strategy fails saying so (the other strategies of the run go on)."""
    overrides = _overrides(data_dir, runs_dir, strategies="mixup-union,local-only", **{"validation-queries": 5})
    with pytest.raises(RunAborted, match="mixup-union: ValueError: no party scored any candidate") as failed:
        inprocess.run(overrides, 3)
    path = re.search(r"partial results in (\S+)\)", str(failed.value))[1]
    results = json.loads(Path(path).read_text())["strategies"]
    assert results["local-only"]["accuracy"] > 0.3  # a local-only party tunes alone and asks nobody


def test_fedavg_and_fedprox_choose_setting_and_round_on_the_parties_validation(data_dir, runs_dir, one_thread):
    results = inprocess.run(_overrides(data_dir, runs_dir, strategies="fedavg,fedprox,local-only",
                                       **{"tuning-budget": 3}), 3)["strategies"]
    for name in ("fedavg", "fedprox"):
        res = results[name]
        assert res["tuning-budget"] == 3 and len(res["tried"]) == 3
        scores = res["tried-validation-accuracy"]
        assert res["chosen"] == res["tried"][int(np.argmax(scores))], name
        validated = {p["round"]: p["validation-accuracy"] for p in res["curve"] if "validation-accuracy" in p}
        assert sorted(validated) == [1, 2, 3]  # every round scored by the voters, none of round 0
        assert res["stopped-at"] == max(validated, key=lambda r: (validated[r], -r)), name
        assert res["validation-accuracy"] == validated[res["stopped-at"]] == max(scores)
        assert res["accuracy"] == next(p["accuracy"] for p in res["curve"] if p["round"] == res["stopped-at"])
    local = results["local-only"]
    assert local["tuning-budget"] == 3 and len(local["tried"]) == 3
    assert set(local["chosen-per-party"]) == {"0", "1", "2"}
    assert all(choice["lr"] in tuning.LOCAL["lr"] + (1e-3,) for choice in local["chosen-per-party"].values())


def test_budget_one_runs_the_configured_setting_without_an_evaluation_round(data_dir, runs_dir, one_thread):
    results = inprocess.run(_overrides(data_dir, runs_dir, strategies="fedavg", **{"tuning-budget": 1}), 3)
    res = results["strategies"]["fedavg"]
    assert res["tried"] == [{"client-lr": 0.05, "local-epochs": 1}] and res["stopped-at"] == 3
    assert not any("validation-accuracy" in p for p in res["curve"])


def test_what_crafted_candidates_learn_is_the_class_histogram_and_the_cap_stops_it(data_dir):
    """The leakage docs/attacks.md states, measured: one constant model per class, scored by the party's own
    function, returns its validation split's exact class counts; under a cap below C the party refuses."""
    from torch import nn

    from fedsmix.trainers import score_models

    class Constant(nn.Module):
        def __init__(self, label: int):
            super().__init__()
            self.label = label

        def forward(self, x):
            return nn.functional.one_hot(torch.full((len(x),), self.label), 10).float()

    settings = load_settings({"dataset": "digits", "data-dir": data_dir, "strategies": "mixup-union",
                              "tuning-budget": 3, "rounds": 1})
    held = load_partition(settings, 0, 3, "validation")
    crafted = {f"class-{c}": Constant(c) for c in range(10)}
    counts = score_models(crafted, held.x, held.labels)
    assert [counts[f"class-{c}"]["correct"] for c in range(10)] == torch.bincount(held.labels, minlength=10).tolist()
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    assert tuning.query_cap(settings) == 6 < len(crafted)
    with pytest.raises(QueryRefused):  # the handler asks before it scores: the whole query is refused
        spend_queries(settings, context, 0, len(crafted))


def test_a_results_entry_describes_its_selection_for_the_tables():
    """What a grid cell and a frontier row print of a strategy's selection: the setting with its stopping round, or
    each party's own choice with how many parties made it; nothing for an entry without a tuning budget."""
    from fedsmix.tuning import described

    federated = {"tuning-budget": 6, "tried": [{}] * 6, "chosen": {"client-lr": 0.05, "local-epochs": 2},
                 "stopped-at": 8}
    assert described(federated) == {"tuning": "6 tried, budget 6", "chosen": "client-lr=0.05 local-epochs=2, round 8"}
    local = {"tuning-budget": 6, "tried": [{}] * 5, "chosen-per-party": {
        "0": {"lr": 0.01, "validation-accuracy": 0.5}, "1": {"lr": 0.003}, "2": {"lr": 0.003}}}
    assert described(local) == {"tuning": "5 tried, budget 6", "chosen": "lr=0.01 (1 party); lr=0.003 (2 parties)"}
    assert described({"tuning-budget": 6, "tried": ["mlp"], "chosen": "mlp"})["chosen"] == "mlp"
    assert described({"accuracy": 0.9}) == {}


def _liar_and_honest_votes():
    """Five honest voters that prefer candidate A (15 / 20 against 14 / 20), and one with a large split that
    votes everything for B: its answers alone decide the pooled score."""
    honest = {p: {"A": {"correct": 15, "n": 20}, "B": {"correct": 14, "n": 20}} for p in range(5)}
    return {**honest, 5: {"A": {"correct": 0, "n": 100}, "B": {"correct": 100, "n": 100}}}


def test_a_trimmed_selection_score_keeps_one_voter_from_deciding_the_choice():
    votes = _liar_and_honest_votes()
    assert tuning.pooled(votes, ["A", "B"])[0] == "B"  # pooled: the one loud voter decides
    chosen, scores = tuning.pooled(votes, ["A", "B"], "trimmed")
    assert chosen == "A" and scores == {"A": 60 / 80, "B": 56 / 80}  # its vote and the other extreme set aside
    honest = {p: v for p, v in votes.items() if p != 5}
    assert tuning.pooled(honest, ["A", "B"], "trimmed")[0] == tuning.pooled(honest, ["A", "B"])[0] == "A"
    two = {p: votes[p] for p in (0, 5)}  # fewer than three voters: nothing to trim, pooled
    assert tuning.score([v["B"] for v in two.values()], "trimmed") == tuning.score([v["B"] for v in two.values()])
    assert np.isnan(tuning.score([{"correct": 0, "n": 0}], "trimmed"))  # nobody answered


def test_fedavg_scores_its_rounds_by_the_same_selection_rule(task_identity):
    from types import SimpleNamespace

    from flwr.app import Message, MetricRecord

    from fedsmix import messages as wire
    from fedsmix.progress import SILENT
    from strategies.fedprox import ReportingFedProx

    votes = _liar_and_honest_votes()

    def replies(answers: dict[int, tuple[int, int]]) -> list[Message]:
        ins = Message(RecordDict({}), dst_node_id=1, message_type="evaluate")
        return [Message(RecordDict({wire.METRICS: MetricRecord({wire.PARTY: party, wire.CORRECT: correct,
                                                                wire.COUNT: n})}), reply_to=ins)
                for party, (correct, n) in answers.items()]

    for rule, expected in (("pooled", 170 / 200), ("trimmed", 56 / 80)):
        ctx = SimpleNamespace(settings=load_settings({"selection-score": rule}), node_party={}, progress=SILENT)
        strategy = ReportingFedProx(ctx, proximal_mu=0.0)
        strategy.aggregate_evaluate(4, replies({p: (v["B"]["correct"], v["B"]["n"]) for p, v in votes.items()}))
        assert strategy.validation[4] == pytest.approx(expected), rule
        assert not strategy.refused_votes
    # a voter is held to its split: the next round, party 5 claims ten times its rows and is not counted
    strategy.aggregate_evaluate(5, replies({0: (15, 20), 1: (14, 20), 5: (1000, 1000)}))
    assert strategy.validation[5] == pytest.approx(29 / 40)
    assert [(r["party"], r["field"]) for r in strategy.refused_votes] == [(5, "model.n")]
    # and to the split its training rows imply (180 rows to train on at validation-fraction 0.1)
    from server.plausibility import validation_rows

    strategy.train_rows[1] = 180
    sizes = validation_rows(180, 0.1)
    strategy.aggregate_evaluate(6, replies({1: (30, 2 * max(sizes))}))
    assert 6 not in strategy.validation and strategy.refused_votes[-1]["field"] == "model.n"
    strategy.aggregate_evaluate(7, replies({1: (3, min(sizes))}))
    assert strategy.validation[7] == 3 / min(sizes)


def test_a_vote_that_cannot_be_counted_is_named():
    from server.validation import vote_problem

    assert vote_problem({"a": (3, 10), "b": (10, 10)}, {10}) is None
    assert vote_problem({"a": (3, 10)}, None) is None  # no size known: counts checked alone
    assert vote_problem({"a": (3, 10), "b": (None, 10)}, {10}) == ("b", "no answer")
    assert vote_problem({"a": (3.5, 10)}, {10}) == ("a.correct", "not a whole number")
    assert vote_problem({"a": (11, 10)}, {10}) == ("a.correct", "11 correct of 10")
    assert vote_problem({"a": (-1, 10)}, None) == ("a.correct", "-1 correct of 10")
    assert vote_problem({"a": (30, 100)}, {10, 11}) == ("a.n", "scored on 100 rows; its validation split has 10 or 11")


def test_a_loud_voter_is_not_counted_through_the_real_apps(data_dir, runs_dir, one_thread):
    loud = inprocess.run(_overrides(data_dir, runs_dir, strategies="mixup-union,fedavg", fault="vote-inflate:1",
                                    **{"fault-scale": 10.0, "tuning-budget": 2, "trainer": "ridge"}), 3)
    union, fedavg = loud["strategies"]["mixup-union"], loud["strategies"]["fedavg"]
    assert [(r["party"], r["field"].split(".")[-1]) for r in union["refused-votes"]] == [(1, "n")]
    assert union["selection"]["voters"] == 2  # the other two parties chose
    assert {r["party"] for r in fedavg["refused-votes"]} == {1} and all(r["field"] == "model.n"
                                                                       for r in fedavg["refused-votes"])


def test_a_dishonest_voter_answers_the_wrong_answers_as_right_and_nothing_else(data_dir, task_identity):
    from flwr.app import ArrayRecord, ConfigRecord, Message

    from clients.app import app as client_app
    from fedsmix import data as datalib
    from fedsmix import faults
    from fedsmix import messages as wire
    from fedsmix.models import new_classifier
    from fedsmix.space import mixing_shape

    counts = {"correct": 70, "n": 100}
    assert faults.vote("vote-invert:2", 2, counts) == {"correct": 30, "n": 100}
    assert faults.vote("vote-invert:2", 1, counts) == counts and faults.vote("", 2, counts) == counts
    # through the ClientApp's evaluate handler: the listed party inverts its counts of the same model, no other does
    answers = {}
    for fault in ("", "vote-invert:1"):
        settings = load_settings(_overrides(data_dir, "unused", fault=fault))
        torch.manual_seed(0)
        model = new_classifier(settings, mixing_shape(settings), datalib.dataset_spec(settings).num_classes)
        for party in (0, 1):
            msg = Message(RecordDict({wire.ARRAYS: ArrayRecord(model.state_dict()),
                                      wire.CONFIG: ConfigRecord({"settings": settings.to_json()})}),
                          dst_node_id=7, message_type="evaluate")
            context = Context(run_id=1, node_id=7, node_config={"partition-id": party, "num-partitions": 3},
                              state=RecordDict(), run_config={})
            reply = client_app(msg, context).content[wire.METRICS]
            answers[fault, party] = (int(reply[wire.CORRECT]), int(reply[wire.COUNT]))
    correct, n = answers["", 1]
    assert n > 0 and answers["vote-invert:1", 1] == (n - correct, n)
    assert answers["vote-invert:1", 0] == answers["", 0]
