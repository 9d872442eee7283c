"""Feature skew: every party's images through its own acquisition (fedsmix/acquisition.py), in pixels and features."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedsmix import data as datalib
from fedsmix.acquisition import KINDS, Acquisition, acquisition, party_acquisition, party_unit
from fedsmix.config import SettingsError, load_settings
from fedsmix.party import load_partition, pooled_data
from fedsmix.space import pixel_spec

QUICK = {"preset": "configs/quickstart.yaml"}


def test_each_party_draws_one_fixed_acquisition_from_the_seed():
    shape = (3, 32, 32)
    assert party_acquisition(0.0, KINDS, 0, 1, shape) is None  # off: the images as stored
    first = [party_acquisition(1.0, KINDS, 0, p, shape) for p in range(10)]
    assert first == [party_acquisition(1.0, KINDS, 0, p, shape) for p in range(10)]  # a pure function of (seed, party)
    assert len({a.brightness for a in first}) == 10 and first != [party_acquisition(1.0, KINDS, 1, p, shape)
                                                                     for p in range(10)]
    for a in first:  # each shift within its range at strength 1
        assert 0.3 <= a.brightness <= 1.7 and 0.4 <= a.contrast <= 1.6 and 0 <= a.blur <= 32 / 20
        assert abs(a.rotation) <= 30 and len(a.colour) == 3 and all(0.75 <= g <= 1.25 for g in a.colour)
    half = party_acquisition(0.5, KINDS, 0, 4, shape)
    assert half.brightness - 1 == pytest.approx((first[4].brightness - 1) / 2)  # strength scales the same draw
    only = party_acquisition(1.0, ("brightness", "blur"), 0, 4, shape)
    assert (only.brightness, only.blur) == (first[4].brightness, first[4].blur)  # the others' values unchanged
    assert (only.contrast, only.rotation, only.colour) == (1.0, 0.0, ())
    assert party_acquisition(1.0, KINDS, 0, 4, (1, 28, 28)).colour == ()  # grey images have no white balance


def test_shifts_keep_images_in_range_and_do_what_they_say():
    torch.manual_seed(0)
    unit = torch.rand(4, 3, 16, 16) * 0.5 + 0.25
    assert torch.equal(Acquisition()(unit), unit)  # the identity
    dark = Acquisition(brightness=0.3)(unit)
    assert torch.allclose(dark, unit * 0.3)
    flat = Acquisition(contrast=0.5)(unit)
    assert float(flat.std()) == pytest.approx(float(unit.std()) * 0.5, rel=0.05)
    assert float(flat.mean()) == pytest.approx(float(unit.mean()), rel=1e-5)
    blurred = Acquisition(blur=1.5)(unit)
    assert blurred.diff(dim=-1).abs().mean() < unit.diff(dim=-1).abs().mean() / 2  # neighbours closer
    tinted = Acquisition(colour=(1.2, 1.0, 0.8))(unit)
    assert torch.allclose(tinted[:, 1], unit[:, 1]) and (tinted[:, 2] < unit[:, 2]).all()
    turned = Acquisition(rotation=90.0)(unit)
    assert torch.allclose(turned, torch.rot90(unit, 1, dims=(-2, -1)), atol=1e-5)  # counter-clockwise, as torchvision
    strong = party_acquisition(1.0, KINDS, 0, 3, (3, 16, 16))(torch.rand(8, 3, 16, 16))
    assert strong.min() >= 0 and strong.max() <= 1


def test_an_unknown_shift_is_named_with_its_key():
    with pytest.raises(SettingsError, match="feature-skew-kinds.*'fog'.*allowed: brightness"):
        load_settings({**QUICK, "feature-skew-kinds": "brightness,fog"})
    with pytest.raises(SettingsError, match="feature-skew"):
        load_settings({**QUICK, "feature-skew": 1.5})


def test_a_partition_holds_its_partys_shifted_images_in_both_parts(one_thread):
    clean = load_settings(QUICK)
    skewed = load_settings({**QUICK, "feature-skew": 1.0, "feature-skew-kinds": "brightness"})
    raw = datalib.load_dataset(clean, "train")
    spec = pixel_spec(clean)
    for party in (0, 3):
        gain = acquisition(skewed, raw.spec, party).brightness
        for part in ("train", "validation"):
            ours, theirs = load_partition(skewed, party, 10, part), load_partition(clean, party, 10, part)
            assert np.array_equal(ours.rows, theirs.rows) and torch.equal(ours.labels, theirs.labels)
            expected = (datalib.denormalize(theirs.x, spec) * gain).clamp(0, 1)
            assert torch.allclose(datalib.denormalize(ours.x, spec), expected, atol=1e-5)
    assert acquisition(skewed, raw.spec, None) is None  # the server's splits are never shifted
    assert torch.equal(party_unit(skewed, raw, np.arange(5), None), datalib.to_unit(raw.images[:5], raw.spec))


def test_the_pooled_reference_pools_what_the_parties_hold(one_thread):
    skewed = load_settings({**QUICK, "feature-skew": 1.0})
    x, labels = pooled_data(skewed, 4)
    parts = [load_partition(skewed, p, 4, part) for p in range(4) for part in ("train", "validation")]
    assert len(x) == len(datalib.load_dataset(skewed, "train")) == sum(len(p.labels) for p in parts)
    assert torch.equal(x[: len(parts[0].x)], parts[0].x) and torch.equal(labels[: len(parts[0].x)], parts[0].labels)


def test_features_are_extracted_from_the_shifted_images(tmp_path, one_thread):
    from fedsmix.features import extractor_for

    settings = load_settings({**QUICK, "backbone": "efficientnet-lite0", "image-size": 32, "partitioner": "iid",
                              "feature-cache-dir": str(tmp_path), "feature-skew": 1.0})
    part = load_partition(settings, 2, 12)
    raw = datalib.load_dataset(settings, "train")
    shift = acquisition(settings, raw.spec, 2)
    expected = extractor_for(settings)(shift(datalib.to_unit(raw.images[part.rows], raw.spec)))
    assert torch.allclose(part.x, expected, atol=1e-5)
    clean = extractor_for(settings)(datalib.to_unit(raw.images[part.rows], raw.spec))
    assert (part.x - clean).norm() > 0.05 * clean.norm()  # the shift reaches the features
    assert not list(tmp_path.glob("*.npy"))  # a shifted party's features are not the split's cache
    assert dataclasses.replace(shift) == shift
