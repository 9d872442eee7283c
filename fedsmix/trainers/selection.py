"""The `trainer` key's candidates over the registered families, their fit, and the honest selection: every
candidate (at most `tuning-budget`) is fit on the whole union, the parties score them on their own validation
splits (fedsmix/tuning.py), and the best is the central model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..config import Settings
from ..data import DatasetUnavailable
from ..progress import SILENT, Progress
from ..registry import TRAINERS
from ..seeding import generator
from ..space import public_in_space
from ..training import evaluate, predict
from ..tuning import draw_names, pooled
from .base import Job, Trainer
from .union import Union, balanced, clipped


def test_accuracy(model: torch.nn.Module, test: tuple[torch.Tensor, torch.Tensor], device: str) -> dict[str, float]:
    return evaluate(model, test[0], test[1], device)


@dataclass
class Fitted:
    models: dict[str, nn.Module]
    reports: dict[str, dict] = field(default_factory=dict)  # per candidate: how it was trained


def families(settings: Settings) -> list[tuple[str, Trainer]]:
    """The registered families the `trainer` key names: one, or under `auto` every one (in registration order)."""
    if settings.trainer == "auto":
        return TRAINERS.items()
    return [(settings.trainer, TRAINERS[settings.trainer])]


def needs_public(settings: Settings) -> bool:
    """Whether the chosen trainer family uses the server's public pool (BatchNorm recalibration, a prior)."""
    return any(family.needs_public for _, family in families(settings))


def ensure_run_features(settings: Settings) -> list[Path]:
    """Extract (or find cached) every backbone-feature split a run reads: train and test, and the public
    pool when the attacker, a `projection` or mixup-union's trainer uses it (`fedsmix features`, a grid's warm-up). A
    public set that is not there is skipped under `trainer: auto`, as `server_public` does at run time."""
    from ..features import PUBLIC_DATASET, ensure_features

    paths = [ensure_features(settings, split) for split in ("train", "test")]
    needed = settings.adversary or settings.projection != "none"  # a projection is fitted on the public set
    if needed or ("mixup-union" in settings.strategies and needs_public(settings)):
        try:
            paths.append(ensure_features(settings.replace(dataset=PUBLIC_DATASET), "train"))
        except DatasetUnavailable:
            if needed or settings.trainer != "auto":
                raise
    return paths


def server_public(settings: Settings, progress: Progress = SILENT) -> torch.Tensor | None:
    """The public pool in the mixing space when the trainer uses one, else None.

    Under `trainer: auto` a server without the public set (no `data-dir`, as in a bare deployment)
    trains the other candidates and says so; a trainer that names a public family needs the set.
    """
    if not needs_public(settings):
        return None
    try:
        return public_in_space(settings)
    except DatasetUnavailable as error:
        if settings.trainer != "auto":
            raise DatasetUnavailable(f"trainer {settings.trainer!r} needs the public set: {error}") from error
        skipped = [name for name, family in families(settings) if family.needs_public]
        progress.emit("public-unavailable", skipped=skipped, reason=str(error).split(". ")[0])
        return None


def party_summary(accuracy: dict[int, float]) -> dict:
    """Per-party accuracies with their mean, min and max (parties sorted)."""
    values = list(accuracy.values())
    if not values:
        return {"per-party-accuracy": {}, "mean": None, "min": None, "max": None}
    return {
        "per-party-accuracy": {str(p): a for p, a in sorted(accuracy.items())},
        "mean": sum(values) / len(values), "min": min(values), "max": max(values),
    }


def candidate_names(settings: Settings, public: bool = True) -> list[str]:
    """The candidates of the `trainer` family; without a public pool, none that needs one."""
    if settings.encoder == "mixcon":  # noise-free representations: LeNet-5's own head, nothing to choose
        return ["mlp"]
    return [name for _, family in families(settings) if public or not family.needs_public
            for name in family.candidates(settings)]


def _by_family(settings: Settings, names: list[str]) -> list[tuple[Trainer, list[str]]]:
    """The named candidates grouped by the registered family that yields each, in registration order."""
    groups = [(family, [name for name in names if name in family.candidates(settings)])
              for _, family in TRAINERS.items()]
    claimed = {name for _, own in groups for name in own}
    unknown = [name for name in names if name not in claimed]
    if unknown:
        raise ValueError(f"trainer: no registered family yields {', '.join(map(repr, unknown))}")
    return [(family, own) for family, own in groups if own]


