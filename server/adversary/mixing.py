"""The linear system behind every mixup-style upload, as the strongest attacker sees it.

Row i of an upload is  x~_i = A_i x + p_i (+ w_i2 e_i for singularized mixup), possibly
sign-masked (InstaHide): A holds the known weights on the party's private samples, p_i the
known public images mixed into row i. Attacks share this operator, a box-constrained least
squares solver (the attacker knows the valid pixel range from the agreed normalisation) and
InstaHide's sign recovery.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Observation


@dataclass
class MixingSystem:
    """x~ = A x + public_part, rows are encodings, columns the party's private samples (flattened).

    A is kept as its k non-zeros per row (weights, sources): A x gathers, A^T r scatters.
    """

    n: int
    public_part: torch.Tensor  # (m, d): known public contribution (zeros when none or unknown)
    private_mass: torch.Tensor  # (m, 1): sum of the private weights of each row
    weights: torch.Tensor  # (m, k) private weights, 0 on public slots
    sources: torch.Tensor  # (m, k) private rows, -1 on public slots
    row_power: torch.Tensor | None = None  # (m,) sum of squared private weights per row, where not sum(weights^2)

    def power(self) -> torch.Tensor:
        """(m,) each row's sum of squared private weights (the interference an appearance sees)."""
        return self.weights.pow(2).sum(dim=1) if self.row_power is None else self.row_power

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.sources), self.n)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        """A x for x of shape (n, d)."""
        rows = self.sources.clamp_min(0)  # public slots carry weight 0
        out = self.weights[:, :1] * x[rows[:, 0]]
        for j in range(1, rows.shape[1]):
            out += self.weights[:, j : j + 1] * x[rows[:, j]]
        return out

    def unmix(self, r: torch.Tensor) -> torch.Tensor:
        """A^T r for r of shape (m, d)."""
        rows = self.sources.clamp_min(0)
        out = torch.zeros(self.n, r.shape[1], dtype=r.dtype)
        for j in range(rows.shape[1]):
            out.index_add_(0, rows[:, j], self.weights[:, j : j + 1] * r)
        return out

    def lipschitz(self, iters: int = 50) -> float:
        """||A||_2^2 by power iteration: the step size of the gradient solver."""
        n = self.n
        v = torch.ones(n, 1, dtype=self.weights.dtype) / n**0.5
        value = 1.0
        for _ in range(iters):
            u = self.unmix(self.mix(v))
            value = float(u.norm())
            v = u / max(value, 1e-30)
        return value


def mixing_system(obs: Observation, dtype: torch.dtype = torch.float64) -> MixingSystem:
    """Build A (and the public part) from the observation's known weights and sources."""
    if obs.weights is None or obs.sources is None:
        raise ValueError("this attack needs the mixing weights and sources (the strongest attacker's knowledge)")
    m, k = obs.sources.shape
    if len(obs.x_tilde) != m:
        raise ValueError(f"observation: {len(obs.x_tilde)} encodings but {m} rows of sources")
    private = obs.sources >= 0
    if int(obs.sources.max()) >= obs.n_private:
        raise ValueError(f"observation: a source index {int(obs.sources.max())} exceeds n_private={obs.n_private}")
    weights = torch.where(private, obs.weights.to(dtype), torch.zeros((), dtype=dtype))
    d = obs.x_tilde[0].numel()
    public_part = torch.zeros(m, d, dtype=dtype)
    if obs.public is not None and obs.public_sources is not None:
        flat = obs.public.reshape(len(obs.public), -1)
        for j in range(k):
            slot = obs.public_sources[:, j]
            used = slot >= 0
            public_part[used] += obs.weights[used, j].to(dtype).unsqueeze(1) * flat[slot[used]].to(dtype)
    mass, power = weights.sum(dim=1, keepdim=True), None
    if obs.extras.get("membership"):  # recovered InstaHide membership: rows list overlapping per-encoding
        mass = obs.extras["row-mass"].to(dtype).reshape(m, 1)  # clusters, so their weights do not add up to
        power = obs.extras["row-power"].to(dtype).reshape(m)  # the row's; the recovery estimated both
    return MixingSystem(obs.n_private, public_part, mass, weights, obs.sources.clone(), power)


