"""The shape of a registry entry: a family of central-trainer candidates, and the one `fit` call it trains in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import Settings
from .union import Union


@dataclass
class Job:
    """One `fit` call as every family sees it: the (clipped) union, what the server knows, and `train_options`
    for the MLP's loop (checkpoints, epoch hooks). `once` computes what several families start from (the MLP of
    `mlp` and `mlp-recal`, the union's moments) a single time per call."""

    settings: Settings
    union: Union
    sample_shape: tuple[int, ...]
    num_classes: int
    device: str
    public: torch.Tensor | None = None  # the server's public pool in the mixing space, when it holds one
    train_options: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], object]):
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]


@dataclass(frozen=True)
class Trainer:
    """A family of central-trainer candidates (`TRAINERS.add(name, Trainer(...))`, fedsmix/trainers/__init__.py).

    `candidates(settings)`: its candidates' names (one per `head-penalties` value for a closed-form head); a name
    belongs to the family that yields it. `fit(job, names)` -> {name: (model, report)} for the named ones.
    `build(settings, sample_shape, num_classes)`: an empty module of the family's architecture, which a party
    fills with a candidate's state dict to score it or to use it. `needs_public`: it reads the server's public pool.
    """

    candidates: Callable[[Settings], list[str]]
    fit: Callable[[Job, list[str]], dict[str, tuple[nn.Module, dict]]]
    build: Callable[[Settings, tuple[int, ...], int], nn.Module]
    needs_public: bool = False
