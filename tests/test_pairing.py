"""Recovering singularized mixup's pairing from the upload alone (server/adversary/pairing.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from fedsmix.config import SettingsError, load_settings
from fedsmix.party import calibrate_party, encode_partition
from server.adversary.cases import observation, public_samples, upload_case, valid_bounds
from server.adversary.mmse import GaussianPrior
from server.adversary.pairing import (
    InstaHidePairing,
    PairingAttack,
    instahide_accuracy,
    instahide_neighbours,
    label_view,
)
from server.adversary.sweep import run_sweep, victim_partition


@pytest.fixture(scope="module")
def mnist(data_dir):
    settings = load_settings({"dataset": "mnist", "data-dir": data_dir, "mixing-weights": "fixed"})
    part = victim_partition(settings, 200)
    prior = GaussianPrior.fit(public_samples(settings, part.spec)[:3000], rank=256)
    return settings, part, prior


def encoded(settings, part, tau=None, radius=None):
    settings = settings.replace(**({"tau": tau} if tau else {"radius_mode": "fixed", "radius": radius}))
    calibration = calibrate_party(settings, part)
    enc, _ = encode_partition(settings, part, calibration)
    return enc, calibration


def test_labels_reveal_classes_and_weights():
    y = torch.tensor([[0.7, 0.3, 0.0], [0.0, 1.0, 0.0], [0.0, 0.45, 0.55]])
    view = label_view(y)
    assert view.classes.tolist() == [[0, 1], [1, 1], [2, 1]] and view.single.tolist() == [False, True, False]
    assert torch.allclose(view.masses, torch.tensor([[0.7, 0.3], [1.0, 0.0], [0.55, 0.45]], dtype=torch.float64))


def test_pairing_is_recovered_perfectly_without_noise(mnist, one_thread):
    """A small case at r = 0: every partner and every weight. (On 60 images 95 %: with fixed weights the
    Gaussian score cannot orient a run of same-class pairs; docs/attacks.md.)"""
    settings, part, prior = mnist
    small = part.subset(torch.arange(24))
    enc, calibration = encoded(settings, small, radius=1e-9)
    lo, hi = valid_bounds(settings, small.spec)
    attack = PairingAttack(prior, settings.alpha, fixed_weights=True, two_cycles=True)
    pairing = attack.recover(enc.x, enc.y, calibration.radius, lo, hi)
    assert pairing.accuracy(enc.sources[:, 1]) == 1.0
    assert torch.equal(pairing.weights, enc.weights)
    assert 0.05 < pairing.chance() < 0.5  # label consistency alone leaves a few candidates each


def test_pairing_is_at_chance_on_shuffled_uploads(mnist, one_thread):
    """Rows of x~ shuffled against their labels and the truth: the images say nothing about pi any more."""
    settings, part, prior = mnist
    enc, calibration = encoded(settings, part, tau=1.0)
    lo, hi = valid_bounds(settings, part.spec)
    attack = PairingAttack(prior, settings.alpha, fixed_weights=True)
    real = attack.recover(enc.x, enc.y, calibration.radius, lo, hi).accuracy(enc.sources[:, 1])
    hits, chance = [], []
    for seed in range(3):
        shuffled = enc.x[torch.randperm(len(enc), generator=torch.Generator().manual_seed(seed))]
        pairing = attack.recover(shuffled, enc.y, calibration.radius, lo, hi)
        hits.append(pairing.accuracy(enc.sources[:, 1]))
        chance.append(pairing.chance())
    mean_hits, mean_chance = sum(hits) / 3, sum(chance) / 3
    assert 0.02 < mean_chance < 0.2  # label consistency alone: about one class in ten
    assert mean_hits < 2 * mean_chance + 0.02 and real > 0.3 > 5 * mean_hits


def test_recovered_pairing_feeds_the_attacks(mnist, one_thread):
    settings, part, prior = mnist
    st = settings.replace(attack_pairing="recovered", tau=1.0)
    enc, calibration = encoded(st, part, tau=1.0)
    attack = PairingAttack(prior, st.alpha, fixed_weights=True)
    case = upload_case(st, part, enc, calibration, torch.arange(len(part.x)), bounds=valid_bounds(st, part.spec),
                       pairing=attack)
    obs = case.observation
    hit = (obs.sources[:, 1] == enc.sources[:, 1]).double().mean()
    assert obs.extras["pairing-accuracy"] == pytest.approx(float(hit)) and 0.3 < float(hit) < 1.0
    assert torch.equal(obs.sources[:, 0], torch.arange(len(part.x))) and torch.equal(case.perm, enc.sources[:, 1])
    with pytest.raises(ValueError, match="needs a pairing attack"):
        upload_case(st, part, enc, calibration, torch.arange(4))
    with pytest.raises(SettingsError, match="attack-pairing 'recovered'"):
        load_settings({"attack-pairing": "recovered", "encoder": "mixup"})


def test_sweep_with_recovered_pairing_names_its_threat_model(data_dir, tmp_path, one_thread):
    settings = load_settings({"dataset": "digits", "attack-pairing": "recovered", "mixing-weights": "fixed",
                              "data-dir": data_dir})
    result = run_sweep(settings, [1.0, 1e-3], ["linear", "mmse"], 80, tmp_path, mmse_rank=32, log=lambda *_: None)
    assert result["pairing"] == "recovered" and "recovered pairing" in result["threat-model"]
    first, last = result["taus"]
    assert first["pairing"]["pairing-accuracy"] > 1.5 * first["pairing"]["pairing-chance"]  # 8x8 digits: little to see
    assert last["pairing"]["pairing-accuracy"] < first["pairing"]["pairing-accuracy"]
    table = (tmp_path / "digits-fixed-pairing-recovered-sweep.md").read_text()
    assert "Threat model: recovered pairing" in table and "pairing recovered" in table
    saved = json.loads((tmp_path / "digits-fixed-pairing-recovered-sweep.json").read_text())
    assert saved["taus"][0]["pairing"] == first["pairing"]


def test_instahide_neighbours_find_shared_images_without_masks_mattering(data_dir, one_thread):
    """With T = 4 encodings per sample, |x~| of encodings sharing a private image correlate."""
    from fedsmix.encoders import EncoderParams, encode

    settings = load_settings({"dataset": "cifar10", "data-dir": data_dir})
    x = victim_partition(settings, 60).x
    enc = encode(x, torch.zeros(60, 1), EncoderParams("instahide-inside", k=2, cap=0.65, encodings_per_sample=4),
                 torch.Generator().manual_seed(0))
    hit, chance = instahide_accuracy(instahide_neighbours(enc.x), enc.sources)
    assert hit > 4 * chance and chance < 0.1
    shuffled = enc.x[torch.randperm(len(enc), generator=torch.Generator().manual_seed(1))]
    miss, _ = instahide_accuracy(instahide_neighbours(shuffled), enc.sources)
    assert miss < hit / 2


# ------------------------------------------------------------------ InstaHide: leakage without the oracle
def instahide_upload(data_dir, n=40, dataset="mnist", **encoder):
    """An InstaHide upload of n test images (inside-dataset unless `encoder` says otherwise; on MNIST the range
    fixes the signs the mask hides, so the oracle's averaging leaks)."""
    from fedsmix.encoders import EncoderParams, encode

    settings = load_settings({"dataset": dataset, "data-dir": data_dir})
    part = victim_partition(settings, n)
    params = EncoderParams(**{"name": "instahide-inside", **encoder})
    enc = encode(part.x, part.one_hot(), params, torch.Generator().manual_seed(0))
    public_mean = public_samples(settings, part.spec)[:2000].mean(dim=0)
    obs = observation(enc, None, bounds=valid_bounds(settings, part.spec), prior_mean=public_mean)
    return part, params, enc, obs, public_mean


def averaging_gain(part, obs, public_mean, rows=None):
    from server.adversary.analysis import leakage
    from server.adversary.averaging import Averaging

    n = len(part.x)
    estimate = Averaging().reconstruct(obs)[:n if rows is None else rows]
    report, _ = leakage(part.x, {"averaging": estimate}, public_mean)
    return report["attacks"]["averaging"]["gain"]["snr_db"], estimate


def test_instahide_membership_with_exact_repeats_leaks_as_the_oracle(data_dir, one_thread):
    """k = 1, T = 4: every encoding is a sign-masked private image repeated 4 times, so |x~| of the repeats are
    equal, the neighbours perfect, the weights read off the labels exact: the recovered membership's averaging
    equals the oracle's. 40 images: the ranking removes fewer common directions than there are distinct images
    (removing all 40 left rounding noise to rank, and each CPU's kernels ranked it differently)."""
    part, params, enc, obs, public_mean = instahide_upload(data_dir, k=1, cap=1.0, encodings_per_sample=4)
    recovered = InstaHidePairing(params).observation(obs, enc.y, truth=enc.sources)
    assert recovered.extras["membership-precision"] == 1.0 and recovered.extras["membership-recall"] == 1.0
    oracle_gain, oracle_x = averaging_gain(part, obs, public_mean)
    gain, x = averaging_gain(part, recovered, public_mean)
    assert oracle_gain > 3.0 and gain == pytest.approx(oracle_gain, abs=1e-3)
    assert torch.allclose(x, oracle_x, atol=1e-4)


def test_instahide_membership_weights_are_the_oracles_where_labels_tell(data_dir, one_thread):
    """k = 2 inside-dataset: where an encoding's two images differ in class, a right member's weight is exact."""
    part, params, enc, obs, _ = instahide_upload(data_dir, n=60, k=2, cap=0.65, encodings_per_sample=4)
    found = InstaHidePairing(params).membership(enc.x, enc.y)
    lead = enc.sources[:, 0]
    members = found.members.clamp_min(0)
    slot = enc.sources[members] == lead[:, None, None]  # (m, a, 2): where c's lead sits in each member
    right = slot.any(dim=2) & (found.members >= 0)
    distinct = (enc.y > 1e-4).sum(dim=1)[members] == 2
    truth = (enc.weights[members] * slot).sum(dim=2).double()
    named = found.lead_class == part.labels[lead]  # c's label has two classes: which is the lead's is a guess
    check = right & distinct & named.unsqueeze(1)
    assert check.sum() > 50 and torch.allclose(found.weights[check], truth[check], atol=1e-5)


def test_instahide_membership_on_noise_leaks_nothing(data_dir, one_thread):
    """Every row of x~ replaced by noise (each pixel's values permuted across the rows): the recovered
    membership's averaging learns no more than the oracle's does from the same noise (the private mean, which
    beats the public mean: the trivial guess), while on the real upload it leaks more."""
    part, params, enc, obs, public_mean = instahide_upload(data_dir, n=60, k=2, cap=0.65, encodings_per_sample=4)
    recovery = InstaHidePairing(params)
    real, _ = averaging_gain(part, recovery.observation(obs, enc.y), public_mean)
    flat = enc.x.reshape(len(enc), -1)
    g = torch.Generator().manual_seed(0)
    noise = torch.stack([col[torch.randperm(len(col), generator=g)] for col in flat.T], dim=1)
    noisy = replace(obs, x_tilde=noise.reshape(enc.x.shape))
    gain, _ = averaging_gain(part, recovery.observation(noisy, enc.y), public_mean)
    mean_only, _ = averaging_gain(part, noisy, public_mean)  # the oracle on the noise: the private mean, no more
    assert gain < mean_only + 0.5 and real > gain + 1.0


def test_instahide_recovered_path_never_reads_the_oracle(data_dir, one_thread):
    """attack-pairing recovered through upload_case (cases.py): the recovered observation, and the averaging on it,
    are the same when the oracle's sources, weights and public slots are garbage; abs-solve declines it."""
    from server.adversary.abs_solve import AbsSolve
    from server.adversary.pairing import build_pairing

    settings = load_settings({"dataset": "mnist", "data-dir": data_dir, "encoder": "instahide-cross",
                              "encodings-per-sample": 4, "attack-pairing": "recovered"})
    part = victim_partition(settings, 40)
    enc, _ = encode_partition(settings, part)
    pairing = build_pairing(settings, public_samples(settings, part.spec))
    assert isinstance(pairing, InstaHidePairing) and pairing.appearances == 8  # 2 private slots x T = 4
    rows = torch.arange(len(part.x))
    case = upload_case(settings, part, enc, None, rows, pairing=pairing)
    g = torch.Generator().manual_seed(3)
    garbage = replace(enc, sources=torch.randint(-1, len(part.x), enc.sources.shape, generator=g),
                      weights=torch.rand(enc.weights.shape, generator=g),
                      public_sources=torch.randint(0, 5, enc.sources.shape, generator=g))
    other = upload_case(settings, part, garbage, None, rows, pairing=pairing)
    a, b = case.observation, other.observation
    assert torch.equal(a.sources, b.sources) and torch.equal(a.weights, b.weights) and a.n_private == len(enc)
    from server.adversary.averaging import Averaging

    assert torch.equal(Averaging().reconstruct(a), Averaging().reconstruct(b))
    assert a.extras["pairing"] == "recovered" and 0 <= a.extras["pairing-accuracy"] <= 1
    with pytest.raises(ValueError, match="abs-solve needs the mixing matrix"):
        AbsSolve().reconstruct(a)
