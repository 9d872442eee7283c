"""The server's learning steps: central trainers on the uploaded union, their honest selection, and
test evaluation.

Singularized mixup uploads carry noise of norm r in every row while the test inputs carry none, so
the trainer that fits the uploads best is not the one that classifies clean inputs best. The
`trainer` key picks a family; each family yields candidates, all trained on the uploaded union only:

- `mlp`: the paper's head (eq. 8). `mlp` keeps the BatchNorm statistics of the noisy union;
  `mlp-recal` the same weights with BatchNorm statistics recalibrated on clean public data in the
  mixing space (the server's Tiny-ImageNet pool, which it legitimately holds).
- `ridge`: a closed-form linear head on the uploads, one candidate per relative penalty gamma.
- `ridge-eiv`: errors in variables: the known noise covariance (sigma^2 I, from every party's
  reported r and the weight distribution) is removed from the uploads' covariance first.
- `lda`: a Gaussian discriminant: class means recovered from the soft labels (the mixing shrinks
  them towards the overall mean by a known factor), the within-class covariance from the uploads'
  covariance less the noise (as `ridge-eiv`), regularised by gamma; large gamma is the nearest
  class mean.
- `lda-public`: the same with the within-class covariance's shape taken from the public pool (the
  server's Tiny-ImageNet data in the mixing space), scaled to the uploads' within-class variance.
- `auto`: every family above.

With more than one candidate the server holds out `validation-fraction` of every party's upload
rows, trains the candidates on the rest, and asks each party to score them on the clean samples
those held-out rows encode (a party knows which of its samples each of its upload rows encodes):
the model goes back to the parties in the paper's protocol anyway, and only counts come back.
The best candidate is refit on every row. Nothing here reads the test split.

Robust training (`robust-training`), for what the plausibility checks (server/plausibility.py)
cannot decide (measured in docs/robustness.md):
- `clip` (the default): every row farther than CLIP_FACTOR x the union's median distance from its
  coordinate-wise median is pulled back onto that radius (direction kept), for every candidate: one party's
  inflated rows weigh no more than a few ordinary ones. Rows within the bound pass bit for bit, and no honest
  row was beyond it in 33 settings (benchmarks/plausibility.py), so a clean run is unchanged.
- `trim` (off unless chosen): the MLP minimises a trimmed loss, each batch without its `robust-trim` fraction of largest
  per-sample losses (rows no model fits: permuted labels, garbage).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .config import Settings
from .data import DatasetUnavailable
from .models import new_classifier
from .progress import SILENT, Progress
from .registry import TRAINERS
from .seeding import generator
from .space import public_in_space
from .training import TrainConfig, TrainReport, evaluate, predict, train, train_config

CLIP_FACTOR = 3.0  # robust-training clip: row radius bound, in medians of the union's row distances

FAMILIES = {
    "mlp": ("mlp",),
    "mlp-recal": ("mlp-recal",),
    "ridge": ("ridge",),
    "ridge-eiv": ("ridge-eiv",),
    "lda": ("lda",),
    "lda-public": ("lda-public",),
}
FAMILIES["auto"] = tuple(name for names in FAMILIES.values() for name in names)
LINEAR = ("ridge", "ridge-eiv", "lda", "lda-public")


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
    """The paper's head trained on (x, soft labels). `on_epoch(model, epoch, loss)` sees the model after each epoch."""
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


# ------------------------------------------------------------------------------------ the union
class Rows:
    """A row subset of an array-like (a tensor, an array, the store's memory-mapped union), without copying."""

    def __init__(self, data, rows: np.ndarray):
        self.data, self.rows = data, np.asarray(rows, dtype=np.int64)
        self.shape = (len(self.rows), *tuple(data.shape[1:]))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        picked = self.rows[np.asarray(index, dtype=np.int64)]
        if isinstance(self.data, torch.Tensor):
            return self.data[torch.from_numpy(picked)]
        return self.data[picked]


