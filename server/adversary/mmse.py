"""The strongest linear attacker: the linear-Gaussian MMSE estimate with known mixing and radius.

Model: private samples x_i ~ N(mu, Sigma) i.i.d. (the prior, fitted on public data), the upload
X~ = W X + E with E_i = w_i2 e_i and Cov(e_i) = (r^2 / d) I (uniform on the r-sphere). Along one
cycle of the permutation, Y' = W^-1 (X~ - W 1 mu^T) = (X - mu) + Z with Cov(Z) = C (x) I,
C = W^-1 diag(w_2^2 r^2 / d) W^-T. With C = U diag(lambda) U^T and Sigma = V diag(gamma) V^T the
posterior is diagonal in U (x) V: mean coefficient gamma / (gamma + lambda), variance
gamma lambda / (gamma + lambda). That is exact per cycle, never iterates, and stays exact at
r = 0 (then it is W^-1 X~). The estimate depends on the data only through first and second
moments, so its expected error is the analytic posterior error even though e_i is not Gaussian,
and it can never do worse than the prior mean (the trivial guess) in expectation.

The eigendecompositions cost O(L^3) per cycle (half a minute at L = 3,000 on one CPU core, and a
random permutation's longest cycle holds about 62 % of a party). `reconstruct` therefore computes
the same posterior mean without them: per prior direction of variance g, c_hat = g W^T (g W W^T +
N)^-1 o, where W W^T is symmetric periodic tridiagonal, so each solve is a banded Cholesky plus one
Sherman-Morrison correction, O(L) per direction. The eigendecompositions remain for
`posterior_error`, the analytic error, and as the reference the fast mean is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.linalg import solveh_banded

from fedsmix.metrics import cycles

from .base import Attack, Observation
from .linear import _bound
from .mixing import upload_mean

DENSE_LIMIT = 8192  # up to this many dimensions the sample covariance is eigendecomposed exactly
SMALL_CYCLE = 16  # cycles up to this length are solved densely (fixed points and 2-cycles included)


@dataclass
class GaussianPrior:
    """N(mean, V diag(variances) V^T + residual (I - V V^T)): low rank plus an isotropic diagonal.

    Probabilistic PCA's maximum-likelihood form: the top `rank` eigenpairs of the sample
    covariance, and the mean of the other eigenvalues on the orthogonal complement.
    With rank >= d it is the full sample covariance.
    """

    mean: torch.Tensor  # (d,) float64
    basis: torch.Tensor  # (d, k) orthonormal columns
    variances: torch.Tensor  # (k,)
    residual: float  # variance of every direction orthogonal to the basis
    shape: tuple[int, ...]

    @property
    def dim(self) -> int:
        return len(self.mean)

    @property
    def rank(self) -> int:
        return self.basis.shape[1]

    def total_variance(self) -> float:
        """E||x - mean||^2: the trivial guess's expected squared error under the prior."""
        return float(self.variances.sum()) + self.residual * (self.dim - self.rank)

    @classmethod
    def fit(cls, samples: torch.Tensor, rank: int = 256) -> GaussianPrior:
        flat = samples.reshape(len(samples), -1).double()
        n, d = flat.shape
        if n < 2:
            raise ValueError(f"prior: need at least 2 public samples, got {n}")
        mean = flat.mean(dim=0)
        centred = (flat - mean).float()
        if d <= DENSE_LIMIT:
            cov = (centred.T @ centred).double() / (n - 1)
            values, vectors = torch.linalg.eigh(cov)
            values, vectors = values.flip(0).clamp_min(0), vectors.flip(1)
            k = min(rank, d)
            residual = float(values[k:].mean()) if k < d else 0.0
        else:  # too large to eigendecompose: randomised SVD of the centred samples
            k = min(rank, n - 1, d)
            _, s, v = torch.svd_lowrank(centred, q=min(k + 16, n, d), niter=4)
            values, vectors = (s.double() ** 2 / (n - 1)), v.double()
            total = float(centred.double().pow(2).sum()) / (n - 1)
            residual = max(total - float(values[:k].sum()), 0.0) / max(d - k, 1)
        return cls(mean, vectors[:, :k].contiguous(), values[:k].contiguous(), residual, tuple(samples.shape[1:]))

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Draws from the prior itself (property tests)."""
        z = torch.randn(n, self.rank, generator=generator, dtype=torch.float64)
        white = torch.randn(n, self.dim, generator=generator, dtype=torch.float64)
        inside = (z * self.variances.sqrt()) @ self.basis.T
        outside = (white - (white @ self.basis) @ self.basis.T) * self.residual**0.5
        return (self.mean + inside + outside).reshape(n, *self.shape)

    def to(self, device) -> GaussianPrior:
        return GaussianPrior(
            self.mean.to(device), self.basis.to(device), self.variances.to(device), self.residual, self.shape
        )


def permutation_of(obs: Observation, attack: str) -> torch.Tensor:
    """The pairing pi of singularized mixup, or a clear error for any other mixing structure."""
    if obs.weights is None or obs.sources is None:
        raise ValueError(f"{attack}: the threat model needs the mixing matrix (observation.weights and .sources)")
    n = obs.n_private
    src = obs.sources
    if src.shape != (n, 2) or len(obs.x_tilde) != n or not torch.equal(src[:, 0].cpu(), torch.arange(n)):
        raise ValueError(
            f"{attack}: needs singularized mixup's structure (one encoding per sample, led by that sample, and one "
            f"partner): got sources {tuple(src.shape)} for {n} private samples and {len(obs.x_tilde)} encodings"
        )
    perm = src[:, 1].cpu()
    if not torch.equal(perm.sort().values, torch.arange(n)):
        raise ValueError(f"{attack}: the partners (sources[:, 1]) are not a permutation of the {n} samples")
    if obs.radius is None:
        raise ValueError(f"{attack}: the threat model needs the noise radius (observation.radius)")
    return perm


class MMSEAttack(Attack):
    name = "mmse"
    threat_model = "knows W and the radius; Gaussian prior (mean, low rank + diagonal covariance) from public data"

    def __init__(self, prior: GaussianPrior, clamp: bool = True):
        self.prior = prior
        self.clamp = clamp  # projecting onto the valid box can only move the estimate closer to the truth

    def reconstruct(self, observation: Observation) -> torch.Tensor:
        mean = self.posterior_mean(observation)
        lo, hi = _bound(observation.lo, mean), _bound(observation.hi, mean)
        if self.clamp and (lo is not None or hi is not None):
            mean = mean.clamp(lo, hi)
        return mean

    def posterior_error(self, observation: Observation) -> torch.Tensor:
        """E||x_i - x_hat_i||^2 under the model, per sample (before clamping)."""
        return self.posterior(observation, want_mean=False)[1]

    def _setup(self, obs: Observation) -> tuple[torch.Tensor, int, int, GaussianPrior, torch.Tensor]:
        """The permutation, sizes, the prior on the upload's device and the weights in float64."""
        perm = permutation_of(obs, self.name)
        n, d = obs.n_private, int(np.prod(obs.sample_shape))
        if d != self.prior.dim:
            raise ValueError(
                f"{self.name}: prior has {self.prior.dim} dimensions, the samples {d} ({obs.sample_shape})"
            )
        device = obs.x_tilde.device
        return perm, n, d, self.prior.to(device), obs.weights.to(device=device, dtype=torch.float64)

    @torch.no_grad()
    def posterior_mean(self, obs: Observation) -> torch.Tensor:
        """E[x_i | upload] for every sample (before clamping): `posterior`'s mean in O(L (k + d)) per cycle.

        The coefficients of one cycle's samples along a prior direction of variance g are N(0, g I)
        a priori and observed as W c + noise with covariance N = diag(w_2^2 r^2 / d), so
        c_hat = g W^T (g W W^T + N)^-1 o: the k basis directions one by one, then the isotropic rest
        (all d coordinates of the residual at once). W need not be invertible.
        """
        perm, n, d, prior, w = self._setup(obs)
        device = obs.x_tilde.device
        y0 = obs.x_tilde.reshape(n, d).to(torch.float64) - w.sum(dim=1, keepdim=True) * prior.mean
        inside = (y0 @ prior.basis).cpu().numpy()  # (n, k): coordinates along the prior's basis
        outside = (y0 - (y0 @ prior.basis) @ prior.basis.T).cpu().numpy()  # (n, d): the isotropic rest
        del y0
        w = w.cpu().numpy()
        noise_var = w[:, 1] ** 2 * (float(obs.radius) ** 2 / d)
        gamma = prior.variances.cpu().numpy()
        inside_hat, outside_hat = np.empty_like(inside), np.empty_like(outside)
        for cycle in cycles(perm.numpy()):
            w1, w2, nv = w[cycle, 0], w[cycle, 1], noise_var[cycle]
            for j, g in enumerate(gamma):
                inside_hat[cycle, j] = _cycle_posterior_mean(float(g), w1, w2, nv, inside[cycle, j])
            outside_hat[cycle] = _cycle_posterior_mean(prior.residual, w1, w2, nv, outside[cycle])
        basis = prior.basis.cpu().numpy()
        mean = torch.from_numpy(inside_hat @ basis.T + outside_hat).to(device) + prior.mean
        dtype = obs.x_tilde.dtype if obs.x_tilde.is_floating_point() else torch.float32
        return mean.reshape(n, *obs.sample_shape).to(dtype)

    @torch.no_grad()
    def posterior(self, obs: Observation, want_mean: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        perm, n, d, prior, w = self._setup(obs)
        device = obs.x_tilde.device
        noise_var = w[:, 1] ** 2 * (float(obs.radius) ** 2 / d)
        gamma, gamma_perp, k = prior.variances, prior.residual, prior.rank
        y0 = None
        if want_mean:
            y0 = obs.x_tilde.reshape(n, d).to(torch.float64) - w.sum(dim=1, keepdim=True) * prior.mean
        mean = torch.empty(n, d, dtype=torch.float64, device=device) if want_mean else None
        error = torch.empty(n, dtype=torch.float64, device=device)
        for cycle in cycles(perm.numpy()):
            idx = torch.from_numpy(cycle).to(device)
            size = len(cycle)
            W = torch.diag(w[idx, 0])
            W[torch.arange(size), torch.roll(torch.arange(size), -1)] += w[
                idx, 1
            ]  # row m mixes i_m and i_{m+1} = pi(i_m)
            W_inv = torch.linalg.inv(W)
            C = (W_inv * noise_var[idx]) @ W_inv.T
            lam, U = torch.linalg.eigh((C + C.T) / 2)
            lam = lam.clamp_min(0)
            shrink = _ratio(gamma[None, :], lam[:, None])  # (L, k): gamma / (gamma + lambda)
            shrink_perp = _ratio(torch.tensor(gamma_perp, dtype=lam.dtype, device=device), lam)  # (L,)
            g_perp = torch.tensor(gamma_perp, dtype=lam.dtype, device=device)
            per_direction = _posterior_var(gamma[None, :], lam[:, None]).sum(dim=1) + (d - k) * _posterior_var(
                g_perp, lam
            )
            error[idx] = (U**2) @ per_direction
            if want_mean:
                y = W_inv @ y0[idx]  # (L, d): X - mu + Z
                inside = y @ prior.basis  # (L, k)
                outside = y - inside @ prior.basis.T
                inside_hat = U @ ((U.T @ inside) * shrink)
                outside_hat = U @ ((U.T @ outside) * shrink_perp[:, None])
                mean[idx] = inside_hat @ prior.basis.T + outside_hat + prior.mean
        if mean is not None:
            mean = mean.reshape(n, *obs.sample_shape).to(
                obs.x_tilde.dtype if obs.x_tilde.is_floating_point() else torch.float32
            )
        return mean, error


def _cycle_posterior_mean(
    g: float, w1: np.ndarray, w2: np.ndarray, noise_var: np.ndarray, obs: np.ndarray
) -> np.ndarray:
    """g W^T (g W W^T + N)^-1 obs for one cycle: W = diag(w1) + w2 on the cyclic superdiagonal
    (row m mixes the cycle's samples m and m + 1), N = diag(noise_var); obs is (L,) or (L, columns)."""
    if g <= 0:
        return np.zeros_like(obs)
    L = len(w1)
    rhs = obs.reshape(L, -1)
    diag = g * (w1**2 + w2**2) + noise_var
    if L <= SMALL_CYCLE:  # dense; also covers a fixed point (L = 1) and a 2-cycle, whose corners coincide
        W = np.diag(w1)
        W[np.arange(L), (np.arange(L) + 1) % L] += w2
        M = g * W @ W.T + np.diag(noise_var)
        z = np.linalg.lstsq(M, rhs, rcond=None)[0] if noise_var.min() <= 0 else np.linalg.solve(M, rhs)
        return (g * W.T @ z).reshape(obs.shape)
    off = g * w2[:-1] * w1[1:]  # M[m, m+1]
    corner = g * w2[-1] * w1[0]  # M[L-1, 0]
    # M = B - u u^T / diag[0] with B tridiagonal (and SPD: M plus a PSD rank one), u = (diag[0], 0, ..., -corner)
    banded = np.zeros((2, L))
    banded[0, 1:] = off
    banded[1] = diag
    banded[1, 0] += diag[0]
    banded[1, -1] += corner**2 / diag[0]
    u = np.zeros(L)
    u[0], u[-1] = diag[0], -corner
    try:
        solved = solveh_banded(banded, np.column_stack([rhs, u]), check_finite=False)
    except np.linalg.LinAlgError:  # W singular and no noise (measure zero): least squares, densely
        W = np.diag(w1)
        W[np.arange(L), (np.arange(L) + 1) % L] += w2
        z = np.linalg.lstsq(g * W @ W.T + np.diag(noise_var), rhs, rcond=None)[0]
    else:
        z_rhs, z_u = solved[:, :-1], solved[:, -1]
        z = z_rhs + np.outer(z_u, u @ z_rhs) / (diag[0] - u @ z_u)  # Sherman-Morrison
    wt_z = w1[:, None] * z + np.roll(w2[:, None] * z, 1, axis=0)  # W^T z: row m gets w1_m z_m + w2_{m-1} z_{m-1}
    return (g * wt_z).reshape(obs.shape)


def _ratio(gamma: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """gamma / (gamma + lambda), and 1 where both vanish (no prior spread, no noise: trust the data)."""
    total = gamma + lam
    return torch.where(total > 0, gamma / total.clamp_min(1e-300), torch.ones_like(total))


def _posterior_var(gamma: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """gamma lambda / (gamma + lambda), written so that neither a huge gamma nor lambda = 0 cancels."""
    total = gamma + lam
    return torch.where(total > 0, gamma * lam / total.clamp_min(1e-300), torch.zeros_like(total))


class UploadCentredMMSE(MMSEAttack):
    """The MMSE attack with its prior's mean read off the upload itself (empirical Bayes): the public prior's
    covariance, centred on the private samples' mean that the encodings give away on average (each row carries
    w_1 + w_2 of it; the noise averages out over n rows, and the estimate is shrunk towards the public mean as far
    as it does not). Where the public data differ from the private (grey Tiny-ImageNet against MNIST's black
    backgrounds) a public-centred prior starts every estimate far from the data set."""

    name = "mmse-centred"
    threat_model = ("knows W and the radius; Gaussian prior: covariance from public data, mean re-estimated from "
                    "the upload")

    def _setup(self, obs: Observation) -> tuple[torch.Tensor, int, int, GaussianPrior, torch.Tensor]:
        perm, n, d, prior, w = super()._setup(obs)
        noise2 = (w[:, 1] * float(obs.radius)).pow(2)  # ||w_i2 e_i||^2 with ||e_i|| = r
        mean = upload_mean(obs.x_tilde.reshape(n, d).to(torch.float64), w.sum(dim=1, keepdim=True), noise2,
                           prior.mean.reshape(1, d), basis=prior.basis)  # judged along the prior's directions
        return perm, n, d, replace(prior, mean=mean.reshape(d)), w
