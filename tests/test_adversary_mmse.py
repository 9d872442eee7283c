"""The linear-Gaussian MMSE attacker: its analytic error, and what it does on real images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsmix import data as datalib
from fedsmix.config import load_settings
from fedsmix.encoders import mixup, singularized_mixup
from fedsmix.metrics import snr_db, theorem41_T
from fedsmix.party import Partition, encode_partition
from fedsmix.space import load_public_pool
from server.adversary.base import Observation
from server.adversary.cases import observation
from server.adversary.linear import LinearAttack
from server.adversary.mixing import upload_mean
from server.adversary.mmse import GaussianPrior, MMSEAttack, UploadCentredMMSE

pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture(scope="module")
def prior() -> GaussianPrior:
    """An anisotropic prior on 4x6 'images': rank 5 plus an isotropic remainder."""
    g = torch.Generator().manual_seed(0)
    scales = torch.linspace(0.2, 2.0, 24).view(1, 4, 6)
    mixing = torch.randn(24, 24, generator=g) / 5 + torch.eye(24)
    public = (torch.randn(3000, 24, generator=g) @ mixing).view(-1, 1, 4, 6) * scales + 0.5
    return GaussianPrior.fit(public, rank=5)


@pytest.mark.parametrize("radius", [0.0, 1.0, 5.0, 30.0])
def test_mmse_error_matches_its_analytic_posterior_error_on_data_from_the_prior(prior, radius):
    """Data drawn from the prior, encoded by Algorithm 1 (sphere noise, not Gaussian: the estimator
    is linear, so only second moments matter). Twenty independent parties; the mean squared error
    must match the analytic posterior error within 4 standard errors, and never exceed the
    trivial guess (the prior mean)."""
    g = torch.Generator().manual_seed(1)
    attack = MMSEAttack(prior)
    measured, analytic, trivial = [], [], []
    for _ in range(20):
        x = prior.sample(150, g).float()
        enc = singularized_mixup(x, torch.zeros(150, 2), 0.7, radius, g)
        obs = Observation(enc.x, 150, enc.weights, enc.sources, radius)
        flat = x.reshape(150, -1).double()
        measured.append(float((flat - attack.reconstruct(obs).reshape(150, -1).double()).pow(2).sum(1).mean()))
        analytic.append(float(attack.posterior_error(obs).mean()))
        trivial.append(float((flat - prior.mean).pow(2).sum(1).mean()))
    measured, analytic, trivial = map(np.asarray, (measured, analytic, trivial))
    standard_error = (measured - analytic).std(ddof=1) / np.sqrt(len(measured))
    assert abs((measured - analytic).mean()) <= 4 * standard_error + 1e-9, (measured.mean(), analytic.mean())
    assert (analytic <= prior.total_variance() + 1e-9).all()  # per sample, by construction
    assert measured.mean() <= trivial.mean()
    if radius == 0:
        assert measured.max() < 1e-6 * prior.total_variance()  # no noise: W^-1 X~, up to float32 rounding


def test_the_upload_centred_prior_gains_where_public_and_private_means_differ(prior):
    """Private samples drawn around another mean than the public prior's: centred on the upload, the MMSE attack
    errs less at every radius (most where the noise is large and the mean is all it can recover), and where the
    means agree it errs no more than the public-centred attack (the shrinkage keeps the public mean)."""
    g = torch.Generator().manual_seed(2)
    shift = torch.linspace(-3, 3, 24).view(1, 1, 4, 6)
    for radius in (1.0, 30.0, 300.0, 1e5):
        errors = {}
        for offset in (shift, 0 * shift):
            x = (prior.sample(400, g) + offset).float()
            enc = singularized_mixup(x, torch.zeros(400, 2), 0.7, radius, g)
            obs = Observation(enc.x, 400, enc.weights, enc.sources, radius)
            flat = x.reshape(400, -1).double()
            for attack in (MMSEAttack(prior), UploadCentredMMSE(prior)):
                estimate = attack.reconstruct(obs).reshape(400, -1).double()
                errors[attack.name, bool(offset.abs().sum() > 0)] = float((flat - estimate).pow(2).sum(1).mean())
        if radius > 1e4:  # the upload's mean is noise: keep the public one rather than shrink noise into it
            assert errors["mmse-centred", True] <= 1.001 * errors["mmse", True], (radius, errors)
        else:
            factor = 0.8 if radius >= 30 else 1.0
            assert errors["mmse-centred", True] < factor * errors["mmse", True], (radius, errors)
        assert errors["mmse-centred", False] <= 1.02 * errors["mmse", False], (radius, errors)


def test_the_upload_mean_keeps_the_public_mean_where_the_uploads_show_only_noise():
    """784 coordinates, 1,000 rows whose noise buries a private mean 0.01 from the public one: a mean shrunk
    whenever the noise happens to look like signal errs more than the public mean; kept unless the evidence clears
    the noise's own spread, it errs no more. Where the private mean stands out it is still read off."""
    g = torch.Generator().manual_seed(3)
    d, n = 784, 1000
    prior, mass, noise2 = torch.zeros(1, d, dtype=torch.float64), torch.ones(n, 1, dtype=torch.float64), \
        torch.full((n,), 1e4, dtype=torch.float64)
    for offset, most in ((0.01, d * 0.01**2), (0.3, 0.5 * d * 0.3**2)):  # the public mean's error; half of it
        errors = [float((upload_mean(torch.randn(n, d, generator=g, dtype=torch.float64) * (1e4 / d) ** 0.5 + offset,
                                     mass, noise2, prior) - offset).pow(2).sum()) for _ in range(40)]
        assert np.mean(errors) <= most + 1e-12, (offset, np.mean(errors))


