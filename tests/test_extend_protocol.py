"""Extending fedsmix: a toy strategy and a toy attack, each one definition plus one registry line in a plugin
module (tests/toys/), run through both transports; the settings accept their names only once registered."""

from __future__ import annotations

import math

import pytest

from commands import inprocess
from fedsmix.config import SettingsError, load_settings
from fedsmix.registry import ATTACKS, STRATEGIES


def _overrides(data_dir: str, runs_dir: str) -> dict:
    return {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir,
            "plugins": "toy_strategy,toy_attack", "strategies": "toy-one-round,mixup-union", "adversary": "toy-mean",
            "attack-victims": 20, "epochs": 2, "head-penalties": "1.0", "seed": 5}


def test_an_unregistered_name_is_refused_naming_its_key():
    for key, name in (("strategies", "toy-two-rounds"), ("adversary", "toy-median")):
        with pytest.raises(SettingsError, match=rf"{key}: .*unknown \w+ '{name}'"):
            load_settings({key: name})
    with pytest.raises(SettingsError, match=r"plugins: cannot import 'no_such_plugin'"):
        load_settings({"plugins": "no_such_plugin"})


def test_a_plugin_registers_its_names_and_the_settings_accept_them():
    settings = load_settings({"plugins": "toy_strategy,toy_attack", "strategies": "toy-one-round",
                              "adversary": "toy-mean"})
    assert settings.strategies == ("toy-one-round",) and "toy-one-round" in STRATEGIES and "toy-mean" in ATTACKS
    assert STRATEGIES.names()[:5] == ("mixup-union", "local-only", "fedavg", "fedprox", "centralized")


def test_the_toys_run_through_the_inprocess_transport(data_dir, runs_dir, one_thread):
    results = inprocess.run(_overrides(data_dir, runs_dir), 3)["strategies"]
    toy = results["toy-one-round"]
    assert toy["parties-used"] == 3 and 0.2 < toy["accuracy"] <= 1  # one round of averaging learns something
    adversary = results["mixup-union"]["adversary"]
    assert adversary["errors"] == {} and set(adversary["pooled"]["attacks"]) == {"toy-mean"}
    assert adversary["pooled"]["victims"] == 60 and set(adversary["parties"]) == {"0", "1", "2"}
    assert math.isfinite(adversary["pooled"]["attacks"]["toy-mean"]["gain"]["snr_db"])  # scored like any attack


@pytest.mark.sim
def test_the_toys_give_the_same_results_through_flowers_runtime(data_dir, tmp_path, both_transports):
    ours, flower = both_transports(_overrides(data_dir, str(tmp_path / "runs")), 3)
    assert ours["toy-one-round"]["weights-sha256"] == flower["toy-one-round"]["weights-sha256"]
    assert ours["mixup-union"]["weights-sha256"] == flower["mixup-union"]["weights-sha256"]
    assert ours["mixup-union"]["adversary"]["pooled"]["attacks"]["toy-mean"]["score"] == \
        flower["mixup-union"]["adversary"]["pooled"]["attacks"]["toy-mean"]["score"]
