"""The strongest attacker's solve and the averaging attack, on small real slices.

Scored with per-image SNR (dB) in the space the encoder mixes in, as the paper scores attacks,
next to the trivial guess's SNR (the public mean sample, as server/adversary/analysis.py)."""

import numpy as np
import pytest
import torch

from fedsmix import data
from fedsmix.config import load_settings
from fedsmix.encoders import EncoderParams, calibrate, data_statistics, encode
from fedsmix.metrics import snr_db
from fedsmix.space import load_public_pool
from server.adversary import Observation
from server.adversary.abs_solve import AbsSolve, recover_signs
from server.adversary.averaging import Averaging
from server.adversary.mixing import flat_bounds, mixing_system

pytestmark = pytest.mark.usefixtures("one_thread")



def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def mnist(data_dir):
    raw = data.load_split("mnist", "train", data_dir)
    x, y = data.normalized_tensors(raw, np.arange(300))
    lo, hi = data.valid_range(raw.spec)
    public = load_public_pool(load_settings({"data-dir": data_dir}), raw.spec)
    return x, data.one_hot(y, 10), lo[0], hi[0], public, raw.spec


def observe(x, y, name, lo, hi, public=None, T=1, k=4, radius=0.0, seed=0):
    enc = encode(x, y, EncoderParams(name=name, k=k, radius=radius, encodings_per_sample=T), gen(seed), public=public)
    obs = Observation(
        x_tilde=enc.x,
        n_private=len(x),
        weights=enc.weights,
        sources=enc.sources,
        radius=radius or None,
        public=public if enc.public_sources is not None else None,
        public_sources=enc.public_sources,
        lo=lo,
        hi=hi,
        extras={"masked": enc.signs is not None, "prior_mean": public.mean(dim=0) if public is not None else None},
    )
    return obs, enc


def mean_snr(x, x_hat):
    return float(snr_db(x, x_hat).mean())


@pytest.mark.parametrize("k", [2, 4])
def test_abs_solve_inverts_plain_mixup_exactly(mnist, k):
    x, y, lo, hi, _, _ = mnist
    obs, _ = observe(x, y, "mixup", lo, hi, k=k)
    assert mean_snr(x, AbsSolve().reconstruct(obs)) > 50  # no noise, known W: exact up to the solver


def test_abs_solve_is_exact_when_instahide_mixes_nonnegative_pixels(mnist):
    """In [0, 1] every mixture is >= 0, so |x~| = A x: the sign mask hides nothing."""
    x, y, _, _, _, spec = mnist
    unit = data.denormalize(x, spec)
    obs, _ = observe(unit, y, "instahide-inside", torch.zeros(1, 1, 1), torch.ones(1, 1, 1))
    assert mean_snr(unit, AbsSolve().reconstruct(obs)) > 40


def test_range_forced_signs_are_right_and_true_signs_make_the_solve_exact(mnist):
    """Signs forced by feasibility are right by construction; the black-atom rule can be fooled only by
    a mixture that lands within float32 precision of |lo| from the bright side."""
    x, y, lo, hi, public, _ = mnist
    obs, enc = observe(x, y, "instahide-inside", lo, hi)
    system = mixing_system(obs)
    d = x[0].numel()
    lo_f, hi_f = flat_bounds(obs, d)
    magnitude = obs.x_tilde.reshape(len(obs.x_tilde), -1).double().abs()
    signs, determined = recover_signs(system, magnitude, lo_f, hi_f, torch.ones_like(magnitude))
    truth = enc.signs.reshape(len(enc.x), -1).double() * torch.sign(obs.x_tilde.reshape(len(obs.x_tilde), -1).double())
    nonzero = magnitude > 1e-3
    assert float(determined.double().mean()) > 0.5  # MNIST's range fixes most signs (bright mixtures, black atoms)
    wrong = (signs != truth) & determined & nonzero
    assert int(wrong.sum()) <= 1e-5 * int(determined.sum())
    # with every sign right the |x~| problem is the linear one: exact
    oracle = Observation(**{**obs.__dict__, "x_tilde": (enc.x * enc.signs), "extras": {"masked": False}})
    assert mean_snr(x, AbsSolve().reconstruct(oracle)) > 50


def test_abs_solve_recovers_centred_instahide_on_mnist(mnist):
    """Centred pixels: |x~| loses on which side of the mean each mixture lies. Recovered in the sense
    of a per-image SNR far above the trivial guess, the residual error being pixels whose sign the
    range could not force (the per-pixel sign ambiguity; |x_hat| vs |x| scores higher still)."""
    x, y, lo, hi, public, _ = mnist
    trivial = mean_snr(x, public.mean(dim=0, keepdim=True).expand_as(x))
    obs, _ = observe(x, y, "instahide-inside", lo, hi)
    inside = AbsSolve().reconstruct(obs)
    assert mean_snr(x, inside) > trivial + 10 and mean_snr(x, inside) > 8
    assert mean_snr(x.abs(), inside.abs()) >= mean_snr(x, inside)
    obs, _ = observe(x, y, "instahide-cross", lo, hi, public=public)
    assert mean_snr(x, AbsSolve().reconstruct(obs)) > 20  # known public images break the sign symmetry


@pytest.mark.parametrize("name", ["mixup", "instahide-inside"])
def test_averaging_improves_with_encodings_per_sample(mnist, name):
    x, y, lo, hi, public, _ = mnist
    scores = []
    for T in (1, 4, 16):
        obs, _ = observe(x, y, name, lo, hi, T=T, k=2 if name == "mixup" else 4)
        obs.extras["prior_mean"] = public.mean(dim=0)
        scores.append(mean_snr(x, Averaging().reconstruct(obs)))
    assert scores[0] > 3 and scores[1] > scores[0] + 2 and scores[2] > scores[1] + 2


def test_averaging_against_singularized_mixup_pays_for_reencoding_only_at_weak_noise(mnist):
    x, y, lo, hi, public, _ = mnist
    stats = data_statistics(x, gen())

    def averaged(tau, T):
        radius = calibrate(stats, tau, 0.7).radius
        obs, _ = observe(x, y, "singularized", lo, hi, T=T, radius=radius)
        obs.extras["prior_mean"] = public.mean(dim=0)
        return mean_snr(x, Averaging().reconstruct(obs))

    assert averaged(1e-2, 16) > averaged(1e-2, 1) + 0.3  # re-encoding at tau = 1e-2 leaks more
    prior = mean_snr(x, public.mean(dim=0, keepdim=True).expand_as(x))
    assert abs(averaged(1e-6, 16) - prior) < 0.2  # at tau = 1e-6 the average is noise: back to the prior
