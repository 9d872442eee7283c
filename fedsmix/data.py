"""Datasets: a registry, loaders (npz data dir first, torchvision second, then raw idx files a system
package installed, e.g. Debian's dataset-fashion-mnist, read by torchvision's reader) and normalisation.

Images stay uint8 (or the bundle's native range) until a party converts its own
partition: thirty simulated parties must not each hold a float copy of CIFAR-10.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

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


class DatasetUnavailable(FileNotFoundError):
    """The data set is neither in the data dir nor obtainable through torchvision."""


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


def default_data_dir(configured: str = "") -> Path | None:
    """Configured dir, else $FEDSMIX_DATA_DIR, else ../shared/data when it exists beside the project."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    beside = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
    return beside if beside.is_dir() else None


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
    tried = []
    if root is not None:
        path = root / ds.npz
        tried.append(str(path))
        if path.is_file():
            images, labels = _load_npz(path, ds, split)
            return RawSplit(_to_nchw(images, ds.channels), labels, ds)
    if ds.torchvision is not None and root is not None:
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
        f"dataset {name!r} ({split}) not found. Tried: {'; '.join(tried) or 'no data dir configured'}. "
        f"Put {ds.npz} (arrays x_train, y_train, x_test, y_test; see ../shared/data/README.md) into a "
        f"directory and set run-config key 'data-dir' or ${DATA_DIR_ENV}"
        + (", or set download=true to fetch it with torchvision." if ds.torchvision else ".")
    )


def to_unit(images: np.ndarray, ds: DatasetSpec) -> torch.Tensor:
    """Raw images -> a new float32 tensor in [0, 1] (never a view: the loaded split is cached)."""
    raw = torch.from_numpy(np.ascontiguousarray(images))
    return raw.div(ds.pixel_scale) if raw.dtype == torch.float32 else raw.float().div_(ds.pixel_scale)


def normalize(unit: torch.Tensor, ds: DatasetSpec) -> torch.Tensor:
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