def flat_bounds(obs: Observation, d: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-coordinate bounds (1, d); unbounded when the observation carries none (feature vectors)."""
    shape = (1, *obs.sample_shape)
    lo = (
        obs.lo.expand(shape).reshape(1, d).to(dtype)
        if obs.lo is not None
        else torch.full((1, d), -torch.inf, dtype=dtype)
    )
    hi = (
        obs.hi.expand(shape).reshape(1, d).to(dtype)
        if obs.hi is not None
        else torch.full((1, d), torch.inf, dtype=dtype)
    )
    return lo, hi


@dataclass
class LinearProblem:
    """What every known-mixing solver starts from: the system, the observed rows, the valid box."""

    system: MixingSystem
    y: torch.Tensor  # (m, d) observed uploads, float64 (sign-masked when `masked`)
    lo: torch.Tensor  # (1, d)
    hi: torch.Tensor  # (1, d)
    masked: bool
    start: torch.Tensor  # (1, d) the data-free guess (public mean, else 0), inside the box


def linear_problem(obs: Observation, masked: bool | None = None) -> LinearProblem:
    """`masked=None`: as the observation says (InstaHide's sign masks)."""
    system = mixing_system(obs)
    d = obs.x_tilde[0].numel()
    lo, hi = flat_bounds(obs, d)
    return LinearProblem(
        system=system,
        y=obs.x_tilde.reshape(system.shape[0], d).to(torch.float64),
        lo=lo,
        hi=hi,
        masked=bool(obs.extras.get("masked", False)) if masked is None else masked,
        start=prior_mean(obs, d).clamp(lo, hi),
    )


def prior_mean(obs: Observation, d: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The attacker's data-free starting point: the public mean sample (the trivial guess), else 0."""
    mean = obs.extras.get("prior_mean")
    if mean is None:
        return torch.zeros(1, d, dtype=dtype)
    return mean.reshape(1, d).to(dtype)


def upload_mean(residual: torch.Tensor, mass: torch.Tensor, noise2: torch.Tensor, prior: torch.Tensor,
                basis: torch.Tensor | None = None) -> torch.Tensor:
    """The private samples' mean read off the uploads (residual = A x + noise, row i carrying mass_i of private
    weight and noise of squared norm noise2_i), shrunk towards the public prior as far as noise corrupts it: what
    averaging many encodings teaches about the data set, not about any one sample.

    Without `basis` the shift from the prior is judged whole (`_judged_whole`). With an orthonormal `basis` (d, k),
    such as the public prior's principal directions, the shift's coordinates along it may instead be judged one by
    one (kept above the universal threshold sqrt(2 ln k) noise deviations, then shrunk; the rest of the shift,
    outside the basis, judged whole), whichever of the two rules has the lower estimated risk on this upload: a
    shift that lives in a few smooth directions (MNIST's black background against grey public images) is read off
    even where, spread over all d coordinates, the noise buries it, and a shift spread evenly is still shrunk
    whole."""
    total = mass.sum().clamp_min(1e-12)
    mean = residual.sum(dim=0, keepdim=True) / total
    d = mean.shape[1]
    error = float(noise2.sum() / total**2)  # E||noise in the mean||^2, spread evenly over the d coordinates
    shift = mean - prior
    whole, whole_risk = _judged_whole(shift, error, d)
    if basis is None:
        return prior + whole
    k = basis.shape[1]
    coefficients = shift @ basis  # (1, k); the noise in each has variance error / d
    variance, energy = error / d, coefficients.pow(2)
    keep = energy > 2 * math.log(max(k, 2)) * variance
    kept = torch.where(keep, coefficients * (1 - variance / energy.clamp_min(1e-300)), 0.0)
    # estimated risk: the noise of each kept coordinate, and the unbiased energy of the dropped ones
    risk = float(keep.sum()) * variance + max(float((energy - variance)[~keep].sum()), 0.0)
    split = kept @ basis.T
    if k < d:
        rest, rest_risk = _judged_whole(shift - coefficients @ basis.T, error * (d - k) / d, d - k)
        split, risk = split + rest, risk + rest_risk
    return prior + (split if risk < whole_risk else whole)


def _judged_whole(shift: torch.Tensor, error: float, dims: int) -> tuple[torch.Tensor, float]:
    """A shift spread over `dims` dimensions whose noise has expected energy `error`: zero unless its energy
    exceeds the noise's by 3 standard deviations of the noise's own energy (about error * sqrt(2 / dims)), else
    shrunk by signal / (signal + noise); with the estimate's expected squared error (plug-in)."""
    signal = float(shift.pow(2).sum()) - error
    if signal <= 3 * error * (2 / max(dims, 1)) ** 0.5:
        return torch.zeros_like(shift), max(signal, 0.0)
    return signal / (signal + error) * shift, signal * error / (signal + error)


def box_least_squares(
    system: MixingSystem,
    target: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    x0: torch.Tensor,
    iters: int = 300,
    lipschitz: float | None = None,
) -> torch.Tensor:
    """argmin ||A x - target||^2 over lo <= x <= hi, by FISTA (accelerated projected gradient).

    The box is what keeps the solve stable: A of k-image mixing is square and badly conditioned
    (smallest singular value ~1e-3 at n = 500), so W^-1 amplifies any error in the target by
    orders of magnitude, while the projected iterates cannot leave the valid pixel range.
    """
    step = 1.0 / (lipschitz or system.lipschitz())
    x = x0.clamp(lo, hi)
    z, t = x.clone(), 1.0
    for _ in range(iters):
        grad = system.unmix(system.mix(z) - target)
        x_next = (z - step * grad).clamp(lo, hi)
        t_next = (1 + (1 + 4 * t * t) ** 0.5) / 2
        z = x_next + ((t - 1) / t_next) * (x_next - x)
        x, t = x_next, t_next
    return x
