"""The grid runner: preset -> run configs, the reuse plan, and a tiny grid through Flower simulation."""

from __future__ import annotations

import csv
import json

import pytest
import torch
import torchvision
import yaml

from commands.grid import plan as grid_plan
from commands.grid import run as grid_run
from commands.grid.run import GridRun
from fedsmix.config import Settings, SettingsError, load_settings, settings_from_flower


def test_table4_preset_becomes_run_configs():
    plan = grid_plan.make_plan("configs/table4-cifar10.yaml")
    assert plan.axes == {"parties": [10, 20, 30], "seed": [0], "radius-mode": ["theorem", "pixel-mapped"]}
    assert len(plan.cells) == 6
    settings = load_settings({**plan.base, **plan.cells[1].overrides()})
    assert (settings.dataset, settings.backbone, settings.tau, settings.partitioner) == (
        "cifar10",
        "efficientnet-lite0",
        1e-6,
        "dirichlet",
    )
    assert settings.radius_mode == "pixel-mapped"
    assert set(settings.strategies) == {"local-only", "fedavg", "fedprox", "mixup-union", "centralized"}
    # what Flower hands the ServerApp (pyproject defaults fused with the overrides) gives the same settings
    overrides = {**plan.base, **plan.cells[1].overrides()}
    assert settings_from_flower(Settings().to_run_config() | overrides, overrides) == settings
    # reuse: the baselines run once per party count, the centralised bound once, mixup-union in every cell
    schedule = {cell.id: todo for cell, todo in plan.schedule()}
    assert schedule["p10_seed=0_radius-mode=theorem"] == [
        "local-only",
        "fedavg",
        "fedprox",
        "mixup-union",
        "centralized",
    ]
    assert schedule["p10_seed=0_radius-mode=pixel-mapped"] == ["mixup-union"]
    assert schedule["p30_seed=0_radius-mode=theorem"] == ["local-only", "fedavg", "fedprox", "mixup-union"]
    # under feature skew the bound pools the parties' shifted images: one per party count as well
    skewed = grid_plan.make_plan("configs/table4-cifar10.yaml", sets={"feature-skew": 0.5})
    assert sum("centralized" in todo for _, todo in skewed.schedule()) == 3


def test_overrides_beat_the_preset_and_bad_axes_name_the_key():
    plan = grid_plan.make_plan("configs/tau-sweep-cifar10.yaml", sets={"tau": 0.5, "epochs": 2}, axes={"parties": [3]})
    assert "tau" not in plan.axes and plan.axes["parties"] == [3]  # --set fixes an axis everywhere
    assert len(plan.cells) == 2 and all(load_settings({**plan.base, **c.overrides()}).tau == 0.5 for c in plan.cells)
    assert load_settings(plan.base).epochs == 2
    with pytest.raises(SettingsError, match="tua"):
        grid_plan.make_plan("configs/table4-cifar10.yaml", axes={"tua": [1]})
    with pytest.raises(SettingsError, match="radius"):  # fixed mode without a radius fails before anything runs
        grid_plan.make_plan("configs/table4-cifar10.yaml", axes={"radius-mode": ["fixed"]})


def test_published_presets_rerun_every_strategy_along_partition_axes():
    """Partition keys change every strategy but the centralised bound (whole split), like `parties`."""
    from commands.grid.report import label, row_key

    for key in ("partitioner", "dirichlet-alpha", "poor-party-ratio", "poor-party", "min-partition-size"):
        assert {s: grid_plan.depends_on(s, key) for s in ("fedprox", "mixup-union", "local-only", "centralized")} == {
            "fedprox": True, "mixup-union": True, "local-only": True, "centralized": False
        }
    plan = grid_plan.make_plan("configs/published-table5-cifar10.yaml")
    assert plan.axes == {
        "parties": [10, 50, 100], "dirichlet-alpha": [1.0, 0.5, 0.1], "radius-mode": ["theorem", "pixel-mapped"]
    }
    s = load_settings({**plan.base, **plan.cells[0].overrides()})
    assert (s.partitioner, s.rounds, s.local_epochs, s.proximal_mu, s.image_size, s.epochs, s.batch_size) == (
        "dirichlet-equal", 50, 1, 1e-3, 128, 30, 128
    )
    schedule = plan.schedule()
    assert sum("fedprox" in todo for _, todo in schedule) == 9  # once per (parties, beta)
    assert sum("mixup-union" in todo for _, todo in schedule) == 18
    cell = plan.cells[3]  # p10, beta 0.5, pixel-mapped
    assert label(cell, "fedprox") == "fedprox" and label(cell, "mixup-union") == "mixup-union radius-mode=pixel-mapped"
    assert row_key(cell, ()) == (("parties", 10), ("dirichlet-alpha", 0.5))
    plan = grid_plan.make_plan("configs/published-table6-cifar10.yaml")
    assert plan.axes["parties"] == [50] and plan.axes["poor-party-ratio"] == [1.0, 0.1, 0.01]
    assert load_settings({**plan.base, **plan.cells[0].overrides()}).partitioner == "size-skew"
    assert sum("fedprox" in todo for _, todo in plan.schedule()) == 9  # once per (rho, beta)
    with pytest.raises(SettingsError, match="poor-party: 50 is outside 0..49"):  # known at plan time
        grid_plan.make_plan("configs/published-table6-cifar10.yaml", sets={"poor-party": 50})


