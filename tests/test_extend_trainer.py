"""A central trainer added as a researcher adds one: a plugin module with one definition and one registry line
(tests/toys/toy_trainer.py), named under `trainer` (or among `auto`'s candidates), trained by mixup-union's server,
scored and used by the parties on both transports."""

from __future__ import annotations

import sys

import pytest

from commands import inprocess
from fedsmix.config import SettingsError, load_settings
from fedsmix.registry import TRAINERS

TOY = {"plugins": "toy_trainer", "trainer": "toy-nearest-mean"}


def _overrides(data_dir: str, runs_dir: str, **extra) -> dict:
    return {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir,
            "strategies": "mixup-union", "epochs": 2, "seed": 5, **extra}


def test_mixup_union_trains_the_toy_through_the_inprocess_transport(data_dir, runs_dir, one_thread):
    """The only candidate: no selection round; the parties rebuild it from its state dict when it comes back."""
    mix = inprocess.run(_overrides(data_dir, runs_dir, **TOY), 3)["strategies"]["mixup-union"]
    assert "error" not in mix, mix.get("error")
    assert mix["trainer"] == "toy-nearest-mean" and mix["selection"]["validation-accuracy"] == {}
    assert 0.5 < mix["accuracy"] <= 1
    assert set(mix["returned"]["per-party-accuracy"]) == {"0", "1", "2"}


def test_auto_scores_the_toy_with_every_built_in_family(data_dir, runs_dir, one_thread):
    mix = inprocess.run(_overrides(data_dir, runs_dir, plugins="toy_trainer", trainer="auto",
                                   **{"tuning-budget": 100}), 3)  # a budget that reaches every candidate
    scored = mix["strategies"]["mixup-union"]["selection"]["validation-accuracy"]
    assert {"toy-nearest-mean", "mlp", "mlp-recal"} <= set(scored) and 0.5 < scored["toy-nearest-mean"] <= 1
    assert {name.split("@")[0] for name in scored} >= {"ridge", "ridge-eiv", "lda", "lda-public"}


def test_a_trainer_is_refused_without_its_plugin():
    TRAINERS.remove("toy-nearest-mean")  # a process that never imported the plugin (a run naming it imports it again)
    sys.modules.pop("toy_trainer", None)
    with pytest.raises(SettingsError, match=r"trainer: unknown trainer 'toy-nearest-mean'.*auto"):
        load_settings({"trainer": "toy-nearest-mean"})


@pytest.mark.sim
def test_flowers_simulation_engine_trains_the_same_toy(data_dir, tmp_path, both_transports):
    """The plugin loads in every Ray actor (tests/conftest.py puts it on PYTHONPATH): the same head, the same
    weights as the in-process transport."""
    overrides = _overrides(data_dir, str(tmp_path / "runs"), **TOY)
    ours, flower = (run["mixup-union"] for run in both_transports(overrides, 3))
    assert flower["trainer"] == ours["trainer"] == "toy-nearest-mean"
    assert flower["weights-sha256"] == ours["weights-sha256"]
