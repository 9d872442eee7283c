"""End to end through the `flwr` CLI, as `make run` does: status from `flwr ls`, SuperLink stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commands.launch import flower_env, flwr_run, free_ports, superlink_pids

PROJECT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.sim]


def _run(tmp_path, overrides, parties):
    ports = tuple(free_ports(2))
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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_and_everything_it_started(tmp_path, signum, capsys):
    """Ctrl-C (SIGINT) or SIGTERM to `fedsmix run` in the middle of training: the command exits 130, the local
    SuperLink, the simulation process and Ray's processes it started are gone, and the run directory says it
    was interrupted (`show` no longer calls it in progress)."""
    from commands.cli import main as cli
    from commands.launch import descendants
    from fedsmix.progress import read_events

    ports = tuple(free_ports(2))
    env = flower_env(tmp_path / "flwr-home", ports)
    runs = tmp_path / "runs"
    argv = [str(Path(sys.executable).parent / "fedsmix"), "run", "--parties", "2", "--set", "epochs=200",
            "--set", "strategies=mixup-union", "--set", "trainer=mlp", "--set", f"runs-dir={runs}"]
    # as from a terminal: SIGINT at its default (a pytest-xdist worker ignores it, and children inherit that)
    proc = subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline, started = time.monotonic() + 600, []
    while time.monotonic() < deadline and proc.poll() is None:  # wait for central training (epoch lines)
        events = read_events(runs / "latest" / "progress.jsonl") if (runs / "latest").exists() else []
        if any(e["kind"] == "epoch" for e in events):
            started = superlink_pids(env)
            break
        time.sleep(1.0)
    tree = started + descendants(started)
    assert started and len(tree) > 2, "the run never reached training"  # SuperLink, simulation, Ray, ...
    proc.send_signal(signum)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output[-3000:]
    alive = [pid for pid in tree if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert alive == [], f"still running after the signal: {alive}"
    assert read_events(runs / "latest" / "progress.jsonl")[-1]["kind"] == "run-interrupted"
    assert cli(["show", str(runs / "latest")]) == 0
    assert "run interrupted: stopped by a signal" in capsys.readouterr().out
