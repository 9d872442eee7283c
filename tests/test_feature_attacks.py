"""Attacks where the upload lives: mixing in a backbone's feature space is attacked and scored there.

Small real data: digits through a ResNet-18 (saved random weights, 16 px) with a 300-image public
Tiny-ImageNet slice through the same backbone, all extracted in the test; and EfficientNet-Lite0's
real ImageNet weights for the [0, 6] feature range the attacks clamp to.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

from commands.cli import main as fedsmix_main
from commands.simulate import simulate
from fedsmix import data as datalib
from fedsmix import features
from fedsmix.config import load_settings
from fedsmix.encoders import singularized_mixup
from fedsmix.party import calibrate_party
from server.adversary.base import Observation
from server.adversary.cases import public_samples, valid_bounds
from server.adversary.mmse import SMALL_CYCLE, GaussianPrior, MMSEAttack
from server.adversary.registry import build_attacks
from server.adversary.sweep import run_sweep, victim_partition

PUBLIC = 300

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def feature_overrides(tmp_path_factory) -> dict:
    """digits through resnet18 at 16 px; the attacker holds 300 public images (same backbone)."""
    torch.manual_seed(0)
    weights = tmp_path_factory.mktemp("weights") / "resnet18-random.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), weights)
    return {
        "dataset": "digits", "backbone": "resnet18", "weights-path": str(weights), "image-size": 16,
        "feature-cache-dir": str(tmp_path_factory.mktemp("features")), "public-size": PUBLIC,
    }


@pytest.fixture(scope="module")
def settings(feature_overrides):
    return load_settings(feature_overrides)


def test_public_set_goes_through_the_parties_backbone(settings):
    """Same extractor, input size and weights as the private features: not pixels, not another net."""
    public = public_samples(settings, datalib.spec("digits"))
    assert public.shape == (PUBLIC, 512)
    raw = datalib.load_split("tiny-imagenet", "train")
    expected = features.FeatureExtractor(settings)(datalib.to_unit(raw.images[:5], raw.spec))
    torch.testing.assert_close(public[:5], expected, rtol=1e-4, atol=1e-5)
    lo, hi = valid_bounds(settings, datalib.spec("digits"))
    assert float(lo) == 0.0 and hi is None  # pooled ReLU outputs
    assert float(public.min()) >= 0.0


def test_public_features_are_cached_like_the_private_ones(settings, tmp_path, monkeypatch):
    """The whole public split gets a cache file keyed by backbone, size and weights; a smaller
    public-size then reads its rows from that file, and without it extracts only those rows."""
    settings = settings.replace(feature_cache_dir=str(tmp_path))
    calls = []

    def small_extractor(settings):  # counts the images that reach the backbone
        def extract(unit):
            calls.append(len(unit))
            return unit.mean(dim=(2, 3)).repeat(1, 512 // 3 + 1)[:, :512]
        return extract

    monkeypatch.setattr(features, "extractor_for", small_extractor)
    subset = features.public_features(settings, 40)
    assert subset.shape == (40, 512) and sum(calls) == 40 and list(tmp_path.glob("*.npy")) == []

    def fill(settings, split, out, progress=True):
        out[:] = np.arange(len(out), dtype=np.float32)[:, None]

    monkeypatch.setattr(features, "extract_split", fill)
    full = features.public_features(settings)
    key = features.cache_key(settings.replace(dataset="tiny-imagenet"), "train")
    assert key.startswith("tiny-imagenet-train-resnet18-16px-")
    whole = len(datalib.load_split("tiny-imagenet", "train"))  # the public split: every row, not public-size's
    assert (tmp_path / f"{key}.npy").is_file() and full.shape == (whole, 512) and whole > 40
    calls.clear()
    assert torch.equal(features.public_features(settings, 40), full[:40]) and calls == []


def test_efficientnet_lite0_features_lie_in_zero_to_six():
    """The head's ReLU6 bounds every pooled feature: real images and saturated extremes stay in [0, 6],
    and the attacks clamp to exactly that box."""
    settings = load_settings({"backbone": "efficientnet-lite0", "image-size": 64})
    raw = datalib.load_split("tiny-imagenet", "train")
    unit = torch.cat([datalib.to_unit(raw.images[:24], raw.spec), torch.zeros(1, 3, 32, 32), torch.ones(1, 3, 32, 32),
                      torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)).round()])
    out = features.FeatureExtractor(settings)(unit)
    assert float(out.min()) == 0.0 and float(out.max()) <= 6.0
    assert float((out == 0).float().mean()) > 0.1  # many inactive units: the lower bound is hit, not just respected
    lo, hi = valid_bounds(settings, datalib.spec("cifar10"))
    assert (float(lo), float(hi)) == (0.0, 6.0)


def test_attacks_clamp_estimates_to_the_feature_box():
    g = torch.Generator().manual_seed(2)
    x = torch.rand(200, 24, generator=g).pow(3) * 6  # many values near 0, like ReLU6 features
    enc = singularized_mixup(x, torch.zeros(200, 2), 0.7, 30.0, g)
    box = (torch.tensor(0.0), torch.tensor(6.0))
    prior = GaussianPrior.fit(torch.rand(500, 24, generator=g).pow(3) * 6, rank=4)
    free = Observation(enc.x, 200, enc.weights, enc.sources, 30.0)
    boxed = Observation(enc.x, 200, enc.weights, enc.sources, 30.0, lo=box[0], hi=box[1])
    for attack in (MMSEAttack(prior), build_attacks(["linear"], load_settings({}), None)[0]["linear"]):
        unclamped, clamped = attack.reconstruct(free), attack.reconstruct(boxed)
        assert float(unclamped.min()) < 0  # the noise pushes estimates out of the box...
        assert float(clamped.min()) >= 0 and float(clamped.max()) <= 6  # ...and the attack knows the box
        assert (clamped - x).pow(2).sum() < (unclamped - x).pow(2).sum()


@pytest.mark.parametrize("derangement,radius", [(True, 2.0), (False, 0.5), (True, 0.0)])
def test_fast_mmse_mean_equals_the_eigendecomposition(derangement, radius):
    """The banded solve is the same posterior mean as the per-cycle eigendecomposition, on cycles of
    every kind (fixed points and 2-cycles with a uniform permutation, long cycles beyond SMALL_CYCLE)."""
    from fedsmix.metrics import cycles

    g = torch.Generator().manual_seed(3)
    prior = GaussianPrior.fit(torch.randn(400, 30, generator=g) @ torch.randn(30, 30, generator=g) + 1, rank=6)
    n = 400
    x = prior.sample(n, g).float()
    enc = singularized_mixup(x, torch.zeros(n, 2), 0.7, radius, g, derangement=derangement)
    lengths = [len(c) for c in cycles(enc.sources[:, 1].numpy())]
    assert max(lengths) > SMALL_CYCLE
    obs = Observation(enc.x, n, enc.weights, enc.sources, radius)
    attack = MMSEAttack(prior)
    reference, _ = attack.posterior(obs)
    fast = attack.posterior_mean(obs)
    scale = float(reference.abs().max())
    assert float((fast - reference).abs().max()) <= 1e-5 * scale


def test_mmse_in_feature_space_leaks_at_tau_1_and_not_at_1e_6(settings, tmp_path):
    """360 real digits in feature space, theorem mode: the MMSE attacker beats the public mean
    feature clearly at tau = 1, and its gain vanishes at tau = 1e-6. Scores are SNRs in feature
    space; PSNR/SSIM are recorded as not applicable, never as NaN."""
    result = run_sweep(settings, [1.0, 1e-6], ["linear", "mmse", "unet"], 360, tmp_path, log=lambda *_: None)
    assert result["space"] == "features (resnet18, 16 px, 512-d)" and result["victims"] == 360
    assert result["attacks"] == ["linear", "mmse"] and "image-shaped" in result["skipped"]["unet"]
    at = {rec["tau"]: rec for rec in result["taus"]}
    mmse_1, mmse_6 = at[1.0]["attacks"]["mmse"], at[1e-6]["attacks"]["mmse"]
    assert mmse_1["gain"]["snr_db"] > 3, mmse_1
    assert abs(mmse_6["gain"]["snr_db"]) < 0.05, mmse_6
    assert at[1.0]["attacks"]["linear"]["gain"]["snr_db"] > 0
    assert at[1e-6]["snr-bound"] == pytest.approx(1e-6)
    for rec in result["taus"]:
        assert rec["trivial"]["psnr_mean"] is None and rec["trivial"]["ssim_mean"] is None
        for entry in rec["attacks"].values():
            assert entry["score"]["psnr_mean"] is None and entry["gain"]["psnr_db"] is None
            assert entry["gain"]["snr_db"] == pytest.approx(entry["score"]["snr_mean"] - rec["trivial"]["snr_mean"])
    stored = (tmp_path / "digits-resnet18-16px-sweep.json").read_text()
    assert "NaN" not in stored and json.loads(stored)["taus"][0]["trivial"]["ssim_mean"] is None
    table = (tmp_path / "digits-resnet18-16px-sweep.md").read_text()
    assert "feature space" in table and "PSNR/SSIM n/a" in table and "paper linear" not in table
    assert not list(tmp_path.glob("*.png"))  # feature vectors have no picture


def test_pixel_mapped_radius_reads_the_victims_own_split(settings):
    """Victims from the test split: the pixel noise is added to their own test images. At a tau
    so large that Theorem 4.2 asks for no noise, the measured feature displacement is zero."""
    part = victim_partition(settings, 50, "test")
    assert part.split == "test"
    calibration = calibrate_party(settings.replace(radius_mode="pixel-mapped", tau=10.0), part)
    assert calibration.mode == "pixel-mapped" and calibration.radius < 1e-4 * calibration.D


def test_attack_command_sweeps_parties_and_radius_modes_in_feature_space(feature_overrides, tmp_path):
    argv = ["attack", "--dataset", "digits", "--parties", "3", "--victims", "31", "--taus", "1,1e-6",
            "--attacks", "linear,mmse", "--backbone", "resnet18", "--image-size", "16",
            "--radius-mode", "theorem,pixel-mapped", "--out", str(tmp_path)]
    for key in ("weights-path", "feature-cache-dir", "public-size"):
        argv += ["--set", f"{key}={feature_overrides[key]}"]
    assert fedsmix_main(argv) == 0
    theorem = json.loads((tmp_path / "digits-resnet18-16px-3parties-sweep.json").read_text())
    mapped = json.loads((tmp_path / "digits-resnet18-16px-pixel-mapped-3parties-sweep.json").read_text())
    for result in (theorem, mapped):
        assert result["victims"] == 31 and result["parties"] == 3 and result["split"] == "train"
        for rec in result["taus"]:
            assert [p["party"] for p in rec["per-party"]] == [0, 1, 2]
            assert set(rec["attacks"]) == {"linear", "mmse"} and "trivial" in rec
    # theorem mode meets tau in every party; pixel-mapped buys far less privacy than tau says
    assert all(p["snr_bound"] == pytest.approx(1e-6) for p in theorem["taus"][1]["per-party"])
    assert min(mapped["taus"][1]["snr-bound-range"]) > 1e-3
    rows = list(csv.DictReader(open(tmp_path / "digits-resnet18-16px-pixel-mapped-3parties-sweep.csv")))
    assert [float(r["tau"]) for r in rows] == [1.0, 1e-6] and all(r["trivial_psnr_mean"] == "" for r in rows)
    assert "effective bound (min-max)" in (tmp_path / "tables.md").read_text()


def test_attack_command_with_the_table4_preset_attacks_its_feature_space(tmp_path, monkeypatch):
    """The README's feature-space command: the Table 4 preset's backbone, input size (64 px, the
    cached features), partitioner and seed reach every sweep, one per radius mode in the order given,
    over the ten parties' partitions and every decade of tau."""
    from server.adversary import sweep

    calls = []

    def fake_sweep(settings, taus, attacks, victims, out_dir, device, mmse_rank, split, resize, parties=0,
                   progress=None, unet_curve=False):
        calls.append((settings, taus, attacks, victims, device, split, parties))
        assert progress.path == Path(out_dir) / "progress.jsonl"  # `fedsmix show --follow <out>` can watch it
        md = Path(out_dir) / f"{settings.radius_mode}.md"
        md.write_text(f"table {settings.radius_mode}\n")
        return {"files": [str(md)]}

    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    argv = ["attack", "--preset", "configs/table4-cifar10.yaml", "--parties", "10", "--victims", "1000",
            "--taus", "1,1e-1,...,1e-6", "--radius-mode", "pixel-mapped,theorem", "--attacks", "linear,mmse",
            "--device", "cpu", "--out", str(tmp_path)]
    assert fedsmix_main(argv) == 0
    assert [c[0].radius_mode for c in calls] == ["pixel-mapped", "theorem"]
    for settings, taus, attacks, victims, device, _split, parties in calls:
        assert (settings.dataset, settings.backbone, settings.image_size) == ("cifar10", "efficientnet-lite0", 64)
        assert (settings.partitioner, settings.dirichlet_alpha, settings.alpha) == ("dirichlet", 0.5, 0.7)
        assert features.input_size(settings) == 64  # the size the cached features were extracted at
        assert taus == [1.0, 0.1, 0.01, 1e-3, 1e-4, 1e-5, 1e-6]
        assert (attacks, victims, device, parties) == (["linear", "mmse"], 1000, "cpu", 10)
    assert (tmp_path / "tables.md").read_text() == "table pixel-mapped\n\ntable theorem\n"


