"""The paper's head (eq. 8) as a central trainer: `mlp` keeps the BatchNorm statistics of the noisy union,
`mlp-recal` is the same weights with them recalibrated on the server's clean public pool."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..config import Settings
from ..models import new_classifier, union_classifier
from ..seeding import generator
from ..training import TrainConfig, TrainReport, train, train_config
from .base import Job, Trainer


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
    build: Callable[[Settings, tuple[int, ...], int], torch.nn.Module] = new_classifier,
) -> tuple[torch.nn.Module, TrainReport]:
    """The paper's head trained on (x, soft labels). `on_epoch(model, epoch, loss)` sees the model after each epoch;
    `build` makes the untrained model (mixup-union: `union_classifier`)."""
    model = build(settings, sample_shape, num_classes)
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


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, x, device: str = "cpu", batch_size: int = 512) -> nn.Module:
    """Replace every BatchNorm's running statistics by those of `x` (clean data the model's user holds):
    cumulative averages over one pass, in train mode for BatchNorm only (dropout stays off)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model
    model.to(device).eval()
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative moving average: every batch counts the same
        bn.train()
    n = len(x)
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        if len(index) < 2:
            continue
        rows = x[torch.from_numpy(index)] if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x[index]))
        model(rows.to(device, dtype=torch.float32))
    for bn in norms:
        bn.momentum = 0.1
    return model.eval()


def _trained(job: Job) -> tuple[nn.Module, dict]:
    """The MLP on the job's union, trained once however many of its variants the job asks for."""

    def fit() -> tuple[nn.Module, dict]:
        settings = job.settings
        cfg = train_config(settings, job.device)
        if settings.robust_training == "trim":
            cfg = dataclasses.replace(cfg, trim=settings.robust_trim)
        model, report = train_classifier(settings, job.union.x, job.union.training_labels(), job.sample_shape,
                                         job.num_classes, job.device, cfg=cfg, build=union_classifier,
                                         **job.train_options)
        return model, {"epochs": report.epochs_run, "seconds": report.seconds, "losses": report.losses,
                       "resumed-from": report.resumed_from}

    return job.once("mlp", fit)


def _fit_recalibrated(job: Job, names: list[str]) -> dict[str, tuple[nn.Module, dict]]:
    if job.public is None:
        raise ValueError("trainer mlp-recal needs the public pool in the mixing space")
    model, info = _trained(job)
    recal = recalibrate_batchnorm(copy.deepcopy(model), job.public, job.device)  # `mlp` keeps the union's statistics
    return {"mlp-recal": (recal, {**info, "batchnorm": f"recalibrated on {len(job.public)} public samples"})}


MLP = Trainer(candidates=lambda settings: ["mlp"], fit=lambda job, names: {"mlp": _trained(job)},
              build=union_classifier)
MLP_RECAL = Trainer(candidates=lambda settings: ["mlp-recal"], fit=_fit_recalibrated, build=union_classifier,
                    needs_public=True)
