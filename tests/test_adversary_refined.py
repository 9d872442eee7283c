"""The refined attacker: the MMSE estimate with a network trained on the attacker's own public encodings."""

from __future__ import annotations

import pytest
import torch

from fedsmix.encoders import EncoderParams, encode
from fedsmix.metrics import snr_db
from fedsmix.seeding import generator
from server.adversary.base import Observation
from server.adversary.mmse import GaussianPrior, MMSEAttack, UploadCentredMMSE
from server.adversary.refined import RefinedCentredMMSE, RefinedMMSE, refiner

pytestmark = pytest.mark.usefixtures("one_thread")


def clusters(n: int, seed: int, d: int = 32, k: int = 6) -> torch.Tensor:
    """Samples near k fixed centres: data a single Gaussian describes badly (the centres are drawn from seed 0)."""
    centres = 3 * torch.randn(k, d, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    return centres[torch.randint(k, (n,), generator=g)] + 0.1 * torch.randn(n, d, generator=g)


def upload(x: torch.Tensor, radius: float, seed: int) -> Observation:
    enc = encode(x, torch.zeros(len(x), 1), EncoderParams(radius=radius), generator(seed, "victims"))
    return Observation(x_tilde=enc.x, n_private=len(x), weights=enc.weights, sources=enc.sources, radius=radius)


def test_the_refiner_keeps_the_sample_shape_for_images_and_vectors():
    for shape in ((3, 8, 8), (1, 28, 28), (40,)):
        stacked = torch.randn(5, 2 * shape[0], *shape[1:])
        assert refiner(stacked, width=4)(stacked).shape == (5, *shape)


def test_where_the_data_is_not_gaussian_the_refined_attack_beats_the_mmse_estimate():
    """Victims from the public data's distribution (clustered, not Gaussian): the network learns what the
    Gaussian prior cannot, on the attacker's own encodings only, and beats the MMSE estimate it starts from."""
    public, victims, radius = clusters(3000, seed=1), clusters(300, seed=2), 20.0
    prior = GaussianPrior.fit(public, rank=32)
    attack = RefinedMMSE(public, EncoderParams(), prior, width=4, epochs=6, train_size=3000, lr=3e-3)
    attack.fit(radius)
    obs = upload(victims, radius, seed=3)
    refined = float(snr_db(victims, attack.reconstruct(obs)).mean())
    mmse = float(snr_db(victims, MMSEAttack(prior).reconstruct(obs)).mean())
    assert attack.report["train-loss"][-1] < attack.report["train-loss"][0]
    report = attack.report
    assert report["chosen-epoch"] >= 1 and report["initial-holdout-snr"] < max(report["holdout-snr"])
    assert refined > mmse + 1.0, (refined, mmse)


def test_where_the_victims_mean_is_not_the_publics_the_centred_refinement_errs_less():
    """Victims from the public clusters moved by a fixed offset (another data set's mean): `refined-centred` starts
    from the estimate centred on the upload's own mean and beats `refined`, which starts from the public mean; it
    also beats `mmse-centred`, the estimate it starts from. Both refiners are trained on the same public
    encodings alike."""
    public, radius = clusters(3000, seed=1), 60.0
    victims = clusters(400, seed=2) + torch.linspace(-2, 2, 32)
    prior = GaussianPrior.fit(public, rank=32)
    obs = upload(victims, radius, seed=3)
    snr = {}
    for attack in (RefinedMMSE(public, EncoderParams(), prior, width=4, epochs=4, train_size=3000, lr=3e-3),
                   RefinedCentredMMSE(public, EncoderParams(), prior, width=4, epochs=4, train_size=3000, lr=3e-3),
                   UploadCentredMMSE(prior)):
        if isinstance(attack, RefinedMMSE):
            attack.fit(radius)
        snr[attack.name] = float(snr_db(victims, attack.reconstruct(obs)).mean())
    assert snr["refined-centred"] > snr["refined"] + 1.0, snr
    assert snr["refined-centred"] > snr["mmse-centred"] + 1.0, snr


def test_the_refined_attack_needs_the_mixing_matrix():
    public = clusters(64, seed=1)
    attack = RefinedMMSE(public, EncoderParams(), GaussianPrior.fit(public, rank=8), width=2, epochs=1)
    attack.fit(1.0)
    obs = upload(public[:16], 1.0, seed=3)
    with pytest.raises(ValueError, match="refined: the threat model needs the mixing matrix"):
        attack.reconstruct(Observation(x_tilde=obs.x_tilde, n_private=16, radius=1.0))


def test_an_untrained_refiner_is_the_mmse_estimate():
    """The residual body's last layer starts at zero: before any step the refiner returns the estimate it reads."""
    for shape in ((3, 8, 8), (40,)):
        stacked = 1e3 * torch.randn(6, 2 * shape[0], *shape[1:])
        assert torch.equal(refiner(stacked, width=4)(stacked), stacked[:, shape[0]:])


def test_the_refiners_fit_does_not_depend_on_the_datas_units():
    """Pixels near 1, features under noise of norm in the thousands: the refiner standardises what it reads and
    scales its correction by the estimates' spread, so the same data in units 100 times larger (radius too) is fit
    alike: one epoch's loss 100^2 times larger to 0.1 %, the held-out SNR the same to 0.05 dB (an unscaled
    network's fit depended on the units: 0.7 % and 0.12 dB on this data)."""
    fits = []
    for unit in (1.0, 100.0):
        public, radius = unit * clusters(2000, seed=1), unit * 20.0
        attack = RefinedMMSE(public, EncoderParams(), GaussianPrior.fit(public, rank=32), width=4, epochs=1,
                             train_size=2000, lr=3e-3)
        attack.fit(radius)
        fits.append((attack.report["train-loss"][0] / unit**2, attack.report["holdout-snr"][0]))
    (loss, snr), (scaled_loss, scaled_snr) = fits
    assert abs(scaled_loss / loss - 1) < 1e-3 and abs(scaled_snr - snr) < 0.05, fits