@pytest.fixture(scope="module")
def tiny_preset(tmp_path_factory, data_dir):
    """Digits through a resnet18 (random weights, saved locally) at 16 px: features in seconds."""
    root = tmp_path_factory.mktemp("grid")
    torch.manual_seed(0)
    weights = root / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    preset = {
        "strategies": "mixup-union,local-only,fedprox",
        "dataset": "digits",
        "backbone": "resnet18",
        "weights-path": str(weights),
        "image-size": 16,
        "feature-cache-dir": str(root / "features"),
        "partitioner": "iid",
        "tau": 1.0,
        "epochs": 3,
        "rounds": 2,
        "proximal-mu": 0.1,
        "device": "cpu",
        "tuning-budget": 2,
        "grid": {"parties": [2, 3], "radius-mode": ["theorem", "pixel-mapped"]},
    }
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(preset))
    return path


@pytest.fixture(scope="module")
def inprocess_grid(tiny_preset, tmp_path_factory):
    out = tmp_path_factory.mktemp("inprocess")
    plan = grid_plan.make_plan(str(tiny_preset))
    GridRun(plan, out, engine="inprocess").run()
    return plan, out


def test_grid_writes_table_csv_and_plot(inprocess_grid):
    plan, out = inprocess_grid
    state = json.loads((out / "grid.json").read_text())
    assert len(state["cells"]) == 4 and not any(c["error"] for c in state["cells"].values())
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert len(rows) == 4 * 3  # every cell reports every strategy, reused or not
    by = {(r["cell"], r["strategy"]): r for r in rows}
    assert by[("p2_radius-mode=pixel-mapped", "local-only")]["reused-from"] == "p2_radius-mode=theorem"
    assert state["cells"]["p2_radius-mode=pixel-mapped"]["strategies"] == ["mixup-union"]
    mix = by[("p3_radius-mode=pixel-mapped", "mixup-union")]
    assert mix["radius-mode"] == "pixel-mapped" and mix["reused-from"] == ""
    assert float(mix["accuracy"]) > 0.2  # chance is 0.1
    prox = by[("p2_radius-mode=theorem", "fedprox")]
    assert float(prox["accuracy"]) > 0.2 and float(prox["bytes-up-per-party"]) > 0
    # after the upload the model comes down to every party (and the trainer's candidates to those that score them)
    assert prox["tuning"] == "2 tried, budget 2" and prox["chosen"].startswith("client-lr=")
    model_bytes = float(prox["bytes-down-per-party"]) / 8  # FedProx: 2 settings x 2 rounds x (train, evaluate)
    assert float(mix["bytes-down-per-party"]) >= model_bytes > 0
    theorem = by[("p2_radius-mode=theorem", "mixup-union")]
    assert float(theorem["snr-bound-max"]) == pytest.approx(1.0)  # theorem mode: the bound is tau
    table = (out / "table.md").read_text()
    assert "mixup-union radius-mode=pixel-mapped" in table and "local-only (party 0)" in table and "[" in table
    assert (out / "accuracy_vs_parties.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_runs_nothing_twice(inprocess_grid, monkeypatch):
    plan, out = inprocess_grid

    def no_run(*args, **kwargs):
        raise AssertionError("a finished cell ran again")

    monkeypatch.setattr(grid_run, "run_cell", no_run)
    GridRun(plan, out).run()


def test_report_tables_the_finished_cells_of_a_wider_plan_and_runs_nothing(inprocess_grid, tmp_path, monkeypatch,
                                                                            capsys):
    import shutil

    from commands.cli import main

    plan, out = inprocess_grid
    copy = tmp_path / "grid"
    shutil.copytree(out, copy)
    state = (copy / "grid.json").read_text()

    def no_run(*args, **kwargs):
        raise AssertionError("--report ran a cell")

    monkeypatch.setattr(grid_run, "run_cell", no_run)
    args = ["grid", "--preset", str(plan.preset), "--parties", "2,3,4", "--axis", "radius-mode=theorem", "--engine",
            "inprocess", "--resume", str(copy)]
    assert main([*args, "--report"]) == 0
    cells = {r["cell"] for r in csv.DictReader((copy / "table.csv").open())}
    assert cells == {"p2_radius-mode=theorem", "p3_radius-mode=theorem"}  # p4 never ran; pixel-mapped not asked
    assert (copy / "grid.json").read_text() == state
    assert main([*args[:-2], "--report"]) == 2  # without --resume: which grid?
    assert "--report: name the grid directory" in capsys.readouterr().err
    assert main([*args[:-1], str(tmp_path / "nowhere"), "--report"]) == 2
    assert "holds no grid.json" in capsys.readouterr().err


def test_a_failed_cell_is_recorded_as_failed_and_retried_on_resume(tiny_preset, tmp_path, monkeypatch):
    plan = grid_plan.make_plan(str(tiny_preset), axes={"parties": [2], "radius-mode": ["theorem"]})
    real_run_cell, calls = grid_run.run_cell, []

    def flaky(overrides, parties, engine, runs_dir):
        calls.append(overrides["strategies"])
        if len(calls) == 1:  # the first attempt crashes before any result is written
            return {"strategies": {}, "error": "RuntimeError: injected"}
        return real_run_cell(overrides, parties, engine, runs_dir)

    monkeypatch.setattr(grid_run, "run_cell", flaky)
    GridRun(plan, tmp_path, engine="inprocess").run()
    state = json.loads((tmp_path / "grid.json").read_text())
    assert state["results"] == {} and len(state["failed"]) == 3  # nothing recorded as done
    assert "failed" in (tmp_path / "table.md").read_text()
    GridRun(plan, tmp_path, engine="inprocess").run()  # --resume: the failed strategies run again
    state = json.loads((tmp_path / "grid.json").read_text())
    assert calls == ["mixup-union,local-only,fedprox"] * 2
    assert state["failed"] == {} and len(state["results"]) == 3
    assert all(r["accuracy"] > 0.2 for r in state["results"].values())


@pytest.mark.sim
def test_a_grid_cell_through_flowers_simulation_matches_the_inprocess_transport(tiny_preset, inprocess_grid, tmp_path):
    """One cell through Flower's simulation engine (2 parties: mixup-union, local-only, FedProx on features) against
    the in-process transport: the same ServerApp and ClientApp, so the same calibration and the same messages."""
    plan = grid_plan.make_plan(str(tiny_preset), axes={"parties": [2], "radius-mode": ["pixel-mapped"]})
    GridRun(plan, tmp_path, engine="simulate").run()
    results = json.loads((tmp_path / "cells" / plan.cells[0].id / "latest" / "results.json").read_text())
    assert results["strategies"]["mixup-union"]["radius-mode"] == "pixel-mapped"
    assert [p["round"] for p in results["strategies"]["fedprox"]["curve"]] == [0, 1, 2]
    sim = {r["strategy"]: r for r in csv.DictReader((tmp_path / "table.csv").open())}
    inprocess = {r["strategy"]: r for r in csv.DictReader((inprocess_grid[1] / "table.csv").open())
                 if r["cell"] == plan.cells[0].id}
    for col in ("radius-mean", "D-mean", "c-mean", "snr-bound-max", "snr-empirical-mean"):
        # the same computation; Ray's actors run one thread where this process runs two (sums in another order)
        assert float(inprocess["mixup-union"][col]) == pytest.approx(float(sim["mixup-union"][col]), rel=1e-12), col
    for col in ("bytes-up-per-party", "bytes-down-per-party"):  # the same messages; only the runs-dir path differs
        assert float(inprocess["mixup-union"][col]) == pytest.approx(float(sim["mixup-union"][col]), rel=1e-3), col
    for strategy in ("mixup-union", "local-only", "fedprox"):
        # training may differ by thread count (Ray workers use one); 360 test images, a few may flip
        assert float(inprocess[strategy]["accuracy"]) == pytest.approx(float(sim[strategy]["accuracy"]), abs=0.05), (
            strategy
        )


def test_the_crossover_is_the_smallest_bound_that_beats_local_only_by_three_points():
    from commands.grid.report import crossovers

    rows = [{"strategy": "local-only", "label": "local-only", "parties": 10, "party0-accuracy": 0.40}]
    for bound, accuracy in ((1.0, 0.60), (1e-2, 0.45), (1e-3, 0.42), (1e-4, 0.30)):
        rows.append({"strategy": "mixup-union", "label": "mixup-union trainer=auto", "parties": 10,
                     "accuracy": accuracy, "snr-bound-max": bound})
    (line,) = crossovers(rows)[1:]
    assert "mixup-union trainer=auto, 10 parties" in line and "smallest effective bound 0.01" in line
    rows[1:] = [{**r, "accuracy": 0.41} for r in rows[1:]]
    assert "never" in crossovers(rows)[1]


def test_a_crossover_over_seeds_says_whether_its_interval_clears_the_margin():
    """Three seeds, paired: a large mean gain with a wide spread is a claim on the mean only."""
    from commands.grid.report import crossovers

    def rows(party0: list[float], union: list[float]) -> list[dict]:
        out = [{"strategy": "local-only", "label": "local-only", "parties": 10, "party0-accuracy": a, "seed": s}
               for s, a in enumerate(party0)]
        return out + [{"strategy": "mixup-union", "label": "mixup-union", "parties": 10, "accuracy": a,
                       "snr-bound-max": 1.0, "seed": s} for s, a in enumerate(union)]

    (wide,) = crossovers(rows([0.40, 0.95, 0.75], [0.95, 0.96, 0.95]))[1:]
    assert "beats" in wide and "not beyond the seed interval" in wide
    (tight,) = crossovers(rows([0.60, 0.62, 0.61], [0.95, 0.96, 0.95]))[1:]
    assert "beyond the seed interval" in tight and "not beyond" not in tight


def test_the_cost_table_names_what_each_strategys_selection_chose_at_each_seed(tiny_preset, tmp_path, monkeypatch):
    """A `trainer` axis must not hide what `trainer: auto` picked in each cell, and FedAvg's cell names its setting,
    stopping round and budget like mixup-union's, with the seed that chose each where seeds chose differently."""
    plan = grid_plan.make_plan(str(tiny_preset), sets={"strategies": "mixup-union,fedavg"},
                               axes={"parties": [2], "radius-mode": ["theorem"], "trainer": ["auto"]}, seeds=[1, 2])

    def chosen(overrides, parties, engine, runs_dir):
        seed = overrides["seed"]
        mix = {"trainer": "lda@10", "parties": {"0": {"radius": 1.0}}, "tuning-budget": 2, "chosen": "lda@10",
               "tried": ["mlp", "lda@10"]}
        fed = {"tuning-budget": 2, "tried": [{"client-lr": 0.05}, {"client-lr": 0.01}],
               "chosen": {"client-lr": 0.05 if seed == 1 else 0.01}, "stopped-at": 3 + seed}
        return {"run-dir": str(runs_dir), "strategies": {
            s: {"accuracy": 0.5, **(mix if s == "mixup-union" else fed if s == "fedavg" else {})}
            for s in overrides["strategies"].split(",")}}

    monkeypatch.setattr(grid_run, "run_cell", chosen)
    GridRun(plan, tmp_path, engine="inprocess").run()
    rows = {r["strategy"]: r for r in csv.DictReader((tmp_path / "table.csv").open())}
    assert rows["mixup-union"]["trainer"] == "auto" and rows["mixup-union"]["trainer-chosen"] == "lda@10"
    table = (tmp_path / "table.md").read_text()
    assert "| lda@10 (2 tried, budget 2) |" in table
    assert "| seed 1: client-lr=0.05, round 4; seed 2: client-lr=0.01, round 5 (2 tried, budget 2) |" in table
