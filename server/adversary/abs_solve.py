"""The strongest attacker's solve against mixup and InstaHide (the last step of Carlini et al.).

Known: which private samples (and public images) went into every encoding and their weights.
Plain mixup is then a linear system, x~ = A x + p, solved by box-constrained least squares.

InstaHide uploads sigma * (A x + p) with a fresh sign per pixel, so only |x~| is usable. Where the
mask bites depends on the normalisation InstaHide mixes in. In a non-negative space (pixels in
[0, 1]) every mixture is >= 0, |x~| = A x + p and the mask hides nothing: the solve is the linear
one, exactly. In the centred space fedsmix (and InstaHide's code) mixes in, |x~| says how far the
mixture lies from the data mean, not on which side: one lost bit per pixel and encoding. The bit
is recovered where the valid pixel range allows only one side (the candidate -|x~| - p would be
darker than black: the mixture is bright) or where a candidate sits exactly on the range's edge
(four black backgrounds mix to exactly black: an atom a continuous mixture never hits from the
other side); where the range is clearly skewed (MNIST's mean sits near black) the darker candidate
is the likelier one; the remaining bits are re-estimated from the current solution, alternating
with the solve (error reduction, as in phase retrieval). With every sign right the solve is
exact; the residual ambiguity is a per-pixel sign shared by all samples (x and -x give the same
|x~| in inside-dataset mode), which the box resolves on MNIST (-x would leave the range) but
often not on CIFAR-10, whose normalised range is nearly symmetric.
"""

from __future__ import annotations

import torch

from .base import Attack, Observation
from .mixing import MixingSystem, box_least_squares, linear_problem

#: |(hi + lo) / (hi - lo)| above which the range itself picks the likelier sign (MNIST: 0.74; CIFAR-10: <= 0.11)
SKEW = 0.25


def recover_signs(
    system: MixingSystem,
    magnitude: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    guess: torch.Tensor,
    eps: float = torch.finfo(torch.float32).eps,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Signs of the mixtures A x + p given |A x + p|: forced by the range where possible.

    Where both signs are feasible, the maximum-entropy pixel prior that the normalisation implies
    (zero mean on [lo, hi]) decides when the range is clearly skewed: on MNIST the mean sits near
    black, so the darker candidate is the likelier one. Otherwise the sign of `guess`, a current
    estimate of A x + p, stands in. `eps` is the upload's precision (float32 or float16): a
    magnitude within a few eps of the range's edge counts as on it. Returns (signs, determined).
    """
    p, mass = system.public_part, system.private_mass
    finite = torch.isfinite(hi - lo)
    scale = float(torch.maximum(hi.abs(), lo.abs())[finite].max()) if finite.any() else float(magnitude.max())
    tol = 16 * eps * scale
    q_lo = torch.where(mass > 0, mass * lo, torch.zeros((), dtype=lo.dtype))  # the private part lies in
    q_hi = torch.where(mass > 0, mass * hi, torch.zeros((), dtype=hi.dtype))  # [mass * lo, mass * hi]
    plus, minus = magnitude - p, -magnitude - p  # the private part under each sign
    plus_ok = (plus >= q_lo - tol) & (plus <= q_hi + tol)
    minus_ok = (minus >= q_lo - tol) & (minus <= q_hi + tol)
    on_floor = (minus - q_lo).abs() <= tol  # an all-dark mixture: an atom, not a coincidence
    on_ceiling = (plus - q_hi).abs() <= tol
    signs = torch.sign(guess)
    signs[signs == 0] = 1.0
    skew = (hi + lo) / (hi - lo)  # > 0: the data mean sits near the dark end of the range (MNIST)
    signs = torch.where(skew > SKEW, -1.0, torch.where(skew < -SKEW, 1.0, signs)).expand_as(signs).clone()
    signs = torch.where(plus_ok & ~minus_ok, 1.0, signs)
    signs = torch.where(minus_ok & ~plus_ok, -1.0, signs)
    signs = torch.where(on_floor & ~on_ceiling, -1.0, signs)
    signs = torch.where(on_ceiling & ~on_floor, 1.0, signs)
    zero = magnitude <= tol  # the sign of ~0 does not matter
    determined = (plus_ok ^ minus_ok) | (on_floor ^ on_ceiling) | zero
    return signs, determined


class AbsSolve(Attack):
    """Least squares on x~ (mixup, singularized mixup) or on |x~| with sign recovery (InstaHide)."""

    name = "abs-solve"
    threat_model = "knows every encoding's private sources, public images and weights; knows the pixel range"

    def __init__(self, iters: int = 300, sign_rounds: int = 6, refine_iters: int = 100, masked: bool | None = None):
        self.iters, self.sign_rounds, self.refine_iters, self.masked = iters, sign_rounds, refine_iters, masked

    def reconstruct(self, observation: Observation) -> torch.Tensor:
        obs = observation
        if obs.extras.get("membership"):
            raise ValueError("abs-solve needs the mixing matrix; a recovered InstaHide membership is overlapping "
                             "per-encoding clusters, not one (the averaging attack reads it)")
        problem = linear_problem(obs, self.masked)
        system, y, lo, hi = problem.system, problem.y, problem.lo, problem.hi
        n = system.n
        x = problem.start.expand(n, -1).clone()
        lipschitz = system.lipschitz()
        p = system.public_part
        if not problem.masked:
            x = box_least_squares(system, y - p, lo, hi, x, self.iters, lipschitz)
        else:
            magnitude = y.abs()
            eps = torch.finfo(obs.x_tilde.dtype).eps
            signs, determined = recover_signs(system, magnitude, lo, hi, system.mix(x) + p, eps)
            x = box_least_squares(system, signs * magnitude - p, lo, hi, x, self.iters, lipschitz)
            for _ in range(self.sign_rounds):
                guess = torch.sign(system.mix(x) + p)
                updated = torch.where(determined | (guess == 0), signs, guess)
                if torch.equal(updated, signs):
                    break
                signs = updated
                x = box_least_squares(system, signs * magnitude - p, lo, hi, x, self.refine_iters, lipschitz)
        return x.reshape(n, *obs.sample_shape).float()
