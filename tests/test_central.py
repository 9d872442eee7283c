"""The central trainers (fedsmix/trainers/): closed-form heads, the known-noise correction, BatchNorm
recalibration, and a selection that sees only what the parties score on their own clean data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsmix import data as datalib
from fedsmix import trainers
from fedsmix.config import load_settings
from fedsmix.encoders import singularized_mixup
from fedsmix.seeding import generator

pytestmark = pytest.mark.usefixtures("one_thread")


def blobs(n: int, d: int = 32, classes: int = 4, seed: int = 0, spread: float = 1.0):
    """Gaussian classes in d dimensions: means on a sphere of radius 3, unit noise."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, d, generator=torch.Generator().manual_seed(99))
    means = 3 * means / means.norm(dim=1, keepdim=True)
    labels = torch.randint(0, classes, (n,), generator=g)
    return means[labels] + spread * torch.randn(n, d, generator=g), labels


def test_ridge_heads_are_the_closed_form_solution():
    x, labels = blobs(400)
    y = datalib.one_hot(labels, 4).numpy()
    m = trainers.Moments.of(x, y)
    head = trainers.linear_heads("ridge", m, (0.1,))["ridge@0.1"]
    xc = (x.double() - x.double().mean(0)).numpy()
    cov = xc.T @ xc / len(x)
    lam = 0.1 * np.trace(cov) / cov.shape[0]
    expected = np.linalg.solve(cov + lam * np.eye(len(cov)), xc.T @ (y - y.mean(0)) / len(x))
    assert np.allclose(head.linear.weight.detach().double().numpy().T, expected, atol=1e-5)
    logits = head(x).detach().double().numpy()
    assert np.allclose(logits, xc @ expected + y.mean(0), atol=1e-4)  # the bias centres the inputs


def test_errors_in_variables_removes_the_known_noise():
    """With isotropic input noise of known variance, ridge-eiv's weights land near the clean solution and
    plain ridge's shrink towards zero (at a penalty that keeps the corrected covariance well conditioned:
    below it the eigenvalues' sampling error dominates, which is why gamma is selected, not fixed)."""
    x, labels = blobs(20_000, d=16, seed=1)
    y = datalib.one_hot(labels, 4).numpy()
    sigma2 = 25.0
    noisy = x + sigma2**0.5 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    clean = trainers.linear_heads("ridge", trainers.Moments.of(x, y), (1.0,))["ridge@1"].linear.weight.detach()
    m = trainers.Moments.of(noisy, y)
    plain = trainers.linear_heads("ridge", m, (1.0,))["ridge@1"].linear.weight.detach()
    eiv = trainers.linear_heads("ridge-eiv", m, (1.0,), noise_var=sigma2)["ridge-eiv@1"].linear.weight.detach()
    assert (eiv - clean).norm() < 0.5 * (plain - clean).norm()
    assert plain.norm() < 0.5 * clean.norm()  # the attenuation errors-in-variables undoes


def test_batchnorm_is_recalibrated_on_the_given_data():
    settings = load_settings({"model": "mlp"})
    model = trainers.build_model("mlp", settings, (8,), 3)
    x = torch.randn(256, 8) * 5 + 2
    trainers.recalibrate_batchnorm(model, x)
    bn = model.net[2]
    first = model.net[1](x).detach()
    assert torch.allclose(bn.running_mean, first.mean(0), atol=1e-4)
    assert torch.allclose(bn.running_var, first.var(0), rtol=1e-3)
    assert not model.training


def _synthetic_union(settings, radius: float, parties: int = 4, n: int = 600):
    """Each party encodes its own blobs with singularized mixup at `radius`; returns the union, the parties'
    clean data and a clean test set."""
    xs, ys, owners, clean = [], [], [], {}
    for p in range(parties):
        x, labels = blobs(n, seed=10 + p)
        enc = singularized_mixup(x, datalib.one_hot(labels, 4), settings.alpha, radius, generator(0, p, "encode"))
        xs.append(enc.x)
        ys.append(enc.y.numpy())
        owners.append(np.full(n, p))
        clean[p] = (x, labels)
    d = xs[0].shape[1]
    reports = [{"num-examples": n, "radius": radius, "alpha": settings.alpha, "V": float(x.var(0).sum())}
               for x, _ in clean.values()]
    union = trainers.Union(torch.cat(xs), np.concatenate(ys), np.concatenate(owners),
                          *trainers.union_statistics(reports, d, "singularized"))
    return union, clean, blobs(2000, seed=77)


def _party_scores(parties: int = 4, n: int = 60):
    """Each party scores on a validation split of its own: clean blobs it never encoded."""
    held = {p: blobs(n, seed=50 + p) for p in range(parties)}

    def score(models):
        return {p: trainers.score_models(models, x, labels) for p, (x, labels) in held.items()}

    return score


