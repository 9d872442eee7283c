"""The server's learning steps: the central trainer on the uploaded union, and test evaluation.

Selection of anything (trainer, epochs) sees encoded or public data only, never the test split.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .config import Settings
from .models import new_classifier
from .seeding import generator
from .training import TrainConfig, TrainReport, evaluate, train, train_config


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
