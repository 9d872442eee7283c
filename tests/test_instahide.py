"""InstaHide and plain mixup against the paper: coefficients, masks, labels, public pool, T encodings."""

import numpy as np
import pytest
import torch

from fedsmix import data
from fedsmix.config import SettingsError, load_settings
from fedsmix.encoders import EncoderParams, encode, instahide, mixup
from fedsmix.party import encode_partition, load_partition
from fedsmix.space import load_public_pool


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def cifar(data_dir):
    raw = data.load_split("cifar10", "train", data_dir)
    x, y = data.normalized_tensors(raw, np.arange(300))
    return x, data.one_hot(y, 10), raw.spec


def unmasked(enc, x, public=None):
    """sum_j w_ij * image_ij rebuilt from the secrets (private rows, public rows)."""
    out = torch.zeros_like(enc.x)
    for j in range(enc.weights.shape[1]):
        w = enc.weights[:, j].view(-1, 1, 1, 1)
        private = enc.sources[:, j] >= 0
        out[private] += w[private] * x[enc.sources[private, j]]
        if public is not None:
            pub = enc.public_sources[:, j] >= 0
            out[pub] += w[pub] * public[enc.public_sources[pub, j]]
    return out


def test_inside_coefficients_mask_and_labels(cifar):
    x, y, _ = cifar
    enc = instahide(x, y, k=4, cap=0.65, generator=gen())
    assert torch.allclose(enc.weights.sum(dim=1), torch.ones(len(x)), atol=1e-6)
    assert float(enc.weights.max()) <= 0.65 + 1e-7 and float(enc.weights.min()) > 0
    assert (enc.sources[:, 0] == torch.arange(len(x))).all()  # every sample is the target of one encoding
    # a fresh +-1 mask per encoded image, pixel and channel; x~ = mask * mixture exactly
    assert set(enc.signs.unique().tolist()) == {-1.0, 1.0} and enc.signs.shape == enc.x.shape
    assert torch.allclose(enc.x, enc.signs * unmasked(enc, x), atol=1e-5)
    assert abs(float((enc.signs > 0).float().mean()) - 0.5) < 0.01
    per_image = enc.signs.flatten(1)
    assert len({tuple(row.tolist()) for row in per_image}) == len(x)  # no mask is reused
    assert 0.4 < float((per_image[0] == per_image[1]).float().mean()) < 0.6  # independent images
    expected_y = (enc.weights.unsqueeze(-1) * y[enc.sources]).sum(dim=1)
    assert torch.allclose(enc.y, expected_y, atol=1e-6)


def test_cross_dataset_private_mass_public_pool_and_labels(cifar, data_dir):
    x, y, spec = cifar
    settings = load_settings({"data-dir": data_dir})
    public = load_public_pool(settings, spec)
    with np.load(f"{data_dir}/tinyimagenet32.npz") as archive:
        rows = len(archive["y"])
    assert public.shape[1:] == x.shape[1:] and len(public) == int(0.8 * rows)  # Tiny-ImageNet, train cut
    enc = instahide(x, y, k=4, cap=0.65, generator=gen(1), public=public, private_min=0.3)
    w = enc.weights
    assert float(w.max()) <= 0.65 + 1e-7 and torch.allclose(w.sum(dim=1), torch.ones(len(x)), atol=1e-6)
    assert float(w[:, :2].sum(dim=1).min()) >= 0.3 - 1e-7
    assert (enc.sources[:, 2:] == -1).all() and (enc.sources[:, :2] >= 0).all()
    assert (enc.public_sources[:, :2] == -1).all() and (enc.public_sources[:, 2:] >= 0).all()
    assert torch.allclose(enc.x, enc.signs * unmasked(enc, x, public), atol=1e-5)
    # labels come from the two private images only, renormalised to sum to 1
    private_mass = w[:, :2].sum(dim=1, keepdim=True)
    expected_y = (w[:, :2].unsqueeze(-1) * y[enc.sources[:, :2]]).sum(dim=1) / private_mass
    assert torch.allclose(enc.y, expected_y, atol=1e-6)
    assert torch.allclose(enc.y.sum(dim=1), torch.ones(len(x)), atol=1e-6)


