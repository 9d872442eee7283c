"""The protocol's steps as plain functions, shared by parties, server, oracle and benchmarks.

A party: load_partition -> calibrate_party -> encode_partition. The server: load_test ->
train_classifier -> evaluate. Everything is a pure function of (settings, party, number of
parties), so the simulation oracle can replay a party's encoding from its seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from . import data as datalib
from .config import Settings
from .encoders import Calibration, Encoded, EncoderParams, calibrate, data_statistics, encode, fixed_radius
from .models import build_classifier
from .partition import partition_indices
from .seeding import generator
from .training import TrainConfig, TrainReport, evaluate, train


@dataclass
class Partition:
    """One party's private data in the space where mixing happens (normalised pixels or features)."""

    party: int
    x: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    spec: datalib.DatasetSpec
    rows: np.ndarray  # rows of the training split (never uploaded)
    split: str = "train"  # the split `rows` index (attack sweeps take victims from the test split)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def one_hot(self) -> torch.Tensor:
        return datalib.one_hot(self.labels, self.num_classes)


def to_space(settings: Settings, raw: datalib.RawSplit, split: str, rows: np.ndarray | None) -> torch.Tensor:
    """Pixels normalised per the paper, or backbone features when a backbone is configured."""
    if settings.backbone == "none":
        images = raw.images if rows is None else raw.images[rows]
        return datalib.normalize(datalib.to_unit(images, raw.spec), raw.spec)
    from .features import features_for

    return features_for(settings, split, rows)


def train_subset_rows(settings: Settings, n: int) -> np.ndarray | None:
    """The fixed random subset of the training split that `train-subset` keeps (None: all of it)."""
    if settings.train_subset and settings.train_subset < n:
        return np.sort(np.random.RandomState(settings.seed).permutation(n)[: settings.train_subset])
    return None


def load_partition(settings: Settings, party: int, num_parties: int) -> Partition:
    raw = datalib.load_split(settings.dataset, "train", settings.data_dir, settings.download)
    subset = train_subset_rows(settings, len(raw))
    rows = partition_indices(
        raw.labels if subset is None else raw.labels[subset],
        party,
        num_parties,
        settings.partitioner,
        settings.seed,
        settings.dirichlet_alpha,
        settings.classes_per_party,
        settings.min_partition_size,
    )
    if subset is not None:
        rows = subset[rows]
    x = to_space(settings, raw, "train", rows)
    labels = torch.from_numpy(raw.labels[rows].astype(np.int64))
    return Partition(party, x, labels, raw.spec.num_classes, raw.spec, rows)