def test_along_the_priors_directions_a_buried_mean_shift_is_read_off():
    """784 coordinates, 1,000 rows, a private mean shifted from the public one along 4 of 64 orthonormal directions,
    with noise that buries the shift when it is judged over all 784 coordinates (the whole-shift rule keeps the
    public mean). Judged coordinate by coordinate along the directions, the shift is mostly read off: under a
    quarter of the public mean's error. Where there is no shift, the basis rule's false keeps cost under a
    twentieth of that shift's energy."""
    g = torch.Generator().manual_seed(4)
    d, n, k = 784, 1000, 64
    basis = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0]
    shift = basis[:, :4] @ torch.full((4,), 0.7, dtype=torch.float64)
    energy = float(shift.pow(2).sum())
    prior, mass = torch.zeros(1, d, dtype=torch.float64), torch.ones(n, 1, dtype=torch.float64)
    noise2 = torch.full((n,), 2e4, dtype=torch.float64)
    for offset in (shift, 0 * shift):
        errors = {"whole": [], "basis": []}
        for _ in range(20):
            rows = torch.randn(n, d, generator=g, dtype=torch.float64) * (2e4 / d) ** 0.5 + offset
            for rule, b in (("whole", None), ("basis", basis)):
                errors[rule].append(float((upload_mean(rows, mass, noise2, prior, basis=b)[0] - offset).pow(2).sum()))
        whole, along = np.mean(errors["whole"]), np.mean(errors["basis"])
        if offset.abs().sum() > 0:
            assert whole >= 0.95 * energy and along < 0.25 * whole, (whole, along)
        else:
            assert along < 0.05 * energy, (whole, along)


def test_mmse_noise_covariance_is_theorem41s():
    """Per cycle, Cov(W^-1 E) has diagonal (r^2 / d) T_i; r^2 T_i bounds every prior-free estimator."""
    g = torch.Generator().manual_seed(3)
    n, d, r = 30, 10, 2.0
    prior = GaussianPrior(torch.zeros(d, dtype=torch.float64), torch.zeros(d, 0, dtype=torch.float64),
                          torch.zeros(0, dtype=torch.float64), 1e12, (d,))  # a flat prior: no prior at all
    x = torch.randn(n, d, generator=g)
    enc = singularized_mixup(x, torch.zeros(n, 2), 0.7, r, g)
    error = MMSEAttack(prior).posterior_error(Observation(enc.x, n, enc.weights, enc.sources, r))
    torch.testing.assert_close(error, r**2 * theorem41_T(enc.weights, enc.sources[:, 1]), rtol=1e-4, atol=1e-9)


def test_mmse_refuses_other_mixing_structures():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(20, 8, generator=g)
    enc = mixup(x, torch.zeros(20, 2), 4, 0.65, g)
    prior = GaussianPrior.fit(torch.randn(50, 8, generator=g), rank=2)
    with pytest.raises(ValueError, match="mmse: needs singularized mixup"):
        MMSEAttack(prior).reconstruct(Observation(enc.x, 20, enc.weights, enc.sources, 0.0))
    enc = singularized_mixup(x, torch.zeros(20, 2), 0.7, 1.0, g)
    with pytest.raises(ValueError, match="prior has 9 dimensions, the samples 8"):
        MMSEAttack(GaussianPrior.fit(torch.randn(50, 9, generator=g))).reconstruct(
            Observation(enc.x, 20, enc.weights, enc.sources, 1.0)
        )


def test_mmse_on_mnist_with_a_tinyimagenet_prior(data_dir):
    """Real victims, public prior: clear gain at tau = 1, the trivial guess's score when the noise
    drowns everything, and never behind the paper's attack."""
    raw = datalib.load_split("mnist", "test", data_dir)
    x, labels = datalib.normalized_tensors(raw, np.arange(120))
    part = Partition(0, x, labels, 10, raw.spec, np.arange(120))
    settings = load_settings({"dataset": "mnist", "data-dir": data_dir})
    public = load_public_pool(settings, raw.spec)
    attack = MMSEAttack(GaussianPrior.fit(public, rank=64))
    trivial = float(snr_db(x, public.mean(dim=0).expand_as(x)).mean())
    gains = {}
    for tau in (1.0, 1e-2, 1e-6):
        enc, cal = encode_partition(settings.replace(tau=tau), part)
        obs = observation(enc, cal.radius, raw.spec)
        mmse = float(snr_db(x, attack.reconstruct(obs)).mean())
        linear = float(snr_db(x, LinearAttack().reconstruct(obs)).mean())
        gains[tau] = mmse - trivial
        assert mmse > linear, (tau, mmse, linear)
    assert gains[1.0] > 2.0 and gains[1.0] > gains[1e-2] > gains[1e-6]
    assert abs(gains[1e-6]) < 0.05, gains
