"""The paper's experiment settings (fixed weights, ImageNet normalisation, the code's V), the two
calibrations of its two versions, and the published post-processing screen."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsmix import data as datalib
from fedsmix.config import SettingsError, load_settings
from fedsmix.encoders import calibrate, data_statistics, noise_multiplier
from fedsmix.party import encode_partition, load_partition, prepare_upload, screen_scores
from server.adversary.sweep import victim_partition


def test_fixed_weights_are_alpha_exactly_and_algorithm1_draws_them(data_dir, one_thread):
    base = {"dataset": "cifar10", "data-dir": data_dir, "train-subset": 200, "tau": 1.0}
    fixed = load_settings({**base, "mixing-weights": "fixed"})
    part = load_partition(fixed, 0, 1)
    enc, _ = encode_partition(fixed, part)
    alpha = torch.tensor(fixed.alpha, dtype=torch.float32)
    assert torch.equal(enc.weights[:, 0], alpha.expand(len(enc)))
    assert torch.equal(enc.weights[:, 1], torch.tensor(1 - fixed.alpha, dtype=torch.float32).expand(len(enc)))
    one_hot = part.one_hot()
    assert torch.allclose(enc.y, alpha * one_hot + (1 - alpha) * one_hot[enc.sources[:, 1]])
    drawn, _ = encode_partition(load_settings(base), part)  # Algorithm 1: uniform, normalised, max <= alpha
    assert drawn.weights[:, 0].std() > 0.05 and bool((drawn.weights.max(dim=1).values <= fixed.alpha + 1e-6).all())
    assert torch.equal(drawn.sources, enc.sources)  # the pairing is drawn first: the same in both modes


def test_directional_calibrations_scale_the_scalar_radius(data_dir, one_thread):
    """directional = sqrt(d) x scalar on the same data; directional-eig puts lambda_max of the covariance
    (checked against a dense eigendecomposition) in place of V; each radius meets tau under its own bound."""
    part = load_partition(load_settings({"dataset": "digits"}), 0, 1)
    stats = data_statistics(part.x, torch.Generator().manual_seed(0), eigenvalue=True)
    flat = part.x.reshape(len(part.x), -1).double()
    lam = float(torch.linalg.eigvalsh(torch.cov(flat.T, correction=0))[-1])
    assert stats.lambda_max == pytest.approx(lam, rel=1e-6) and stats.d == 64
    tau, alpha = 1e-2, 0.7
    scalar, directional, eig = (calibrate(stats, tau, alpha, c) for c in ("scalar", "directional", "directional-eig"))
    assert directional.radius == pytest.approx(math.sqrt(64) * scalar.radius, rel=1e-12)
    k = alpha**2 / (tau * (1 - alpha) ** 2) - 1
    assert eig.radius == pytest.approx(math.sqrt(64 * lam * k), rel=1e-6)
    assert scalar.radius == pytest.approx(noise_multiplier(tau, alpha, stats.c) * stats.D, rel=1e-12)
    assert scalar.radius < eig.radius < directional.radius  # lambda_max < V < d lambda_max here
    for cal in (scalar, directional, eig):
        assert cal.snr_bound == pytest.approx(tau, rel=1e-9) and cal.calibration in cal.as_dict().values()


def test_calibration_is_reported_per_party(data_dir, one_thread):
    settings = load_settings({"dataset": "digits", "calibration": "directional-eig", "tau": 0.1})
    upload = prepare_upload(settings, 0, 2)
    m = upload.metrics
    assert m["calibration-variance"] == pytest.approx(64 * m["lambda-max"], rel=1e-12)
    assert m["snr-bound"] == pytest.approx(0.1, rel=1e-9) and m["screened-fraction"] == 0.0
    assert upload.calibration.calibration == "directional-eig"


def test_imagenet_normalisation_makes_mnist_three_grey_channels(data_dir):
    settings = load_settings({"dataset": "mnist", "data-dir": data_dir, "normalisation": "imagenet"})
    part = victim_partition(settings, 20)
    assert part.x.shape == (20, 3, 28, 28) and part.spec.mean == datalib.IMAGENET_MEAN
    unit = datalib.denormalize(part.x, part.spec)
    assert torch.allclose(unit[:, 0], unit[:, 2], atol=1e-6) and float(unit.min()) > -1e-6
    lo, hi = datalib.valid_range(part.spec)
    assert torch.allclose(lo.flatten(), -torch.tensor(datalib.IMAGENET_MEAN) / torch.tensor(datalib.IMAGENET_STD))
    raw = datalib.load_split("mnist", "test", data_dir)
    assert torch.allclose(unit[:, :1], datalib.to_unit(raw.images[:20], raw.spec), atol=1e-6)
    with pytest.raises(SettingsError, match="normalisation 'imagenet' applies to pixels"):
        load_settings({"normalisation": "imagenet", "backbone": "resnet18"})


def test_global_centring_is_the_paper_codes_larger_variance(data_dir):
    x = victim_partition(load_settings({"dataset": "mnist", "data-dir": data_dir}), 300).x
    per_pixel = data_statistics(x, torch.Generator().manual_seed(0))
    global_ = data_statistics(x, torch.Generator().manual_seed(0), centring="global")
    flat = x.reshape(300, -1).double()
    assert global_.V == pytest.approx(float((flat - flat.mean()).pow(2).sum(dim=1).mean()), rel=1e-9)
    assert per_pixel.V == pytest.approx(float((flat - flat.mean(dim=0)).pow(2).sum(dim=1).mean()), rel=1e-9)
    assert global_.V > 1.2 * per_pixel.V and global_.D == per_pixel.D


def test_screen_discards_encodings_too_similar_to_their_source(data_dir, one_thread):
    base = load_settings({"dataset": "cifar10", "data-dir": data_dir, "train-subset": 300, "tau": 1.0})
    part = load_partition(base, 0, 1)
    full, _ = encode_partition(base, part)
    ssim = screen_scores(base, part, full, "ssim")
    threshold = float(ssim.quantile(0.8))
    screened = base.replace(screen="ssim", screen_threshold=threshold)
    enc, _ = encode_partition(screened, part)
    keep = ssim < threshold
    assert len(enc) == int(keep.sum()) and torch.equal(enc.x, full.x[keep]) and torch.equal(enc.y, full.y[keep])
    assert bool((screen_scores(screened, part, enc, "ssim") < threshold).all())
    upload = prepare_upload(screened, 0, 1)  # the party reports what it discarded
    assert upload.metrics["screened-fraction"] == pytest.approx(1 - len(enc) / len(part.x))
    lpips = screen_scores(base, part, full, "lpips")  # ST-LPIPS distance: the screen keeps the far ones
    far = base.replace(screen="lpips", screen_threshold=float(lpips.quantile(0.2)))
    assert len(encode_partition(far, part)[0]) == int((lpips >= far.screen_threshold).sum())
    snr = screen_scores(base, part, full, "snr")  # the upload taken as a guess of its source
    flat, up = part.x.reshape(len(part.x), -1).double(), full.x.reshape(len(full), -1).double()
    expect = 10 * torch.log10(flat.pow(2).sum(1) / (flat - up).pow(2).sum(1))
    assert torch.allclose(snr.double(), expect, atol=1e-4)


def test_the_cifar10_matched_public_classes_are_those_objects(data_dir):
    with np.load(f"{data_dir}/tinyimagenet32.npz") as archive:
        words = dict(zip(archive["wnids"].astype(str), archive["words"].astype(str)))
        image_wnids = archive["wnids"].astype(str)[archive["y"]]  # each image's class
    expected = {"automobile": ("car", "wagon", "convertible", "limousine"), "bird": ("goose", "stork", "penguin",
                "albatross"), "cat": ("cat",), "deer": ("gazelle",), "dog": ("terrier", "retriever", "shepherd",
                "poodle", "chihuahua"), "frog": ("frog",), "ship": ("lifeboat", "gondola"), "truck": ("van",)}
    for cifar_class, wnids in datalib.CIFAR10_MATCHED_WNIDS.items():
        for wnid in wnids:
            assert any(w in words[wnid].lower() for w in expected[cifar_class]), (cifar_class, words[wnid])
    from fedsmix.space import load_public_pool

    settings = load_settings({"dataset": "cifar10", "data-dir": data_dir, "public-classes": "cifar10"})
    pool = load_public_pool(settings, datalib.spec("cifar10"))
    matched = int(np.isin(image_wnids, sum(datalib.CIFAR10_MATCHED_WNIDS.values(), ())).sum())  # the archive's images
    assert 0.6 * matched < len(pool) < matched  # of those classes: their part of the archive's 80 % cut
