"""TensorBoard event files beside progress.jsonl (fedsmix/tensorboard_log.py), read back with TensorBoard's own
reader: the scalars equal results.json's numbers; `tensorboard: false` writes none; a writer that fails stops
alone, named by one progress event, and the run goes on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from commands import inprocess
from fedsmix.progress import FILE, Progress, read_events
from fedsmix.tensorboard_log import TensorBoardSink, attach, scalars


def _overrides(data_dir: str, runs_dir: str, **extra) -> dict:
    return {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir,
            "strategies": "mixup-union,fedavg,local-only", "epochs": 2, "rounds": 2, "eval-every": 1,
            "head-penalties": "1.0", "seed": 5, "tuning-budget": 2, **extra}


def _event_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("events.out.tfevents.*"))


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    board = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every point
    board.Reload()
    return {tag: [(e.step, e.value) for e in board.Scalars(tag)] for tag in board.Tags()["scalars"]}


def test_a_run_writes_its_scalars_and_they_equal_results_json(data_dir, runs_dir, one_thread):
    results = inprocess.run(_overrides(data_dir, runs_dir), 3)
    run_dir = Path(results["run-dir"])
    assert [p.parent for p in _event_files(Path(runs_dir))] == [run_dir]  # one file, in the run directory itself
    tags = _scalars(run_dir)
    for name in ("mixup-union", "fedavg", "local-only"):
        res = json.loads((run_dir / "results.json").read_text())["strategies"][name]
        assert tags[f"{name}/final-accuracy"] == [(0, pytest.approx(res["accuracy"]))], name
        assert tags[f"{name}/bytes-up-per-party"] == [(0, pytest.approx(res["mean-bytes-up-per-party"]))], name
        assert tags[f"{name}/bytes-down-per-party"] == [(0, pytest.approx(res["mean-bytes-down-per-party"]))], name
        assert tags[f"{name}/wall-seconds"][0][1] >= res["wall-seconds"] > 0, name  # its adversary included
    fedavg = results["strategies"]["fedavg"]  # each tuned setting has its own curve; results.json the chosen one's
    chosen = f"fedavg/setting-{fedavg['tried'].index(fedavg['chosen']) + 1}-of-2"
    assert tags[f"{chosen}/accuracy"] == [(p["round"], pytest.approx(p["accuracy"])) for p in fedavg["curve"]]
    assert tags[f"{chosen}/validation-accuracy"] == [
        (p["round"], pytest.approx(p["validation-accuracy"])) for p in fedavg["curve"] if "validation-accuracy" in p]
    for setting in ("fedavg/setting-1-of-2", "fedavg/setting-2-of-2"):
        assert [step for step, _ in tags[f"{setting}/accuracy"]] == [0, 1, 2]
        assert [step for step, _ in tags[f"{setting}/local-loss"]] == [1, 2]
        assert tags[f"{setting}/parties-answered"] == [(1, 3), (2, 3)]
    mix = results["strategies"]["mixup-union"]
    assert [step for step, _ in tags["mixup-union/loss"]] == [1, 2]  # the MLP's epochs (the first candidate)
    # the chosen trainer's own epochs (none for a closed-form one), each measured with eval-every 1
    assert tags.get("mixup-union/accuracy", []) == [(p["epoch"], pytest.approx(p["accuracy"])) for p in mix["curve"]]
    assert tags["mixup-union/returned-accuracy"] == [(0, pytest.approx(mix["returned"]["mean"]))]
    local = results["strategies"]["local-only"]
    # one point per party, written as its answer arrives (in any order): the step is the party
    assert sorted(tags["local-only/party-accuracy"]) == [
        (int(p), pytest.approx(a)) for p, a in sorted(local["per-party-accuracy"].items(), key=lambda kv: int(kv[0]))
    ]
    assert sorted(step for step, _ in tags["local-only/party-loss"]) == [0, 1, 2]
    assert not [e for e in read_events(run_dir / FILE) if e["kind"] == "sink-failed"]


def test_tensorboard_false_writes_no_event_file(data_dir, runs_dir, one_thread):
    results = inprocess.run(_overrides(data_dir, runs_dir, strategies="fedavg", rounds=1, tensorboard=False), 3)
    assert results["settings"]["tensorboard"] is False
    assert _event_files(Path(runs_dir)) == [] and results["strategies"]["fedavg"]["accuracy"] > 0


def test_sinks_get_every_epoch_the_lines_leave_out(tmp_path):
    progress, seen = Progress(tmp_path / FILE, echo=False, interval=3600), []
    progress.attach(seen.append)
    report = progress.bind(strategy="centralized").epochs(50, phase="central training")
    for epoch in range(1, 51):
        report(epoch, 1.0 / epoch, 0.9 if epoch == 20 else None)
    assert [e["epoch"] for e in read_events(tmp_path / FILE)] == [1, 20, 50]  # the lines stay throttled
    assert [e["epoch"] for e in seen] == list(range(1, 51)) and seen[19]["accuracy"] == 0.9
    assert [t for t, _, _ in scalars(seen[19])] == ["centralized/loss", "centralized/accuracy"]
    assert scalars(seen[0]) == [("centralized/loss", 1.0, 1)]


def test_the_adversarys_leakage_gets_one_scalar_per_attack(tmp_path):
    progress = Progress(tmp_path / FILE, echo=False)
    sink = attach(progress, tmp_path)
    progress.bind(strategy="mixup-union").emit("attack", attack="mmse", tau=1e-6, snr=3.5, gain=1.25)
    progress.emit("attack", attack="linear", snr=2.0, gain=None)  # no gain measured: only the SNR
    sink.close()
    tags = _scalars(tmp_path)
    assert tags == {"adversary/mixup-union/mmse/gain-snr-db": [(0, 1.25)],
                    "adversary/mixup-union/mmse/snr-db": [(0, 3.5)], "adversary/linear/snr-db": [(0, 2.0)]}
    assert scalars({"kind": "alive", "strategy": "fedavg"}) == []


def test_a_failing_writer_stops_alone_with_one_event(tmp_path, monkeypatch):
    progress = Progress(tmp_path / FILE, echo=False).bind(strategy="fedavg")
    sink = attach(progress, tmp_path)

    def broken(self, *args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("torch.utils.tensorboard.SummaryWriter.add_scalar", broken)
    for step in range(3):  # the run goes on: three rounds, one failure event
        progress.emit("round", round=step, rounds=2, accuracy=0.5)
    sink.close()
    events = read_events(tmp_path / FILE)
    assert [e["kind"] for e in events] == ["round", "sink-failed", "round", "round"]
    assert events[1]["sink"] == "tensorboard" and "No space left on device" in events[1]["error"]
    assert isinstance(sink, TensorBoardSink) and sink not in progress._shared["sinks"]


def test_without_the_tensorboard_package_the_run_goes_on_with_one_event(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    progress = Progress(tmp_path / FILE, echo=False).bind(strategy="fedavg")
    sink = attach(progress, tmp_path)
    progress.emit("round", round=0, rounds=1, accuracy=0.5)
    progress.emit("strategy-end", accuracy=0.5, seconds=1.0)
    sink.close()
    assert [e["kind"] for e in read_events(tmp_path / FILE)] == ["round", "sink-failed", "strategy-end"]
    assert _event_files(tmp_path) == []
