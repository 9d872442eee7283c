"""A defence added as a researcher adds one: a plugin module with one definition and one registry line
(tests/toys/toy_defence.py), named under `defences`, acting in every party's round on both transports and
reporting into the run's results."""

from __future__ import annotations

import sys

import pytest
import torch

from commands import inprocess
from fedsmix.config import SettingsError, load_settings
from fedsmix.models import new_classifier
from fedsmix.party import load_partition, train_local
from fedsmix.registry import DEFENCES

TOY = {"plugins": "toy_defence", "defences": "toy-noise"}


def _overrides(data_dir: str, runs_dir: str, **extra) -> dict:
    return {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir, "strategies": "fedavg",
            "rounds": 2, "seed": 5, **extra}


def test_the_toy_defence_acts_on_the_round_update_alone(data_dir, one_thread):
    """Same training, then noise of the stated std on every weight (not on BatchNorm's statistics)."""
    settings = load_settings({"dataset": "digits", "data-dir": data_dir, "partitioner": "iid", **TOY})
    part = load_partition(settings, 0, 3)
    state = new_classifier(settings, part.sample_shape, part.num_classes).state_dict()
    plain = train_local(settings.replace(defences=()), part, state, server_round=1)
    noisy = train_local(settings, part, state, server_round=1)
    assert noisy.report.losses == plain.report.losses
    weights = dict(plain.model.named_parameters())
    noise = torch.cat([(p - weights[name]).detach().flatten() for name, p in noisy.model.named_parameters()])
    assert float(noise.std()) == pytest.approx(0.01, rel=0.05) and abs(float(noise.mean())) < 1e-3
    buffers = dict(plain.model.named_buffers())
    assert all(torch.equal(b, buffers[name]) for name, b in noisy.model.named_buffers())


@pytest.fixture(scope="module")
def undefended(data_dir, tmp_path_factory, one_thread) -> dict:
    return inprocess.run(_overrides(data_dir, str(tmp_path_factory.mktemp("runs"))), 3)["strategies"]["fedavg"]


def test_fedavg_through_the_inprocess_transport_applies_and_reports_it(data_dir, runs_dir, one_thread, undefended):
    noisy = inprocess.run(_overrides(data_dir, runs_dir, **TOY), 3)["strategies"]["fedavg"]
    assert "error" not in noisy, noisy.get("error")
    assert noisy["weights-sha256"] != undefended["weights-sha256"]
    assert noisy["toy-noise"] == {"std": pytest.approx(0.01)} and "toy-noise" not in undefended
    assert [m["toy-noise-std"] for m in noisy["train-metrics"].values()] == [pytest.approx(0.01)] * 2


def test_a_defence_is_refused_without_its_plugin_and_a_built_in_one_by_name():
    DEFENCES.remove("toy-noise")  # a process that never imported the plugin (a run naming it imports it again)
    sys.modules.pop("toy_defence", None)
    with pytest.raises(SettingsError, match=r"defences: unknown defence 'toy-noise'"):
        load_settings({"defences": "toy-noise"})
    with pytest.raises(SettingsError, match=r"defences: 'prune' is on by its own keys"):
        load_settings({"defences": "prune"})


@pytest.mark.sim
def test_flowers_simulation_engine_trains_the_same_defended_weights(data_dir, tmp_path, both_transports):
    """The plugin loads in every Ray actor (tests/conftest.py puts it on PYTHONPATH): the same noise, the same
    weights as the in-process transport."""
    ours, flower = (run["fedavg"] for run in both_transports(_overrides(data_dir, str(tmp_path / "runs"), **TOY), 3))
    assert flower["weights-sha256"] == ours["weights-sha256"]
    assert flower["toy-noise"] == ours["toy-noise"]
