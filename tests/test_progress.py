"""Progress of a run: one line per event, the same events in progress.jsonl, the order per strategy, the
watchdog's cadence, and `fedsmix show` on a run still going (and `--follow`)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from commands.cli import main as cli
from fedsmix import tuning
from fedsmix.config import load_settings
from fedsmix.progress import FILE, Progress, describe, follow, read_events


def test_emit_prints_one_line_and_appends_the_same_event(tmp_path, capsys):
    progress = Progress(tmp_path / FILE).bind(strategy="local-only")
    event = progress.emit("party", party=3, done=1, of=2, accuracy=0.5)
    assert capsys.readouterr().out == "fedsmix [local-only] party 3 done: 1 of 2, test accuracy 50.00%\n"
    (stored,) = read_events(tmp_path / FILE)
    assert stored == event and stored["strategy"] == "local-only" and stored["kind"] == "party"
    assert describe(stored) == "fedsmix [local-only] party 3 done: 1 of 2, test accuracy 50.00%"


def test_epoch_lines_are_throttled_and_carry_loss_eta_and_accuracy(tmp_path):
    slow = Progress(tmp_path / "slow.jsonl", echo=False, interval=3600)
    report = slow.epochs(50, phase="central training")
    for epoch in range(1, 51):
        report(epoch, 1.0 / epoch, 0.9 if epoch == 20 else None)
    events = read_events(tmp_path / "slow.jsonl")
    assert [e["epoch"] for e in events] == [1, 20, 50]  # first, the one that measured accuracy, last
    assert events[1]["accuracy"] == 0.9 and "accuracy" not in events[0]
    assert events[-1]["eta"] == 0 and events[0]["eta"] >= 0 and events[-1]["loss"] == pytest.approx(0.02)
    every = Progress(tmp_path / "every.jsonl", echo=False, interval=0)
    report = every.epochs(5)
    for epoch in range(3, 6):  # a resumed run: ETA from the epochs run here
        report(epoch, 0.5)
    assert [e["epoch"] for e in read_events(tmp_path / "every.jsonl")] == [3, 4, 5]


def test_eta_follows_the_epochs_pace_not_the_wait_before_them(tmp_path, monkeypatch):
    """A reporter made before a 20-minute selection: the final fit's 10 s epochs give a 10 s-per-epoch ETA."""
    now = {"t": 0.0}
    monkeypatch.setattr("fedsmix.progress.time.monotonic", lambda: now["t"])
    report = Progress(tmp_path / FILE, echo=False, interval=0).epochs(30, phase="central training")
    for epoch, end in ((1, 1200.0), (2, 1210.0), (3, 1220.0)):  # made at 0, then 20 min of selection
        now["t"] = end
        report(epoch, 1.0)
    last = read_events(tmp_path / FILE)[-1]
    assert last["epoch"] == 3 and last["eta"] == pytest.approx(27 * 10.0) and last["elapsed"] == pytest.approx(30.0)


def test_the_watchdog_fills_silences_and_names_the_last_step(tmp_path):
    progress = Progress(tmp_path / FILE, echo=False).bind(strategy="fedavg")
    progress.emit("round", round=1, rounds=3, accuracy=0.5)
    with progress.watch(silence=0.3):
        time.sleep(1.6)
    events = read_events(tmp_path / FILE)
    alive = [e for e in events if e["kind"] == "alive"]
    assert len(alive) >= 2 and all("round 1/3" in e["step"] for e in alive)
    gaps = [b["clock"] - a["clock"] for a, b in zip(events, events[1:])]
    assert max(gaps) < 1.0  # never silent for long inside watch()
    time.sleep(0.5)  # stopped with the block: nothing more
    assert len(read_events(tmp_path / FILE)) == len(events)


def test_follow_tails_a_growing_file_until_the_run_ends(tmp_path):
    path = tmp_path / FILE
    writer = Progress(path, echo=False)

    def write():
        time.sleep(0.3)
        writer.emit("run-start", strategies=["mixup-union"], parties=2)
        with open(path, "a") as handle:  # a line written in two pieces is read once, whole
            handle.write('{"kind": "strategy-start", "strategy": "mixup-union", ')
            handle.flush()
            time.sleep(0.3)
            handle.write('"index": 1, "total": 1}\n')
        writer.emit("run-end", failures=[])
        writer.emit("party", party=9)  # after the end: not followed

    thread = threading.Thread(target=write)
    thread.start()
    lines: list[str] = []
    count = follow(path, out=lines.append, poll=0.05, timeout=20)
    thread.join()
    assert count == 3 and lines[1] == "fedsmix [mixup-union] start (1 of 1)"
    assert lines[-1].startswith("fedsmix run finished")


