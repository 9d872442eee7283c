"""The paper's attacks (linear inversion, U-Net) and the leakage metrics, on small real slices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsmix import data as datalib
from fedsmix.config import load_settings
from fedsmix.encoders import calibrate, data_statistics, encode, singularized_mixup
from fedsmix.metrics import psnr_db, score, snr_db, ssim, st_lpips, st_lpips_pairwise, theorem41_T
from fedsmix.party import Partition, encode_partition, encoder_params
from fedsmix.seeding import generator
from fedsmix.space import load_public_pool
from server.adversary.analysis import leakage, theorem41
from server.adversary.base import Observation
from server.adversary.cases import observation
from server.adversary.linear import LinearAttack
from server.adversary.unet import UNetAttack

pytestmark = pytest.mark.usefixtures("one_thread")



def cifar_victims(data_dir: str, n: int) -> Partition:
    raw = datalib.load_split("cifar10", "test", data_dir)
    x, labels = datalib.normalized_tensors(raw, np.arange(n))
    return Partition(0, x, labels, 10, raw.spec, np.arange(n))


def test_linear_gradient_is_the_gradient_of_its_loss():
    """The hand-written, chunked gradient equals autograd's on the unchunked loss (images and vectors)."""
    g = torch.Generator().manual_seed(0)
    attack = LinearAttack(lambda_tv=0.3, lambda_2=0.2, chunk=3)
    weights = torch.rand(10, 2, generator=g)
    sources = torch.stack([torch.arange(10), torch.randperm(10, generator=g)], dim=1)
    for shape in ((3, 5, 6), (7,)):
        x, target = torch.randn(10, *shape, generator=g), torch.randn(10, *shape, generator=g)
        leaf = x.clone().requires_grad_()
        attack.loss(leaf, target, weights, sources).backward()
        torch.testing.assert_close(attack.gradient(x, target, weights, sources), leaf.grad, rtol=1e-5, atol=1e-8)


def test_linear_attack_recovers_cifar10_without_noise(data_dir):
    """r = 0 and W known: the system is exactly invertible, and the paper's Adam attack finds it."""
    part = cifar_victims(data_dir, 32)
    enc = singularized_mixup(part.x, part.one_hot(), 0.7, 0.0, generator(0, "test", "encode"))
    obs = observation(enc, 0.0, part.spec)
    recovered = LinearAttack(steps=1000).reconstruct(obs)
    snr = snr_db(part.x, recovered)
    assert snr.median() > 25 and snr.mean() > 25, snr
    assert recovered.min() >= obs.lo.min() - 1e-6 and recovered.max() <= obs.hi.max() + 1e-6


def test_linear_attack_snr_falls_as_tau_falls(data_dir):
    part = cifar_victims(data_dir, 48)
    means = []
    for tau in (1.0, 1e-2, 1e-6):
        settings = load_settings({"dataset": "cifar10", "tau": tau, "data-dir": data_dir})
        enc, cal = encode_partition(settings, part)
        means.append(float(snr_db(part.x, LinearAttack().reconstruct(observation(enc, cal.radius, part.spec))).mean()))
    assert means[0] > means[1] > means[2], means
    assert means[2] < 0  # the paper's regime: worse than guessing zero


