"""Encoders: pure tensor functions, one per file, behind one `encode()` entry."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Encoded, concat
from .calibration import (
    CALIBRATIONS,
    Calibration,
    DataStatistics,
    calibrate,
    data_statistics,
    fixed_radius,
    noise_multiplier,
    radius_bound,
    snr_bound,
    top_eigenvalue,
)
from .instahide import instahide
from .mixup import mixup
from .singularized import sample_permutation, sample_sphere, sample_weights, singularized_mixup

__all__ = [
    "CALIBRATIONS", "radius_bound", "top_eigenvalue",
    "Calibration", "DataStatistics", "Encoded", "EncoderParams", "calibrate", "data_statistics", "encode",
    "fixed_radius", "instahide", "mixup", "noise_multiplier", "sample_permutation", "sample_sphere",
    "sample_weights", "singularized_mixup", "snr_bound", "empirical_snr",
]


@dataclass(frozen=True)
class EncoderParams:
    name: str = "singularized"  # singularized | mixup | instahide-inside | instahide-cross | none
    alpha: float = 0.7
    radius: float = 0.0
    derangement: bool = True
    k: int = 4
    cap: float = 0.65
    private_min: float = 0.3
    encodings_per_sample: int = 1
    fixed_weights: bool = False  # singularized: w = (alpha, 1 - alpha) for every row (the paper's experiments)


def encode(
    x: torch.Tensor,
    y: torch.Tensor,
    params: EncoderParams,
    generator: torch.Generator,
    public: torch.Tensor | None = None,
) -> Encoded:
    """Encode a whole partition; T = encodings_per_sample independent encodings are stacked."""
    parts = []
    for _ in range(params.encodings_per_sample):
        if params.name == "singularized":
            parts.append(singularized_mixup(x, y, params.alpha, params.radius, generator, params.derangement,
                                                fixed_weights=params.fixed_weights))
        elif params.name == "mixup":
            parts.append(mixup(x, y, params.k, params.cap, generator))
        elif params.name == "instahide-inside":
            parts.append(instahide(x, y, params.k, params.cap, generator))
        elif params.name == "instahide-cross":
            if public is None:
                raise ValueError("instahide-cross needs a public pool")
            parts.append(instahide(x, y, params.k, params.cap, generator, public, params.private_min))
        elif params.name == "none":
            idx = torch.arange(len(x)).unsqueeze(1)
            parts.append(Encoded(x=x.clone(), y=y.clone(), weights=torch.ones(len(x), 1), sources=idx))
        else:
            raise ValueError(f"encoder: unknown {params.name!r}")
    return concat(parts, len(x))


def empirical_snr(x: torch.Tensor, enc: Encoded) -> float:
    """The paper's SNR of an upload: E||w1 x_i||^2 / E||x~_i - w1 x_i||^2, on centred data.

    Centring matches Theorem 4.2's zero-mean assumption; the interference is everything in the
    upload that is not the target sample (partner, noise, public images).
    """
    flat = x.reshape(len(x), -1)
    mean = flat.sum(dim=0, dtype=torch.float64).div_(len(flat)).unsqueeze(0)
    rows = enc.sources[:, 0]
    upload = enc.x.reshape(len(enc.x), -1)
    signs = enc.signs.reshape(len(enc.x), -1) if enc.signs is not None else None
    signal = interference = 0.0
    for start in range(0, len(upload), 1024):  # float64 a block of rows at a time, not whole copies
        block = slice(start, start + 1024)
        w1 = enc.weights[block, :1].double()
        target = flat[rows[block]].double()
        mixed = upload[block].double()
        if signs is not None:  # judge InstaHide on what the mask hides: compare unmasked
            mixed = mixed * signs[block].double()
        signal += (w1 * (target - mean)).pow(2).sum().item()
        interference += (mixed - w1 * target - (1 - w1) * mean).pow(2).sum().item()
    return signal / interference if interference > 0 else float("inf")  # encoder none: nothing interferes
