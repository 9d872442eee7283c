"""What the uploads allow (fedsmix/bound.py, `fedsmix bound`): the genie's estimates are the uploads' own, its error
is what it predicts, and it moves with the noise and the union size as it must."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedsmix import bound
from fedsmix.config import SettingsError, load_settings
from fedsmix.party import pooled_data, prepare_upload
from fedsmix.space import load_test

PARTIES = 5


def uploads_of(data_dir: str, **overrides):
    settings = load_settings({"preset": "configs/quickstart.yaml", "data-dir": data_dir, **overrides})
    parts = [prepare_upload(settings, p, PARTIES) for p in range(PARTIES)]
    x = np.concatenate([np.asarray(u.arrays["x"], dtype=np.float32) for u in parts])
    y = np.concatenate([u.arrays["y"] for u in parts])
    clean_x, clean_labels = pooled_data(settings, PARTIES)
    return bound.Regression.of(x, y), bound.Genie.of(clean_x, clean_labels, 10), load_test(settings)


def test_without_an_encoder_the_uploads_give_the_class_means_exactly(data_dir):
    """encoder none: rows are clean samples with one-hot labels, so least squares on the labels is each class's mean
    of the uploaded rows, and the residual covariance their pooled within-class covariance."""
    settings = load_settings({"preset": "configs/quickstart.yaml", "data-dir": data_dir, "encoder": "none"})
    part = prepare_upload(settings, 0, PARTIES)
    x = np.asarray(part.arrays["x"], dtype=np.float64).reshape(len(part.arrays["x"]), -1)
    labels = part.arrays["y"].argmax(1)
    reg = bound.Regression.of(x, part.arrays["y"])
    for c in np.unique(labels):
        np.testing.assert_allclose(reg.means[c].numpy(), x[labels == c].mean(0), atol=1e-8)
    held = np.unique(labels)
    assert 3 < len(held) and int(reg.held.sum()) == len(held)  # a party holds some classes; the rest have no mean
    assert torch.isnan(reg.means[~reg.held]).all()
    genie = bound.Genie.of(torch.from_numpy(x), torch.from_numpy(labels), 10)
    np.testing.assert_allclose(reg.residual.numpy() * (len(x) - len(held)), genie.within.numpy() * (len(x) - 10),
                               atol=1e-6)  # the same scatter about the class means, per its own degrees of freedom


@pytest.mark.parametrize("tau", [1.0, 1e-3])
def test_the_error_of_the_uploads_means_is_what_the_genie_expects(data_dir, tau):
    """The genie's uncertainty in each class mean (K_cc tr R) is the squared error the uploads' means really have
    against the clean union's: its whole point is to know how much the uploads tell, no more, no less."""
    reg, genie, _ = uploads_of(data_dir, tau=tau)
    k = torch.linalg.inv(reg.gram)
    predicted = torch.stack([k[c, c] * torch.trace(reg.residual) for c in range(10)])
    actual = ((reg.means - genie.means) ** 2).sum(1)
    ratio = float(actual.sum() / predicted.sum())  # ten classes pooled: a chi-square of many degrees of freedom
    assert 0.6 < ratio < 1.6, ratio


def test_the_genie_loses_with_the_noise_and_gains_with_the_union(data_dir):
    """At tau 1 the genie is at the clean ceiling; at tau 1e-3 the same union tells it much less, and a union 100x
    larger (same noise) gives most of it back. The simulation of a union of the real size draws what the real
    uploads give. The clean ceiling does not depend on tau."""
    loose, genie, (test_x, test_y) = uploads_of(data_dir, tau=1.0)
    middle, _, _ = uploads_of(data_dir, tau=1e-2)
    tight, _, _ = uploads_of(data_dir, tau=1e-3)
    at_1, at_small = bound.bound(genie, loose, test_x, test_y), bound.bound(genie, tight, test_x, test_y)
    assert at_1["clean-lda"] == at_small["clean-lda"] > 0.8
    assert at_1["genie-subspace"] > at_1["clean-lda"] - 0.05
    assert at_small["genie-subspace"] < at_1["genie-subspace"] - 0.3
    assert at_small["genie-subspace"] >= at_small["genie-flat"] - 0.05  # knowing the subspace never hurts much
    real = bound.genie_accuracy(genie, middle, test_x, test_y, genie.between())
    drawn, spread = bound.simulated(genie, middle, test_x, test_y, middle.rows, draws=5, means_prior=genie.between())
    assert abs(drawn - real) < 3 * spread + 0.03, (drawn, spread, real)
    small, _ = bound.simulated(genie, tight, test_x, test_y, tight.rows, draws=3, means_prior=genie.between())
    large, _ = bound.simulated(genie, tight, test_x, test_y, 100 * tight.rows, draws=3, means_prior=genie.between())
    assert large > small + 0.3 and large > at_1["clean-lda"] - 0.1


