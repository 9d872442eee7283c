"""InstaHide (Huang et al. 2020): mix k images, then flip the sign of every pixel at random.

Inside-dataset: k private images. Cross-dataset: 2 private + (k-2) public images, the two
private coefficients summing to at least `private_min`; labels come from private images
only (renormalised to sum 1 so they stay a distribution: InstaHide's code leaves them summing
to w1 + w2, which only rescales each sample's loss, and the server rejects rows not summing to 1).
Coefficients are uniform on [0, 1]^k, normalised, and redrawn until every one is <= cap (c1 = 0.65
in the paper) and, in cross mode, the private pair reaches private_min (c2 = 0.3), both checked on
the same draw (InstaHide's code redraws for c2 without re-checking c1). The mask is drawn fresh
for every encoded image and every pixel and channel (Definition 3.1), also for each of the T
encodings of a sample. Mixing happens in the normalised (centred) space, as in InstaHide's code:
there the mask hides on which side of the data mean a mixture lies (server/adversary/abs_solve.py).
"""

from __future__ import annotations

import torch

from .base import Encoded
from .mixup import mix_sources, weighted_sum
from .singularized import sample_weights


def sign_masks(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """A fresh +-1 mask per encoded image and pixel (Definition 3.1)."""
    return torch.randint(0, 2, shape, generator=generator).mul_(2).sub_(1).float()


def cross_weights(
    n: int, k: int, cap: float, private_min: float, generator: torch.Generator, max_rounds: int = 1000
) -> torch.Tensor:
    """Weights with max <= cap and the first two (private) summing to >= private_min, by rejection."""
    if private_min > min(1.0, 2 * cap) or (private_min >= 1.0 and k > 2):
        raise ValueError(
            f"private-mass-min {private_min} cannot be reached: two private coefficients of at most "
            f"coefficient-cap {cap} each, leaving room for {k - 2} public ones"
        )
    weights = torch.empty(n, k)
    todo = torch.arange(n)
    for _ in range(max_rounds):
        if not len(todo):
            return weights
        draw = sample_weights(len(todo), cap, generator, k=k)
        ok = draw[:, :2].sum(dim=1) >= private_min
        weights[todo[ok]] = draw[ok]
        todo = todo[~ok]
    if len(todo):
        raise ValueError(
            f"private-mass-min {private_min} with coefficient-cap {cap} and mix-k {k}: fewer than 1 in "
            f"{max_rounds} weight draws qualify; lower private-mass-min or mix-k"
        )
    return weights


def instahide(
    x: torch.Tensor,
    y: torch.Tensor,
    k: int,
    cap: float,
    generator: torch.Generator,
    public: torch.Tensor | None = None,
    private_min: float = 0.3,
    rows: torch.Tensor | None = None,
) -> Encoded:
    """Encode every sample of x, or only `rows` of it (inside-dataset; partners from all of x)."""
    n = len(x)
    if rows is not None and public is not None:
        raise ValueError("instahide: encoding a subset of rows is implemented for inside-dataset InstaHide only")
    if public is None:  # inside-dataset
        sources = mix_sources(n, k, generator, rows)
        weights = sample_weights(len(sources), cap, generator, k=k)
        mixed = weighted_sum(x, sources, weights)
        y_enc = (weights.unsqueeze(-1).to(y.dtype) * y[sources]).sum(dim=1)
        public_sources = None
    else:
        if k < 3:
            raise ValueError(f"mix-k: cross-dataset InstaHide mixes 2 private and k-2 >= 1 public images; got {k}")
        if public.shape[1:] != x.shape[1:]:
            raise ValueError(f"public pool shape {tuple(public.shape[1:])} differs from private {tuple(x.shape[1:])}")
        private = mix_sources(n, 2, generator)
        pub = torch.randint(0, len(public), (n, k - 2), generator=generator)
        weights = cross_weights(n, k, cap, private_min, generator)
        mixed = weighted_sum(x, private, weights[:, :2]) + weighted_sum(public, pub, weights[:, 2:])
        private_mass = weights[:, :2].sum(dim=1, keepdim=True)
        y_enc = (weights[:, :2].unsqueeze(-1).to(y.dtype) * y[private]).sum(dim=1) / private_mass.to(y.dtype)
        sources = torch.cat([private, torch.full((n, k - 2), -1, dtype=torch.long)], dim=1)
        public_sources = torch.cat([torch.full((n, 2), -1, dtype=torch.long), pub], dim=1)
    signs = sign_masks(tuple(mixed.shape), generator).to(mixed.dtype)
    return Encoded(
        x=signs * mixed, y=y_enc, weights=weights, sources=sources, signs=signs, public_sources=public_sources
    )
