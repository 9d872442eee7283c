"""The frontier command: plan validation (fast) and one tiny end-to-end run (a Flower simulation)."""

import csv
import json
from pathlib import Path

import pytest

from commands.cli import main
from commands.frontier.plan import load_plan, parse_row
from fedsmix.config import SettingsError, load_settings


def test_rows_become_overrides_of_one_preset():
    assert parse_row("instahide-cross-k6").overrides == {"encoder": "instahide-cross", "mix_k": 6}
    assert parse_row("singularized-tau1e-4").overrides == {"encoder": "singularized", "tau": 1e-4}
    assert parse_row("fedprox").strategy == "fedprox" and parse_row("fedprox").target == "fedprox"
    row = parse_row("mixup-k2")
    settings = row.settings(load_settings(preset="configs/frontier-mnist.yaml"), Path("/tmp/x"))
    assert settings.strategies == ("mixup-union",) and settings.encoder == "mixup" and settings.mix_k == 2
    assert settings.dataset == "mnist"  # everything else comes from the preset


@pytest.mark.parametrize(
    "overrides, hint",
    [
        ({"rows": "fedavg,instahide-k4"}, "frontier.rows"),
        ({"rows": "singularized-tau0"}, "frontier.rows"),
        ({"parties": 1}, "frontier.parties"),
        ({"victim-party": 5, "parties": 5}, "frontier.victim-party"),
        ({"gradient-stpes": 10}, "gradient-stpes"),
    ],
)
def test_bad_plans_fail_naming_the_key(overrides, hint):
    with pytest.raises(SettingsError, match=hint):
        load_plan("configs/frontier-tiny.yaml", overrides)


def test_feature_space_rows_take_the_plans_feature_settings(runs_dir):
    base = load_settings(preset="configs/frontier-cifar10.yaml")
    features = {"backbone": "efficientnet-lite0", "image-size": 64, "trainer": "auto"}
    row = parse_row("singularized-tau1e-3-features")
    with pytest.raises(SettingsError, match="model 'cnn' needs images"):  # the preset's CNN cannot take features
        row.settings(base, Path(runs_dir), features=features)
    features["model"] = "mlp"
    settings = row.settings(base, Path(runs_dir), features=features)
    assert row.space == "features" and not row.defended
    assert (settings.backbone, settings.image_size, settings.trainer, settings.tau) == (
        "efficientnet-lite0", 64, "auto", 1e-3)
    assert settings.radius_mode == "theorem" and settings.train_subset == base.train_subset  # same partitions
    mapped = parse_row("singularized-pixelmapped-tau1e-2").settings(base, Path(runs_dir), features=features)
    assert mapped.radius_mode == "pixel-mapped" and mapped.backbone == "efficientnet-lite0"
    assert parse_row("fedavg-features").strategy == "fedavg" and not parse_row("fedavg-features").defended
    assert parse_row("fedavg").space == "pixels" and parse_row("fedavg-prune0.9").defended
    with pytest.raises(SettingsError, match="frontier.features"):  # no feature settings: the error says where
        row.settings(base, Path(runs_dir))
    plan = load_plan("configs/frontier-defences-cifar10.yaml", {"features.image-size": 128})
    assert plan.features["image-size"] == 128 and plan.features["backbone"] == "efficientnet-lite0"  # merged


@pytest.mark.parametrize("name", ["fedavg-prune0.9-features", "mixup-k2-features", "mixcon-l0-features",
                                  "singularized-tau1e-2-features-features", "singularized-pixelmapped-tau0"])
def test_rows_without_a_feature_space_form_are_refused(name):
    with pytest.raises(SettingsError, match="frontier.rows"):
        parse_row(name)


def test_cli_reports_a_bad_plan_without_running(capsys):
    assert main(["frontier", "--preset", "configs/frontier-tiny.yaml", "--plan", "rows=nonsense"]) == 2
    assert "frontier.rows" in capsys.readouterr().err


