"""Seeds as replicates: every grid cell runs once per seed and every table cell is a mean with a 95 % interval."""

from __future__ import annotations

import csv
import json
import math

import pytest
import yaml

from commands.grid import plan as grid_plan
from commands.grid import run as grid_run
from commands.grid.run import GridRun
from fedsmix import tables
from fedsmix.config import SettingsError

T_2 = 4.302652729749464  # t_{0.975, 2}, from a printed t table


def test_the_interval_is_students_t_over_the_seeds():
    iv = tables.interval([1, 2, 3])  # mean 2, s = 1
    assert (iv.mean, iv.n, iv.values) == (2.0, 3, (1.0, 2.0, 3.0))
    assert tables.t_quantile(3) == pytest.approx(T_2, abs=1e-9)
    assert iv.half == pytest.approx(T_2 / math.sqrt(3)) == pytest.approx(2.484, abs=5e-4)
    assert (iv.low, iv.high) == (pytest.approx(2 - 2.4841, abs=1e-4), pytest.approx(2 + 2.4841, abs=1e-4))
    assert tables.ci(iv) == "2.00 ± 2.48"
    assert tables.ci(tables.interval([0.853, 0.861, 0.845]), ".1f", 100) == "85.3 ± 2.0"  # s = 0.008
    assert tables.t_quantile(2) == pytest.approx(12.706, abs=1e-3) and tables.t_quantile(30) == pytest.approx(
        2.045, abs=1e-3)
    one = tables.interval([0.5, None, float("nan")])  # missing values are not replicates
    assert (one.mean, one.half, one.low, one.n) == (0.5, None, None, 1) and tables.ci(one, ".1f", 100) == "50.0"
    assert tables.interval([None]) is None and tables.ci(None) == "-"
    assert tables.interval([0.1 + 0.2, 0.3, 0.3]).half == 0.0  # equal up to rounding: no spurious 1e-17
    assert iv.as_dict()["values"] == [1.0, 2.0, 3.0] and iv.as_dict()["ci-high"] == pytest.approx(4.4841, abs=1e-4)
    assert tables.ci_caption([3, 3], seeds=[0, 1, 2]).startswith("mean ± 95 % CI over 3 seeds (0, 1, 2)")
    assert "t = 4.30" in tables.ci_caption([3])
    assert "says its n" in tables.ci_caption([3, 2])
    assert tables.ci_caption([1], seeds=[7]) == "one seed (seed 7), no interval"


def _preset(tmp_path, grid: dict, **keys) -> str:
    preset = {"strategies": "mixup-union,local-only", "dataset": "digits", "partitioner": "iid", "tau": 1.0,
              "epochs": 1, "device": "cpu", **keys, "grid": grid}
    path = tmp_path / "seeds.yaml"
    path.write_text(yaml.safe_dump(preset))
    return str(path)


def test_seeds_are_a_replicate_axis_of_the_plan(tmp_path):
    preset = _preset(tmp_path, {"parties": [2, 3], "tau": [1.0, 0.001], "seeds": [0, 1]})
    plan = grid_plan.make_plan(preset)
    assert plan.axes == {"parties": [2, 3], "seed": [0, 1], "tau": [1.0, 0.001]} and plan.seeds == [0, 1]
    assert [c.id for c in plan.cells][:2] == ["p2_seed=0_tau=1.0", "p2_seed=0_tau=0.001"]
    assert [c.seed for c in plan.cells] == [0] * 4 + [1] * 4  # one whole pass per seed
    assert plan.cells[4].table_id == "p2_tau=1.0" and plan.cells[4].overrides()["seed"] == 1
    # every strategy runs at every seed: a seed draws the partitions, the encodings and the initialisation
    assert sum("local-only" in todo for _, todo in plan.schedule()) == 4
    assert grid_plan.make_plan(preset, seeds=[5, 6, 7]).seeds == [5, 6, 7]  # --seeds replaces the preset's
    fixed = grid_plan.make_plan(preset, sets={"seed": 3}, seeds=[5, 6])  # --set seed fixes one seed
    assert "seed" not in fixed.axes and fixed.seeds == [3] and fixed.cells[0].seed is None
    assert grid_plan.make_plan(_preset(tmp_path, {"parties": [2]})).seeds == [0]  # the preset's seed
    with pytest.raises(SettingsError, match="given twice"):
        grid_plan.make_plan(preset, seeds=[1, 1])
    with pytest.raises(SettingsError, match="not both"):
        grid_plan.make_plan(_preset(tmp_path, {"parties": [2], "seed": [0], "seeds": [1]}))
    with pytest.raises(SettingsError, match="replicates, not rows"):
        grid_plan.make_plan(_preset(tmp_path, {"parties": [2], "seeds": [0, 1], "table-rows": ["seed"]}))


