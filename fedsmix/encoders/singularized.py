"""Singularized mixup (Algorithm 1): x~_i = w_i1 x_i + w_i2 (x_pi(i) + e_i), e_i on the r-sphere."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from .base import Encoded


def sample_weights(n: int, alpha: float, generator: torch.Generator, k: int = 2, device=None,
                   fixed: bool = False) -> torch.Tensor:
    """Rows uniform on [0,1]^k, normalised to sum 1, resampled until max <= alpha (as InstaHide's code).

    fixed=True (k = 2 only): every row is (alpha, 1 - alpha), as the paper's experiment code mixes for
    its Tables 1-2 (`mixing-weights = "fixed"`); Algorithm 1 draws them as above.
    """
    if alpha * k < 1:
        raise ValueError(f"coefficient cap {alpha} (alpha or coefficient-cap) cannot hold for {k} weights summing to 1")
    if fixed:
        if k != 2:
            raise ValueError(f"mixing-weights 'fixed' is defined for two-image mixing, got k = {k}")
        weights = torch.tensor([[alpha, 1.0 - alpha]], dtype=torch.float64).expand(n, 2).float().contiguous()
        return weights.to(device) if device is not None else weights
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
    return fill_sphere(torch.empty(n, *shape), radius, generator)


def fill_sphere(out: torch.Tensor, radius: float, generator: torch.Generator) -> torch.Tensor:
    """Fill the rows of `out` with vectors uniform on the r-sphere, in place."""
    torch.randn(out.shape, generator=generator, out=out)
    norms = out.reshape(len(out), -1).norm(dim=1).clamp_min(1e-12)
    return out.mul_((radius / norms).view(len(out), *([1] * (out.dim() - 1))))


# Values per block of rows: each block's arrays stay in cache while it is encoded in one pass.
BLOCK_VALUES = 1 << 18


def singularized_mixup(
    x: torch.Tensor,
    y: torch.Tensor,
    alpha: float,
    radius: float,
    generator: torch.Generator,
    derangement: bool = True,
    keep_noise: bool = False,
    fixed_weights: bool = False,
) -> Encoded:
    """Encode a whole partition at once. x: (n, ...) any shape; y: (n, classes) one-hot or soft.

    Whole-tensor arithmetic would pass over memory once per operation; instead rows are encoded
    in cache-sized blocks (noise, partner gather, mix, in place), spread over a thread pool.
    Each block draws its noise from its own generator, seeded from `generator`, so the result
    depends on the seed alone, not on the number of threads. The noise lives in a per-thread
    scratch block unless `keep_noise` (tests, analysis) asks for all of it: a party never needs
    it again, and a second partition-sized tensor would cost as much as the encoding itself.
    """
    n = len(x)
    perm = sample_permutation(n, generator, derangement)
    w = sample_weights(n, alpha, generator, fixed=fixed_weights)
    rows = max(1, BLOCK_VALUES // max(1, x[0].numel()))
    seeds = torch.randint(0, 2**63 - 1, ((n + rows - 1) // rows,), generator=generator).tolist()
    x = x.contiguous()
    x_enc = torch.empty_like(x)
    noise = torch.empty_like(x) if keep_noise else None
    scratch = threading.local()
    view = (n,) + (1,) * (x.dim() - 1)
    w1, w2 = w[:, 0].to(x.dtype).view(view), w[:, 1].to(x.dtype).view(view)

    def noise_block(lo: int, hi: int) -> torch.Tensor:
        if noise is not None:
            return noise[lo:hi]
        if getattr(scratch, "block", None) is None:
            scratch.block = torch.empty((rows,) + tuple(x.shape[1:]), dtype=x.dtype)
        return scratch.block[: hi - lo]

    def encode_block(block: int) -> None:
        lo, hi = block * rows, min((block + 1) * rows, n)
        e = fill_sphere(noise_block(lo, hi), radius, torch.Generator().manual_seed(seeds[block]))
        out = torch.index_select(x, 0, perm[lo:hi], out=x_enc[lo:hi])  # the partner x_pi(i)
        out.add_(e).mul_(w2[lo:hi]).addcmul_(x[lo:hi], w1[lo:hi])  # w1 x_i + w2 (x_pi(i) + e_i)

    run_blocks(encode_block, len(seeds))
    y_enc = w[:, :1].to(y.dtype) * y + w[:, 1:].to(y.dtype) * y[perm]
    sources = torch.stack([torch.arange(n), perm], dim=1)
    return Encoded(x=x_enc, y=y_enc, weights=w, sources=sources, noise=noise)


def run_blocks(fn, count: int) -> None:
    """fn(0..count-1) on torch's intra-op thread count; each block's ops run single-threaded
    (OpenMP teams nested inside the pool would oversubscribe the cores)."""
    threads = torch.get_num_threads()
    if threads == 1 or count == 1:
        for block in range(count):
            fn(block)
        return
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, range(count)))  # list(): re-raise a block's exception here
    finally:
        torch.set_num_threads(threads)