def test_linear_attack_runs_on_feature_vectors():
    """No TV, no box: a 1280-d feature vector is just a vector."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 1280, generator=g)
    enc = singularized_mixup(x, torch.zeros(40, 2), 0.7, 0.0, g)
    obs = Observation(enc.x, 40, enc.weights, enc.sources, radius=0.0)
    assert snr_db(x, LinearAttack(steps=2000).reconstruct(obs)).median() > 25  # no box: Adam needs longer


def test_unet_learns_to_beat_the_mixed_input_on_public_data(data_dir):
    """tau = 1, tiny budget: on held-out public encodings the U-Net beats the encoding itself and
    the public mean (it learned something about the inverse, not just the average image)."""
    settings = load_settings({"dataset": "digits", "tau": 1.0, "data-dir": data_dir})
    spec = datalib.spec("digits")
    public = load_public_pool(settings, spec)
    held_out = public[-300:]
    train = public[:-300]
    radius = calibrate(data_statistics(train[:2000], generator(0, "stats")), 1.0, settings.alpha).radius
    attack = UNetAttack(train, encoder_params(settings, radius), width=8, epochs=3, train_size=1024)
    attack.fit(radius)
    assert attack.report["train-loss"][-1] < attack.report["train-loss"][0]
    enc = encode(held_out, torch.zeros(len(held_out), 1), encoder_params(settings, radius), generator(1, "held-out"))
    unet = float(snr_db(held_out, attack.reconstruct(observation(enc, radius, spec))).mean())
    mixed = float(snr_db(held_out, enc.x).mean())
    blind = float(snr_db(held_out, train.mean(dim=0).expand_as(held_out)).mean())
    assert unet > mixed + 1.0, (unet, mixed)
    assert unet > blind + 0.5, (unet, blind)


def test_an_interrupted_unet_fit_resumes_to_the_same_model(data_dir, tmp_path):
    """A fit stopped after one epoch and continued from its checkpoint ends where an uninterrupted fit ends
    (weights, losses and the learning curve), and a checkpoint of other settings is refused by name."""
    settings = load_settings({"dataset": "digits", "tau": 1.0, "data-dir": data_dir})
    public = load_public_pool(settings, datalib.spec("digits"))[:256]
    radius = calibrate(data_statistics(public, generator(0, "stats")), 1.0, settings.alpha).radius
    params = encoder_params(settings, radius)

    def unet(epochs: int) -> UNetAttack:
        return UNetAttack(public, params, width=4, epochs=epochs, train_size=256)

    def curve(epoch, attack):
        return {"public-snr": float(snr_db(public[:32], attack.predict(public[:32])).mean())}

    whole = unet(3).fit(radius, on_epoch=curve)
    checkpoint = tmp_path / "unet.pt"
    unet(1).fit(radius, checkpoint=checkpoint, on_epoch=curve)
    lines = []
    resumed = unet(3).fit(radius, checkpoint=checkpoint, on_epoch=curve, log=lines.append)
    assert resumed.report["resumed-at-epoch"] == 1
    assert lines[0].startswith("unet: resumed at epoch 1/3") and "epoch 3/3" in lines[-1]
    assert resumed.report["train-loss"] == whole.report["train-loss"]
    assert resumed.report["curve"] == whole.report["curve"] and len(whole.report["curve"]) == 3
    for name, value in whole.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    assert resumed.report["chosen-epoch"] == whole.report["chosen-epoch"]
    with pytest.raises(ValueError, match="radius"):
        unet(3).fit(radius * 2, checkpoint=checkpoint)
    with pytest.raises(ValueError, match="has 3 epochs, this fit asks for 2"):
        unet(2).fit(radius, checkpoint=checkpoint)


def test_the_unet_keeps_the_epoch_its_held_out_public_images_score_best(data_dir):
    """`holdout`: the epoch is chosen on public images kept out of training (the attacker's own data); `last`
    keeps the last epoch (the paper's protocol). The held-out images are never trained on."""
    settings = load_settings({"dataset": "digits", "tau": 1e-2, "data-dir": data_dir})
    public = load_public_pool(settings, datalib.spec("digits"))[:400]
    radius = calibrate(data_statistics(public, generator(0, "stats")), 1e-2, settings.alpha).radius
    params = encoder_params(settings, radius)
    chosen = UNetAttack(public, params, width=4, epochs=4, train_size=256).fit(radius)
    snr = chosen.report["holdout-snr"]
    assert len(snr) == 4 and chosen.report["chosen-epoch"] == 1 + snr.index(max(snr))
    assert chosen.report["holdout-size"] == 144 and chosen.report["train-size"] == 256  # the images after the 256
    train, held = chosen.public_split()
    assert not {tuple(r.flatten()[:16].tolist()) for r in train} & {tuple(r.flatten()[:16].tolist()) for r in held}
    (held_in, held_out) = chosen.training_pairs(radius)[1]
    assert abs(chosen.holdout_snr(held_in, held_out) - max(snr)) < 1e-4  # the model kept is the one chosen
    last = UNetAttack(public, params, width=4, epochs=4, train_size=256, select="last").fit(radius)
    assert last.report["chosen-epoch"] == 4 and last.report["holdout-snr"] == snr  # same fit, another choice
    small = UNetAttack(public[:260], params, width=4, epochs=1, train_size=256).fit(radius)
    assert small.report["train-size"] == 231 and small.report["holdout-size"] == 25  # no spare: a tenth held out


def test_unet_refuses_feature_vectors():
    with pytest.raises(ValueError, match="image-shaped"):
        UNetAttack(torch.zeros(10, 1280), encoder_params(load_settings({}), 1.0))


def test_snr_psnr_ssim_match_hand_computed_values():
    x = torch.tensor([[3.0, 4.0]])
    assert snr_db(x, torch.tensor([[3.0, 3.0]])).item() == pytest.approx(10 * math.log10(25 / 1))
    assert snr_db(x, torch.zeros(1, 2)).item() == pytest.approx(0.0, abs=1e-6)  # guessing zero: 0 dB
    a, b = torch.full((1, 1, 8, 8), 0.5), torch.full((1, 1, 8, 8), 0.6)
    assert psnr_db(a, b).item() == pytest.approx(10 * math.log10(1 / 0.01), rel=1e-4)  # MSE 0.01
    c1 = 0.01**2  # constant images: SSIM = (2 m_a m_b + C1) / (m_a^2 + m_b^2 + C1), the contrast terms are 1
    assert ssim(a, b).item() == pytest.approx((2 * 0.5 * 0.6 + c1) / (0.25 + 0.36 + c1), rel=1e-4)
    assert ssim(b, b).item() == pytest.approx(1.0, abs=1e-6)
    texture = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert ssim(texture, texture).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    noisy = (texture + 0.2 * torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    many, other = texture.repeat(5, 1, 1, 1), noisy.repeat(5, 1, 1, 1)
    assert torch.equal(ssim(many, other, batch=3), ssim(many, other))  # scored in batches, image by image
    # mean, std and the best-recovered index over images
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    x_hat = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])  # SNR 0, 10 log10 4, 0
    result, per_image = score(x, x_hat)
    assert per_image["snr"].tolist() == pytest.approx([0.0, 10 * math.log10(4), 0.0], abs=1e-5)
    assert result.best_index == 1 and result.snr_mean == pytest.approx(10 * math.log10(4) / 3, abs=1e-5)


def test_st_lpips_orders_real_images_and_forgives_a_one_pixel_shift(data_dir):
    """Shift-tolerant LPIPS (offline weights): 0 for the image itself, a one-pixel shift far closer than noise,
    noise closer than another image, a flat grey image the farthest; NaN where AlexNet's stem cannot run."""
    raw = datalib.load_split("cifar10", "test", data_dir)
    x = datalib.to_unit(raw.images[:12], raw.spec)
    noisy = (x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    same, shifted = st_lpips(x, x), st_lpips(x, x.roll(1, dims=-1))
    noise, other, grey = st_lpips(x, noisy), st_lpips(x, x.roll(1, dims=0)), st_lpips(x, torch.full_like(x, 0.5))
    assert same.abs().max() < 1e-6 and len(same) == 12
    assert shifted.mean() < 0.25 * noise.mean() and noise.mean() < other.mean() < grey.mean()
    assert torch.isnan(st_lpips(torch.rand(2, 1, 8, 8), torch.rand(2, 1, 8, 8))).all()  # digits' 8 px
    result, per_image = score(x, noisy, to_unit=lambda t: t)  # images: the score carries it, and its gain
    assert result.st_lpips_mean == pytest.approx(float(noise.mean()), rel=1e-5)
    report, _ = leakage(x, {"noisy": noisy}, torch.full_like(x[0], 0.5), to_unit=lambda t: t)
    assert report["attacks"]["noisy"]["gain"]["st_lpips"] == pytest.approx(float(grey.mean() - noise.mean()), rel=1e-4)
    assert score(x.flatten(1), noisy.flatten(1))[0].st_lpips_mean is None  # feature vectors: does not apply
    pairs = st_lpips_pairwise(torch.cat([x[:5], noisy[:3]]))  # every pair, the network run once per image
    both = torch.cat([x[:5], noisy[:3]])
    for i in range(8):
        assert torch.allclose(pairs[i], st_lpips(both, both[i : i + 1].expand_as(both)), atol=1e-5), i


def test_the_st_lpips_blind_guess_is_the_best_public_image_not_the_mean(data_dir):
    """A blurred mean image is far from every natural image in ST-LPIPS, so the gain in that metric is measured from
    a public image chosen among the public ones (their ST-LPIPS medoid, no victim seen): it is closer to the victims
    than the mean, the report names it, and the squared-error metrics keep the mean guess."""
    from server.adversary.analysis import Blind, st_lpips_medoid

    victims = datalib.to_unit(datalib.load_split("cifar10", "test", data_dir).images[:24],
                              datalib.load_split("cifar10", "test", data_dir).spec)
    public_raw = datalib.load_split("tiny-imagenet", "train", data_dir)
    public = datalib.to_unit(public_raw.images[:32], public_raw.spec)
    blind = Blind.of(public, to_unit=lambda t: t, pool=32)
    assert blind.perceptual is not None and any(torch.equal(blind.perceptual, p) for p in public)
    noisy = (victims + 0.1 * torch.randn(victims.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    mean_only, _ = leakage(victims, {"noisy": noisy}, blind.mean, to_unit=lambda t: t)
    both, _ = leakage(victims, {"noisy": noisy}, blind, to_unit=lambda t: t)
    assert both["trivial"]["st_lpips_mean"] < mean_only["trivial"]["st_lpips_mean"] - 0.1
    assert both["trivial"]["st_lpips_guess"] == "public medoid (ST-LPIPS)"
    assert mean_only["trivial"]["st_lpips_guess"] == "public mean"
    assert both["trivial"]["snr_mean"] == mean_only["trivial"]["snr_mean"]  # SNR's best blind guess is the mean
    gain = both["attacks"]["noisy"]["gain"]["st_lpips"]
    assert gain == pytest.approx(both["trivial"]["st_lpips_mean"] - both["attacks"]["noisy"]["score"]["st_lpips_mean"])
    assert st_lpips_medoid(public.flatten(1), to_unit=None) is None  # feature vectors: no perceptual guess
    assert st_lpips_medoid(public[:, :, :8, :8], to_unit=lambda t: t) is None  # under 28 px


def test_gain_over_the_trivial_guess_is_the_difference_in_db():
    x = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    public_mean = torch.tensor([1.0, 1.0])  # error 2 for both: SNR 10 log10(4/2)
    estimate = torch.tensor([[2.0, 1.0], [1.0, 2.0]])  # error 1: SNR 10 log10 4
    report, _ = leakage(x, {"guess": estimate}, public_mean)
    assert report["trivial"]["snr_mean"] == pytest.approx(10 * math.log10(2), abs=1e-5)
    assert report["attacks"]["guess"]["gain"]["snr_db"] == pytest.approx(10 * math.log10(2), abs=1e-5)
    report, _ = leakage(x, {"guess": estimate}, None)  # no public data: no gain, never a made-up one
    assert "gain" not in report["attacks"]["guess"] and "trivial" not in report


def test_theorem41_T_is_the_dense_inverse_and_reported_beside_the_error():
    g = torch.Generator().manual_seed(2)
    n = 9
    w1 = 0.3 + 0.4 * torch.rand(n, generator=g, dtype=torch.float64)
    weights = torch.stack([w1, 1 - w1], dim=1)
    perm = torch.randperm(n, generator=g)
    W = torch.diag(weights[:, 0]).index_put_((torch.arange(n), perm), weights[:, 1], accumulate=True)
    W_inv = torch.linalg.inv(W)
    dense = (W_inv**2 * weights[:, 1] ** 2).sum(dim=1)
    torch.testing.assert_close(theorem41_T(weights, perm), dense)
    x, x_hat = torch.ones(n, 4), torch.zeros(n, 4)
    report = theorem41(x, x_hat, weights, perm, radius=2.0)
    assert report["bound-median"] == pytest.approx(float((4 * dense).median()))
    assert report["error-mean"] == pytest.approx(4.0)
