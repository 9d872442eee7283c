"""What the uploads allow: the test accuracy of a genie learner that knows everything but the class means.

A central trainer learns from noisy, mixed rows; how far it is from what those rows allow is measured against a
learner that is told the clean data's second-order structure and has to learn from the uploads only what they are
for, the class means. The model is Gaussian classes with a shared covariance (their Bayes rule is linear
discriminant analysis):

- The genie knows the clean data's within-class covariance `W` and the class priors (from the union's clean rows:
  a simulation measurement, like test accuracy; no party reveals them).
- From the uploads it estimates the class means by least squares on the soft labels: a singularized-mixup row is
  x = w1 x_i + w2 x_j + w2 e with label y = w1 y_i + w2 y_j, so E[x | y] = y M for the class-mean matrix M, and
  M_hat = (Y'Y)^-1 Y'X with Cov(vec M_hat) = (Y'Y)^-1 (x) R; R, the rows' residual covariance (within-class spread
  after mixing, plus the noise), is estimated from the residuals themselves.
- It classifies a clean test input by each class's predictive density N(x; m_c, W + V_c), V_c the uncertainty
  left in class c's mean, plus the log prior: the Bayes rule when the features are Gaussian.

What it is told of the means decides what it is (`bound`):
- `genie-subspace`: the between-class covariance B of the true means (the C - 1 dimensional subspace they span,
  and their spread), as a prior N(overall mean, B); each mean is its posterior. The upper reference: with it the
  noise of M_hat outside the means' subspace costs nothing. The uploads alone do not reveal B: C noisy means in d
  dimensions span mostly their own noise when the noise's norm exceeds the separation (docs/results/upload-bound.md).
- `genie-flat`: nothing (a flat prior, the least squares means as they are). Not a bound: in hundreds of dimensions
  the plug-in under a flat prior is beaten by shrinkage (Stein), and trainers beat it.
- `clean-lda`: the true means: Gaussian discriminant analysis on clean data, the ceiling at any tau. A trainer can
  beat the genies where the clean features are far from Gaussian (an MLP on clean digits beats LDA).

`simulated` draws M_hat = M + E, E ~ N(0, K (x) R), for a union of any size (K scales as 1 / rows): how the bound
moves with the union size at a fixed tau, the parties' noise and mixing unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .seeding import generator
from .trainers.union import Moments


@dataclass
class Genie:
    """What the genie is told: the clean union's within-class covariance and class priors, and its class means (used
    only by `clean-lda`, `genie-subspace`'s prior and `simulated`'s draws)."""

    means: torch.Tensor  # (C, d)
    within: torch.Tensor  # (d, d)
    prior: torch.Tensor  # (C,)

    @classmethod
    def of(cls, x: torch.Tensor, labels: torch.Tensor, num_classes: int) -> Genie:
        x = x.reshape(len(x), -1).double()
        counts = torch.bincount(labels, minlength=num_classes).double()
        means = torch.zeros(num_classes, x.shape[1], dtype=torch.float64).index_add_(0, labels, x) / counts.clamp_min(
            1).unsqueeze(1)
        centred = x - means[labels]
        return cls(means, centred.T @ centred / max(len(x) - num_classes, 1), counts / counts.sum())

    def between(self) -> torch.Tensor:
        """The between-class covariance of the means (around their prior-weighted overall mean)."""
        centred = self.means - self.prior @ self.means
        return (centred * self.prior.unsqueeze(1)).T @ centred


@dataclass
class Regression:
    """The class means as the uploads give them: M_hat (C, d), the soft labels' Gram matrix Y'Y (C, C), the residual
    covariance R (d, d) and the rows."""

    means: torch.Tensor
    gram: torch.Tensor
    residual: torch.Tensor
    rows: int

    @classmethod
    def of(cls, x, y: np.ndarray) -> Regression:
        """From the union's second moments (one pass over an array, a tensor or the store's memory-mapped union)."""
        m = Moments.of(x, y)
        yy = m.n * m.label_gram  # the uncentred sums: least squares on the soft labels needs no intercept (rows of Y
        yx = m.n * (m.xy + torch.outer(m.mean_x, m.mean_y)).T  # sum to 1)
        xx = m.n * (m.xx + torch.outer(m.mean_x, m.mean_x))
        held = torch.diagonal(yy) > 0  # a class no row carries has no mean to estimate (NaN; never predicted)
        means = torch.full(yx.shape, float("nan"), dtype=torch.float64)
        means[held] = torch.linalg.solve(yy[held][:, held], yx[held])
        residual = (xx - yx[held].T @ means[held]) / max(m.n - int(held.sum()), 1)  # X'X - X'Y (Y'Y)^-1 Y'X, per dof
        return cls(means, yy, (residual + residual.T) / 2, m.n)

    @property
    def held(self) -> torch.Tensor:
        return torch.diagonal(self.gram) > 0

    def uncertainty(self) -> torch.Tensor:
        """K = (Y'Y)^-1 over the classes the rows carry (Cov(vec M_hat) = K (x) R); zero elsewhere."""
        held, k = self.held, torch.zeros_like(self.gram)
        k[torch.outer(held, held)] = torch.linalg.inv(self.gram[held][:, held]).flatten()
        return k

    def scaled(self, rows: int) -> Regression:
        """The same uploads' statistics for a union of `rows` rows (Y'Y grows with the rows; M_hat is kept)."""
        return Regression(self.means, self.gram * (rows / self.rows), self.residual, rows)


def _accuracy(centres: torch.Tensor, spreads: list[torch.Tensor], prior: torch.Tensor, test_x: torch.Tensor,
              test_y: torch.Tensor) -> float:
    """Test accuracy of the rule argmax_c log N(x; centres_c, spreads_c) + log prior_c."""
    x = test_x.reshape(len(test_x), -1).double()
    scores = torch.empty(len(x), len(centres), dtype=torch.float64)
    for c, (centre, spread) in enumerate(zip(centres, spreads, strict=True)):
        chol = torch.linalg.cholesky(spread)
        z = torch.linalg.solve_triangular(chol, (x - centre).T, upper=False)
        scores[:, c] = -0.5 * (z * z).sum(0) - torch.log(torch.diagonal(chol)).sum() + torch.log(prior[c])
    return float((scores.argmax(1) == test_y).double().mean())


def _jitter(matrix: torch.Tensor) -> torch.Tensor:
    """A covariance made safely positive definite (a floor of 1e-9 of its mean eigenvalue)."""
    d = matrix.shape[0]
    return matrix + 1e-9 * float(torch.trace(matrix)) / d * torch.eye(d, dtype=matrix.dtype)


def clean_lda(genie: Genie, test_x: torch.Tensor, test_y: torch.Tensor) -> float:
    """The rule with the true class means and covariance: the Gaussian ceiling, at any tau."""
    spread = _jitter(genie.within)
    return _accuracy(genie.means, [spread] * len(genie.means), genie.prior, test_x, test_y)


def genie_accuracy(genie: Genie, uploads: Regression, test_x: torch.Tensor, test_y: torch.Tensor,
                   means_prior: torch.Tensor | None = None, means: torch.Tensor | None = None) -> float:
    """The genie's test accuracy with the class means estimated from `uploads` (or `means`, a draw of them).
    `means_prior`: the covariance of the class means around their overall mean that the genie is told (None: a flat
    prior, the least squares means as they are); each mean is then its posterior under N(overall mean, means_prior)."""
    estimate = uploads.means if means is None else means
    k, held = uploads.uncertainty(), uploads.held
    overall = genie.prior @ genie.means
    centres, spreads = [], []
    for c in range(len(estimate)):
        if not held[c]:  # no row of class c: the genie cannot place it (nor can any trainer)
            centres.append(overall)
            spreads.append(_jitter(genie.within))
            continue
        uncertainty = k[c, c] * uploads.residual
        if means_prior is not None:  # posterior of mean c under N(overall, means_prior)
            gain = torch.linalg.solve(_jitter(means_prior + uncertainty), means_prior).T  # B (B + V)^-1
            centres.append(overall + gain @ (estimate[c] - overall))
            uncertainty = means_prior - gain @ means_prior
        else:
            centres.append(estimate[c])
        spreads.append(_jitter(genie.within + (uncertainty + uncertainty.T) / 2))
    return _accuracy(torch.stack(centres), spreads, torch.where(held, genie.prior, 0.0), test_x, test_y)


def simulated(genie: Genie, uploads: Regression, test_x: torch.Tensor, test_y: torch.Tensor, rows: int,
              draws: int = 3, seed: int = 0, means_prior: torch.Tensor | None = None) -> tuple[float, float]:
    """Mean and standard deviation over `draws` of the genie's accuracy for a union of `rows` rows with the same
    noise and mixing: M_hat = M + E, E ~ N(0, K (x) R), K = (Y'Y)^-1 scaled to `rows`; `means_prior` as in
    `genie_accuracy`."""
    union = uploads.scaled(rows)
    left = torch.linalg.cholesky(_jitter(union.uncertainty()))
    right = torch.linalg.cholesky(_jitter(union.residual))
    g = generator(seed, "upload-bound", rows)
    accuracies = []
    for _ in range(draws):
        noise = torch.randn(genie.means.shape, generator=g, dtype=torch.float64)
        accuracies.append(genie_accuracy(genie, union, test_x, test_y, means_prior,
                                         means=genie.means + left @ noise @ right.T))
    values = torch.tensor(accuracies)
    return float(values.mean()), float(values.std()) if draws > 1 else 0.0


def bound(genie: Genie, uploads: Regression, test_x: torch.Tensor, test_y: torch.Tensor) -> dict[str, float]:
    """Every reference for one union: the two genies on the actual uploads and the clean ceiling."""
    return {
        "genie-flat": genie_accuracy(genie, uploads, test_x, test_y),
        "genie-subspace": genie_accuracy(genie, uploads, test_x, test_y, genie.between()),
        "clean-lda": clean_lda(genie, test_x, test_y),
        "rows": uploads.rows,
    }