@dataclass
class Union:
    """The uploaded union as the central trainer sees it.

    `parties[i]` is the party of row i (rows are grouped by party, in the order uploaded);
    `noise_var` the mean per-coordinate variance of the noise in a row (sigma^2) and `mix_scale` the
    factor by which mixing scales the clean covariance (E[w1^2 + w2^2]): both from what every party
    reports with its upload and the encoder's weight distribution (`union_statistics`).
    """

    x: object
    y: np.ndarray
    parties: np.ndarray
    noise_var: float = 0.0
    mix_scale: float = 1.0

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, rows: np.ndarray) -> Union:
        rows = np.asarray(rows, dtype=np.int64)
        return Union(Rows(self.x, rows), self.y[rows], self.parties[rows], self.noise_var, self.mix_scale)

    def local_rows(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """Global row indices -> each party's own upload rows (what the party can map to its samples)."""
        out = {}
        for party in np.unique(self.parties[rows]):
            first = int(np.flatnonzero(self.parties == party)[0])
            out[int(party)] = np.sort(rows[self.parties[rows] == party]) - first
        return out


class Clipped:
    """A row view of an array-like whose rows are pulled back to at most `bound` from `center`."""

    def __init__(self, data, center: np.ndarray, bound: float):
        self.data, self.center, self.bound = data, center.astype(np.float32), float(bound)
        self.shape = tuple(data.shape)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index) -> np.ndarray:
        rows = self.data[np.asarray(index, dtype=np.int64)]
        rows = rows.numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows, dtype=np.float32)
        offset = rows - self.center
        norms = np.linalg.norm(offset.reshape(len(rows), -1), axis=1)
        far = norms > self.bound
        if far.any():  # rows within the bound are returned as they are, bit for bit
            rows = rows.copy()
            rows[far] = self.center + offset[far] * (self.bound / norms[far]).astype(np.float32).reshape(
                (-1,) + (1,) * (offset.ndim - 1))
        return rows


def clipped(union: Union, seed: int = 0, factor: float = CLIP_FACTOR, sample: int = 4096) -> Union:
    """robust-training clip: the union with rows beyond `factor` x the median distance to its centre pulled in.
    Centre and median from a seeded sample of at most `sample` rows; the centre is the coordinate-wise median
    (a mean would follow the inflated rows it is meant to bound)."""
    n = len(union)
    rows = np.sort(torch.randperm(n, generator=generator(seed, "robust-clip"))[:sample].numpy())
    picked = np.asarray(union.x[rows], dtype=np.float32).reshape(len(rows), -1)
    center = np.median(picked, axis=0)
    bound = factor * float(np.median(np.linalg.norm((picked - center).astype(np.float64), axis=1)))
    view = Clipped(union.x, center.reshape(tuple(union.x.shape[1:])), bound)
    return Union(view, union.y, union.parties, union.noise_var, union.mix_scale)


@lru_cache(maxsize=8)
def weight_moments(alpha: float, draws: int = 200_000) -> tuple[float, float]:
    """(E[w2^2], E[w1^2 + w2^2]) under Algorithm 1's weights (a uniform pair normalised to sum 1, redrawn
    until max <= alpha), by Monte Carlo with a fixed seed."""
    from .encoders import sample_weights

    w = sample_weights(draws, alpha, generator(0, "weight-moments")).double()
    return float((w[:, 1] ** 2).mean()), float((w**2).sum(dim=1).mean())


def union_statistics(reports: list[dict], dim: int, encoder: str) -> tuple[float, float]:
    """(sigma^2, mixing scale) of the union from the parties' reports (num-examples, radius, alpha),
    row-weighted: for singularized mixup the noise w2 e has sigma^2 = E[w2^2] r^2 / d per coordinate and
    the two mixed samples keep E[w1^2 + w2^2] of the clean covariance. Other encoders add no noise; their
    mixing scale is left at 1 (their class means are then shrunk, which leaves a discriminant's direction)."""
    n = sum(int(r["num-examples"]) for r in reports)
    if not n or dim <= 0 or encoder != "singularized":
        return 0.0, 1.0
    noise = scale = 0.0
    for r in reports:
        partner, mixed = weight_moments(float(r["alpha"]))
        noise += int(r["num-examples"]) * partner * float(r.get("radius", 0.0)) ** 2
        scale += int(r["num-examples"]) * mixed
    return noise / n / dim, scale / n


