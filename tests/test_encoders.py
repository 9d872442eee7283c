import math

import numpy as np
import pytest
import torch

from fedsmix import data
from fedsmix.config import load_settings
from fedsmix.encoders import (
    calibrate,
    data_statistics,
    empirical_snr,
    noise_multiplier,
    sample_permutation,
    sample_weights,
    singularized_mixup,
    snr_bound,
)
from fedsmix.metrics import theorem41_T
from fedsmix.party import encode_partition, load_partition


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def mnist_slice(data_dir, n=600):
    raw = data.load_split("mnist", "train", data_dir)
    x, y = data.normalized_tensors(raw, np.arange(n))
    return x, data.one_hot(y, 10)


def test_weights_sum_to_one_and_respect_the_cap():
    w = sample_weights(20000, 0.7, gen())
    assert torch.allclose(w.sum(dim=1), torch.ones(20000), atol=1e-6)
    assert float(w.max()) <= 0.7 + 1e-7 and float(w.min()) >= 0.3 - 1e-7
    assert abs(float(w[:, 0].mean()) - 0.5) < 0.01  # symmetric: no component favoured


def test_derangement_has_no_fixed_points_and_uniform_may():
    for seed in range(50):
        perm = sample_permutation(7, gen(seed))
        assert not bool((perm == torch.arange(7)).any())
    fixed = sum(bool((sample_permutation(7, gen(s), derangement=False) == torch.arange(7)).any()) for s in range(200))
    assert fixed > 50  # a uniform permutation keeps a fixed point ~63% of the time


def test_encoding_is_algorithm_1(data_dir):
    x, y = mnist_slice(data_dir)
    enc = singularized_mixup(x, y, alpha=0.7, radius=123.0, generator=gen(), keep_noise=True)
    norms = enc.noise.reshape(len(x), -1).norm(dim=1)
    assert torch.allclose(norms, torch.full_like(norms, 123.0), rtol=1e-4)
    w1, w2 = enc.weights[:, 0].view(-1, 1, 1, 1), enc.weights[:, 1].view(-1, 1, 1, 1)
    partner = enc.sources[:, 1]
    assert torch.allclose(enc.x, w1 * x + w2 * (x[partner] + enc.noise), atol=1e-4)
    expected_y = enc.weights[:, :1] * y + enc.weights[:, 1:] * y[partner]
    assert torch.allclose(enc.y, expected_y, atol=1e-6)
    assert torch.allclose(enc.y.sum(dim=1), torch.ones(len(y)), atol=1e-6)
    lean = singularized_mixup(x, y, alpha=0.7, radius=123.0, generator=gen())  # what a party uploads
    assert lean.noise is None and torch.equal(lean.x, enc.x)  # same encoding without keeping e


def test_works_on_feature_vectors():
    x = torch.randn(50, 1280)
    enc = singularized_mixup(x, data.one_hot(torch.arange(50) % 10, 10), 0.7, 5.0, gen(), keep_noise=True)
    assert enc.x.shape == (50, 1280)
    assert torch.allclose(enc.noise.norm(dim=1), torch.full((50,), 5.0), rtol=1e-4)


def test_same_seed_same_bits_different_seed_differs(data_dir):
    x, y = mnist_slice(data_dir, 200)
    a = singularized_mixup(x, y, 0.7, 10.0, gen(1))
    b = singularized_mixup(x, y, 0.7, 10.0, gen(1))
    c = singularized_mixup(x, y, 0.7, 10.0, gen(2))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, c.x)


def test_noise_multiplier_formula_and_zero_root():
    c, alpha, tau = 0.9, 0.7, 1e-4
    expected = math.sqrt((alpha**2 / (tau * (1 - alpha) ** 2) - 1) / (2 * c))
    assert noise_multiplier(tau, alpha, c) == pytest.approx(expected)
    assert snr_bound(alpha, c, expected) == pytest.approx(tau)
    assert noise_multiplier(100.0, alpha, c) == 0.0  # root negative: no noise needed


def test_theorem_mode_radius_is_m_f_times_D(data_dir):
    x, _ = mnist_slice(data_dir, 500)
    stats = data_statistics(x, gen())
    flat = x.reshape(len(x), -1).double()
    exact_D = torch.cdist(flat, flat).sum() / (len(x) * (len(x) - 1))
    assert stats.D == pytest.approx(float(exact_D), rel=0.02)
    cal = calibrate(stats, tau=1e-3, alpha=0.7)
    assert cal.radius == pytest.approx(cal.m_f * stats.D)
    assert 0 < stats.c <= 1.05


@pytest.mark.parametrize("tau", [1.0, 1e-2, 1e-6])
def test_measured_snr_is_below_the_theorem_bound_on_real_data(data_dir, tau):
    x, y = mnist_slice(data_dir, 1000)
    cal = calibrate(data_statistics(x, gen()), tau, 0.7)
    enc = singularized_mixup(x, y, 0.7, cal.radius, gen(3))
    measured = empirical_snr(x, enc)
    assert measured <= cal.snr_bound <= tau * 1.0001
    assert measured > 0


def test_party_encoding_replays_from_its_seed():
    settings = load_settings({"preset": "configs/quickstart.yaml"})
    part = load_partition(settings, 3, 10)
    a, cal_a = encode_partition(settings, part)
    b, cal_b = encode_partition(settings, load_partition(settings, 3, 10))
    assert torch.equal(a.x, b.x) and cal_a == cal_b
    other, _ = encode_partition(settings.replace(seed=1), load_partition(settings.replace(seed=1), 3, 10))
    assert not torch.equal(a.x[: len(other.x)], other.x[: len(a.x)])


def test_theorem41_T_matches_the_dense_inverse():
    n = 40
    w, perm = sample_weights(n, 0.7, gen(5)), sample_permutation(n, gen(6))
    W = torch.zeros(n, n, dtype=torch.float64)
    W[torch.arange(n), torch.arange(n)] = w[:, 0].double()
    W[torch.arange(n), perm] += w[:, 1].double()
    dense = (torch.linalg.inv(W) ** 2 * (w[:, 1].double() ** 2)[None, :]).sum(dim=1)
    assert torch.allclose(theorem41_T(w, perm), dense, rtol=1e-8)