def test_plain_mixup_has_no_mask_and_respects_the_cap(cifar):
    x, y, _ = cifar
    enc = mixup(x, y, k=2, cap=0.65, generator=gen(2))
    assert enc.signs is None and float(enc.weights.max()) <= 0.65 + 1e-7 and float(enc.weights.min()) >= 0.35 - 1e-7
    assert torch.allclose(enc.x, unmasked(enc, x), atol=1e-5)


def test_T_encodings_are_independent_with_fresh_masks(cifar):
    x, y, _ = cifar
    enc = encode(x, y, EncoderParams(name="instahide-inside", k=4, encodings_per_sample=3), gen(3))
    n = len(x)
    assert len(enc) == 3 * n
    assert (enc.sources[:, 0] == torch.arange(n).repeat(3)).all()  # each sample targeted once per encoding
    first, second = enc.signs[:n].flatten(1), enc.signs[n : 2 * n].flatten(1)
    assert 0.45 < float((first == second).float().mean()) < 0.55
    assert not torch.equal(enc.weights[:n], enc.weights[n : 2 * n])


def test_party_encoding_uses_the_settings_and_replays(data_dir):
    settings = load_settings(
        {
            "dataset": "cifar10",
            "data-dir": data_dir,
            "train-subset": 600,
            "encoder": "instahide-cross",
            "mix-k": 4,
            "partitioner": "iid",
        }
    )
    part = load_partition(settings, 0, 3)
    a, _ = encode_partition(settings, part)
    b, _ = encode_partition(settings, load_partition(settings, 0, 3))
    assert torch.equal(a.x, b.x) and torch.equal(a.signs, b.signs)
    assert float(a.weights[:, :2].sum(dim=1).min()) >= settings.private_mass_min - 1e-7


@pytest.mark.parametrize(
    "overrides, hint",
    [
        ({"encoder": "instahide-cross", "mix-k": 2}, "mix-k"),
        ({"encoder": "instahide-cross", "private-mass-min": 1.0}, "private-mass-min"),
        ({"encoder": "instahide-cross", "coefficient-cap": 0.4, "private-mass-min": 0.9}, "private-mass-min"),
        ({"encoder": "instahide-inside", "coefficient-cap": 0.2}, "coefficient-cap"),
    ],
)
def test_infeasible_instahide_settings_fail_naming_the_key(overrides, hint):
    with pytest.raises(SettingsError, match=hint):
        load_settings(overrides)


def test_encoder_refuses_an_unreachable_private_mass(cifar):
    x, y, _ = cifar
    with pytest.raises(ValueError, match="private-mass-min"):
        instahide(x, y, 4, 0.65, gen(), public=x[:50], private_min=1.0)


def test_a_sign_masked_union_trains_a_sign_invariant_model(data_dir, runs_dir, one_thread):
    """mixup-union on InstaHide uploads: the central model reads |x| (the parties rebuild the same model to score
    the candidates and recalibrate the chosen one), so flipping the signs of an input changes none of its outputs;
    on singularized uploads the model is the run's classifier, unwrapped."""
    from pathlib import Path

    from commands import inprocess
    from fedsmix.models import Absolute, union_classifier

    overrides = {"preset": "configs/quickstart.yaml", "data-dir": data_dir, "runs-dir": runs_dir, "epochs": 3,
                 "strategies": "mixup-union", "encoder": "instahide-inside", "trainer": "auto",
                 "head-penalties": "1", "tuning-budget": 3, "seed": 1}
    results = inprocess.run(overrides, 3)
    mix = results["strategies"]["mixup-union"]
    assert "mlp" in mix["tried"] and set(mix["returned"]["per-party-accuracy"]) == {"0", "1", "2"}
    settings = load_settings(overrides)
    model = union_classifier(settings, (1, 8, 8), 10)
    assert isinstance(model[0], Absolute)
    model.load_state_dict(torch.load(Path(results["run-dir"]) / "models" / "mixup-union.pt", weights_only=True)
                          if mix["trainer"] == "mlp" else model.state_dict())
    model.eval()
    x = torch.randn(64, 1, 8, 8, generator=gen(5))
    signs = torch.randint(0, 2, x.shape, generator=gen(6)).mul(2).sub(1).float()
    with torch.no_grad():
        assert torch.equal(model(x), model(signs * x))
    assert not isinstance(union_classifier(settings.replace(encoder="singularized"), (1, 8, 8), 10),
                          torch.nn.Sequential)
