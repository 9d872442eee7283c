"""Theorem 4.2: choose the noise radius r = m_f * D from a privacy target tau.

V = E||X||^2 on centred data, D = E||X - X'||, c = D^2 / (2V);
m_f = sqrt((alpha^2 / (tau (1 - alpha)^2) - 1) / (2c)), or 0 when the root is negative.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class DataStatistics:
    V: float  # mean squared norm of the centred samples
    D: float  # mean distance between two distinct samples
    c: float  # D^2 / (2V), in (0, 1] up to sampling error
    n: int


@dataclass(frozen=True)
class Calibration:
    tau: float
    alpha: float
    V: float
    D: float
    c: float
    m_f: float
    radius: float
    snr_bound: float  # alpha^2 / ((1 - alpha)^2 (1 + 2 c m_f^2)), the theorem's bound for this r
    mode: str = "theorem"

    def as_dict(self) -> dict[str, float | str]:
        return asdict(self)


def data_statistics(x: torch.Tensor, generator: torch.Generator, max_pairs: int = 20000) -> DataStatistics:
    """Estimate V and D from a party's own samples (any shape; rows are samples)."""
    flat = x.reshape(len(x), -1)  # float64 a block at a time: a whole float64 copy doubles the memory
    n = len(flat)
    if n < 2:
        raise ValueError(f"calibration needs at least 2 samples, got {n}")
    mean = flat.sum(dim=0, dtype=torch.float64).div_(n)
    V = sum((flat[s : s + 1024].double() - mean).pow(2).sum().item() for s in range(0, n, 1024)) / n
    pairs = min(max_pairs, n * (n - 1))
    i = torch.randint(0, n, (pairs,), generator=generator)
    j = (i + torch.randint(1, n, (pairs,), generator=generator)) % n  # j != i
    # pairs x d can be large: chunks through two reused buffers (fresh 100 MB temporaries per
    # chunk cost more in page faults than the arithmetic does)
    chunk = 512
    left, right = (
        torch.empty(chunk, flat.shape[1], dtype=flat.dtype),
        torch.empty(chunk, flat.shape[1], dtype=flat.dtype),
    )
    D = 0.0
    for start in range(0, pairs, chunk):
        a, b = i[start : start + chunk], j[start : start + chunk]
        first = torch.index_select(flat, 0, a, out=left[: len(a)]).double()
        D += (
            torch.linalg.vector_norm(first.sub_(torch.index_select(flat, 0, b, out=right[: len(b)])), dim=1)
            .sum()
            .item()
        )
    D /= pairs
    return DataStatistics(V=V, D=D, c=D * D / (2 * V) if V > 0 else 1.0, n=n)


def noise_multiplier(tau: float, alpha: float, c: float) -> float:
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    inner = (alpha**2 / (tau * (1 - alpha) ** 2) - 1) / (2 * c)
    return math.sqrt(inner) if inner > 0 else 0.0


def snr_bound(alpha: float, c: float, m_f: float) -> float:
    return alpha**2 / ((1 - alpha) ** 2 * (1 + 2 * c * m_f**2))


def calibrate(stats: DataStatistics, tau: float, alpha: float) -> Calibration:
    """Theorem mode: r = m_f(tau, alpha, c) * D."""
    m_f = noise_multiplier(tau, alpha, stats.c)
    return Calibration(tau, alpha, stats.V, stats.D, stats.c, m_f, m_f * stats.D, snr_bound(alpha, stats.c, m_f))


def fixed_radius(stats: DataStatistics, radius: float, tau: float, alpha: float, mode: str = "fixed") -> Calibration:
    """A radius chosen elsewhere, reported with its effective m_f = r / D and bound."""
    m_f = radius / stats.D if stats.D > 0 else 0.0
    return Calibration(tau, alpha, stats.V, stats.D, stats.c, m_f, radius, snr_bound(alpha, stats.c, m_f), mode)