def test_presets_load_and_plan(runs_dir):
    for preset in ("configs/frontier-mnist.yaml", "configs/frontier-cifar10.yaml"):
        settings, plan = load_settings(preset=preset), load_plan(preset)
        assert len(plan.rows) >= 9 and settings.train_subset > 0
        for row in map(parse_row, plan.rows):  # every row's settings validate (mixcon rows switch to LeNet-5)
            row.settings(settings, Path(runs_dir))
    mixcon = [r for r in load_plan("configs/frontier-mnist.yaml").rows if r.startswith("mixcon")]
    assert mixcon == ["mixcon-l0", "mixcon-l1-b1e-4", "mixcon-l10-b1e-2"]


@pytest.mark.sim
def test_tiny_frontier_writes_table_csv_and_plot(runs_dir):
    from commands.frontier.run import run_frontier

    rows = ["fedavg", "instahide-inside-k4", "singularized-tau1e-2"]
    summary = run_frontier("configs/frontier-tiny.yaml", {"runs-dir": runs_dir},
                           {"rows": ",".join(rows), "gradient-study": "2,4"})
    run_dir = Path(summary["run-dir"])
    for name in ("frontier.md", "frontier.csv", "attacks.csv", "reencoding.csv", "frontier.png", "reconstructions.png",
                 "gradient-study.csv", "gradient-study.png"):
        assert (run_dir / name).stat().st_size > 0, name
    study = list(csv.DictReader((run_dir / "gradient-study.csv").open()))  # the FedAvg row only, both attackers
    assert [(r["strategy"], r["study_batch_size"], r["attack"]) for r in study] == [
        ("fedavg", "2", "gradient"), ("fedavg", "2", "gradient-realistic"),
        ("fedavg", "4", "gradient"), ("fedavg", "4", "gradient-realistic")]
    assert [int(r["victims"]) for r in study] == [4, 4, 4, 4]  # every study batch size on the same 4 victims
    for r in study:  # each attacker chose alpha_TV on a public probe for each update it attacked (2 at B = 2)
        chosen = r["attack_setting"].removeprefix("alpha_TV ").split(" / ")
        assert len(chosen) == 4 // int(r["study_batch_size"]) and set(chosen) <= {"0.01", "0.1"}, r
    table = list(csv.DictReader((run_dir / "frontier.csv").open()))
    assert [r["strategy"] for r in table] == rows
    for r in table:
        assert 0 <= float(r["accuracy"]) <= 1 and float(r["bytes_up_per_party"]) > 0 and float(r["wall_seconds"]) > 0
        assert float(r["gain_snr_db"]) >= 0  # the trivial guess is always among the attacks
    attacks = list(csv.DictReader((run_dir / "attacks.csv").open()))
    by_row = {name: {a["attack"] for a in attacks if a["strategy"] == name} for name in rows}
    assert by_row["fedavg"] == {"trivial guess", "gradient", "gradient-realistic"}
    assert by_row["instahide-inside-k4"] == {"trivial guess", "abs-solve", "averaging"}
    assert by_row["singularized-tau1e-2"] == {"trivial guess", "abs-solve", "averaging", "linear", "mmse",
                                              "mmse-centred"}
    gradient = next(a for a in attacks if a["attack"] == "gradient")
    assert gradient["batch_size"] == "2" and gradient["local_steps"] == "1"
    instahide = next(r for r in table if r["strategy"] == "instahide-inside-k4")
    assert instahide["attack"] != "trivial guess" and float(instahide["gain_snr_db"]) > 1
    study = list(csv.DictReader((run_dir / "reencoding.csv").open()))
    assert [(r["strategy"], r["encodings_per_sample"]) for r in study] == [
        ("instahide-inside-k4", "1"),
        ("instahide-inside-k4", "2"),
        ("singularized-tau1e-2", "1"),
        ("singularized-tau1e-2", "2"),
    ]
    markdown = (run_dir / "frontier.md").read_text()
    assert "| strategy | space | test acc % |" in markdown and all(f"| {name} |" in markdown for name in rows)
    header = next(line for line in markdown.splitlines() if line.startswith("| strategy |"))
    rule = markdown.splitlines()[markdown.splitlines().index(header) + 1]
    assert header.count("|") == rule.count("|")  # every column has its rule
    for r in table:  # every row names what its selection chose, and the tuning budget every row shares
        assert r["chosen"] and r["tuning"].endswith(f"budget {summary['settings']['tuning-budget']}"), r["strategy"]
        assert f"{r['chosen']} ({r['tuning']})" in markdown
    saved = json.loads((run_dir / "frontier.json").read_text())
    assert len(saved["records"]) == 3 and saved["plan"]["rows"] == rows
    for record in saved["records"]:  # every row is a real run with its own results.json and stored uploads
        assert (Path(record["run_dir"]) / "results.json").is_file()


