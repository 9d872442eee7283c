"""The averaging attack (InstaHide paper, section 2.1): average the encodings a sample appears in.

A private sample x_j that is mixed into several encodings is their persistent component; the
partners, public images and noise differ from encoding to encoding and average out. This is the
paper's stronger variant: the attacker knows which encodings contain x_j and with what weight,
but nothing about the other samples' values, so no linear system is solved. Each appearance
x~_i - p_i - (mass_i - w_ij) mu = w_ij x_j + interference is weighted by w_ij / var_ij (best
linear unbiased, treating the interference as independent noise), and the average is shrunk
towards the mean sample as far as its error power exceeds the samples' spread (Wiener), so a
noise-drowned average falls back to the mean instead of scoring below it. InstaHide encodings are
demasked first with the range-forced signs of `abs_solve.recover_signs` (the paper demasks with
a GAN). With one encoding per sample (T = 1) x_j still appears in k encodings (once as the
target, k - 1 times as a partner); T > 1 re-encodings add k appearances each, so the estimate
improves with T, also against singularized mixup, whose noise is fresh in every encoding.
Without the oracle (`attack-pairing = "recovered"`), `pairing.InstaHidePairing` supplies the
membership: one pseudo private image per encoding (the image leading it), averaged over the
encodings believed to contain it, with weights read off the soft labels.
"""

from __future__ import annotations

import torch

from .abs_solve import recover_signs
from .base import Attack, Observation
from .mixing import linear_problem, prior_mean, upload_mean


class Averaging(Attack):
    name = "averaging"
    threat_model = "knows which encodings contain each private sample and its weight there; not the partners' values"

    def __init__(self, masked: bool | None = None):
        self.masked = masked

    def reconstruct(self, observation: Observation) -> torch.Tensor:
        obs = observation
        problem = linear_problem(obs, self.masked)
        system, y, lo, hi = problem.system, problem.y, problem.lo, problem.hi
        m, n = system.shape
        d = y.shape[1]
        if problem.masked:
            guess = system.private_mass * problem.start + system.public_part  # A applied to the constant start
            signs, _ = recover_signs(system, y.abs(), lo, hi, guess, torch.finfo(obs.x_tilde.dtype).eps)
            y = signs * y.abs()
        residual = y - system.public_part  # = A x (+ noise)
        mass = system.private_mass  # (m, 1)
        noise2 = self._noise_power(obs, system.weights)  # (m,) squared norm of the noise per row
        mu = upload_mean(residual, mass, noise2, prior_mean(obs, d))
        w2_row = system.power()  # (m,)
        spread = (residual - mass * mu).pow(2).sum(dim=1)
        V = float(((spread - noise2).mean() / w2_row.mean().clamp_min(1e-12)).clamp_min(1e-12))  # E||x - mu||^2

        private = system.sources >= 0
        rows = torch.arange(m).unsqueeze(1).expand_as(system.sources)[private]
        cols = system.sources[private]
        w = system.weights[private]
        var = ((w2_row[rows] - w.pow(2)) * V + noise2[rows]).clamp_min(1e-12 * V)  # interference of this appearance
        G = torch.sparse_coo_tensor(torch.stack([cols, rows]), w / var, (n, m), check_invariants=True).coalesce()
        S = torch.zeros(n, dtype=torch.float64).index_add_(0, cols, w.pow(2) / var)  # 1 / error power of the average
        offset = torch.sparse.mm(G, mass).squeeze(1) - S  # sum_i (w / var)(mass_i - w)
        numerator = torch.sparse.mm(G, residual) - offset.unsqueeze(1) * mu
        seen = S > 0
        x = mu.expand(n, d).clone()
        average = numerator[seen] / S[seen].unsqueeze(1)
        shrink = (V / (V + 1 / S[seen])).unsqueeze(1)  # Wiener: trust the average as far as it beats the mean
        x[seen] = mu + shrink * (average - mu)
        return x.clamp(lo, hi).reshape(n, *obs.sample_shape).float()

    @staticmethod
    def _noise_power(obs: Observation, weights: torch.Tensor) -> torch.Tensor:
        """Singularized mixup adds w_i2 e_i with ||e_i|| = r to every encoding; a recovered InstaHide membership
        adds the unknown public images' expected power (extras["row-noise-power"]); nothing else is noisy."""
        extra = obs.extras.get("row-noise-power")
        power = torch.zeros(len(weights), dtype=torch.float64) if extra is None else extra.double().cpu()
        if not obs.radius:
            return power
        return power + (weights[:, 1] * obs.radius).pow(2)