def test_under_large_known_noise_the_noise_aware_trainers_beat_the_mlp():
    settings = load_settings({"model": "mlp", "epochs": 15, "batch-size": 64, "trainer": "auto",
                              "head-penalties": "0.01,1,100", "tuning-budget": 30})
    union, clean, (x_test, y_test) = _synthetic_union(settings, radius=150.0)
    public, _ = blobs(1000, seed=5)
    accuracy = {}
    for trainer in ("mlp", "ridge-eiv", "auto"):
        chosen = settings.replace(trainer=trainer)
        selection = trainers.train_union(chosen, union, (32,), 4, "cpu", score=_party_scores(), public=public)
        accuracy[trainer] = trainers.test_accuracy(selection.model, (x_test, y_test), "cpu")["accuracy"]
        if trainer == "auto":
            assert selection.chosen != "mlp" and selection.voters == 4
            assert set(selection.validation) == set(trainers.candidate_names(chosen))
    assert accuracy["mlp"] < 0.4  # the head fits the noise statistics and fails on clean inputs
    assert accuracy["ridge-eiv"] > accuracy["mlp"] + 0.2
    assert accuracy["auto"] > accuracy["mlp"] + 0.2


def test_no_strategy_can_read_the_test_split_to_choose(data_dir, runs_dir, one_thread, monkeypatch):
    """Through the real path (the ServerApp and the ClientApp over the in-process transport): the same run with the
    test split's labels shifted by one class chooses the same trainer with the same validation scores and trains
    the same weights for every strategy; only the reported test accuracies move."""
    import server.context
    from commands import inprocess
    from fedsmix import space

    overrides = {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir, "epochs": 2,
                 "rounds": 2, "strategies": "mixup-union,local-only,fedavg,fedprox", "trainer": "auto",
                 "head-penalties": "0.1,10", "seed": 2}
    honest = inprocess.run(overrides, 3)["strategies"]
    real = space.load_test

    def shifted(settings):
        x, y = real(settings)
        return x, (y + 1) % 10

    for module in (space, server.context):  # the parties' returned models read it through space.returned_test
        monkeypatch.setattr(module, "load_test", shifted)
    poisoned = inprocess.run(overrides, 3)["strategies"]
    mix, bad = honest["mixup-union"], poisoned["mixup-union"]
    assert len(mix["selection"]["validation-accuracy"]) > 5  # a real choice among many candidates
    assert (mix["trainer"], mix["selection"]) == (bad["trainer"], bad["selection"])
    for name in ("mixup-union", "fedavg", "fedprox"):
        assert len(honest[name]["tried"]) > 1, name  # every strategy chose among several settings
        assert (honest[name]["chosen"], honest[name].get("stopped-at")) == (bad_choice := (
            poisoned[name]["chosen"], poisoned[name].get("stopped-at"))), (name, bad_choice)
        assert honest[name]["weights-sha256"] == poisoned[name]["weights-sha256"], name
        assert poisoned[name]["accuracy"] < honest[name]["accuracy"] - 0.5, name  # the shifted labels were read
    assert poisoned["local-only"]["per-party-accuracy"] != honest["local-only"]["per-party-accuracy"]
    assert poisoned["local-only"]["chosen-per-party"] == honest["local-only"]["chosen-per-party"]


def test_a_server_without_the_public_set_skips_only_the_candidates_that_need_it(tmp_path):
    events = []

    class Record:
        def emit(self, kind, **fields):
            events.append((kind, fields))

    settings = load_settings({"dataset": "digits", "trainer": "auto", "data-dir": str(tmp_path)})
    assert trainers.server_public(settings, Record()) is None  # no tinyimagenet32.npz in an empty data dir
    assert events[0][0] == "public-unavailable" and events[0][1]["skipped"] == list(trainers.PUBLIC)
    names = trainers.candidate_names(settings, public=False)
    assert names and not any(name.split("@")[0] in trainers.PUBLIC for name in names)
    with pytest.raises(datalib.DatasetUnavailable, match="trainer 'lda-public' needs the public set"):
        trainers.server_public(settings.replace(trainer="lda-public"))
    assert trainers.server_public(settings.replace(trainer="ridge")) is None  # needs none, loads none


def test_lda_recovers_the_clean_class_means_from_mixed_soft_labels():
    """Mixing pulls every soft-label-weighted class mean towards the overall mean by E[w1^2 + w2^2]; the
    discriminant undoes it, so its class means match the clean data's, and it classifies clean inputs."""
    settings = load_settings({})
    x, labels = blobs(20_000, d=16, seed=4)
    enc = singularized_mixup(x, datalib.one_hot(labels, 4), settings.alpha, 0.0, generator(0, "lda"))
    _, mix_scale = trainers.union_statistics([{"num-examples": 1, "alpha": settings.alpha, "radius": 0.0}], 16,
                                            "singularized")
    m = trainers.Moments.of(enc.x, enc.y.numpy())
    recovered = m.xy / (m.mean_y * mix_scale)
    truth = torch.stack([x[labels == c].double().mean(0) for c in range(4)], dim=1) - x.double().mean(0)[:, None]
    assert (recovered - truth).norm() < 0.05 * truth.norm()
    shrunk = m.xy / m.mean_y  # without the mixing scale: the class means of the mixtures
    assert (shrunk - truth).norm() > 0.3 * truth.norm()
    head = trainers.linear_heads("lda", m, (1e-3,), 0.0, mix_scale)["lda@0.001"]
    x_test, y_test = blobs(2000, d=16, seed=8)
    assert trainers.test_accuracy(head, (x_test, y_test), "cpu")["accuracy"] > 0.9