@pytest.mark.sim
def test_feature_rows_join_the_frontier_in_their_own_space(runs_dir, tmp_path):
    """Pixel and feature-space rows on the same partitions: the feature rows are attacked in feature space (the
    linear/MMSE attacks), their records say so, and dominance never compares gains across spaces."""
    import torch
    import torchvision

    from commands.frontier.run import run_frontier

    torch.manual_seed(0)
    weights = tmp_path / "resnet18-random.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    features = {"backbone": "resnet18", "weights-path": str(weights), "image-size": 16, "public-size": 200,
                "feature-cache-dir": str(tmp_path / "features")}
    rows = ["local-only", "singularized-tau1e-2", "local-only-features", "singularized-tau1-features",
            "singularized-pixelmapped-tau1e-2"]
    summary = run_frontier("configs/frontier-tiny.yaml", {"runs-dir": runs_dir},
                           {"rows": ",".join(rows), "features": features, "reencoding": "1"})
    records = {r["strategy"]: r for r in summary["records"]}
    assert [records[name]["space"] for name in rows] == ["pixels", "pixels", "features", "features", "features"]
    for name in rows:
        assert 0 <= records[name]["accuracy"] <= 1 and not records[name]["error"], name
    assert records["singularized-tau1-features"]["attack"] in ("linear", "mmse", "mmse-centred")
    assert records["singularized-tau1-features"]["gain_snr_db"] > 1  # tau = 1 leaks its features
    attacked = {a["attack"] for a in summary["attacks"] if a["strategy"] == "singularized-pixelmapped-tau1e-2"}
    assert {"linear", "mmse", "mmse-centred"} <= attacked
    for record in summary["records"]:  # a row is dominated only by rows of its own space
        for other in record["dominated_by"].split():
            assert records[other]["space"] == record["space"], (record["strategy"], other)
    mapped = json.loads((Path(records["singularized-pixelmapped-tau1e-2"]["run_dir"]) / "results.json").read_text())
    assert mapped["settings"]["radius-mode"] == "pixel-mapped" and mapped["settings"]["backbone"] == "resnet18"
    assert {r["space"] for r in summary["reencoding"]} == {"pixels", "features"}
    assert "| singularized-tau1-features | features |" in (Path(summary["run-dir"]) / "frontier.md").read_text()


def test_overheads_and_dominance_stay_within_a_space():
    from commands.frontier.report import dominated_by
    from commands.frontier.run import time_overheads

    def rec(name, space, acc, gain, train_s):
        return {"strategy": name, "space": space, "accuracy": acc, "gain_snr_db": gain, "bytes_up_per_party": 1.0,
                "local_train_seconds": train_s}

    records = [rec("fedavg", "pixels", 0.5, 2.0, 10.0), rec("fedavg-prune0.9", "pixels", 0.4, 3.0, 12.0),
               rec("fedavg-features", "features", 0.9, 1.0, 2.0), rec("fedprox-features", "features", 0.8, 1.5, 3.0)]
    time_overheads(records)
    assert [r["time_overhead"] for r in records] == [1.0, 1.2, 1.0, 1.5]
    dominated_by(records)  # fedavg-features beats every row on every axis, but only its own space counts
    assert [r["dominated_by"] for r in records] == ["", "fedavg", "", "fedavg-features"]


