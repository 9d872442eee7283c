"""Plain mixup with k private samples (Zhang et al.; eq. (1)-(2) of the paper), no noise."""

from __future__ import annotations

import torch

from .base import Encoded
from .singularized import sample_weights


def mix_sources(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """Column 0 is the sample itself; columns 1..k-1 are independent random permutations."""
    columns = [torch.arange(n)] + [torch.randperm(n, generator=generator) for _ in range(k - 1)]
    return torch.stack(columns, dim=1)


def weighted_sum(x: torch.Tensor, sources: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    view = (len(sources),) + (1,) * (x.dim() - 1)
    out = torch.zeros((len(sources),) + tuple(x.shape[1:]), dtype=x.dtype)
    for j in range(sources.shape[1]):
        out += weights[:, j].to(x.dtype).view(view) * x[sources[:, j]]
    return out


def mixup(x: torch.Tensor, y: torch.Tensor, k: int, cap: float, generator: torch.Generator) -> Encoded:
    n = len(x)
    sources = mix_sources(n, k, generator)
    weights = sample_weights(n, cap, generator, k=k)
    y_enc = (weights.to(y.dtype).unsqueeze(-1) * y[sources]).sum(dim=1)
    return Encoded(x=weighted_sum(x, sources, weights), y=y_enc, weights=weights, sources=sources)
