"""Issue 17: recovering singularized mixup's pairing from the upload alone (server/adversary/pairing.py)."""

from __future__ import annotations

import json

import pytest
import torch

from fedsmix.config import SettingsError, load_settings
from fedsmix.party import calibrate_party, encode_partition
from server.adversary.cases import public_samples, upload_case, valid_bounds
from server.adversary.mmse import GaussianPrior
from server.adversary.pairing import PairingAttack, instahide_accuracy, instahide_neighbours, label_view
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
