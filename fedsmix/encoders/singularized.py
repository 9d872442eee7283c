"""Singularized mixup (Algorithm 1): x~_i = w_i1 x_i + w_i2 (x_pi(i) + e_i), e_i on the r-sphere."""

from __future__ import annotations

import torch

from .base import Encoded


def sample_weights(n: int, alpha: float, generator: torch.Generator, k: int = 2, device=None) -> torch.Tensor:
    """Rows uniform on [0,1]^k, normalised to sum 1, resampled until max <= alpha (as InstaHide's code)."""
    if alpha * k < 1:
        raise ValueError(f"coefficient cap {alpha} (alpha or coefficient-cap) cannot hold for {k} weights summing to 1")
    weights = torch.empty(n, k, dtype=torch.float64)
    todo = torch.arange(n)
    while len(todo):
        draw = torch.rand(len(todo), k, generator=generator, dtype=torch.float64)
        draw = draw / draw.sum(dim=1, keepdim=True)
        ok = draw.max(dim=1).values <= alpha
        weights[todo[ok]] = draw[ok]
        todo = todo[~ok]
    return weights.float().to(device) if device is not None else weights.float()


def sample_permutation(n: int, generator: torch.Generator, derangement: bool = True) -> torch.Tensor:
    """Uniform permutation, or uniform derangement by rejection (about e tries on average).

    A fixed point would mix a sample with itself, uploading w1 x + w2 (x + e): x plus scaled noise.
    """
    if derangement and n < 2:
        raise ValueError(f"a derangement needs at least 2 samples, got {n}")
    while True:
        perm = torch.randperm(n, generator=generator)
        if not derangement or not bool((perm == torch.arange(n)).any()):
            return perm


def sample_sphere(n: int, shape: tuple[int, ...], radius: float, generator: torch.Generator) -> torch.Tensor:
    """n vectors uniform on the sphere of radius r in R^d (normalised Gaussians)."""
    g = torch.randn(n, *shape, generator=generator)
    norms = g.reshape(n, -1).norm(dim=1).clamp_min(1e-12)
    return g * (radius / norms).view(n, *([1] * len(shape)))


def singularized_mixup(
    x: torch.Tensor,
    y: torch.Tensor,
    alpha: float,
    radius: float,
    generator: torch.Generator,
    derangement: bool = True,
) -> Encoded:
    """Encode a whole partition at once. x: (n, ...) any shape; y: (n, classes) one-hot or soft."""
    n = len(x)
    perm = sample_permutation(n, generator, derangement)
    w = sample_weights(n, alpha, generator)
    noise = sample_sphere(n, tuple(x.shape[1:]), radius, generator).to(x.dtype)
    view = (n,) + (1,) * (x.dim() - 1)
    w1, w2 = w[:, 0].to(x.dtype), w[:, 1].to(x.dtype)
    x_enc = w1.view(view) * x + w2.view(view) * (x[perm] + noise)
    y_enc = w[:, :1].to(y.dtype) * y + w[:, 1:].to(y.dtype) * y[perm]
    sources = torch.stack([torch.arange(n), perm], dim=1)
    return Encoded(x=x_enc, y=y_enc, weights=w, sources=sources, noise=noise)