def fit(settings: Settings, union: Union, sample_shape: tuple[int, ...], num_classes: int, device: str,
        names: list[str], public: torch.Tensor | None = None, **train_options) -> Fitted:
    """Train the named candidates on `union`, each family on its own names, in one `Job`: the MLP once for both
    of its variants, the linear heads from one pass over the union's moments. `train_options` reach the MLP's
    train_classifier."""
    if settings.robust_training == "clip":
        union = clipped(union, settings.seed)
    if settings.class_prior == "uniform":
        union = balanced(union)
    job = Job(settings, union, sample_shape, num_classes, device, public, train_options)
    fitted = Fitted({})
    for family, own in _by_family(settings, names):
        for name, (model, report) in family.fit(job, own).items():
            fitted.models[name], fitted.reports[name] = model, report
    return fitted


def sample_parties(parties, k: int, seed: int, purpose: str) -> list[int]:
    """`k` of `parties` (all of them when k is 0 or covers them), drawn from the run seed for `purpose`: a round
    that needs a sample (the selection's votes, the model's return) costs the same at 30 or 10,000 parties."""
    parties = sorted(int(p) for p in parties)
    if k == 0 or k >= len(parties):
        return parties
    order = torch.randperm(len(parties), generator=generator(seed, purpose, "parties")).numpy()
    return sorted(parties[i] for i in order[:k])


@torch.no_grad()
def score_models(models: dict[str, nn.Module], x: torch.Tensor, labels: torch.Tensor, device: str = "cpu") -> dict:
    """Correct predictions of each model on (x, labels): what a party reports for selection."""
    out = {}
    for name, model in models.items():
        pred = predict(model, x, device).argmax(dim=1)
        out[name] = {"correct": int((pred == labels.long()).sum()), "n": len(labels)}
    return out


def build_model(name: str, settings: Settings, sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """An empty module of a candidate's architecture (its state dict travels in messages)."""
    ((family, _),) = _by_family(settings, [name])
    return family.build(settings, sample_shape, num_classes)


@dataclass
class Selection:
    """The central model and how it was chosen."""

    chosen: str
    model: nn.Module
    validation: dict[str, float]  # pooled party-validation accuracy per candidate (empty: nothing to choose)
    report: dict
    voters: int = 0  # parties that scored the candidates
    tried: list[str] = field(default_factory=list)  # the candidates the tuning budget drew


def train_union(
    settings: Settings,
    union: Union,
    sample_shape: tuple[int, ...],
    num_classes: int,
    device: str,
    *,
    score: Callable[[dict[str, nn.Module]], dict] | None = None,
    public: torch.Tensor | None = None,
    progress: Progress = SILENT,
    **train_options,
) -> Selection:
    """Select a trainer honestly: fit at most `tuning-budget` of the family's candidates (a seeded draw, the
    first always) on the whole union, and `score(models)` returns every voting party's counts on its own
    validation split (`score_models`); the best is the central model. `train_options` reach the MLP's fit
    (checkpoints, epoch hooks). `progress` hears the selection: its epochs, the scores, the choice.
    """
    names = draw_names(settings, candidate_names(settings, public is not None), "mixup-union")
    if not names:
        raise ValueError(f"trainer {settings.trainer!r}: no candidate can be trained without the public set")
    if len(names) > 1 and score is None:
        raise ValueError(f"trainer {settings.trainer!r} has {len(names)} candidates and nobody to score them")
    validation, scores = {}, {}
    if len(names) > 1:
        progress.emit("selection-start", candidates=len(names), **{"train-rows": len(union)})
    fitted = fit(settings, union, sample_shape, num_classes, device, names, public, **train_options)
    chosen = names[0]
    if len(names) > 1:
        scores = score(fitted.models)
        chosen, validation = pooled(scores, names, settings.selection_score)
        progress.emit("selection", chosen=chosen, voters=len(scores), scores=validation)
    return Selection(chosen, fitted.models[chosen], validation, fitted.reports.get(chosen, {}),
                     voters=len(scores), tried=names)
