"""MixCon: the loss term, the split model's upload, model inversion, Fashion-MNIST's idx files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from commands.frontier.plan import parse_row
from fedsmix import data
from fedsmix.config import SettingsError, load_settings
from fedsmix.metrics import score
from fedsmix.models import SplitModel, lenet5
from fedsmix.training import TrainConfig, batch_loss, mixcon_loss, soft_cross_entropy, state_digest, train
from server.adversary.base import Observation
from server.adversary.inversion import DecoderInversion, ModelInversion
from server.adversary.registry import applicable

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def mnist(data_dir):
    train_split, test_split = data.load_split("mnist", "train", data_dir), data.load_split("mnist", "test", data_dir)
    x, labels = data.normalized_tensors(train_split, np.arange(2000))
    xt, lt = data.normalized_tensors(test_split, np.arange(16))
    return x, labels, xt, lt, train_split.spec


def sgd(**mixcon) -> TrainConfig:
    return TrainConfig(epochs=3, batch_size=32, lr=0.02, weight_decay=0.0, optimizer="sgd", cosine=False, **mixcon)


# ------------------------------------------------------------------------------------------- the loss
def test_lambda_zero_is_the_vanilla_loss_exactly(mnist):
    x, labels, *_ = mnist
    torch.manual_seed(0)
    model = lenet5((1, 28, 28), 10)
    xb, yb = x[:64], data.one_hot(labels[:64], 10)
    vanilla = soft_cross_entropy(model(xb), yb)
    off = batch_loss(model, xb, yb, TrainConfig(mixcon_lambda=0.0, mixcon_beta=1e-4))
    assert torch.equal(off, vanilla)
    on = batch_loss(model, xb, yb, TrainConfig(mixcon_lambda=0.5, mixcon_beta=1e-4))
    term = mixcon_loss(model.encoder(xb), labels[:64], 1e-4)
    assert term > 0 and torch.allclose(on, vanilla + 0.5 * term)
    # and in training: lambda = 0 (whatever beta) leaves the same weights as no MixCon at all
    digests = []
    for cfg in (sgd(), sgd(mixcon_lambda=0.0, mixcon_beta=1e-2)):
        torch.manual_seed(0)
        model = lenet5((1, 28, 28), 10)
        train(model, x[:256], data.one_hot(labels[:256], 10), cfg.__class__(**{**cfg.__dict__, "epochs": 1}),
              torch.Generator().manual_seed(0))
        digests.append(state_digest(model))
    assert digests[0] == digests[1]


def test_the_parties_mixcon_training_clips_its_gradient_and_the_vanilla_split_does_not(mnist):
    """beta / dist spikes made lambda = 10 diverge to NaN in 8 FedAvg rounds (docs/results/mixcon.md); `mixcon-clip`
    bounds each step, and only where the term is on."""
    from fedsmix.training import train_config

    base = load_settings({"dataset": "mnist", "encoder": "mixcon", "model": "lenet5", "client-lr": 0.01})
    assert train_config(base, "cpu", federated_client=True, split=True).clip_grad_norm == 1.0
    assert train_config(base.replace(mixcon_lambda=0.0), "cpu", federated_client=True, split=True).clip_grad_norm == 0
    assert train_config(base.replace(mixcon_clip=0.0), "cpu", federated_client=True, split=True).clip_grad_norm == 0
    x, labels, *_ = mnist
    moved = {}
    for clip in (0.0, 1e-3):  # one SGD step on one batch, no momentum or decay: the step is lr x the (clipped) gradient
        torch.manual_seed(0)
        model = lenet5((1, 28, 28), 10)
        before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        cfg = TrainConfig(epochs=1, batch_size=64, lr=0.1, weight_decay=0.0, momentum=0.0, optimizer="sgd",
                          cosine=False, mixcon_lambda=10.0, mixcon_beta=1e-2, clip_grad_norm=clip)
        train(model, x[:64], data.one_hot(labels[:64], 10), cfg, torch.Generator().manual_seed(0))
        moved[clip] = float((torch.cat([p.detach().flatten() for p in model.parameters()]) - before).norm())
    assert moved[1e-3] <= 0.1 * 1e-3 * 1.001 < moved[0.0]


def test_mixcon_term_rises_when_two_classes_are_pushed_together():
    torch.manual_seed(0)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    a, b = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    jitter = 1e-3 * torch.randn(8, 3)

    def loss_at(t: float, beta: float) -> float:  # t = 0: classes apart; t = 1: class 1 on top of class 0
        z = torch.where((labels == 0).unsqueeze(1), a, (1 - t) * b + t * a) + jitter
        return float(mixcon_loss(z, labels, beta))

    beta = 1e-2  # dist + beta/dist is smallest at dist = sqrt(beta) = 0.1
    far, near, on_top = loss_at(0.0, beta), loss_at(0.95, beta), loss_at(0.9999, beta)
    assert on_top > near and on_top > 10 * far  # beta/dist explodes as the classes meet
    assert loss_at(0.9999, 0.0) < loss_at(0.0, 0.0)  # beta = 0 only pulls them together (the collapse)
    # the gradient pushes coinciding classes apart when beta > 0
    z = (torch.where((labels == 0).unsqueeze(1), a, a) + jitter).requires_grad_(True)
    mixcon_loss(z, labels, beta).backward()
    step = z.detach() - 1e-6 * z.grad
    assert mixcon_loss(step, labels, beta) < mixcon_loss(z.detach(), labels, beta)
    gap = lambda t: (t[labels == 0].mean(0) - t[labels == 1].mean(0)).norm()  # noqa: E731
    assert gap(step) > gap(z.detach())


def test_pairing_is_class_balanced_and_clamped():
    z = torch.randn(7, 4)
    labels = torch.tensor([2, 0, 2, 0, 2, 5, 2])  # counts: 0 -> 2, 2 -> 4, 5 -> 1: p = 1
    unit = nn.functional.normalize(z, dim=1)
    first = {0: 1, 2: 0, 5: 5}  # the first sample of each class in batch order
    dists = [(unit[first[c1]] - unit[first[c2]]).pow(2).sum() for c1 in first for c2 in first if c1 != c2]
    expected = torch.stack([d + 0.1 / d for d in dists]).mean()
    assert torch.allclose(mixcon_loss(z, labels, 0.1), expected)
    assert float(mixcon_loss(z, torch.zeros(7, dtype=torch.long), 0.1)) == 0.0  # one class: no pair
    same = torch.ones(4, 3)
    assert torch.isfinite(mixcon_loss(same, torch.tensor([0, 1, 0, 1]), 1e-4, eps=1e-6))  # dist 0 clamped to eps


def test_mixcon_needs_a_split_model():
    with pytest.raises(ValueError, match="split model"):
        batch_loss(nn.Linear(4, 2), torch.randn(4, 4), torch.eye(2)[[0, 1, 0, 1]], TrainConfig(mixcon_lambda=1.0))


# ------------------------------------------------------------------------------------------- inversion
def inversion_ssim(h: nn.Module, x: torch.Tensor, spec, steps: int) -> float:
    lo, hi = data.valid_range(spec)
    with torch.no_grad():
        z = h(x)
    obs = Observation(x_tilde=z, n_private=len(x), lo=lo, hi=hi, encoder=h, input_shape=tuple(x.shape[1:]))
    estimate = ModelInversion(steps=steps, lr=1.0).reconstruct(obs)
    return score(x, estimate, lambda t: data.denormalize(t, spec))[0].ssim_mean


def test_inversion_recovers_images_through_an_identity_like_h(mnist):
    *_, xt, _, spec = mnist
    h = nn.Conv2d(1, 2, 3, padding=1)  # an untrained, invertible h: the image and a blurred copy
    with torch.no_grad():
        h.weight.zero_()
        h.bias.zero_()
        h.weight[0, 0, 1, 1] = 1.0
        h.weight[1, 0] = 1.0 / 9
    assert inversion_ssim(h, xt[:8], spec, steps=150) > 0.9


def test_inversion_chooses_zeta_on_public_probes_only(mnist):
    x, _, xt, _, spec = mnist
    h = nn.Conv2d(1, 1, 1)  # identity: any TV only blurs, so the smaller zeta must win
    with torch.no_grad():
        h.weight.fill_(1.0)
        h.bias.zero_()
    lo, hi = data.valid_range(spec)
    with pytest.raises(ValueError, match="probe"):
        ModelInversion(tv=(1e-5, 10.0))
    attack = ModelInversion(steps=60, tv=(10.0, 1e-5), probe=x[:4])
    with torch.no_grad():
        z = h(xt[:4])
    attack.reconstruct(Observation(x_tilde=z, n_private=4, lo=lo, hi=hi, encoder=h, input_shape=(1, 28, 28)))
    assert attack.tv == 1e-5 and set(attack.selection) == {10.0, 1e-5}
    assert attack.selection[1e-5] > attack.selection[10.0]


def test_inversion_does_worse_against_a_mixcon_trained_h(mnist):
    x, labels, xt, _, spec = mnist
    ssim = {}
    for lam in (0.0, 1.0):
        torch.manual_seed(0)
        model = lenet5((1, 28, 28), 10)
        train(model, x, data.one_hot(labels, 10), sgd(momentum=0.9, mixcon_lambda=lam, mixcon_beta=1e-4),
              torch.Generator().manual_seed(0))
        ssim[lam] = inversion_ssim(model.encoder.eval(), xt[:8], spec, steps=150)
    assert ssim[0.0] > 0.2 and ssim[1.0] < ssim[0.0] - 0.1, ssim


def test_decoder_learns_to_invert_h_from_public_images(mnist):
    x, _, xt, _, spec = mnist
    torch.manual_seed(0)
    h = lenet5((1, 28, 28), 10).encoder.eval()
    lo, hi = data.valid_range(spec)
    attack = DecoderInversion(x[:1024], epochs=4, batch_size=64, adversarial=0.0, xi_code=0.0)
    with torch.no_grad():
        z = h(xt)
    obs = Observation(x_tilde=z, n_private=len(xt), lo=lo, hi=hi, encoder=h, input_shape=(1, 28, 28))
    estimate = attack.reconstruct(obs)
    assert estimate.shape == xt.shape and attack.report["train-size"] == 1024
    to_unit = (lambda t: data.denormalize(t, spec))
    learnt = score(xt, estimate, to_unit)[0]
    blind = score(xt, x[:1024].mean(0, keepdim=True).expand_as(xt), to_unit)[0]  # the public mean image
    assert learnt.snr_mean > blind.snr_mean + 1.0 and learnt.ssim_mean > blind.ssim_mean
    with pytest.raises(ValueError, match="observation.encoder"):
        attack.reconstruct(Observation(x_tilde=z, n_private=len(xt)))


def test_registry_targets_the_representations():
    assert applicable("mixcon") == ("inversion", "inversion-decoder")
    assert applicable("backbone-features") == ("inversion", "inversion-decoder")
    assert "inversion" not in applicable("singularized")


# -------------------------------------------------------------------------------- settings and upload
@pytest.mark.parametrize("overrides, hint", [
    ({"encoder": "mixcon", "model": "cnn"}, "lenet5"),
    ({"encoder": "mixcon", "backbone": "efficientnet-lite0"}, "backbone"),
    ({"mixcon-lambda": -1}, "mixcon-lambda"),
    ({"mixcon-eps": 0}, "mixcon-eps"),
])
def test_bad_mixcon_settings_name_the_key(overrides, hint):
    with pytest.raises(SettingsError, match=hint):
        load_settings(overrides)


def test_rows_of_the_frontier():
    row = parse_row("mixcon-l1-b1e-4")
    assert row.strategy == "mixup-union" and row.target == "mixcon"
    assert row.overrides == {"encoder": "mixcon", "model": "lenet5", "mixcon_lambda": 1.0, "mixcon_beta": 1e-4}
    assert parse_row("mixcon-l0").overrides["mixcon_lambda"] == 0.0  # the vanilla split model
    for bad in ("mixcon-l1", "mixcon-lx-b1"):
        with pytest.raises(SettingsError, match="frontier.rows"):
            parse_row(bad)
    from commands.frontier.report import _family
    from commands.frontier.run import privacy_parameters

    settings = row.settings(load_settings({"dataset": "mnist"}), Path("/tmp/x"))
    privacy = privacy_parameters(row, settings, {})  # its own column: lambda and beta, not an upload's k
    assert privacy["mixcon"] == "lambda=1 beta=0.0001" and privacy["upload_k"] is None and privacy["tau"] is None
    assert _family({"strategy": row.name, **privacy}) == "MixCon cut layer"
    vanilla = parse_row("mixcon-l0")
    assert privacy_parameters(vanilla, vanilla.settings(load_settings({"dataset": "mnist"}), Path("/tmp/x")), {})[
        "mixcon"] == "lambda=0 (vanilla split)"
    mixup = parse_row("mixup-k2")
    assert privacy_parameters(mixup, mixup.settings(load_settings({"dataset": "mnist"}), Path("/tmp/x")), {})[
        "upload_k"] == 2


def test_a_mixcon_party_uploads_h_of_its_partition(data_dir, runs_dir):
    from commands import inprocess
    from fedsmix.models import new_classifier, represent
    from fedsmix.party import load_partition, prepare_upload

    settings = load_settings({"dataset": "mnist", "data-dir": data_dir, "train-subset": 600, "test-subset": 200,
                              "encoder": "mixcon", "partitioner": "iid", "strategies": "mixup-union",
                              "mixcon-rounds": 1, "epochs": 1, "batch-size": 64, "runs-dir": runs_dir})
    with pytest.raises(ValueError, match="encoder_state"):
        prepare_upload(settings, 0, 2)
    split = new_classifier(settings, (1, 28, 28), 10)
    assert isinstance(split, SplitModel)
    upload = prepare_upload(settings, 0, 2, encoder_state=split.encoder.state_dict())
    part = load_partition(settings, 0, 2)
    assert upload.arrays["x"].shape == (len(part.x), 400) and upload.calibration is None
    assert np.array_equal(upload.arrays["x"], represent(split.encoder, part.x).numpy())
    assert np.array_equal(upload.arrays["y"].argmax(1), part.labels.numpy())
    assert 0 <= upload.metrics["separability-min"] <= upload.metrics["separability-mean"] <= 4
    # the whole protocol in one process: FedAvg trains h, parties upload h(x), the server trains the head
    result = inprocess.run(settings, 2)["strategies"]["mixup-union"]
    trained = [len(load_partition(settings, p, 2).x) for p in range(2)]  # each party less its validation split
    assert trained == [270, 270]
    assert result["encoder"] == "mixcon" and result["union-size"] == sum(trained) and 0 <= result["accuracy"] <= 1
    payload = trained[1] * (400 + 10) * 4  # h(x) and the soft labels, float32; the message adds its framing
    assert payload <= result["parties"]["1"]["upload-bytes"] < payload + 4096


# ----------------------------------------------------------------------------------------- Fashion-MNIST
def test_fashion_mnist_from_debians_idx_files(tmp_path, monkeypatch):
    """No npz in the data dir: the loader reads the dataset-fashion-mnist package's idx files through
    torchvision's reader (deploy/system-packages.sh installs the package)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    test = data.load_split.__wrapped__("fashion-mnist", "test", str(tmp_path))
    assert test.images.shape == (10000, 1, 28, 28) and test.images.dtype == np.uint8
    assert test.labels[:10].tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]  # the official test order
    assert abs(float(data.to_unit(test.images, test.spec).mean()) - 0.2860) < 0.005
    assert (tmp_path / "cache" / "fedsmix" / "idx" / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte").is_file()


@pytest.mark.sim
@pytest.mark.slow
def test_mixcon_rows_in_a_frontier(data_dir, runs_dir):
    """Both rows are real Flower runs (FedAvg trains h, every party uploads h(x) through the ClientApp); the
    frontier replays the victim's upload bit for bit from the stored split model and inverts it."""
    import csv
    from pathlib import Path

    from commands.frontier.run import run_frontier

    overrides = {"runs-dir": runs_dir, "data-dir": data_dir, "train-subset": 600, "test-subset": 200, "epochs": 1,
                 "rounds": 1, "mixcon-rounds": 1, "attack-victims": 4, "public-size": 256}
    plan = {"rows": "mixcon-l0,mixcon-l1-b1e-4", "parties": 2, "inversion-steps": 20, "decoder-epochs": 1,
            "reencoding": 1}
    summary = run_frontier("configs/frontier-mnist.yaml", overrides, plan)
    run_dir = Path(summary["run-dir"])
    attacks = list(csv.DictReader((run_dir / "attacks.csv").open()))
    for row in ("mixcon-l0", "mixcon-l1-b1e-4"):
        assert {a["attack"] for a in attacks if a["strategy"] == row} == {"trivial guess", "inversion",
                                                                          "inversion-decoder"}
    for record in summary["records"]:
        run = json.loads((Path(record["run_dir"]) / "results.json").read_text())["strategies"]["mixup-union"]
        assert run["encoder"] == "mixcon" and run["mixcon-phase"]["rounds"] == 1
        assert (Path(record["run_dir"]) / "models" / "mixcon-split.pt").is_file()
        assert record["bytes_up_per_party"] > 300 * 410 * 4  # h(x) and labels, plus the FedAvg round
    assert summary["reencoding"] == []  # h(x) is the same at every re-encoding
