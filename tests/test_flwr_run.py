"""End to end through the `flwr` CLI, as `make run` does: status from `flwr ls`, SuperLink stopped."""

from __future__ import annotations

import json

import pytest

from commands.launch import flower_env, flwr_run, free_port, superlink_pids

pytestmark = [pytest.mark.slow, pytest.mark.sim]


def _run(tmp_path, overrides, parties):
    ports = (free_port(), free_port())
    home = tmp_path / "flwr-home"
    config = {"preset": "configs/quickstart.yaml", "runs-dir": str(tmp_path / "runs"), **overrides}
    result = flwr_run(config, parties, flwr_home=home, ports=ports, echo=False)
    assert superlink_pids(flower_env(home, ports)) == []  # the SuperLink we started is gone
    return result


def test_flwr_run_completes_and_writes_results(tmp_path):
    result = _run(tmp_path, {"epochs": 10}, parties=3)
    assert result.ok, result.output[-3000:]
    results = json.loads((tmp_path / "runs" / "latest" / "results.json").read_text())
    assert results["num-parties"] == 3
    assert results["strategies"]["mixup-union"]["accuracy"] > 0.5
    assert "fedsmix results" in result.output  # the table reached the stream


def test_a_failing_serverapp_is_reported_as_failed(tmp_path):
    """`flwr run --stream` exits 0 here; only `flwr ls` tells the truth."""
    result = _run(tmp_path, {"fault": "raise:0", "strategies": "mixup-union", "epochs": 2}, parties=2)
    assert result.returncode == 0
    assert result.status == "finished:failed" and not result.ok