def test_reuse_takes_finished_rows_with_the_same_settings_only(tmp_path):
    """`frontier --reuse DIR`: a row runs again when its settings changed, it failed, or its global model is gone."""
    from commands.frontier.run import reused_runs
    from fedsmix.config import dump_settings

    base = load_settings(preset="configs/frontier-tiny.yaml")
    plan = load_plan("configs/frontier-tiny.yaml", {"gradient-round": "last"})
    rows = [parse_row(n) for n in ("local-only", "fedavg", "fedprox", "singularized-tau1e-2", "mixup-k2")]
    settings = [r.settings(base, tmp_path / "new") for r in rows]
    earlier = [r.settings(base, tmp_path / "old") for r in rows]  # other runs-dir: a key that may change
    earlier[3] = earlier[3].replace(tau=1e-3)  # the same name, another tau
    model = tmp_path / "fedavg.pt"
    model.write_bytes(b"weights")
    results = {0: {}, 1: {"global-model": str(model)}, 2: {"global-model": str(tmp_path / "gone.pt")}, 3: {},
               4: {"error": "ValueError: boom"}}
    for i, (row, s) in enumerate(zip(rows, earlier)):
        run = tmp_path / "old" / "runs" / f"20261126-00000{i}-{row.name}-1"
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(
            {"settings": dump_settings(s), "run-dir": str(run), "strategies": {row.strategy: results[i]}}))
    reused = reused_runs(tmp_path / "old", rows, settings, plan)
    assert sorted(reused) == [0, 1]  # fedprox: model gone; tau changed; mixup-k2 failed
    assert reused[1]["strategies"]["fedavg"]["global-model"] == str(model)
    with pytest.raises(SettingsError, match="--reuse"):
        reused_runs(tmp_path / "nowhere", rows, settings, plan)


@pytest.mark.sim
def test_a_stopped_attack_phase_keeps_the_rows_it_attacked(runs_dir, monkeypatch):
    """Each row's attacks are saved as they finish: `--reuse` of a frontier whose attack phase stopped takes the
    attacked rows back and attacks only the rest; a changed attack key attacks every row again."""
    from commands.frontier import run as frontier

    real, attacked = frontier.attack_row, []

    def attack_row(row, *args, **kwargs):
        attacked.append(row.name)
        if row.name == stop_at:
            raise KeyboardInterrupt  # the user stops the attack phase here
        return real(row, *args, **kwargs)

    monkeypatch.setattr(frontier, "attack_row", attack_row)
    rows = {"rows": "singularized-tau1e-2,instahide-inside-k4", "reencoding": "1"}
    stop_at = "instahide-inside-k4"
    with pytest.raises(KeyboardInterrupt):
        frontier.run_frontier("configs/frontier-tiny.yaml", {"runs-dir": runs_dir}, rows)
    (first,) = Path(runs_dir).glob("*-frontier-digits")
    assert attacked == ["singularized-tau1e-2", "instahide-inside-k4"]
    assert [p.name for p in (first / "attacks").iterdir()] == ["singularized-tau1e-2.pt"]  # nothing half-written

    stop_at, attacked[:] = None, []
    summary = frontier.run_frontier("configs/frontier-tiny.yaml", {"runs-dir": runs_dir}, rows, reuse=first)
    assert attacked == ["instahide-inside-k4"]  # the finished row's attacks came back from the first directory
    assert "Attacks reused from there (same settings and plan): 1." in summary["meta"]["budget"]
    tau = next(r for r in summary["records"] if r["strategy"] == "singularized-tau1e-2")
    assert tau["attack"] in ("averaging", "mmse", "mmse-centred") and tau["gain_snr_db"] > 0
    assert {a["attack"] for a in summary["attacks"] if a["strategy"] == tau["strategy"]} == {
        "trivial guess", "abs-solve", "averaging", "linear", "mmse", "mmse-centred"}

    attacked[:] = []  # another attack budget: every row is attacked again, from the second directory
    frontier.run_frontier("configs/frontier-tiny.yaml", {"runs-dir": runs_dir}, {**rows, "attacks": "mmse,averaging"},
                          reuse=summary["run-dir"])
    assert attacked == ["singularized-tau1e-2", "instahide-inside-k4"]


