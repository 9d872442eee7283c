"""One dishonest party through the real ServerApp and ClientApp (Flower simulation, Ray), per fault kind.

Three parties of digits (IID, so that the checks compare like with like at this size), party 2 dishonest.
All runs share one simulation (commands.simulate.simulate_each: one Ray start), each is its own experiment.
"""

from __future__ import annotations

import io
import math

import pytest
from rich.console import Console

from commands.simulate import simulate_each
from fedsmix.config import load_settings
from server.results import render

pytestmark = pytest.mark.sim  # starts Ray

PARTIES, BAD = 3, 2
MIXUP = {"strategies": "mixup-union", "epochs": 3, "trainer": "mlp", "return-model": False}
FEDAVG = {"strategies": "fedavg", "rounds": 3}
RUNS = {
    "scale": {**MIXUP, "fault": f"scale:{BAD}"},
    "garbage": {**MIXUP, "fault": f"garbage:{BAD}"},
    "label-flip": {**MIXUP, "fault": f"label-flip:{BAD}"},
    "replay": {**MIXUP, "fault": f"replay:{BAD}"},
    # honest, with feature skew: seed 32 makes party 1 far darker and flatter (x 0.35, contrast x 0.55) than 0 and 2
    "feature skew": {**MIXUP, "feature-skew": 1.0, "seed": 32},
    "fedavg scale": {**FEDAVG, "fault": f"scale:{BAD}", "fault-scale": 1e4},
    "fedmedian scale": {**FEDAVG, "fault": f"scale:{BAD}", "fault-scale": 1e4, "aggregation": "fedmedian"},
    "fedprox+median sign-flip": {"strategies": "fedprox", "rounds": 3, "fault": f"sign-flip:{BAD}",
                                 "aggregation": "fedmedian"},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = {"preset": "configs/quickstart.yaml", "partitioner": "iid", "runs-dir": str(tmp_path_factory.mktemp("runs"))}
    settings = [load_settings({**base, **overrides, "run-name": name.replace(" ", "-").replace("+", "-")})
                for name, overrides in RUNS.items()]
    return dict(zip(RUNS, simulate_each(settings, PARTIES)))


def quarantined(result: dict) -> list[tuple[int, str]]:
    mix = result["strategies"]["mixup-union"]
    assert "error" not in mix, mix.get("error")
    return [(q["party"], q["check"]) for q in mix["quarantined"]]


# garbage: any of the three checks made for it (docs/robustness.md); with three parties the party's own
# shortfall widens the parties' spread, so labels-vs-inputs abstains and structure decides, and digits' 64
# dimensions leave random rows' norms spread enough for norm-spread to let them through
@pytest.mark.parametrize(("kind", "checks"), [("scale", {"domain"}),
                                              ("garbage", {"labels-vs-inputs", "structure", "norm-spread"}),
                                              ("label-flip", {"labels-vs-inputs"})])
def test_the_dishonest_party_is_quarantined_and_the_run_goes_on(runs, kind, checks):
    result = runs[kind]
    [(party, check)] = quarantined(result)
    assert party == BAD and check in checks
    mix = result["strategies"]["mixup-union"]
    assert sorted(mix["parties"]) == ["0", "1"] and mix["parties-used"] == 2  # honest parties all used
    assert mix["quarantined"][0]["node"] in {int(n) for n in mix["bytes-up-per-node"]}  # its node named too
    assert mix["accuracy"] > 0.5 and not mix["rejected"]  # it passed validation: well-formed, implausible
    printed = io.StringIO()
    render(result, Console(file=printed, width=250))
    assert any("quarantined" in line and check in line for line in printed.getvalue().splitlines())


def test_a_replayed_upload_is_caught(runs):
    """Content cannot tell copy from original: one of the two identical uploads is quarantined, naming the other."""
    (party, check), = quarantined(runs["replay"])
    assert check == "replay" and party in (BAD - 1, BAD)
    reason = runs["replay"]["strategies"]["mixup-union"]["quarantined"][0]["reason"]
    assert f"party {({BAD - 1, BAD} - {party}).pop()}'s upload" in reason
    assert runs["replay"]["strategies"]["mixup-union"]["parties-used"] == 2


def test_honest_parties_with_their_own_acquisition_all_pass(runs):
    mix = runs["feature skew"]["strategies"]["mixup-union"]
    assert quarantined(runs["feature skew"]) == [] and not mix["rejected"]
    assert mix["parties-used"] == PARTIES and mix["accuracy"] > 0.5
    spread = {int(p): math.sqrt(float(r["V"])) for p, r in mix["parties"].items()}
    assert spread[1] < min(spread[0], spread[2]) / 2  # the dark party's images differ that much
    shifts = runs["feature skew"]["acquisitions"]  # each party's acquisition, in results.json
    assert sorted(shifts) == ["0", "1", "2"] and shifts["1"]["brightness"] < 0.4 and shifts["0"]["rotation"] != 0


def test_one_scaled_update_sinks_fedavg_but_not_fedmedian(runs):
    plain, median = runs["fedavg scale"]["strategies"]["fedavg"], runs["fedmedian scale"]["strategies"]["fedavg"]
    assert plain["aggregation"] == "fedavg" and median["aggregation"] == "fedmedian"
    assert plain["accuracy"] < 0.3 < 0.7 < median["accuracy"]  # chance is 0.1


def test_fedprox_with_a_robust_aggregator_survives_a_sign_flipped_update(runs):
    prox = runs["fedprox+median sign-flip"]["strategies"]["fedprox"]
    assert prox["aggregation"] == "fedmedian" and prox["proximal-mu"] > 0
    assert prox["accuracy"] > 0.7 and prox["parties-used"] == PARTIES
