"""Scoring reconstructions against the ground truth, next to the best data-independent guess.

A negative SNR only says the attacker did worse than guessing; the trivial guess (the public
data's mean sample, in the same normalisation) scores about 0 dB without looking at the upload.
Leakage is therefore reported as the attack's gain over that guess.
"""

from __future__ import annotations

import torch

from fedsmix.metrics import Score, score


def trivial_guess(public_mean: torch.Tensor, n: int) -> torch.Tensor:
    """The same public mean sample guessed for every victim."""
    return public_mean.unsqueeze(0).expand(n, *public_mean.shape).clone()


def score_with_baseline(x: torch.Tensor, x_hat: torch.Tensor, public_mean: torch.Tensor, to_unit=None) -> dict:
    """The attack's scores, the trivial guess's, and the gain (dB for SNR/PSNR, difference for SSIM)."""
    attack, per_image = score(x, x_hat, to_unit)
    blind, _ = score(x, trivial_guess(public_mean.to(x.dtype), len(x)), to_unit)
    return {
        "attack": attack.as_dict(),
        "trivial": blind.as_dict(),
        "gain": {
            "snr_db": attack.snr_mean - blind.snr_mean,
            "psnr_db": attack.psnr_mean - blind.psnr_mean,
            "ssim": attack.ssim_mean - blind.ssim_mean,
        },
        "per_image": per_image,
    }


__all__ = ["Score", "score", "score_with_baseline", "trivial_guess"]