# ----------------------------------------------------------------------------------- candidates
@dataclass
class Moments:
    """Centred second moments of the union, accumulated in float64 blocks."""

    n: int
    mean_x: torch.Tensor  # (d,)
    mean_y: torch.Tensor  # (C,)
    xx: torch.Tensor  # (d, d) covariance
    xy: torch.Tensor  # (d, C) cross-covariance
    yy: torch.Tensor  # (C,) mean squared label per class (how unevenly the soft labels weight the rows)

    @classmethod
    def of(cls, x, y: np.ndarray, block: int = 4096) -> Moments:
        n = len(y)
        first = _flat(x[np.arange(min(block, n))])
        d, c = first.shape[1], y.shape[1]
        sx, sy, syy = (torch.zeros(k, dtype=torch.float64) for k in (d, c, c))
        sxx, sxy = torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, c, dtype=torch.float64)
        for start in range(0, n, block):
            xb = first if start == 0 else _flat(x[np.arange(start, min(start + block, n))])
            yb = torch.from_numpy(np.asarray(y[start : start + block], dtype=np.float64))
            sx += xb.sum(0)
            sy += yb.sum(0)
            syy += (yb * yb).sum(0)
            sxx.addmm_(xb.T, xb)
            sxy.addmm_(xb.T, yb)
        mx, my = sx / n, sy / n
        return cls(n, mx, my, sxx / n - torch.outer(mx, mx), sxy / n - torch.outer(mx, my), syy / n)


def _flat(rows) -> torch.Tensor:
    t = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(rows))
    return t.reshape(len(t), -1).double()


