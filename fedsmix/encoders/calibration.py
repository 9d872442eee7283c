"""Theorem 4.2: choose the noise radius r = m_f * D from a privacy target tau.

V = E||X||^2 on centred data, D = E||X - X'||, c = D^2 / (2V), k = alpha^2 / (tau (1 - alpha)^2) - 1.
Three calibrations (`calibration`), all r^2 = k V_eff with the SNR bound alpha^2 / ((1-alpha)^2 (1 + r^2 / V_eff)):
- scalar (the earlier version's Theorem 4.2, bounds E||S||^2 / E||I||^2): V_eff = V, i.e.
  m_f = sqrt(k / (2c)) and r = m_f D;
- directional (the published version's Theorem 2, bounds E<S,u>^2 / E<I,u>^2 for every unit u, using
  E<X,u>^2 <= V): V_eff = d V, sqrt(d) times the scalar radius;
- directional-eig (the same directional guarantee with the tightest admissible bound on E<X,u>^2, the
  largest eigenvalue lambda_max of the data covariance): V_eff = d lambda_max.
m_f = r / D is reported in every case; r = 0 when k <= 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

CALIBRATIONS = ("scalar", "directional", "directional-eig")


@dataclass(frozen=True)
class DataStatistics:
    V: float  # mean squared norm of the centred samples
    D: float  # mean distance between two distinct samples
    c: float  # D^2 / (2V), in (0, 1] up to sampling error
    n: int
    d: int = 0  # dimension of one sample
    lambda_max: float | None = None  # largest eigenvalue of the covariance (directional-eig only)

    def variance(self, calibration: str = "scalar") -> float:
        """V_eff of the calibration: r^2 = k V_eff (see the module docstring)."""
        if calibration == "scalar":
            return self.V
        if calibration == "directional":
            return self.d * self.V
        if calibration == "directional-eig":
            if self.lambda_max is None:
                raise ValueError("calibration 'directional-eig' needs the covariance's top eigenvalue (lambda_max)")
            return self.d * self.lambda_max
        raise ValueError(f"calibration: unknown {calibration!r}; allowed: {', '.join(CALIBRATIONS)}")


@dataclass(frozen=True)
class Calibration:
    tau: float
    alpha: float
    V: float
    D: float
    c: float
    m_f: float
    radius: float
    snr_bound: float  # alpha^2 / ((1 - alpha)^2 (1 + r^2 / V_eff)), the calibration's bound for this r
    mode: str = "theorem"
    calibration: str = "scalar"  # scalar | directional | directional-eig: which bound r was chosen (or judged) by
    lambda_max: float | None = None
    variance: float = 0.0  # V_eff of the calibration: V, d V or d lambda_max

    def as_dict(self) -> dict[str, float | str]:
        return asdict(self)


def data_statistics(x: torch.Tensor, generator: torch.Generator, max_pairs: int = 20000,
                    eigenvalue: bool = False, centring: str = "per-pixel") -> DataStatistics:
    """Estimate V and D (and lambda_max when asked) from a party's own samples (any shape; rows are samples).

    centring "per-pixel": V = E||X - E X||^2, the trace of the covariance (Theorem 4.2's zero-mean V);
    "global": V = E||X - m 1||^2 with one scalar mean m over all coordinates, as the paper's experiment
    code estimates it (larger where the mean image is not flat: 1.41x on MNIST, 1.03x on CIFAR-10).
    """
    flat = x.reshape(len(x), -1)  # float64 a block at a time: a whole float64 copy doubles the memory
    n = len(flat)
    if n < 2:
        raise ValueError(f"calibration needs at least 2 samples, got {n}")
    mean = flat.sum(dim=0, dtype=torch.float64).div_(n)
    if centring not in ("per-pixel", "global"):
        raise ValueError(f"variance-centring: unknown {centring!r}; allowed: per-pixel, global")
    centre = mean if centring == "per-pixel" else mean.mean()
    V = sum((flat[s : s + 1024].double() - centre).pow(2).sum().item() for s in range(0, n, 1024)) / n
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
    lam = top_eigenvalue(flat, generator, mean=mean) if eigenvalue else None
    return DataStatistics(V=V, D=D, c=D * D / (2 * V) if V > 0 else 1.0, n=n, d=flat.shape[1], lambda_max=lam)


def top_eigenvalue(flat: torch.Tensor, generator: torch.Generator, mean: torch.Tensor | None = None,
                   block: int = 4, iters: int = 30, tol: float = 1e-6) -> float:
    """lambda_max of the covariance (1/n) sum (x - mean)(x - mean)^T, by randomised subspace iteration.

    Never forms the d x d covariance: each step is two passes over the (n, d) samples (X V and X^T Y,
    the mean subtracted as a rank-one correction), so it scales to 224 px (d = 150,528) at the cost of
    a few matrix products with a `block`-column matrix. Stops when the Rayleigh quotient settles.
    """
    n, d = flat.shape
    mean = flat.sum(dim=0, dtype=torch.float64).div_(n) if mean is None else mean.double()
    q = torch.randn(d, min(block, d), generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(q)
    previous = 0.0
    for _ in range(iters):
        z = _covariance_times(flat, mean, q)
        # Rayleigh-Ritz on the current subspace: the top Ritz value never exceeds lambda_max
        small = q.T @ z
        value = float(torch.linalg.eigvalsh((small + small.T) / 2)[-1])
        q, _ = torch.linalg.qr(z)
        if abs(value - previous) <= tol * abs(value):
            break
        previous = value
    return value


def _covariance_times(flat: torch.Tensor, mean: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(1/n) (X - 1 mean^T)^T (X - 1 mean^T) q, a chunk of rows (about 4M values in float64) at a time."""
    n, d = flat.shape
    chunk = max(1, (1 << 22) // max(d, 1))
    out = torch.zeros_like(q)
    shift = mean @ q  # (k,)
    for start in range(0, n, chunk):
        rows = flat[start : start + chunk].double()
        y = rows @ q - shift  # (rows, k): (x - mean)^T q
        out += rows.T @ y - torch.outer(mean, y.sum(dim=0))
    return out / n


def noise_multiplier(tau: float, alpha: float, c: float) -> float:
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    inner = (alpha**2 / (tau * (1 - alpha) ** 2) - 1) / (2 * c)
    return math.sqrt(inner) if inner > 0 else 0.0


def snr_bound(alpha: float, c: float, m_f: float) -> float:
    """The scalar bound in Theorem 4.2's form (2 c m_f^2 = r^2 / V)."""
    return alpha**2 / ((1 - alpha) ** 2 * (1 + 2 * c * m_f**2))


def radius_bound(alpha: float, radius: float, variance: float) -> float:
    """alpha^2 / ((1 - alpha)^2 (1 + r^2 / V_eff)): the bound a radius buys under a calibration's V_eff."""
    return alpha**2 / ((1 - alpha) ** 2 * (1 + radius**2 / variance)) if variance > 0 else 0.0


def calibrate(stats: DataStatistics, tau: float, alpha: float, calibration: str = "scalar") -> Calibration:
    """Theorem mode: r^2 = k V_eff (scalar: r = m_f(tau, alpha, c) * D)."""
    variance = stats.variance(calibration)
    m_f = noise_multiplier(tau, alpha, stats.c) * math.sqrt(variance / stats.V) if stats.V > 0 else 0.0
    radius = m_f * stats.D
    return Calibration(tau, alpha, stats.V, stats.D, stats.c, m_f, radius, radius_bound(alpha, radius, variance),
                       calibration=calibration, lambda_max=stats.lambda_max, variance=variance)


def fixed_radius(stats: DataStatistics, radius: float, tau: float, alpha: float, mode: str = "fixed",
                 calibration: str = "scalar") -> Calibration:
    """A radius chosen elsewhere, reported with its effective m_f = r / D and the calibration's bound for it."""
    m_f = radius / stats.D if stats.D > 0 else 0.0
    variance = stats.variance(calibration)
    bound = radius_bound(alpha, radius, variance)
    return Calibration(tau, alpha, stats.V, stats.D, stats.c, m_f, radius, bound, mode, calibration, stats.lambda_max,
                       variance)
