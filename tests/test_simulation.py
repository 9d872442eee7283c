"""In-process simulations of the real ServerApp and ClientApp (Flower simulation engine, Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands.simulate import simulate
from fedsmix.faults import CORRUPTIONS

pytestmark = pytest.mark.sim  # every test here starts Ray


def test_two_parties_all_strategies(runs_dir):
    results = simulate(
        {
            "preset": "configs/quickstart.yaml",
            "strategies": "mixup-union,local-only,fedprox",
            "runs-dir": runs_dir,
            "rounds": 2,
            "epochs": 15,
        },
        num_parties=2,
    )
    strategies = results["strategies"]
    assert results["num-parties"] == 2
    mix = strategies["mixup-union"]
    assert mix["parties-used"] == 2 and mix["accuracy"] > 0.5  # chance is 0.1
    assert set(mix["parties"]) == {"0", "1"}
    # trainer=auto through the real messages: the parties scored every candidate, the model went back
    candidates = {"mlp", "mlp-recal"} | {f"{k}@{g:g}" for k in ("ridge", "ridge-eiv", "lda", "lda-public")
                                          for g in (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)}
    tried = mix["tried"]  # the tuning budget's draw (6 by default) of the 26 candidates, scored by both parties
    assert len(tried) == 6 and set(tried) <= candidates and mix["chosen"] == mix["trainer"] in tried
    assert set(mix["selection"]["validation-accuracy"]) == set(tried) and mix["selection"]["voters"] == 2
    assert set(mix["returned"]["per-party-accuracy"]) == {"0", "1"} and mix["returned"]["min"] > 0.3
    assert all(down > 10_000 for down in mix["bytes-down-per-node"].values())  # candidates and the model
    for party in mix["parties"].values():
        assert party["snr-empirical"] <= party["snr-bound"] <= 1.0 + 1e-9
        # wire bytes of the reply include the arrays' bytes (plus metrics and framing)
        assert mix["bytes-up-per-node"][str(party["node"])] >= party["upload-bytes"] > 0
    local = strategies["local-only"]
    assert local["party0-accuracy"] is not None and len(local["per-party-accuracy"]) == 2
    prox = strategies["fedprox"]
    assert [point["round"] for point in prox["curve"]] == [0, 1, 2] and prox["accuracy"] > 0.3
    run_dir = Path(results["run-dir"])
    manifest = json.loads((run_dir / "uploads" / "manifest.json").read_text())
    assert set(manifest) == {"0", "1"}
    assert (Path(runs_dir) / "latest").resolve() == run_dir.resolve()


def test_ten_parties_quickstart(runs_dir):
    results = simulate({"preset": "configs/quickstart.yaml", "runs-dir": runs_dir}, num_parties=10)
    mix, local = results["strategies"]["mixup-union"], results["strategies"]["local-only"]
    assert mix["parties-used"] == 10 and local["parties-used"] == 10
    assert mix["union-size"] == sum(p["num-examples"] for p in mix["parties"].values())
    assert mix["accuracy"] > local["party0-accuracy"]  # pooling beats party 0 alone at tau = 1
    assert mix["accuracy"] > local["mean-party-accuracy"]


def test_bad_uploads_are_rejected_and_the_run_goes_on(runs_dir):
    """Parties 0 and 1 are honest; every other party sends a different kind of bad upload."""
    kinds = [k for k in CORRUPTIONS if k != "duplicate"]
    fault = ";".join(f"{kind}:{party}" for party, kind in enumerate(kinds, start=2))
    results = simulate(
        {
            "preset": "configs/quickstart.yaml",
            "strategies": "mixup-union",
            "runs-dir": runs_dir,
            "fault": fault,
            "max-upload-mb": 0.25,
            "epochs": 3,
            "partitioner": "iid",
        },
        num_parties=len(kinds) + 2,
    )
    mix = results["strategies"]["mixup-union"]
    assert sorted(mix["parties"]) == ["0", "1"]
    rejected = {r["party"]: r for r in mix["rejected"]}
    assert len(rejected) == len(kinds) >= 10
    expected_field = {
        "nan": "upload.x",
        "inf": "upload.x",
        "shape": "upload.x",
        "dtype": "upload.x",
        "negative-labels": "upload.y",
        "label-sum": "upload.y",
        "class-count": "upload.y",
        "empty": "upload.x",
        "oversized": "upload",
        "missing-key": "upload.y",
        "extra-key": "upload",
        "count-mismatch": "metrics.num-examples",
        "class-counts": "metrics.validation-counts",
    }
    for party, kind in enumerate(kinds, start=2):
        assert rejected[str(party)]["field"] == expected_field[kind], (kind, rejected[str(party)])
    assert mix["accuracy"] is not None


def test_failing_and_duplicate_parties(runs_dir):
    results = simulate(
        {
            "preset": "configs/quickstart.yaml",
            "strategies": "mixup-union,local-only,fedavg",
            "runs-dir": runs_dir,
            "fault": "raise:1;duplicate:3",
            "rounds": 1,
            "epochs": 3,
        },
        num_parties=4,
    )
    mix = results["strategies"]["mixup-union"]
    assert len(mix["dropped"]) == 1 and "party 1: injected fault" in mix["dropped"][0]["reason"]
    assert [r["field"] for r in mix["rejected"]] == ["party"]
    assert "duplicate" in mix["rejected"][0]["reason"]
    assert mix["parties-used"] == 2
    local = results["strategies"]["local-only"]
    assert len(local["dropped"]) == 1 and local["parties-used"] == 3
    fedavg = results["strategies"]["fedavg"]
    assert len(fedavg["dropped"]) == 1 and fedavg["dropped"][0]["round"] == 1


def test_too_few_parties_ends_with_a_clear_error(runs_dir):
    with pytest.raises(Exception, match="min-parties"):
        simulate(
            {
                "preset": "configs/quickstart.yaml",
                "strategies": "mixup-union",
                "runs-dir": runs_dir,
                "fault": "raise:0",
                "epochs": 2,
            },
            num_parties=2,
        )
    results = json.loads((Path(runs_dir) / "latest" / "results.json").read_text())
    assert "min-parties is 2" in results["strategies"]["mixup-union"]["error"]


def test_a_setting_no_party_can_start_with_aborts_the_run_once_naming_the_key(runs_dir):
    """A run config no party can load its partition with (here a data-poor party the federation lacks, which
    `fedsmix run` refuses but a hand-run `flwr run` or `simulate` passes on) fails in every ClientApp's hello:
    the ServerApp stops there with the parties' reason instead of running each strategy into it."""
    with pytest.raises(Exception, match="every party failed to start"):
        simulate(
            {
                "preset": "configs/quickstart.yaml",
                "strategies": "mixup-union,local-only,fedavg",
                "runs-dir": runs_dir,
                "partitioner": "size-skew",
                "poor-party": 5,
                "epochs": 2,
            },
            num_parties=3,
        )
    results = json.loads((Path(runs_dir) / "latest" / "results.json").read_text())
    for name in ("mixup-union", "local-only", "fedavg"):
        strategy = results["strategies"][name]
        assert strategy["error"].startswith("every party failed to start (all 3 hello replies are errors)")
        assert "poor-party: 5 is outside 0..2" in strategy["error"], strategy["error"]
        assert len(strategy["hello-errors"]) == 3 and "accuracy" not in strategy
