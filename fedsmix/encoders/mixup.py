"""Plain mixup with k private samples (Zhang et al.; eq. (1)-(2) of the paper), no noise."""

from __future__ import annotations

import torch

from .base import Encoded
from .singularized import sample_weights


def mix_sources(n: int, k: int, generator: torch.Generator, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Column 0 is the sample itself; columns 1..k-1 are independent random permutations.

    With `rows`, only those samples are encoded (one local batch): the rows of the same k - 1
    permutations of all n samples, so partners come from the whole set, as when the set is encoded.
    """
    if rows is None:
        columns = [torch.arange(n)] + [torch.randperm(n, generator=generator) for _ in range(k - 1)]
    else:
        columns = [rows] + [torch.randperm(n, generator=generator)[rows] for _ in range(k - 1)]
    return torch.stack(columns, dim=1)


def weighted_sum(x: torch.Tensor, sources: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    view = (len(sources),) + (1,) * (x.dim() - 1)
    out = torch.zeros((len(sources),) + tuple(x.shape[1:]), dtype=x.dtype)
    for j in range(sources.shape[1]):
        out += weights[:, j].to(x.dtype).view(view) * x[sources[:, j]]
    return out


def mixup(
    x: torch.Tensor, y: torch.Tensor, k: int, cap: float, generator: torch.Generator, rows: torch.Tensor | None = None
) -> Encoded:
    """Encode every sample of x, or only `rows` of it (partners still drawn from all of x)."""
    sources = mix_sources(len(x), k, generator, rows)
    weights = sample_weights(len(sources), cap, generator, k=k)
    y_enc = (weights.to(y.dtype).unsqueeze(-1) * y[sources]).sum(dim=1)
    return Encoded(x=weighted_sum(x, sources, weights), y=y_enc, weights=weights, sources=sources)
