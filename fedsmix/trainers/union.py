"""The uploaded union as the central trainers see it: row views (a held-out split, robust clipping) that copy
nothing, the noise and mixing statistics the parties report, and its second moments."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import torch

from ..seeding import generator

CLIP_FACTOR = 3.0  # robust-training clip: row radius bound, in medians of the union's row distances


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
    class_weights: np.ndarray | None = None  # (C,) the class prior's reweighting (`balanced`); None: the uploads'

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, rows: np.ndarray) -> Union:
        rows = np.asarray(rows, dtype=np.int64)
        return replace(self, x=Rows(self.x, rows), y=self.y[rows], parties=self.parties[rows])

    def training_labels(self) -> np.ndarray:
        """The soft labels a loss-trained family fits: each class's entries times its class weight, if any."""
        if self.class_weights is None:
            return self.y
        return (np.asarray(self.y, dtype=np.float64) * self.class_weights).astype(np.float32)

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
    return replace(union, x=Clipped(union.x, center.reshape(tuple(union.x.shape[1:])), bound))


def balanced(union: Union) -> Union:
    """class-prior uniform: the union with `class_weights` set, f_c = (1 / C) / pi_c for pi_c the union's label share
    of class c (a class absent from the union keeps weight 0), so that every trainer learns a uniform class prior,
    which no party can move, and nothing else: the MLP minimises the class-balanced soft cross-entropy
    (`training_labels`), a closed-form head's scores are rescaled as if fitted to the reweighted labels (ridge: the
    scores times f_c; lda: log f_c added to the log-prior term). The rows and their labels are the union's."""
    mass = np.asarray(union.y, dtype=np.float64).sum(axis=0)
    held = mass > 0
    weights = np.zeros_like(mass)
    weights[held] = mass[held].sum() / held.sum() / mass[held]
    return replace(union, class_weights=weights)


@lru_cache(maxsize=8)
def _weight_draws(alpha: float, draws: int = 200_000) -> torch.Tensor:
    """Algorithm 1's weights (a uniform pair normalised to sum 1, redrawn until max <= alpha), a fixed-seed
    Monte Carlo sample shared by the moments below."""
    from ..encoders import sample_weights

    return sample_weights(draws, alpha, generator(0, "weight-moments")).double()


@lru_cache(maxsize=8)
def weight_moments(alpha: float) -> tuple[float, float]:
    """(E[w2^2], E[w1^2 + w2^2]) under Algorithm 1's weights, by Monte Carlo with a fixed seed."""
    w = _weight_draws(alpha)
    return float((w[:, 1] ** 2).mean()), float((w**2).sum(dim=1).mean())


@lru_cache(maxsize=8)
def weight_spread(alpha: float) -> tuple[float, float, float]:
    """(Var g, Var w2^2, Cov(g, w2^2)) with g = (1 - w2)^2 + w2^2 = w1^2 + w2^2, under Algorithm 1's weights, by
    Monte Carlo with a fixed seed: how much a row's expected squared norm varies with its weights."""
    w = _weight_draws(alpha)[:, 1].numpy()
    g, square = (1 - w) ** 2 + w**2, w**2
    return float(g.var()), float(square.var()), float(np.cov(g, square)[0, 1])


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


@dataclass
class Moments:
    """Centred second moments of the union, accumulated in float64 blocks."""

    n: int
    mean_x: torch.Tensor  # (d,)
    mean_y: torch.Tensor  # (C,)
    xx: torch.Tensor  # (d, d) covariance
    xy: torch.Tensor  # (d, C) cross-covariance
    label_gram: torch.Tensor  # (C, C) Y'Y / n, uncentred

    @property
    def yy(self) -> torch.Tensor:
        """(C,) mean squared label per class (how unevenly the soft labels weight the rows): label_gram's diagonal."""
        return torch.diagonal(self.label_gram)

    @classmethod
    def of(cls, x, y: np.ndarray, block: int = 4096) -> Moments:
        n = len(y)
        first = _flat(x[np.arange(min(block, n))])
        d, c = first.shape[1], y.shape[1]
        sx, sy = (torch.zeros(k, dtype=torch.float64) for k in (d, c))
        sxx, sxy = torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, c, dtype=torch.float64)
        syy = torch.zeros(c, c, dtype=torch.float64)
        for start in range(0, n, block):
            xb = first if start == 0 else _flat(x[np.arange(start, min(start + block, n))])
            yb = torch.from_numpy(np.asarray(y[start : start + block], dtype=np.float64))
            sx += xb.sum(0)
            sy += yb.sum(0)
            syy.addmm_(yb.T, yb)
            sxx.addmm_(xb.T, xb)
            sxy.addmm_(xb.T, yb)
        mx, my = sx / n, sy / n
        return cls(n, mx, my, sxx / n - torch.outer(mx, mx), sxy / n - torch.outer(mx, my), syy / n)


def _flat(rows) -> torch.Tensor:
    t = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(rows))
    return t.reshape(len(t), -1).double()