class LinearHead(nn.Module):
    """logits = flatten(x) W + b: a closed-form head as a module (evaluated, sent and scored like the MLP)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.linear = nn.Linear(weight.shape[0], weight.shape[1])
        with torch.no_grad():
            self.linear.weight.copy_(weight.T.float())
            self.linear.bias.copy_(bias.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def linear_heads(kind: str, m: Moments, gammas: tuple[float, ...], noise_var: float = 0.0, mix_scale: float = 1.0,
                 prior: torch.Tensor | None = None) -> dict[str, LinearHead]:
    """One closed-form head per relative penalty gamma (the penalty is gamma times the mean eigenvalue).

    ridge:       W = (S + penalty I)^-1 C_xy, b = mean_y - mean_x W, with S the uploads' covariance;
    ridge-eiv:   S less the known noise sigma^2 I, eigenvalues floored at 0 (errors in variables);
    lda:         logits_c = x S_w^-1 mu_c - mu_c S_w^-1 mu_c / 2 + log pi_c, with the clean class means
                 mu_c - mean = C_xy[:, c] / (pi_c * mix_scale) (soft labels pull every mixed class mean
                 towards the overall mean by mix_scale) and the within-class covariance S_w = the clean
                 total covariance (S - sigma^2 I) / mix_scale less the between-class one, floored at 0;
                 S_w is shrunk as (S_w + gamma s I) / (1 + gamma), s its mean eigenvalue, so that large
                 gamma is the nearest class mean (with the class priors) rather than the priors alone.
                 The quadratic term is debiased for the noise in the estimated means (at small tau the
                 noise in mu_c's estimate, not mu_c, would dominate mu_c S_w^-1 mu_c);
    lda-public:  S_w's shape from the public pool's covariance (`prior`), scaled to S_w's trace.
    C_xy always comes from the uploads: the noise is independent of the labels, so it is unbiased there.
    """
    d = m.xx.shape[0]
    if kind in ("ridge", "ridge-eiv"):
        cov = m.xx if kind == "ridge" else _floored(m.xx - noise_var * torch.eye(d, dtype=m.xx.dtype))
        values, vectors = torch.linalg.eigh(cov)
        values = values.clamp_min(0)
        scale, rotated = max(float(values.mean()), 1e-12), vectors.T @ m.xy
        heads = {}
        for gamma in gammas:
            weight = vectors @ (rotated / (values + gamma * scale).unsqueeze(1))
            heads[f"{kind}@{gamma:g}"] = LinearHead(weight, m.mean_y - m.mean_x @ weight)
        return heads
    if kind not in ("lda", "lda-public"):
        raise ValueError(f"trainer: unknown linear head {kind!r}")
    prior_c = m.mean_y.clamp_min(1e-12)
    means = m.xy / (prior_c * mix_scale)  # (d, C): mu_c - overall mean
    total = _floored((m.xx - noise_var * torch.eye(d, dtype=m.xx.dtype)) / mix_scale)
    within = _floored(total - (means * prior_c) @ means.T)
    if kind == "lda-public":
        if prior is None:
            raise ValueError("lda-public needs a clean covariance from public data")
        within = prior.double() * (float(torch.trace(within)) / max(float(torch.trace(prior)), 1e-12))
    values, vectors = torch.linalg.eigh(within)
    values = values.clamp_min(0)
    scale, rotated = max(float(values.mean()), 1e-12), vectors.T @ means
    # per coordinate, the variance of an estimated mean: the uploads' variance, weighted by the soft labels
    mean_var = (float(torch.trace(m.xx)) / d) * m.yy / (m.n * prior_c**2) / mix_scale**2
    heads = {}
    for gamma in gammas:
        shrunk = (values + gamma * scale) / (1 + gamma)  # shrinkage towards scale * I, keeping the total variance
        weight = vectors @ (rotated / shrunk.unsqueeze(1))  # S_w^-1 (mu_c - mean)
        quadratic = (means * weight).sum(0) - mean_var * float((1.0 / shrunk).sum())
        bias = -0.5 * quadratic + prior_c.log() - m.mean_x @ weight
        heads[f"{kind}@{gamma:g}"] = LinearHead(weight, bias)
    return heads


def _floored(cov: torch.Tensor) -> torch.Tensor:
    """The nearest positive semi-definite matrix in the eigenbasis (negative eigenvalues set to 0)."""
    values, vectors = torch.linalg.eigh((cov + cov.T) / 2)
    return (vectors * values.clamp_min(0.0)) @ vectors.T


def public_covariance(public: torch.Tensor) -> torch.Tensor:
    flat = public.reshape(len(public), -1).double()
    centred = flat - flat.mean(0)
    return centred.T @ centred / max(len(flat) - 1, 1)


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


@dataclass
class Fitted:
    models: dict[str, nn.Module]
    reports: dict[str, dict] = field(default_factory=dict)  # per candidate: how it was trained


PUBLIC = ("mlp-recal", "lda-public")  # the families that use the server's public pool


def needs_public(settings: Settings) -> bool:
    """Whether the chosen trainer family uses the server's public pool (BatchNorm recalibration, a prior)."""
    return bool(set(PUBLIC) & set(FAMILIES[settings.trainer]))


def ensure_run_features(settings: Settings) -> list[Path]:
    """Extract (or find cached) every backbone-feature split a run reads: train and test, and the public
    pool when the attacker or mixup-union's trainer uses it (`fedsmix features`, a grid's warm-up). A
    public set that is not there is skipped under `trainer: auto`, as `server_public` does at run time."""
    from .features import PUBLIC_DATASET, ensure_features

    paths = [ensure_features(settings, split) for split in ("train", "test")]
    if settings.adversary or ("mixup-union" in settings.strategies and needs_public(settings)):
        try:
            paths.append(ensure_features(settings.replace(dataset=PUBLIC_DATASET), "train"))
        except DatasetUnavailable:
            if settings.adversary or settings.trainer != "auto":
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
        progress.emit("public-unavailable", skipped=list(PUBLIC), reason=str(error).split(". ")[0])
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
    names = []
    for family in FAMILIES[settings.trainer]:
        if family in PUBLIC and not public:
            continue
        if family in LINEAR:
            names += [f"{family}@{gamma:g}" for gamma in settings.head_penalties]
        else:
            names.append(family)
    return names


def fit(settings: Settings, union: Union, sample_shape: tuple[int, ...], num_classes: int, device: str,
        names: list[str], public: torch.Tensor | None = None, **train_options) -> Fitted:
    """Train the named candidates on `union` (the MLP once for both of its variants; the linear heads from
    one pass over the union's moments). `train_options` reach the MLP's train_classifier."""
    fitted = Fitted({})
    if settings.robust_training == "clip":
        union = clipped(union, settings.seed)
    if {"mlp", "mlp-recal"} & set(names):
        cfg = train_config(settings, device)
        if settings.robust_training == "trim":
            cfg = dataclasses.replace(cfg, trim=settings.robust_trim)
        model, report = train_classifier(settings, union.x, union.y, sample_shape, num_classes, device, cfg=cfg,
                                         **train_options)
        info = {"epochs": report.epochs_run, "seconds": report.seconds, "losses": report.losses,
                "resumed-from": report.resumed_from}
        if "mlp" in names:
            fitted.models["mlp"], fitted.reports["mlp"] = model, info
        if "mlp-recal" in names:
            if public is None:
                raise ValueError("trainer mlp-recal needs the public pool in the mixing space")
            recal = copy.deepcopy(model) if "mlp" in names else model
            fitted.models["mlp-recal"] = recalibrate_batchnorm(recal, public, device)
            fitted.reports["mlp-recal"] = {**info, "batchnorm": f"recalibrated on {len(public)} public samples"}
    kinds = sorted({name.split("@")[0] for name in names if "@" in name})
    if kinds:
        m = Moments.of(union.x, union.y)
        prior = public_covariance(public) if "lda-public" in kinds and public is not None else None
        for kind in kinds:
            gammas = tuple(float(name.split("@")[1]) for name in names if name.startswith(kind + "@"))
            heads = linear_heads(kind, m, gammas, union.noise_var, union.mix_scale, prior)
            fitted.models.update(heads)
            info = {"noise-var": union.noise_var, "mix-scale": union.mix_scale}
            fitted.reports.update({name: dict(info) for name in heads})
    return fitted


def validation_rows(settings: Settings, parties: np.ndarray) -> np.ndarray:
    """The rows held out for selection: `validation-fraction` of every party's rows (at least one), seeded."""
    held = []
    for party in np.unique(parties):
        rows = np.flatnonzero(parties == party)
        k = max(1, math.ceil(settings.validation_fraction * len(rows)))
        order = torch.randperm(len(rows), generator=generator(settings.seed, int(party), "validation")).numpy()
        held.append(np.sort(rows[order[:k]]))
    return np.concatenate(held) if held else np.empty(0, dtype=np.int64)


def select(scores: dict[str, dict[str, int]], names: list[str]) -> tuple[str, dict[str, float]]:
    """The candidate with the most correct predictions pooled over the parties (ties: the earlier name)."""
    pooled = {}
    for name in names:
        correct = sum(int(s[name]["correct"]) for s in scores.values() if name in s)
        total = sum(int(s[name]["n"]) for s in scores.values() if name in s)
        pooled[name] = correct / total if total else float("nan")
    valid = [n for n in names if not math.isnan(pooled[n])]
    if not valid:
        raise ValueError("no party scored any candidate: cannot select a trainer")
    return max(valid, key=lambda n: (pooled[n], -names.index(n))), pooled


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
    if name in ("mlp", "mlp-recal"):
        return new_classifier(settings, sample_shape, num_classes)
    if name.split("@")[0] in LINEAR:
        return LinearHead(torch.zeros(math.prod(sample_shape), num_classes), torch.zeros(num_classes))
    raise ValueError(f"trainer: no model called {name!r}")


@dataclass
class Selection:
    """The central model and how it was chosen."""

    chosen: str
    model: nn.Module
    validation: dict[str, float]  # pooled party-validation accuracy per candidate (empty: nothing to choose)
    held_out: int  # upload rows held out for the selection (refit on every row afterwards)
    report: dict


def train_union(
    settings: Settings,
    union: Union,
    sample_shape: tuple[int, ...],
    num_classes: int,
    device: str,
    *,
    score: Callable[[dict[str, nn.Module], dict[int, np.ndarray]], dict] | None = None,
    public: torch.Tensor | None = None,
    progress: Progress = SILENT,
    **train_options,
) -> Selection:
    """Select a trainer honestly and fit it on the whole union.

    With several candidates: hold out `validation-fraction` of every party's rows, train the candidates
    on the rest, and `score(models, {party: its held-out upload rows})` returns every party's counts
    (`score_models` on its clean samples); the best is refit on every row. `train_options` reach the
    final MLP fit (checkpoints, epoch hooks). `progress` hears the selection: its epochs, the scores, the choice.
    """
    names = candidate_names(settings, public is not None)
    if not names:
        raise ValueError(f"trainer {settings.trainer!r}: no candidate can be trained without the public set")
    validation, held = {}, np.empty(0, dtype=np.int64)
    if len(names) > 1:
        if score is None:
            raise ValueError(f"trainer {settings.trainer!r} has {len(names)} candidates and nobody to score them")
        held = validation_rows(settings, union.parties)
        keep = np.setdiff1d(np.arange(len(union)), held)
        progress.emit("selection-start", candidates=len(names), **{"train-rows": len(keep), "held-out": len(held)})
        report = progress.epochs(settings.epochs, phase="selection")
        fitted = fit(settings, union.subset(keep), sample_shape, num_classes, device, names, public,
                     on_epoch=lambda model, epoch, loss: report(epoch, loss))
        scores = score(fitted.models, union.local_rows(held))
        chosen, validation = select(scores, names)
        progress.emit("selection", chosen=chosen, voters=len(scores), scores=validation)
        del fitted
    else:
        chosen = names[0]
    final = fit(settings, union, sample_shape, num_classes, device, [chosen], public, **train_options)
    return Selection(chosen, final.models[chosen], validation, len(held), final.reports.get(chosen, {}))


for _family, _names in FAMILIES.items():
    TRAINERS.add(_family, _names)