@pytest.mark.sim
def test_serverapp_attacks_feature_uploads_in_feature_space(feature_overrides, runs_dir):
    """Two parties mix digits features at tau = 1; the server attacks the stored feature uploads with
    a prior and trivial guess from public features, and reports SNR in feature space."""
    results = simulate(
        {
            **feature_overrides, "preset": "configs/quickstart.yaml", "strategies": "mixup-union", "runs-dir": runs_dir,
            "epochs": 1, "adversary": "linear,mmse,unet", "attack-victims": 60,
        },
        num_parties=2,
    )
    adv = results["strategies"]["mixup-union"]["adversary"]
    assert adv["errors"] == {} and adv["refused"] == {}
    assert set(adv["skipped"]) == {"unet"} and "image-shaped" in adv["skipped"]["unet"]
    assert adv["space"] == "features (resnet18, 16 px, 512-d)"
    pooled = adv["pooled"]
    assert pooled["victims"] == 120 and set(pooled["attacks"]) == {"linear", "mmse"}
    assert pooled["trivial"]["psnr_mean"] is None
    for entry in pooled["attacks"].values():
        assert entry["gain"]["psnr_db"] is None and entry["gain"]["ssim"] is None
        assert entry["gain"]["snr_db"] == pytest.approx(entry["score"]["snr_mean"] - pooled["trivial"]["snr_mean"])
    assert pooled["attacks"]["mmse"]["gain"]["snr_db"] > 3
    assert pooled["theorem41"]["mmse"]["bound-median"] > 0
    out = Path(results["run-dir"]) / "adversary"
    summary = (out / "summary.md").read_text()
    assert "features (resnet18, 16 px, 512-d)" in summary and "| mmse |" in summary and "n/a" in summary
    assert {Path(f).name for f in adv["files"]} == {"summary.md", "summary.csv"}
    assert "NaN" not in (Path(results["run-dir"]) / "results.json").read_text()


def test_invert_command_takes_feature_uploads_back_to_pixels(settings, tmp_path):
    """`fedsmix invert` end to end on a small case: the clean features and the linear attack's estimate of
    the mixed ones are inverted through the backbone, scored against the images, and written out."""
    from commands.invert import run_invert

    result = run_invert(settings, [1.0], ["theorem"], ["linear"], ["inversion"], victims=4, parties=1,
                        out=tmp_path, options={"inversion_steps": 5, "inversion_tv": (1e-3,)}, figure=2,
                        log=lambda *_: None)
    sources = [entry["source"] for entry in result["sources"]]
    assert sources[0] == "clean features" and len(sources) == 2  # clean, then one (mode, tau, estimator)
    for entry in result["sources"]:
        score = entry["attacks"]["inversion"]["score"]
        assert score["ssim_mean"] is not None and math.isfinite(score["psnr_mean"])  # scored as images
    assert all(Path(f).is_file() for f in result["files"])
