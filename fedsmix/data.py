"""Datasets: a registry, loaders (npz data dir first, torchvision second, then raw idx files a system
package installed, e.g. Debian's dataset-fashion-mnist, read by torchvision's reader) and normalisation.

Images stay uint8 (or the bundle's native range) until a party converts its own
partition: thirty simulated parties must not each hold a float copy of CIFAR-10.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .config import SettingsError

DATA_DIR_ENV = "FEDSMIX_DATA_DIR"


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    num_classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    npz: str  # file name inside the data dir
    pixel_scale: float = 255.0  # raw value of a white pixel
    torchvision: str | None = None  # torchvision.datasets class for online users
    idx_dirs: tuple[str, ...] = ()  # system folders holding the raw idx files (gzipped), e.g. a Debian package

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)


# Normalisation constants are the paper's appendix E values (digits: its own train statistics).
REGISTRY: dict[str, DatasetSpec] = {
    "digits": DatasetSpec("digits", 10, 1, 8, (0.3053,), (0.3760,), "", pixel_scale=16.0),
    "mnist": DatasetSpec("mnist", 10, 1, 28, (0.1307,), (0.3081,), "mnist.npz", torchvision="MNIST"),
    "fashion-mnist": DatasetSpec(
        "fashion-mnist", 10, 1, 28, (0.2860,), (0.3530,), "fashion-mnist.npz", torchvision="FashionMNIST",
        idx_dirs=("/usr/share/datasets/fashion-mnist",),  # Debian's dataset-fashion-mnist
    ),
    "cifar10": DatasetSpec(
        "cifar10", 10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), "cifar10.npz", torchvision="CIFAR10"
    ),
    "cifar100": DatasetSpec(
        "cifar100",
        100,
        3,
        32,
        (0.5071, 0.4867, 0.4408),
        (0.2675, 0.2565, 0.2761),
        "cifar100.npz",
        torchvision="CIFAR100",
    ),
    "tiny-imagenet": DatasetSpec(
        "tiny-imagenet", 200, 3, 32, (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761), "tinyimagenet32.npz"
    ),
}


# Tiny-ImageNet's classes that depict a CIFAR-10 class (WordNet ids, checked against the archive's `words`).
# CIFAR-10's airplane and horse have no counterpart among the 200 classes. (The published paper's curated
# set lists other ids, several of which are not these objects: n04099969 is a rocking chair, n03930313 a
# picket fence, n04507155 an umbrella, n02814860 a beacon; see docs/attacks.md.)
CIFAR10_MATCHED_WNIDS: dict[str, tuple[str, ...]] = {
    "automobile": ("n02814533", "n03100240", "n03670208", "n04285008"),  # station wagon, convertible, limo, sports car
    "bird": ("n01855672", "n02002724", "n02056570", "n02058221"),  # goose, black stork, king penguin, albatross
    "cat": ("n02123045", "n02123394", "n02124075"),  # tabby, Persian, Egyptian cat
    "deer": ("n02423022",),  # gazelle
    "dog": ("n02085620", "n02094433", "n02099601", "n02099712", "n02106662", "n02113799"),
    "frog": ("n01641577", "n01644900"),  # bullfrog, tailed frog
    "ship": ("n03662601", "n03447447"),  # lifeboat, gondola
    "truck": ("n03796401", "n03977966"),  # moving van, police van
}


class DatasetUnavailable(FileNotFoundError):
    """The data set is neither in the data dir nor obtainable through torchvision."""


def cifar10_matched(labels: np.ndarray, data_dir: str, key: str) -> np.ndarray:
    """Each Tiny-ImageNet label's CIFAR-10-matched group (its index in CIFAR10_MATCHED_WNIDS), -1 for a class that
    matches none; `key` names the setting that asked, in the error when the bundle lacks a matched class."""
    wnids = class_ids("tiny-imagenet", data_dir)
    group = {w: c for c, ids in enumerate(CIFAR10_MATCHED_WNIDS.values()) for w in ids}
    missing = set(group) - set(wnids)
    if missing:
        raise DatasetUnavailable(f"{key}: Tiny-ImageNet lacks {sorted(missing)}")
    return np.array([group.get(w, -1) for w in wnids], dtype=np.int64)[labels]


@dataclass(frozen=True)
class RawSplit:
    """Images NCHW in their stored dtype (uint8 for most), labels int64."""

    images: np.ndarray
    labels: np.ndarray
    spec: DatasetSpec

    def __len__(self) -> int:
        return len(self.labels)


def spec(name: str) -> DatasetSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"dataset: unknown {name!r}; allowed: {', '.join(REGISTRY)}") from None


USER_DATA_DIR = Path("~/.cache/fedsmix/data")  # where a clone's data sets go (download=true puts them there)


def default_data_dir(configured: str = "") -> Path:
    """Configured dir, else $FEDSMIX_DATA_DIR, else ../shared/data when it exists beside the project (this
    repository's CI), else ~/.cache/fedsmix/data."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    beside = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
    return beside if beside.is_dir() else USER_DATA_DIR.expanduser()


def _to_nchw(images: np.ndarray, channels: int) -> np.ndarray:
    if images.ndim == 3:  # N H W (grey)
        return images[:, None]
    if images.ndim == 4 and images.shape[-1] == channels and images.shape[1] != channels:
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    return images


def _load_digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bundle = load_digits()
    images = bundle.images.astype(np.float32)  # 0..16
    labels = bundle.target.astype(np.int64)
    order = np.random.RandomState(1797).permutation(len(labels))  # fixed 80/20 split
    cut = int(0.8 * len(labels))
    idx = order[:cut] if split == "train" else order[cut:]
    return images[idx], labels[idx]


def _load_npz(path: Path, ds: DatasetSpec, split: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as archive:
        if f"x_{split}" in archive:
            return archive[f"x_{split}"], archive[f"y_{split}"].astype(np.int64)
        if "x" in archive:  # a single public split (tiny-imagenet32): fixed 80/20 cut
            images, labels = archive["x"], archive["y"].astype(np.int64)
            order = np.random.RandomState(len(labels)).permutation(len(labels))
            cut = int(0.8 * len(labels))
            idx = order[:cut] if split == "train" else order[cut:]
            return images[idx], labels[idx]
    raise DatasetUnavailable(f"{path}: expected arrays x_{split}/y_{split} (or x/y)")


IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fedsmix" / "idx"


def _idx_root(ds: DatasetSpec) -> Path | None:
    """A torchvision root (<root>/<Class>/raw/<idx files>) made from a system folder of gzipped idx files.

    torchvision's reader wants the files uncompressed in its raw layout; they are decompressed once,
    with torchvision's own `extract_archive`, into ~/.cache/fedsmix/idx (the system folder stays read-only).
    """
    from filelock import FileLock
    from torchvision.datasets.utils import extract_archive

    for folder in map(Path, ds.idx_dirs):
        if not all((folder / f"{name}.gz").is_file() or (folder / name).is_file() for name in IDX_FILES):
            continue
        root = idx_cache_root()
        raw = root / ds.torchvision / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        with FileLock(str(raw / ".lock")):  # one process decompresses; the others wait, then read
            for name in IDX_FILES:
                if (raw / name).is_file():
                    continue
                if (folder / name).is_file():
                    (raw / name).symlink_to(folder / name)
                    continue
                with tempfile.TemporaryDirectory(dir=raw) as tmp:  # a crash leaves no half-written file
                    extract_archive(str(folder / f"{name}.gz"), tmp)
                    os.replace(Path(tmp) / name, raw / name)
        return root
    return None


def _load_torchvision(ds: DatasetSpec, split: str, root: Path, download: bool) -> tuple[np.ndarray, np.ndarray]:
    import torchvision

    cls = getattr(torchvision.datasets, ds.torchvision)
    dataset = cls(root=str(root), train=(split == "train"), download=download)
    images = dataset.data.numpy() if isinstance(dataset.data, torch.Tensor) else np.asarray(dataset.data)
    return images, np.asarray(dataset.targets, dtype=np.int64)


@lru_cache(maxsize=8)
def load_split(name: str, split: str, data_dir: str = "", download: bool = False) -> RawSplit:
    """Load one split; cached per process so a simulated party reads each archive once."""
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    ds = spec(name)
    if name == "digits":
        images, labels = _load_digits(split)
        return RawSplit(_to_nchw(images, 1), labels, ds)
    root = default_data_dir(data_dir)
    path = root / ds.npz
    tried = [str(path)]
    if path.is_file():
        images, labels = _load_npz(path, ds, split)
        return RawSplit(_to_nchw(images, ds.channels), labels, ds)
    if ds.torchvision is not None:
        try:
            images, labels = _load_torchvision(ds, split, root, download)
            return RawSplit(_to_nchw(images, ds.channels), labels, ds)
        except (RuntimeError, OSError) as err:
            tried.append(f"torchvision {ds.torchvision}(root={root}, download={download}): {err}")
    if ds.idx_dirs:  # raw idx files a system package installed (torchvision's raw layout, its reader)
        idx_root = _idx_root(ds)
        if idx_root is not None:
            images, labels = _load_torchvision(ds, split, idx_root, False)
            return RawSplit(_to_nchw(images, ds.channels), labels, ds)
        tried.append(f"idx files in {', '.join(ds.idx_dirs)}")
    raise DatasetUnavailable(
        f"dataset {name!r} ({split}) not found. Tried: {'; '.join(tried)}. "
        f"Put {ds.npz} (uint8 arrays x_train, y_train, x_test, y_test; README, section Data) into {root} or "
        f"another directory named by the key 'data-dir' or ${DATA_DIR_ENV}"
        + (", or set download=true to fetch it with torchvision." if ds.torchvision else ".")
    )


def class_ids(name: str, data_dir: str = "") -> np.ndarray:
    """The class ids (WordNet ids for Tiny-ImageNet) that a bundle's labels index, where it names them."""
    root = default_data_dir(data_dir)
    path = root / spec(name).npz
    if not path.is_file():
        raise DatasetUnavailable(f"{name}: no archive with class names in {root}")
    with np.load(path) as archive:
        if "wnids" not in archive:
            raise DatasetUnavailable(f"{path}: has no class names (array 'wnids')")
        return archive["wnids"].astype(str)


def to_unit(images: np.ndarray, ds: DatasetSpec) -> torch.Tensor:
    """Raw images -> a new float32 tensor in [0, 1] (never a view: the loaded split is cached)."""
    raw = torch.from_numpy(np.ascontiguousarray(images))
    return raw.div(ds.pixel_scale) if raw.dtype == torch.float32 else raw.float().div_(ds.pixel_scale)


# ImageNet's statistics: the paper's experiment code normalises every data set with them (appendix F),
# MNIST replicated to three channels; `normalisation = "imagenet"` reproduces that.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NORMALISATIONS = ("dataset", "imagenet")


def pixel_spec(ds: DatasetSpec, normalisation: str = "dataset") -> DatasetSpec:
    """The spec pixels are normalised with: the data set's own statistics, or ImageNet's in 3 channels."""
    if normalisation == "dataset":
        return ds
    if normalisation == "imagenet":
        return replace(ds, channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    raise ValueError(f"normalisation: unknown {normalisation!r}; allowed: {', '.join(NORMALISATIONS)}")


def is_grey(ds: DatasetSpec) -> bool:
    """Stored with one channel (a 3-channel normalisation replicates it)."""
    return REGISTRY[ds.name].channels == 1 if ds.name in REGISTRY else ds.channels == 1


def normalize(unit: torch.Tensor, ds: DatasetSpec) -> torch.Tensor:
    """[0, 1] images -> normalised; grey images are replicated to a 3-channel spec's channels."""
    if unit.dim() == 4 and unit.shape[1] == 1 and ds.channels == 3:
        unit = unit.expand(-1, 3, -1, -1)
    mean = torch.tensor(ds.mean, dtype=unit.dtype, device=unit.device).view(1, -1, 1, 1)
    std = torch.tensor(ds.std, dtype=unit.dtype, device=unit.device).view(1, -1, 1, 1)
    return (unit - mean) / std


def denormalize(x: torch.Tensor, ds: DatasetSpec) -> torch.Tensor:
    mean = torch.tensor(ds.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(ds.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return x * std + mean


def valid_range(ds: DatasetSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel bounds of normalised pixels (images of 0 and 1), shaped (1, C, 1, 1)."""
    lo = normalize(torch.zeros(1, ds.channels, 1, 1), ds)
    hi = normalize(torch.ones(1, ds.channels, 1, 1), ds)
    return lo, hi


def normalized_tensors(raw: RawSplit, index: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    images = raw.images if index is None else raw.images[index]
    labels = raw.labels if index is None else raw.labels[index]
    return normalize(to_unit(images, raw.spec), raw.spec), torch.from_numpy(labels.astype(np.int64))


def one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(labels.long(), num_classes).float()


# ------------------------------------------------------------------------------ your own data
# `dataset` may be a path (fedsmix/config.py checks the layout): an .npz archive or an ImageFolder.
# Everything about it is inferred from the files and checked before a run writes anything; a bad
# file is refused with a DatasetError naming the file and what is wrong. Decoded once per process.

NPZ_SPLITS = ("x_train", "y_train", "x_test", "y_test")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N")
SIXTEEN_BIT = ("I", "I;16", "I;16B", "I;16L", "I;16N")


class DatasetError(SettingsError):
    """A data set given as a path cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class UserDataset:
    """A data set read from a path: both splits, the inferred spec, and how it was read."""

    spec: DatasetSpec
    train: RawSplit
    test: RawSplit
    layout: str  # "npz" or "image-folder"
    split: str  # how train and test were obtained
    classes: tuple[str, ...]
    fingerprint: str  # changes when the files change (feature cache key)

    def describe(self, statistics: str = "inferred from the training split") -> dict:
        return {
            "name": self.spec.name, "path": self.spec.npz, "layout": self.layout, "split": self.split,
            "channels": self.spec.channels, "image-size": self.spec.image_size, "num-classes": self.spec.num_classes,
            "classes": list(self.classes[:20]) + (["..."] if len(self.classes) > 20 else []),
            "train": len(self.train), "test": len(self.test), "pixel-scale": self.spec.pixel_scale,
            "mean": [round(v, 6) for v in self.spec.mean], "std": [round(v, 6) for v in self.spec.std],
            "statistics": statistics,
        }


def is_path_dataset(name: str) -> bool:
    return name not in REGISTRY


def _fingerprint(path: Path) -> str:
    """Every file's name, size and modification time (the feature cache's key for this data set)."""
    import hashlib

    h = hashlib.sha256(str(path).encode())
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path.parent)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _stamp(path: Path) -> str:
    """A cheap change marker for the per-process cache: the file's size and time, or the modification times
    of the folder, train/, test/ and the class folders (adding, removing or renaming an image changes them)."""
    if path.is_file():
        st = path.stat()
        return f"{st.st_size}:{st.st_mtime_ns}"
    dirs = [path, path / "train", path / "test"]
    dirs += [d for sub in dirs[1:] if sub.is_dir() for d in sub.iterdir() if d.is_dir()]
    return ",".join(str(d.stat().st_mtime_ns) for d in dirs if d.is_dir())


def _pixel_scale(where: str, images: np.ndarray) -> float:
    """The raw value of a white pixel: 255 for 8-bit, 65535 for 16-bit, 1 for floats in [0, 1]."""
    if images.dtype == np.uint8:
        return 255.0
    if images.dtype == np.uint16:
        return 65535.0
    if images.dtype.kind not in "iuf" or images.dtype.kind == "b":
        raise DatasetError(f"{where}: pixel values must be numbers, got dtype {images.dtype}")
    if images.dtype.kind == "f" and not np.isfinite(images).all():
        raise DatasetError(f"{where}: {int((~np.isfinite(images)).sum())} pixel values are NaN or infinite")
    low, high = (float(images.min()), float(images.max())) if images.size else (0.0, 0.0)
    if low < 0:
        raise DatasetError(f"{where}: pixel values must be >= 0 (raw intensities), found {low:g}")
    if images.dtype.kind == "f" and high <= 1.0:
        return 1.0
    if high <= 255:
        return 255.0
    if high <= 65535 and images.dtype.kind in "iu":
        return 65535.0
    raise DatasetError(
        f"{where}: pixel values reach {high:g}; store 8-bit (0..255) or 16-bit (0..65535) integers, or floats in [0, 1]"
    )


def _images_nchw(where: str, images: np.ndarray) -> np.ndarray:
    """N x H x W (grey), N x H x W x C or N x C x H x W with C in (1, 3) -> N x C x H x W, square images only."""
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4 and images.shape[1] in (1, 3) and images.shape[3] not in (1, 3):
        pass  # already N C H W
    elif images.ndim == 4 and images.shape[3] in (1, 3):
        images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    else:
        raise DatasetError(
            f"{where}: images of shape {images.shape[1:]}; expected N x H x W (grey), N x H x W x C or N x C x H x W "
            "with C = 1 or 3"
        )
    if images.shape[2] != images.shape[3]:
        raise DatasetError(f"{where}: images are {images.shape[2]}x{images.shape[3]}; fedsmix needs square images "
                           "(crop or resize them first)")
    return images


def _labels(where: str, labels: np.ndarray, n: int) -> np.ndarray:
    if labels.ndim != 1:
        raise DatasetError(f"{where}: labels must be one integer class per row (shape (N,)), got shape {labels.shape}")
    if len(labels) != n:
        raise DatasetError(f"{where}: {len(labels)} labels for {n} images (mismatched lengths)")
    if labels.dtype.kind == "f":
        if not np.isfinite(labels).all() or (labels != np.round(labels)).any():
            raise DatasetError(f"{where}: labels must be whole numbers (class ids 0..K-1)")
    elif labels.dtype.kind not in "iu":
        raise DatasetError(f"{where}: labels must be integer class ids 0..K-1, got dtype {labels.dtype}")
    return labels.astype(np.int64)


def _check_classes(where: str, train: np.ndarray, test: np.ndarray, classes: tuple[str, ...]) -> int:
    """K = the number of class names when given, else 1 + the largest training label; every label in 0..K-1,
    and every class with at least one training sample."""
    k = len(classes) if classes else int(train.max()) + 1
    for split, labels in (("train", train), ("test", test)):
        bad = labels[(labels < 0) | (labels >= k)]
        if len(bad):
            raise DatasetError(
                f"{where}: {split} label {int(bad[0])} is out of range 0..{k - 1} ({len(bad)} such labels; "
                + ("K = the number of class names" if classes else "K = 1 + the largest training label") + ")"
            )
    counts = np.bincount(train, minlength=k)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        names = [classes[i] if classes else str(i) for i in empty[:10]]
        more = f" and {len(empty) - 10} more" if len(empty) > 10 else ""
        basis = f"{k} class names" if classes else f"K = {k}: the largest training label is {k - 1}"
        raise DatasetError(f"{where}: class {', '.join(names)}{more} has no training samples (an empty class; "
                           f"{basis}); relabel to 0..K-1 without gaps")
    return k


def _statistics(images: np.ndarray, scale: float, block: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of the training images in [0, 1], in float64 blocks."""
    c = images.shape[1]
    total, square, count = np.zeros(c), np.zeros(c), 0
    for start in range(0, len(images), block):
        chunk = images[start : start + block].astype(np.float64) / scale
        total += chunk.sum(axis=(0, 2, 3))
        square += (chunk**2).sum(axis=(0, 2, 3))
        count += chunk.shape[0] * chunk.shape[2] * chunk.shape[3]
    mean = total / count
    std = np.sqrt(np.maximum(square / count - mean**2, 0.0))
    if (std <= 0).any():
        raise DatasetError("every training image has the same value in a channel (std 0): nothing to learn from")
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _stratified_cut(labels: np.ndarray, fraction: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """A fixed split of one labelled array: per class, a permutation seeded with the number of rows (never the
    run's seed, so the test split is the same in every run), its first 80 % (at least one row) for training."""
    rng = np.random.RandomState(len(labels))
    train, test = [], []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        rows = rows[rng.permutation(len(rows))]
        cut = max(1, int(round(fraction * len(rows))))
        train.append(rows[:cut])
        test.append(rows[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _user_dataset(path: Path, layout: str, split: str, x_train, y_train, x_test, y_test,
                  classes: tuple[str, ...], where: dict[str, str]) -> UserDataset:
    x_train = _images_nchw(where["x_train"], x_train)
    x_test = _images_nchw(where["x_test"], x_test)
    for key, x in (("x_train", x_train), ("x_test", x_test)):
        if len(x) == 0:
            raise DatasetError(f"{where[key]}: no images")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DatasetError(f"{where['x_test']}: test images are {x_test.shape[1:]} (C, H, W), training images "
                           f"{x_train.shape[1:]}: both splits need the same size and channels")
    scale = _pixel_scale(where["x_train"], x_train)
    test_scale = _pixel_scale(where["x_test"], x_test)
    if test_scale != scale and x_test.dtype != x_train.dtype:
        raise DatasetError(f"{where['x_test']}: pixel type {x_test.dtype} differs from the training images' "
                           f"{x_train.dtype}; store both splits alike")
    y_train, y_test = _labels(where["y_train"], y_train, len(x_train)), _labels(where["y_test"], y_test, len(x_test))
    k = _check_classes(str(path), y_train, y_test, classes)
    mean, std = _statistics(x_train, scale)
    name = path.stem if path.is_file() else path.name
    spec_ = DatasetSpec(name, k, x_train.shape[1], x_train.shape[2], mean, std, str(path), pixel_scale=scale)
    return UserDataset(spec_, RawSplit(x_train, y_train, spec_), RawSplit(x_test, y_test, spec_), layout, split,
                       classes or tuple(str(i) for i in range(k)), _fingerprint(path))


def read_npz_dataset(path: Path) -> UserDataset:
    """x_train, y_train, x_test, y_test; or x, y (a fixed stratified 80/20 split: `_stratified_cut`). An
    optional `classes` array names the classes (and fixes K)."""
    import zipfile

    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise DatasetError(f"{path}: not a readable .npz archive ({err})") from None
    with archive:
        keys = set(archive.files)
        classes = tuple(str(c) for c in archive["classes"]) if "classes" in keys else ()
        if set(NPZ_SPLITS) <= keys:
            arrays = [archive[k] for k in NPZ_SPLITS]
            split = "x_train/y_train and x_test/y_test as given"
            where = {k: f"{path}: {k}" for k in NPZ_SPLITS}
        elif {"x", "y"} <= keys and not keys & set(NPZ_SPLITS):
            x = archive["x"]
            y = _labels(f"{path}: y", archive["y"], len(x))
            train, test = _stratified_cut(y)
            if len(test) == 0:
                raise DatasetError(f"{path}: x, y has too few rows per class to hold out a test split")
            arrays = [x[train], y[train], x[test], y[test]]
            split = "x, y cut 80/20 per class (numpy RandomState(len(y)); the same in every run)"
            where = {"x_train": f"{path}: x", "y_train": f"{path}: y", "x_test": f"{path}: x", "y_test": f"{path}: y"}
        else:
            present = sorted(keys & set(NPZ_SPLITS))
            missing = sorted(set(NPZ_SPLITS) - keys) if present else ["x_train", "y_train", "x_test", "y_test"]
            raise DatasetError(
                f"{path}: missing arrays {', '.join(missing)}; expected x_train, y_train, x_test, y_test "
                f"(or x, y alone); found {', '.join(sorted(keys)) or 'no arrays'}"
            )
    return _user_dataset(path, "npz", split, *arrays, classes=classes, where=where)


def _image_files(folder: Path, classes: list[str], problems: list[str]) -> list[tuple[Path, int]]:
    """The images of each class folder; what is wrong (stray files, non-images, empty classes) goes to
    `problems`, so that one report names every one."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    files = []
    for stray in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        problems.append(f"{stray}: a file directly in {folder.name}/; every image belongs in a class "
                        f"sub-folder ({folder.name}/<class>/<image>)")
    for index, name in enumerate(classes):
        found = 0
        for p in sorted((folder / name).rglob("*")):
            if not p.is_file() or any(part.startswith(".") for part in p.relative_to(folder).parts):
                continue  # hidden files (.DS_Store) and folders are not data
            if not p.name.lower().endswith(IMG_EXTENSIONS):
                problems.append(f"{p}: not an image file (extension {p.suffix or 'none'}; "
                                f"allowed: {', '.join(IMG_EXTENSIONS)})")
                continue
            files.append((p, index))
            found += 1
        if not found:
            problems.append(f"{folder / name}: class folder holds no images (an empty class)")
    return files


def _report(problems: list[str], path: Path, shown: int = 20) -> DatasetError:
    """One error for every problem found: the first on the first line (it names its file), the rest below."""
    more = f"\n... and {len(problems) - shown} more" if len(problems) > shown else ""
    tail = f"\n({len(problems)} problems in {path})" if len(problems) > 1 else ""
    return DatasetError("\n".join(problems[:shown]) + more + tail)


def read_image_folder(path: Path) -> UserDataset:
    """torchvision's ImageFolder layout under train/ and test/: one sub-folder per class (sorted names are
    the class ids, as torchvision numbers them). Every image is decoded with Pillow: greyscale when every
    image is (8 or 16 bit), else RGB; all must share one square size."""
    from PIL import Image, UnidentifiedImageError
    from torchvision.datasets.folder import find_classes

    try:
        classes, _ = find_classes(str(path / "train"))
    except FileNotFoundError as err:
        raise DatasetError(f"{path / 'train'}: {err}") from None
    test_classes = sorted(p.name for p in (path / "test").iterdir() if p.is_dir() and not p.name.startswith("."))
    problems = [f"{path / 'test' / name}: class folder has no counterpart in {path / 'train'}/ (training classes: "
                f"{', '.join(classes)})" for name in test_classes if name not in classes]
    known = [name for name in test_classes if name in classes]
    splits = {"train": _image_files(path / "train", classes, problems),
              "test": _image_files(path / "test", known, problems)}
    splits["test"] = [(p, classes.index(known[i])) for p, i in splits["test"]]  # the training split's class ids
    modes, size, first = set(), None, None
    for files in splits.values():  # headers only: sizes and colour modes
        for p, _ in files:
            try:
                with Image.open(p) as img:
                    mode, this = img.mode, img.size
            except (UnidentifiedImageError, OSError) as err:
                problems.append(f"{p}: not a readable image ({err})")
                continue
            if mode == "F":
                problems.append(f"{p}: floating-point image (mode F); store such data as an .npz")
            elif size is None:
                size, first = this, p
            elif this != size:
                problems.append(f"{p}: image is {this[0]}x{this[1]} but {first} is {size[0]}x{size[1]}: "
                                "every image must have the same size (resize them first)")
            modes.add(mode)
    if problems:
        raise _report(problems, path)
    grey = modes <= set(GREY_MODES)
    wide = grey and bool(modes & set(SIXTEEN_BIT))  # 16-bit greyscale: keep 16 bits (8-bit images x 257)
    arrays = {}
    for split, files in splits.items():
        images = np.empty((len(files), size[1], size[0], *(() if grey else (3,))), np.uint16 if wide else np.uint8)
        for i, (p, _) in enumerate(files):
            try:
                with Image.open(p) as img:
                    if wide and img.mode in SIXTEEN_BIT:
                        pixels = np.asarray(img, dtype=np.int64)
                        if pixels.min() < 0 or pixels.max() > 65535:
                            raise DatasetError(f"{p}: pixel values outside 0..65535")
                        images[i] = pixels
                    elif wide:
                        images[i] = np.asarray(img.convert("L"), dtype=np.uint16) * 257
                    else:
                        images[i] = np.asarray(img.convert("L" if grey else "RGB"))
            except (UnidentifiedImageError, OSError) as err:
                raise DatasetError(f"{p}: cannot decode image ({err})") from None
        arrays[split] = (images, np.array([c for _, c in files], dtype=np.int64))
    where = {"x_train": str(path / "train"), "y_train": str(path / "train"),
             "x_test": str(path / "test"), "y_test": str(path / "test")}
    return _user_dataset(path, "image-folder", "train/ and test/ as given", *arrays["train"], *arrays["test"],
                         classes=tuple(classes), where=where)


@lru_cache(maxsize=2)
def _read_user_dataset(path: str, stamp: str) -> UserDataset:
    del stamp  # part of the cache key only: changed files are read again
    p = Path(path)
    return read_npz_dataset(p) if p.is_file() else read_image_folder(p)


def user_dataset(path: str) -> UserDataset:
    """The data set at `path`, read and checked once per process (again only when its files change)."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{path}: no such file or folder")
    return _read_user_dataset(str(p), _stamp(p))


def _with_statistics(dataset: UserDataset, mean: tuple[float, ...], std: tuple[float, ...]) -> UserDataset:
    """The preset's statistics in place of the inferred ones."""
    if not mean:
        return dataset
    if len(mean) != dataset.spec.channels:
        raise DatasetError(f"dataset-mean / dataset-std: {len(mean)} values for {dataset.spec.npz}, which has "
                           f"{dataset.spec.channels} channel(s)")
    from dataclasses import replace

    spec_ = replace(dataset.spec, mean=tuple(mean), std=tuple(std))
    train, test = replace(dataset.train, spec=spec_), replace(dataset.test, spec=spec_)
    return replace(dataset, spec=spec_, train=train, test=test)


def dataset_spec(settings) -> DatasetSpec:
    """The run's data set: the registry's spec, or the one inferred from the path (preset statistics applied)."""
    if not is_path_dataset(settings.dataset):
        return spec(settings.dataset)
    return _with_statistics(user_dataset(settings.dataset), settings.dataset_mean, settings.dataset_std).spec


def load_dataset(settings, split: str) -> RawSplit:
    """One split of the run's data set: `load_split` for registered names, the path's files otherwise."""
    if not is_path_dataset(settings.dataset):
        return load_split(settings.dataset, split, settings.data_dir, settings.download)
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    dataset = _with_statistics(user_dataset(settings.dataset), settings.dataset_mean, settings.dataset_std)
    return dataset.train if split == "train" else dataset.test


def dataset_key(settings) -> str:
    """A file-name-safe name of the run's data set (feature cache keys): the registry name, or the path's
    stem and a fingerprint of its files."""
    if not is_path_dataset(settings.dataset):
        return settings.dataset
    dataset = user_dataset(settings.dataset)
    return f"{dataset.spec.name}-{dataset.fingerprint[:12]}"


def describe_dataset(settings) -> dict:
    """What the run trains on, for results.json and the log; reading (and checking) a path data set here."""
    if not is_path_dataset(settings.dataset):
        s = spec(settings.dataset)
        return {"name": s.name, "registered": True, "channels": s.channels, "image-size": s.image_size,
                "num-classes": s.num_classes, "mean": list(s.mean), "std": list(s.std)}
    dataset = _with_statistics(user_dataset(settings.dataset), settings.dataset_mean, settings.dataset_std)
    return dataset.describe("given by the settings (dataset-mean, dataset-std)" if settings.dataset_mean
                            else "inferred from the training split")