def load_test(settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's clean test split (parties never see it); optionally a fixed subset."""
    raw = datalib.load_split(settings.dataset, "test", settings.data_dir, settings.download)
    rows = None
    if settings.test_subset and settings.test_subset < len(raw):
        rows = np.sort(np.random.RandomState(settings.seed).permutation(len(raw))[: settings.test_subset])
    x = to_space(settings, raw, "test", rows)
    labels = raw.labels if rows is None else raw.labels[rows]
    return x, torch.from_numpy(labels.astype(np.int64))


def calibrate_party(settings: Settings, part: Partition) -> Calibration:
    """Theorem 4.2 on the party's own data (or the configured radius, reported the same way)."""
    stats = data_statistics(part.x, generator(settings.seed, part.party, "calibrate"))
    if settings.radius_mode == "fixed":
        return fixed_radius(stats, settings.radius, settings.tau, settings.alpha)
    if settings.radius_mode == "pixel-mapped":
        from .features import pixel_mapped_radius

        radius = pixel_mapped_radius(settings, part, generator(settings.seed, part.party, "pixel-mapped"))
        return fixed_radius(stats, radius, settings.tau, settings.alpha, mode="pixel-mapped")
    return calibrate(stats, settings.tau, settings.alpha)


def encoder_params(settings: Settings, radius: float) -> EncoderParams:
    return EncoderParams(
        name=settings.encoder,
        alpha=settings.alpha,
        radius=radius,
        derangement=settings.permutation == "derangement",
        k=settings.mix_k,
        cap=settings.coefficient_cap,
        private_min=settings.private_mass_min,
        encodings_per_sample=settings.encodings_per_sample,
    )


def load_public_pool(settings: Settings, private: datalib.DatasetSpec) -> torch.Tensor:
    """Tiny-ImageNet (the public set) mapped to the private images' shape and normalisation."""
    public = datalib.load_split("tiny-imagenet", "train", settings.data_dir, settings.download)
    unit = datalib.to_unit(public.images, public.spec)
    c, h, w = private.sample_shape
    if c == 1:
        unit = unit.mean(dim=1, keepdim=True)
    if unit.shape[-2:] != (h, w):
        unit = torch.nn.functional.interpolate(unit, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
    return datalib.normalize(unit.clamp(0, 1), private)


def encode_partition(settings: Settings, part: Partition, calibration: Calibration | None = None) -> tuple[Encoded, Calibration]:
    """Calibrate and encode the whole partition once, from the party's own seed."""
    calibration = calibration or calibrate_party(settings, part)
    public = load_public_pool(settings, part.spec) if settings.encoder == "instahide-cross" else None
    enc = encode(
        part.x,
        part.one_hot(),
        encoder_params(settings, calibration.radius),
        generator(settings.seed, part.party, "encode"),
        public=public,
    )
    return enc, calibration


def upload_inputs(x: torch.Tensor, dtype: str) -> np.ndarray:
    """Encoded inputs in the agreed upload dtype; float16 halves the bytes (relative error <= 2^-11)."""
    array = x.numpy()
    if dtype == "float32":
        return array.astype(np.float32, copy=False)
    limit = float(np.finfo(np.float16).max)
    peak = float(np.abs(array).max()) if array.size else 0.0
    if peak > limit:
        raise ValueError(f"upload-dtype float16: encoded values reach {peak:.3g}, beyond float16's {limit:.0f}; use float32")
    return array.astype(np.float16)


def train_config(settings: Settings, device: str, *, federated_client: bool = False, proximal_mu: float = 0.0) -> TrainConfig:
    """Central and local-only training follow appendix E (AdamW, cosine); FedAvg/FedProx
    clients run `local-epochs` of SGD with momentum per round, as in the FedProx paper."""
    if federated_client:
        return TrainConfig(
            epochs=settings.local_epochs,
            batch_size=settings.batch_size,
            lr=settings.client_lr,
            weight_decay=settings.weight_decay,
            optimizer="sgd",
            cosine=False,
            proximal_mu=proximal_mu,
            device=device,
        )
    return TrainConfig(settings.epochs, settings.batch_size, settings.lr, settings.weight_decay, device=device)


def new_classifier(settings: Settings, sample_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    torch.manual_seed(settings.seed)  # same initial weights for every strategy
    return build_classifier(settings.model, sample_shape, num_classes)


def train_classifier(
    settings: Settings,
    x,
    y_soft,
    sample_shape: tuple[int, ...],
    num_classes: int,
    device: str,
    purpose: str = "central",
    cfg: TrainConfig | None = None,
    checkpoint_path=None,
    checkpoint_key: str = "",
    on_epoch: Callable[[torch.nn.Module, int, float], None] | None = None,
) -> tuple[torch.nn.Module, TrainReport]:
    """The central trainer. `on_epoch(model, epoch, loss)` sees the model after each epoch."""
    model = new_classifier(settings, sample_shape, num_classes)
    torch.manual_seed(settings.seed + 1)  # dropout stream
    report = train(
        model,
        x,
        y_soft,
        cfg or train_config(settings, device),
        generator(settings.seed, purpose, "shuffle"),
        checkpoint_path=checkpoint_path,
        checkpoint_every=settings.checkpoint_every,
        on_epoch=(lambda epoch, loss: on_epoch(model, epoch, loss)) if on_epoch else None,
        checkpoint_key=checkpoint_key,
    )
    return model, report


def test_accuracy(model: torch.nn.Module, test: tuple[torch.Tensor, torch.Tensor], device: str) -> dict[str, float]:
    return evaluate(model, test[0], test[1], device)


def mixing_shape(settings: Settings) -> tuple[int, ...]:
    """Shape of one sample where mixing happens: pixels (C, H, W) or a feature vector."""
    if settings.backbone == "none":
        return datalib.spec(settings.dataset).sample_shape
    from .features import feature_dim

    return (feature_dim(settings),)


def load_train_all(settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole training split in mixing space: only for the non-private reference."""
    raw = datalib.load_split(settings.dataset, "train", settings.data_dir, settings.download)
    rows = train_subset_rows(settings, len(raw))
    labels = raw.labels if rows is None else raw.labels[rows]
    return to_space(settings, raw, "train", rows), torch.from_numpy(labels.astype(np.int64))


def mixup_union_in_process(settings: Settings, num_parties: int, device: str = "cpu", on_epoch=None) -> dict:
    """Mixup-union without Flower: every party encodes here, in party order, and the union trains here.

    The same steps as the ClientApp's encode handler and the ServerApp's mixup-union (upload
    dtype included), minus messaging, validation and the upload store: the reference for what
    the federation costs. Same settings, same weights (see benchmarks/flower_overhead.py).
    """
    import time

    from .training import state_digest

    t0 = time.perf_counter()
    xs, ys = [], []
    for party in range(num_parties):
        part = load_partition(settings, party, num_parties)
        enc, _ = encode_partition(settings, part)
        xs.append(upload_inputs(enc.x, settings.upload_dtype))
        ys.append(enc.y.numpy().astype(np.float32, copy=False))
        del part, enc
    x, y = np.concatenate(xs), np.concatenate(ys)
    del xs, ys
    encode_seconds = time.perf_counter() - t0
    num_classes = datalib.spec(settings.dataset).num_classes
    model, report = train_classifier(settings, x, y, mixing_shape(settings), num_classes, device, on_epoch=on_epoch)
    metrics = test_accuracy(model, load_test(settings), device)
    return {
        "accuracy": metrics["accuracy"],
        "test-loss": metrics["loss"],
        "union-size": len(x),
        "weights-sha256": state_digest(model),
        "encode-seconds": encode_seconds,
        "train-seconds": report.seconds,
        "wall-seconds": time.perf_counter() - t0,
    }