def test_bound_command_writes_beside_a_run_and_names_what_it_lacks(data_dir, runs_dir, one_thread, tmp_path, capsys):
    from commands import cli, inprocess

    results = inprocess.run({"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir,
                             "strategies": "mixup-union", "epochs": 2, "trainer": "lda", "tau": 1e-2}, 3)
    run_dir = results["run-dir"]
    assert cli.main(["bound", run_dir, "--sizes", "10", "--draws", "1"]) == 0
    written = json.loads((tmp_path.joinpath(run_dir) / "upload-bound.json").read_text())
    assert written["accuracy"] == results["strategies"]["mixup-union"]["accuracy"]
    assert written["parties-used"] == 3 and written["rows"] == results["strategies"]["mixup-union"]["union-size"]
    assert 0.1 < written["genie-subspace"] <= 1 and written["sizes"]["10"]["genie-subspace"] > 0
    assert "genie (subspace known)" in capsys.readouterr().out
    latest = tmp_path.joinpath(runs_dir) / "latest"  # what a user names: the link to the newest run
    assert latest.is_symlink() and cli.main(["bound", str(latest)]) == 0
    capsys.readouterr()
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert cli.main(["bound", str(empty)]) == 2
    assert "no run with stored mixup-union uploads" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="encoder 'instahide-inside'"):
        from commands.bound import of_run

        stored = json.loads((tmp_path.joinpath(run_dir) / "results.json").read_text())
        stored["settings"]["encoder"] = "instahide-inside"
        other = tmp_path / "other"
        (other / "uploads").mkdir(parents=True)
        (other / "uploads" / "manifest.json").write_text("{}")
        (other / "results.json").write_text(json.dumps(stored))
        of_run(other)


def test_bound_of_a_grid_takes_every_run_its_grid_json_names(data_dir, runs_dir, one_thread, tmp_path, capsys):
    """A grid continued in a second directory on a copy of the first one's grid.json (seed 1 reused from the first,
    seed 2 run in the second): `fedsmix bound` on the second bounds both seeds, grouped in one cell."""
    import shutil

    import yaml

    from commands.cli import main

    preset = tmp_path / "two-seeds.yaml"
    preset.write_text(yaml.safe_dump({
        "dataset": "digits", "partitioner": "dirichlet", "dirichlet-alpha": 0.5, "strategies": "mixup-union",
        "trainer": "lda", "tau": 1e-2, "epochs": 2, "data-dir": data_dir, "runs-dir": runs_dir,
        "grid": {"parties": [3]},
    }))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    assert main(["grid", "--preset", str(preset), "--engine", "inprocess", "--seeds", "1", "--resume", str(first)]) == 0
    shutil.copy(first / "grid.json", second / "grid.json")
    assert main(["grid", "--preset", str(preset), "--engine", "inprocess", "--seeds", "1,2",
                 "--resume", str(second)]) == 0
    assert [p.name for p in second.glob("cells/*")] == ["p3_seed=2"]  # only seed 2 ran here
    capsys.readouterr()
    assert main(["bound", str(second)]) == 0
    table = capsys.readouterr().out
    assert "| 1,2 |" in table, table  # both seeds, one cell
    assert len({p.resolve() for p in first.glob("cells/*/*/upload-bound.json")}) == 1  # beside the reused run