def test_show_renders_a_run_still_in_progress(tmp_path, capsys):
    run = tmp_path / "run"
    progress = Progress(run / FILE, echo=False)
    progress.emit("run-start", strategies=["mixup-union", "local-only"], parties=2)
    mix = progress.bind(strategy="mixup-union")
    mix.emit("strategy-start", index=1, total=2)
    mix.emit("upload", party=0, done=1, of=2, rows=10)
    assert cli(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "run in progress (0 strategies finished, running mixup-union)" in out
    assert "upload from party 0: 1 of 2 parties done" in out and "fedsmix results" not in out
    assert "progress: 3 events over 0s; longest silence between two: 0.0s" in out
    mix.emit("strategy-end", accuracy=0.9, seconds=3)
    (run / "results.json").write_text(json.dumps({"settings": {"dataset": "digits"}, "num-parties": 2,
                                                  "strategies": {"mixup-union": {"accuracy": 0.9}}}))
    progress.bind(strategy="local-only").emit("strategy-start", index=2, total=2)
    assert cli(["show", str(run), "--events", "2"]) == 0
    out = capsys.readouterr().out
    assert "fedsmix results" in out and "90.00" in out  # what finished so far
    assert "running local-only" in out and "[local-only] start (2 of 2)" in out and "upload from" not in out
    progress.emit("run-end", failures=[])
    assert cli(["show", str(run), "--follow", "--timeout", "5"]) == 0  # a finished run: prints it all, returns
    assert "run finished" in capsys.readouterr().out


def test_show_refuses_a_folder_that_is_no_run(tmp_path, capsys):
    assert cli(["show", str(tmp_path)]) == 2
    assert "neither results.json nor progress.jsonl" in capsys.readouterr().err


# ------------------------------------------------------------------------------- order per strategy
def assert_events_in_order(events: list[dict], settings, parties: int) -> None:
    """The run's events: run-start first and run-end last; each strategy's events together, from its start
    to its end, in the order its work happens."""
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run-start" and kinds[-1] == "run-end" and "dataset" in kinds
    work = [e for e in events if e["kind"] != "alive"]
    for name in settings.strategies:
        mine = [i for i, e in enumerate(work) if e.get("strategy") == name]
        assert mine == list(range(mine[0], mine[-1] + 1)), f"{name}: events interleave with another strategy's"
        own = [work[i] for i in mine]
        assert own[0]["kind"] == "strategy-start" and own[-1]["kind"] == "strategy-end", [e["kind"] for e in own]
        body = own[1:-1]
        steps = [k for i, k in enumerate(e["kind"] for e in body) if i == 0 or body[i - 1]["kind"] != k]
        if name == "mixup-union":
            uploads = [e for e in body if e["kind"] == "upload"]
            assert [e["done"] for e in uploads] == list(range(1, parties + 1))
            assert sorted(e["party"] for e in uploads) == list(range(parties))
            # the candidates are fit once on the whole union (the MLP's epochs), scored, and the best kept
            assert steps == ["upload", "selection-start", "epoch", "answers", "selection", "answers",
                             "returned"], steps
            answers = [e for e in body if e["kind"] == "answers"]  # each round says who answered: at its end, and
            last = {}  # while it waits past the progress interval (a loaded machine), how many so far
            for e in answers:
                assert e["answered"] >= last.get(e["phase"], {"answered": 0})["answered"], answers
                last[e["phase"]] = e
            assert [(phase, e["answered"], e["of"]) for phase, e in last.items()] == [
                ("trainer selection", parties, parties), ("model return", parties, parties)]
            epochs = [e for e in body if e["kind"] == "epoch"]
            assert {e["phase"] for e in epochs} == {"central training"} and epochs[-1]["epoch"] == settings.epochs
        elif name == "local-only":
            assert steps == ["party"] and [e["done"] for e in body] == list(range(1, parties + 1))
            assert sorted(e["party"] for e in body) == list(range(parties))
        elif name in ("fedavg", "fedprox"):
            tried = len(tuning.draw(settings, name))  # each setting the budget drew, its rounds in turn
            assert steps == ["round"] and [e["round"] for e in body] == list(range(settings.rounds + 1)) * tried
            assert all(e["answered"] == parties for e in body if e["round"])
            assert [e.get("phase") for e in body if not e["round"]] == (
                [f"setting {i + 1}/{tried}" for i in range(tried)] if tried > 1 else [None])
        elif name == "centralized":
            assert steps == ["epoch"] and body[-1]["epoch"] == settings.epochs and body[-1]["eta"] == 0
        assert own[-1]["accuracy"] is not None


def test_inprocess_transport_events_in_order_for_each_strategy(tmp_path, one_thread, capsys):
    from commands import inprocess

    settings = load_settings({"preset": "configs/quickstart.yaml", "runs-dir": str(tmp_path / "runs"),
                              "strategies": "mixup-union,local-only,fedavg,centralized", "epochs": 2, "rounds": 2,
                              "train-subset": 600})
    results = inprocess.run(settings, 2)
    events = read_events(tmp_path / "runs" / "latest" / FILE)
    assert_events_in_order(events, settings, parties=2)
    out = capsys.readouterr().out  # the same events, one line each, on stdout; besides, the parties' own epochs
    lines = [line for line in out.splitlines() if line.startswith("fedsmix") and not line.startswith("fedsmix:")]
    assert [line for line in lines if " local training epoch " not in line] == [describe(e) for e in events]
    assert any(line.startswith("fedsmix [local-only] party 1 local training epoch 2/2") for line in lines)
    assert results["dataset"]["name"] == "digits"


@pytest.mark.sim
def test_simulation_events_in_order_and_never_silent_for_long(data_dir, runs_dir):
    """MNIST through the real ServerApp and ClientApps (Flower's simulation engine): the same order as the
    in-process transport, test accuracy in the epoch lines (eval-every), and no silence longer than the watchdog's
    (2 x progress-interval, at least 5 s): with the default interval of 10 s, a line at least every ~21 s."""
    from commands.simulate import simulate

    overrides = {"preset": "configs/quickstart.yaml", "dataset": "mnist", "data-dir": data_dir, "runs-dir": runs_dir,
                 "strategies": "mixup-union,local-only,fedavg,centralized", "train-subset": 2000, "test-subset": 500,
                 "epochs": 3, "rounds": 2, "eval-every": 1, "progress-interval": 1, "head-penalties": "1.0"}
    simulate(overrides, num_parties=2)
    settings = load_settings(overrides)
    events = read_events(f"{runs_dir}/latest/{FILE}")
    assert_events_in_order(events, settings, parties=2)
    central = [e for e in events if e.get("strategy") == "centralized" and e["kind"] == "epoch"]
    assert [e["epoch"] for e in central] == [1, 2, 3] and all(0.5 < e["accuracy"] <= 1 for e in central)
    assert [e["answered"] for e in events if e["kind"] == "parties"][-1] == 2
    gaps = [b["clock"] - a["clock"] for a, b in zip(events, events[1:])]
    assert max(gaps) <= 5 + 5, f"a silence of {max(gaps):.1f}s (watchdog after 5s)"


def test_the_results_table_cuts_no_cell_and_says_what_its_columns_mean():
    import io

    from rich.console import Console

    from server.results import render

    results = {"settings": {"dataset": "digits"}, "num-parties": 10, "strategies": {
        "local-only": {"accuracy": 0.6704, "party0-accuracy": 0.6704, "per-party-accuracy": {"0": 0.6704},
                       "mean-party-accuracy": 0.6704, "min-party-accuracy": 0.55, "max-party-accuracy": 0.7667,
                       "parties-used": 10, "dropped": [], "rejected": [], "mean-bytes-up-per-party": 2418086,
                       "wall-seconds": 12.5}}}
    printed = io.StringIO()
    render(results, Console(file=printed, width=140))
    out = printed.getvalue()
    assert "…" not in out and all(value in out for value in ("67.04", "55.00", "76.67", "2,418,086"))
    assert "local-only: party 0's own model" in out and "docs/run.md" in out


def test_show_before_any_run_says_so(tmp_path, capsys):
    assert cli(["show", str(tmp_path / "runs" / "latest")]) == 2
    assert "show: no run yet" in capsys.readouterr().err