def test_frontiers_at_several_seeds_report_mean_and_interval(tmp_path):
    """No training: two rows at three seeds, each run_frontier summary made up."""
    from commands.frontier.report import over_seeds, write_seeds

    def summary(seed, fedavg_acc, fedavg_gain, tau_acc):
        def rec(name, acc, gain, attack, bytes_up):
            return {"strategy": name, "space": "pixels", "accuracy": acc, "attack": attack, "snr_db": gain - 5,
                    "ssim": 0.1, "gain_snr_db": gain, "gain_psnr_db": gain, "gain_ssim": 0.0, "best_ssim": 0.2,
                    "gain_vs_party_mean_db": -1.0, "bytes_up_per_party": bytes_up, "wall_seconds": 2.0,
                    **({"chosen": f"client-lr={0.05 * (seed + 1):g}, round 4", "tuning": "6 tried, budget 6"}
                       if name == "fedavg" else {})}

        return {"settings": {"seed": seed}, "run-dir": f"/runs/seed{seed}",
                "meta": {"dataset": "mnist", "budget": "tiny budget.", "threat-model": "oracle pairing"},
                "records": [rec("fedavg", fedavg_acc, fedavg_gain, "gradient", 1000.0),
                            rec("singularized-tau1e-2", tau_acc, 0.5, "trivial guess" if seed else "mmse", 2000.0)]}

    summaries = [summary(0, 0.80, 10.0, 0.70), summary(1, 0.82, 12.0, 0.72), summary(2, 0.84, 14.0, 0.74)]
    fedavg, tau = over_seeds(summaries)
    assert fedavg["n"] == 3 and fedavg["stats"]["accuracy"].mean == pytest.approx(0.82)
    assert fedavg["stats"]["gain_snr_db"].half == pytest.approx(4.302653 * 2 / 3 ** 0.5, abs=1e-5)  # s = 2
    assert fedavg["values"]["gain_snr_db"] == {0: 10.0, 1: 12.0, 2: 14.0}
    assert tau["attack"] == "mmse; trivial guess" and fedavg["dominated_by"] == tau["dominated_by"] == ""
    write_seeds(tmp_path, summaries)
    table = (tmp_path / "frontier-seeds.md").read_text()
    assert "mean ± 95 % CI over 3 seeds (0, 1, 2)" in table
    assert "| fedavg | pixels | 3 | 82.00 ± 4.97 | gradient | 7.00 ± 4.97 |" in table
    # every row names what its selection chose at each seed, and the budget it had
    assert ("| seed 0: client-lr=0.05, round 4; seed 1: client-lr=0.1, round 4; seed 2: client-lr=0.15, round 4 "
            "(6 tried, budget 6) |") in table
    rows = list(csv.DictReader((tmp_path / "frontier-seeds.csv").open()))
    assert [r["strategy"] for r in rows] == ["fedavg", "singularized-tau1e-2"] and rows[0]["seeds"] == "0;1;2"
    assert rows[0]["tuning"] == "6 tried, budget 6" and rows[1]["chosen"] == rows[1]["tuning"] == ""
    assert float(rows[0]["accuracy_ci_low"]) == pytest.approx(0.82 - 4.302653 * 0.02 / 3 ** 0.5, abs=1e-6)
    detail = json.loads((tmp_path / "frontier-seeds.json").read_text())
    acc = detail["rows"][1]["columns"]["accuracy"]
    assert acc["values"] == pytest.approx([0.70, 0.72, 0.74]) and acc["seeds"] == [0, 1, 2] and acc["n"] == 3
    assert detail["runs"]["2"] == "/runs/seed2"
    one = over_seeds(summaries[:1])
    assert one[0]["stats"]["accuracy"].half is None
    assert "one seed (seed 0), no interval" in (write_seeds(tmp_path, summaries[:1]) and
                                                 (tmp_path / "frontier-seeds.md").read_text())
