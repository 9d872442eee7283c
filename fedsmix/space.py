"""Where the mixing happens: normalised pixels, or a pretrained backbone's features.

Every split a run touches (a party's rows, the server's test split, the non-private union, the
attacker's public pool) is mapped into that one space here, so parties, server and attacks agree
on it by construction.
"""

from __future__ import annotations

import numpy as np
import torch

from . import data as datalib
from .acquisition import party_unit
from .config import Settings


def pixel_spec(settings: Settings, ds: datalib.DatasetSpec | None = None) -> datalib.DatasetSpec:
    """The run's pixel normalisation (`normalisation`) of `ds` (default: the run's data set)."""
    return datalib.pixel_spec(ds or datalib.dataset_spec(settings), settings.normalisation)


def to_space(settings: Settings, raw: datalib.RawSplit, split: str, rows: np.ndarray | None,
             party: int | None = None) -> torch.Tensor:
    """Pixels normalised per `normalisation`, or backbone features when a backbone is configured (in the
    `projection`'s coordinates when one is set); `party`: its images as its acquisition records them
    (`feature-skew`; features of shifted images are extracted here, not read from the split's cache)."""
    if settings.backbone == "none":
        return datalib.normalize(party_unit(settings, raw, rows, party), pixel_spec(settings, raw.spec))
    from .features import extractor_for, features_for, project

    if party is not None and settings.feature_skew > 0:
        return project(settings, extractor_for(settings)(party_unit(settings, raw, rows, party)))
    return project(settings, features_for(settings, split, rows))


def mixing_shape(settings: Settings) -> tuple[int, ...]:
    """Shape of one sample where mixing happens: pixels (C, H, W) or a feature vector."""
    if settings.backbone == "none":
        return pixel_spec(settings).sample_shape
    from .features import feature_dim

    return (feature_dim(settings),)


def upload_shape(settings: Settings) -> tuple[int, ...]:
    """Shape of one uploaded sample: the mixing space's, or for encoder=mixcon the cut-layer representation's."""
    shape = mixing_shape(settings)
    if settings.encoder == "mixcon":
        from .models import cut_shape

        return cut_shape(settings, shape)
    return shape


def train_subset_rows(settings: Settings, n: int) -> np.ndarray | None:
    """The fixed random subset of the training split that `train-subset` keeps (None: all of it)."""
    if settings.train_subset and settings.train_subset < n:
        return np.sort(np.random.RandomState(settings.seed).permutation(n)[: settings.train_subset])
    return None


def load_test(settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's clean test split (parties never see it); optionally a fixed subset."""
    raw = datalib.load_dataset(settings, "test")
    rows = None
    if settings.test_subset and settings.test_subset < len(raw):
        rows = np.sort(np.random.RandomState(settings.seed).permutation(len(raw))[: settings.test_subset])
    x = to_space(settings, raw, "test", rows)
    labels = raw.labels if rows is None else raw.labels[rows]
    return x, torch.from_numpy(labels.astype(np.int64))


def returned_test(settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of the test split a returned model is scored on: `return-test-rows` of `load_test`'s, drawn from
    the seed (the same for every party), or all of them."""
    x, labels = load_test(settings)
    k = settings.return_test_rows
    if not k or k >= len(labels):
        return x, labels
    rows = np.sort(np.random.RandomState(settings.seed + 1).permutation(len(labels))[:k])
    return x[rows], labels[rows]


def load_train_all(settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole training split in mixing space, as stored (the pooled reference: fedsmix.party.pooled_data)."""
    raw = datalib.load_dataset(settings, "train")
    rows = train_subset_rows(settings, len(raw))
    labels = raw.labels if rows is None else raw.labels[rows]
    return to_space(settings, raw, "train", rows), torch.from_numpy(labels.astype(np.int64))


def public_rows(settings: Settings, labels: np.ndarray) -> np.ndarray | None:
    """Rows of the public split that `public-classes` keeps (None: all of them)."""
    if settings.public_classes == "all":
        return None
    return np.flatnonzero(datalib.cifar10_matched(labels, settings.data_dir, "public-classes 'cifar10'") >= 0)


def load_public_pool(settings: Settings, private: datalib.DatasetSpec) -> torch.Tensor:
    """Tiny-ImageNet (the public set) mapped to the private images' shape and normalisation.

    `private` is the spec the private pixels are normalised with; grey private data get grey public
    images (replicated to three channels where the normalisation has three). `public-classes`
    restricts the pool to the classes that match CIFAR-10's.
    """
    public = datalib.load_split("tiny-imagenet", "train", settings.data_dir, settings.download)
    rows = public_rows(settings, public.labels)
    unit = datalib.to_unit(public.images if rows is None else public.images[rows], public.spec)
    c, h, w = private.sample_shape
    if c == 1 or datalib.is_grey(private):
        unit = unit.mean(dim=1, keepdim=True)
    if unit.shape[-2:] != (h, w):
        unit = torch.nn.functional.interpolate(unit, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return datalib.normalize(unit.clamp(0, 1), private).contiguous()


def public_in_space(settings: Settings, spec: datalib.DatasetSpec | None = None) -> torch.Tensor:
    """The server's public data (Tiny-ImageNet) where the mixing happens: pixels in the private images'
    shape and normalisation (`spec`, default the run's data set), or features of the parties' backbone.
    `public-size` > 0 keeps that many."""
    if settings.backbone != "none":
        from .features import public_features

        return public_features(settings, settings.public_size)
    pool = load_public_pool(settings, spec or pixel_spec(settings))
    return pool[: settings.public_size] if settings.public_size else pool