LOCAL = {0: 0.40, 1: 0.42, 2: 0.44}  # local-only party 0 by seed
GAIN = {1.0: {0: 0.12, 1: 0.13, 2: 0.11}, 0.001: {0: 0.01, 1: 0.02, 2: 0.0}}  # mixup-union over it, by tau and seed


def test_the_report_aggregates_each_cell_over_its_seeds(tmp_path, monkeypatch):
    """No training: each run's results.json is made up, so every mean and interval is known."""
    preset = _preset(tmp_path, {"parties": [2, 3], "tau": [1.0, 0.001]})
    plan = grid_plan.make_plan(preset, seeds=[0, 1, 2])

    def made_up(overrides, parties, engine, runs_dir):
        seed, tau, out = overrides["seed"], overrides["tau"], {}
        for s in overrides["strategies"].split(","):
            if s == "local-only":
                out[s] = {"accuracy": LOCAL[seed], "party0-accuracy": LOCAL[seed], "mean-party-accuracy": 0.5,
                          "mean-bytes-up-per-party": 1000.0}
            elif (parties, seed, tau) == (3, 2, 0.001):  # one run fails: that cell is over two seeds
                out[s] = {"error": "RuntimeError: injected"}
            else:
                out[s] = {"accuracy": LOCAL[seed] + GAIN[tau][seed], "radius-mode": "theorem",
                          "parties": {"0": {"snr-bound": tau, "radius": 1.0 + seed}}}
        return {"run-dir": str(runs_dir), "strategies": out}

    monkeypatch.setattr(grid_run, "run_cell", made_up)
    GridRun(plan, tmp_path / "grid", engine="inprocess").run()
    out = tmp_path / "grid"

    rows = list(csv.DictReader((out / "table.csv").open()))
    assert len(rows) == 2 * 2 * 2  # (parties, tau) x strategy: one row per table cell, never per seed
    by = {(r["cell"], r["strategy"]): r for r in rows}
    mix = by[("p2_tau=1.0", "mixup-union")]
    assert (mix["n"], mix["seeds"]) == ("3", "0;1;2") and float(mix["accuracy"]) == pytest.approx(0.54)
    half = T_2 * math.sqrt(0.0003) / math.sqrt(3)  # values 0.52, 0.55, 0.55
    assert float(mix["accuracy-ci-low"]) == pytest.approx(0.54 - half)
    assert float(mix["accuracy-ci-high"]) == pytest.approx(0.54 + half)
    assert float(mix["radius-mean"]) == pytest.approx(2.0)  # radius 1, 2, 3
    assert by[("p2_tau=0.001", "local-only")]["reused-from"] == "p2_tau=1.0"
    assert by[("p3_tau=0.001", "mixup-union")]["n"] == "2" and "seed 2" in by[("p3_tau=0.001", "mixup-union")]["error"]
    per_seed = list(csv.DictReader((out / "table-seeds.csv").open()))
    assert len(per_seed) == 3 * 8 and {r["seed"] for r in per_seed} == {"0", "1", "2"}

    table = (out / "table.md").read_text()
    assert "mean ± 95 % CI over 3 seeds (0, 1, 2)" in table and "a cell over fewer seeds says its n" in table
    assert "Engine: inprocess" in table and "Threat model" in table
    main = table.split("\n## ")[0]
    body = [line for line in main.splitlines() if line.startswith("| 2 ") or line.startswith("| 3 ")]
    assert len(body) == 2  # one line per party count: the seeds are inside the cells
    assert "| 2 | 54.00 ± 4.30 [1 ± 0] | 43.00 ± 4.30 [0.001 ± 0] | 42.00 ± 4.97 | 50.00 ± 0.00 |" in body[0]
    assert "(n=2)" in body[1]
    crossing = next(line for line in table.splitlines() if line.startswith("- mixup-union tau=1.0, 2 parties"))
    # paired by seed: the difference 0.12, 0.13, 0.11 is far tighter than either accuracy's interval
    assert "local-only party 0 (42.00 ± 4.97 %)" in crossing
    assert "from smallest effective bound 1 (tau 1), there by +12.0 ± 2.5 points (3 seeds, paired by seed)" in crossing
    assert "never beats" in next(line for line in table.splitlines() if line.startswith("- mixup-union tau=0.001, 2"))
    assert "| p2_tau=1.0 | mixup-union tau=1.0 | 3 | 54.00 ± 4.30 |" in table  # the cost table, per cell

    summary = json.loads((out / "table.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and summary["level"] == 0.95 and len(summary["runs"]) == 24
    cell = next(c for c in summary["cells"] if c["cell"] == "p2_tau=1.0" and c["strategy"] == "mixup-union")
    acc = cell["metrics"]["accuracy"]
    assert acc["seeds"] == [0, 1, 2] and acc["values"] == pytest.approx([0.52, 0.55, 0.55])
    assert (acc["n"], acc["mean"], acc["ci-low"]) == (3, pytest.approx(0.54), pytest.approx(0.54 - half))
    assert any("+12.0 ± 2.5 points" in line for line in summary["crossovers"])


def test_one_seed_shows_the_value_and_says_so(tmp_path, monkeypatch):
    plan = grid_plan.make_plan(_preset(tmp_path, {"parties": [2]}, seed=4))

    def made_up(overrides, parties, engine, runs_dir):
        names = overrides["strategies"].split(",")
        return {"strategies": {s: {"accuracy": 0.5, "party0-accuracy": 0.4} for s in names}}

    monkeypatch.setattr(grid_run, "run_cell", made_up)
    GridRun(plan, tmp_path / "grid", engine="inprocess").run()
    table = (tmp_path / "grid" / "table.md").read_text()
    assert "one seed (seed 4), no interval" in table and "| 2 | 50.00 | 40.00 |" in table
    assert "±" not in table.split("\n## ")[0]
    assert next(csv.DictReader((tmp_path / "grid" / "table.csv").open()))["accuracy-ci-low"] == ""


def test_a_real_grid_over_two_seeds_reports_one_row_per_cell(tmp_path):
    """digits, 2 parties, mixup-union and local-only, 1 epoch, seeds 0 and 1, through the in-process engine."""
    from commands.cli import main

    preset = _preset(tmp_path, {"parties": [2]})
    out = tmp_path / "grid"
    out.mkdir()
    assert main(["grid", "--preset", preset, "--seeds", "0,1", "--engine", "inprocess", "--resume", str(out)]) == 0
    state = json.loads((out / "grid.json").read_text())
    assert sorted(state["cells"]) == ["p2_seed=0", "p2_seed=1"] and not any(c["error"] for c in state["cells"].values())
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [(r["cell"], r["strategy"], r["n"], r["seeds"]) for r in rows] == [
        ("p2", "mixup-union", "2", "0;1"), ("p2", "local-only", "2", "0;1")]
    for r in rows:
        assert float(r["accuracy-ci-low"]) <= float(r["accuracy"]) <= float(r["accuracy-ci-high"])
        assert float(r["accuracy"]) > 0.2  # chance is 0.1
    table = (out / "table.md").read_text()
    assert "mean ± 95 % CI over 2 seeds (0, 1)" in table
    body = [line for line in table.split("\n## ")[0].splitlines() if line.startswith("| 2 |")]
    assert len(body) == 1 and body[0].count("±") >= 3
    summary = json.loads((out / "table.json").read_text())
    mix = next(c for c in summary["cells"] if c["strategy"] == "mixup-union")
    assert mix["n"] == 2 and mix["metrics"]["accuracy"]["seeds"] == [0, 1]
    assert len(mix["metrics"]["accuracy"]["values"]) == 2
    radius = mix["metrics"]["radius-mean"]["values"]  # each seed draws its own partitions and encodings
    assert len(set(radius)) == 2
    assert [r["seed"] for r in summary["runs"]] == [0, 0, 1, 1]
