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
    summary = run_frontier("configs/frontier-tiny.yaml", {"runs-dir": runs_dir}, {"rows": ",".join(rows)})
    run_dir = Path(summary["run-dir"])
    for name in ("frontier.md", "frontier.csv", "attacks.csv", "reencoding.csv", "frontier.png", "reconstructions.png"):
        assert (run_dir / name).stat().st_size > 0, name
    table = list(csv.DictReader((run_dir / "frontier.csv").open()))
    assert [r["strategy"] for r in table] == rows
    for r in table:
        assert 0 <= float(r["accuracy"]) <= 1 and float(r["bytes_up_per_party"]) > 0 and float(r["wall_seconds"]) > 0
        assert float(r["gain_snr_db"]) >= 0  # the trivial guess is always among the attacks
    attacks = list(csv.DictReader((run_dir / "attacks.csv").open()))
    by_row = {name: {a["attack"] for a in attacks if a["strategy"] == name} for name in rows}
    assert by_row["fedavg"] == {"trivial guess", "gradient", "gradient-realistic"}
    assert by_row["instahide-inside-k4"] == {"trivial guess", "abs-solve", "averaging"}
    assert by_row["singularized-tau1e-2"] == {"trivial guess", "abs-solve", "averaging", "linear", "mmse"}
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
    assert "| strategy | test acc % |" in markdown and all(f"| {name} |" in markdown for name in rows)
    saved = json.loads((run_dir / "frontier.json").read_text())
    assert len(saved["records"]) == 3 and saved["plan"]["rows"] == rows
    for record in saved["records"]:  # every row is a real run with its own results.json and stored uploads
        assert (Path(record["run_dir"]) / "results.json").is_file()
