"""The adversary where it runs: the oracle's replay, the ServerApp path, the tau-sweep command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from commands.attack import parse_taus
from commands.cli import main as fedsmix_main
from commands.simulate import simulate
from fedsmix.config import SettingsError, load_settings
from server.adversary.oracle import ReplayMismatch, check_replay, replay_party

pytestmark = pytest.mark.usefixtures("one_thread")



def test_oracle_replays_a_party_and_refuses_anything_else():
    """The replay reproduces a party's upload (float32 or float16), and refuses another party's."""
    from fedsmix.party import encode_partition, load_partition

    settings = load_settings({"preset": "configs/quickstart.yaml"})
    upload_1 = encode_partition(settings, load_partition(settings, 1, 3))[0].x.numpy()
    replay = replay_party(settings, 1, 3, upload_1.astype(np.float16))
    assert replay.party == 1 and len(replay.partition.x) == len(upload_1)
    assert replay.calibration.radius > 0 and torch.equal(replay.encoded.sources[:, 0], torch.arange(len(upload_1)))
    upload_0 = encode_partition(settings, load_partition(settings, 0, 3))[0].x.numpy()
    with pytest.raises(ReplayMismatch, match="party 1"):
        replay_party(settings, 1, 3, upload_0)
    with pytest.raises(ReplayMismatch, match="party 1"):  # another seed is another encoding
        replay_party(settings.replace(seed=1), 1, 3, upload_1)


def test_replay_is_checked_bit_for_bit_or_within_float16_rounding():
    replayed = np.linspace(-300, 300, 1001, dtype=np.float32).reshape(7, 11, 13)
    check_replay(0, replayed, replayed.copy())
    check_replay(0, replayed, replayed.astype(np.float16))  # one rounding to float16 is what parties do
    tampered = replayed.copy()
    tampered[3, 4, 5] += 1e-3
    with pytest.raises(ReplayMismatch, match="party 0: the replayed encoding differs"):
        check_replay(0, replayed, tampered)
    coarse = replayed.astype(np.float16)
    up = np.float16(np.inf)
    coarse[1, 1, 1] = np.nextafter(np.nextafter(coarse[1, 1, 1], up), up)  # two float16 steps off: not a rounding
    with pytest.raises(ReplayMismatch):
        check_replay(0, replayed, coarse)
    with pytest.raises(ReplayMismatch, match="shape"):
        check_replay(2, replayed, replayed[:3])


@pytest.mark.sim
def test_serverapp_attacks_the_uploads_it_received(runs_dir):
    """Two parties on digits upload float16; the server attacks what it stored, scored via the oracle."""
    results = simulate(
        {
            "preset": "configs/quickstart.yaml", "strategies": "mixup-union", "runs-dir": runs_dir, "epochs": 2,
            "upload-dtype": "float16", "adversary": "linear,mmse,unet", "attack-victims": 40,
            "unet-width": 4, "unet-epochs": 1, "unet-train-size": 256,
        },
        num_parties=2,
    )
    mix = results["strategies"]["mixup-union"]
    assert mix["accuracy"] is not None  # the attack did not cost the run its result
    adv = mix["adversary"]
    assert adv["errors"] == {} and adv["refused"] == {} and adv["skipped"] == {}
    assert set(adv["parties"]) == {"0", "1"}
    for party in adv["parties"].values():
        assert party["replay"] == "verified" and party["victims"] == 40 and party["tau"] == 1.0
    pooled = adv["pooled"]
    assert pooled["victims"] == 80 and set(pooled["attacks"]) == {"linear", "mmse", "unet"}
    for entry in pooled["attacks"].values():
        assert set(entry["gain"]) == {"snr_db", "psnr_db", "ssim", "st_lpips"}
        assert entry["gain"]["st_lpips"] is None  # digits' 8 px images are too small for ST-LPIPS
        assert entry["gain"]["snr_db"] == pytest.approx(entry["score"]["snr_mean"] - pooled["trivial"]["snr_mean"])
    # tau = 1 leaks: both known-W attacks beat the blind guess clearly
    assert pooled["attacks"]["mmse"]["gain"]["snr_db"] > 1 and pooled["attacks"]["linear"]["gain"]["snr_db"] > 1
    t41 = pooled["theorem41"]["linear"]
    assert t41["bound-median"] > 0 and 0 < t41["error-mean"] < float("inf")
    assert adv["unet-training"]["train-size"] == 256 and adv["unet-training"]["width"] == 4
    files = [Path(f) for f in adv["files"]]
    assert {f.name for f in files} == {"summary.md", "summary.csv", "best-recovered.png"}
    assert all(f.parent == Path(results["run-dir"]) / "adversary" and f.stat().st_size > 0 for f in files)
    assert "| mmse |" in (Path(results["run-dir"]) / "adversary" / "summary.md").read_text()
    events = [json.loads(line) for line in (Path(results["run-dir"]) / "progress.jsonl").read_text().splitlines()]
    attacks = [e for e in events if e["kind"] in ("attack-start", "attack")]
    assert [e["kind"] for e in attacks] == ["attack-start", "attack", "attack", "attack"]
    assert {e["attack"] for e in attacks[1:]} == {"linear", "mmse", "unet"} and attacks[0]["victims"] == 80
    assert all(e["strategy"] == "mixup-union" and e["tau"] == 1.0 for e in attacks)
    assert events[events.index(attacks[-1]) + 1]["kind"] == "strategy-end"  # inside mixup-union, before its end


def test_attack_command_writes_the_sweep_tables_and_figures(tmp_path, data_dir):
    argv = [
        "attack",
        "--dataset",
        "digits",
        "--victims",
        "60",
        "--taus",
        "1,...,1e-2",
        "--attacks",
        "linear,mmse,unet,refined",
        "--unet-curve",
        "--set",
        "unet-epochs=2",
        "--set",
        "unet-width=4",
        "--set",
        "unet-train-size=128",
        "--set",
        f"data-dir={data_dir}",
        "--out",
        str(tmp_path),
    ]
    assert fedsmix_main(argv) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"digits-sweep.md", "digits-sweep.csv", "digits-sweep.json", "tables.md"} <= names
    assert {"digits-linear.png", "digits-mmse.png", "digits-unet.png"} <= names
    rows = list(csv.DictReader(open(tmp_path / "digits-sweep.csv")))
    assert [float(r["tau"]) for r in rows] == [1.0, 0.1, 0.01]
    assert "| gain ST-LPIPS" not in (tmp_path / "digits-sweep.md").read_text()  # 8 px: the metric does not apply
    for row in rows:
        gain = float(row["linear_snr_mean"]) - float(row["trivial_snr_mean"])
        assert float(row["linear_gain_snr_db"]) == pytest.approx(gain, abs=1e-4)
        assert float(row["thm41_linear_bound-median"]) > 0 and float(row["mmse_seconds"]) >= 0
    radii = [float(r["radius"]) for r in rows]
    assert radii[0] < radii[1] < radii[2]
    sweep = json.loads((tmp_path / "digits-sweep.json").read_text())
    assert sweep["victims"] == 60 and len(sweep["taus"]) == 3
    table = (tmp_path / "digits-sweep.md").read_text()
    assert "trivial guess" in table and "gain linear" in table and "gain mmse" in table
    events = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["run-start", "tau", "tau", "tau", "run-end"]  # one event per tau
    assert [(e["tau"], e["index"], e["of"]) for e in events[1:4]] == [(1.0, 1, 3), (0.1, 2, 3), (0.01, 3, 3)]
    assert set(events[1]["snr"]) == {"linear", "mmse", "unet", "refined"} and events[3]["eta"] == 0
    assert "| refined | trivial guess |" in next(line for line in table.splitlines() if line.startswith("| tau"))
    for record, row in zip(sweep["taus"], rows):  # the leakage cell: the attack of the highest gain, named
        gains = {name: entry["gain"]["snr_db"] for name, entry in record["attacks"].items()}
        assert record["strongest"] == max(gains, key=gains.get) == row["strongest_attack"]
        assert f"| {record['strongest']} ({gains[record['strongest']]:+.2f}) |" in table
        # beside it, the guess of an oracle that knows the victims' mean but no victim: population, not samples
        over = record["attacks"][record["strongest"]]["score"]["snr_mean"] - record["victims-mean-snr"]
        assert float(row["strongest_over_victims_mean_db"]) == pytest.approx(over, abs=1e-4)
        assert record["victims-mean-snr"] > record["trivial"]["snr_mean"]  # the public mean is not the digits'
    assert "| victims' mean (oracle guess) | strongest − victims' mean |" in table
    for record in sweep["taus"]:  # each learned attack: its curve on the victims, its epoch, its checkpoint
        for name in ("unet", "refined"):
            fit = record[f"{name}-training"]
            assert [c["epoch"] for c in fit["curve"]] == [1, 2]
            candidates = [fit["initial-holdout-snr"], *fit["holdout-snr"]]  # epoch 0: the network as initialised
            assert fit["chosen-epoch"] == candidates.index(max(candidates))
            assert (tmp_path / "unet-checkpoints" / f"{name}-digits-tau{record['tau']:g}.pt").exists()


def test_attack_command_rejects_bad_input(tmp_path, capsys):
    assert fedsmix_main(["attack", "--attacks", "linear,magic", "--out", str(tmp_path)]) == 2
    assert "unknown attack 'magic'" in capsys.readouterr().err
    assert fedsmix_main(["attack", "--set", "alpha=2", "--out", str(tmp_path)]) == 2


def test_tau_lists_expand_decades():
    assert parse_taus("1,1e-1,...,1e-6") == [1.0, 0.1, 0.01, 0.001, 1e-4, 1e-5, 1e-6]
    assert parse_taus("1,...,1e-2") == [1.0, 0.1, 0.01]
    assert parse_taus("0.5") == [0.5]
    for bad in ("...,1e-2", "1,0", "1,abc", "1,1e-1,...,3e-3"):
        with pytest.raises(SettingsError, match="--taus"):
            parse_taus(bad)
