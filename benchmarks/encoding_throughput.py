"""Benchmark 1: singularized mixup of the CIFAR-10 training set (pixel space) vs a plain copy.

Both run in this process on the same normalised (50000, 3, 32, 32) float32 tensor; each is
timed `--repeats` times, interleaved, and the medians are compared. Target: encode <= 3x copy.
The profile times each step of the encoder on the same tensor, to show where the time goes.

    .venv/bin/python benchmarks/encoding_throughput.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
from common import DATA_DIR, write

from fedsmix import data as datalib
from fedsmix.encoders import singularized as sm
from fedsmix.seeding import generator


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def whole_tensor_encode(x: torch.Tensor, y: torch.Tensor, alpha: float, radius: float, gen: torch.Generator):
    """The encoder before blocking (commit 3465e17): one whole-tensor operation after another."""
    n = len(x)
    perm = sm.sample_permutation(n, gen)
    w = sm.sample_weights(n, alpha, gen)
    g = torch.randn(x.shape, generator=gen)
    noise = g * (radius / g.reshape(n, -1).norm(dim=1).clamp_min(1e-12)).view(n, 1, 1, 1)
    w1, w2 = w[:, 0].view(n, 1, 1, 1), w[:, 1].view(n, 1, 1, 1)
    return w1 * x + w2 * (x[perm] + noise), w[:, :1] * y + w[:, 1:] * y[perm]


def profile(x: torch.Tensor, alpha: float, radius: float) -> dict[str, float]:
    """The encoder's steps one at a time, each as the encoder runs it (blocks on the thread pool)."""
    n, gen = len(x), generator(0, "bench", "profile")
    rows = max(1, sm.BLOCK_VALUES // x[0].numel())
    blocks = (n + rows - 1) // rows
    partner = torch.empty_like(x)
    perm = torch.randperm(n, generator=gen)
    scratch = threading.local()  # as the encoder does: one cache-sized noise block per thread

    def sphere(block):
        if getattr(scratch, "block", None) is None:
            scratch.block = torch.empty((rows,) + tuple(x.shape[1:]))
        sm.fill_sphere(scratch.block, radius, torch.Generator().manual_seed(block))

    def gather(block):
        lo, hi = block * rows, min((block + 1) * rows, n)
        torch.index_select(x, 0, perm[lo:hi], out=partner[lo:hi])

    return {
        "permutation + weights": timed(lambda: (sm.sample_permutation(n, gen), sm.sample_weights(n, alpha, gen))),
        "sphere noise (Gaussian draw + normalise)": timed(lambda: sm.run_blocks(sphere, blocks)),
        "partner gather x[perm]": timed(lambda: sm.run_blocks(gather, blocks)),
        "copy (reference)": timed(lambda: x.clone()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    raw = datalib.load_split("cifar10", "train", DATA_DIR)
    x = datalib.normalize(datalib.to_unit(raw.images, raw.spec), raw.spec).contiguous()
    y = datalib.one_hot(torch.from_numpy(raw.labels), 10)
    radius, alpha = 100.0, 0.7
    copies, encodes = [], []
    for i in range(args.repeats):
        copies.append(timed(lambda: x.clone()))
        encodes.append(timed(lambda i=i: sm.singularized_mixup(x, y, alpha, radius, generator(0, i, "encode"))))
        print(f"repeat {i}: copy {copies[-1]:.3f} s, encode {encodes[-1]:.3f} s", flush=True)
    copy_s, encode_s = statistics.median(copies), statistics.median(encodes)
    before = [timed(lambda i=i: whole_tensor_encode(x, y, alpha, radius, generator(0, i, "encode"))) for i in range(2)]
    print(f"whole-tensor encoder (before blocking): {statistics.median(before):.3f} s", flush=True)
    steps = profile(x, alpha, radius)
    ratio = encode_s / copy_s
    best = min(encodes) / min(copies)
    print(
        f"encode / copy = {encode_s:.3f} s / {copy_s:.3f} s = {ratio:.2f}x median, {best:.2f}x best-of (target <= 3x)"
    )
    print(f"  whole-tensor encoder before blocking: {statistics.median(before) / copy_s:.2f}x")
    for name, seconds in steps.items():
        print(f"  {name:>42}: {seconds:.3f} s ({seconds / copy_s:.2f}x the median copy)")
    write(
        "encoding_throughput",
        {
            "command": f"benchmarks/encoding_throughput.py --repeats {args.repeats}",
            "tensor": list(x.shape),
            "bytes": x.numel() * 4,
            "copy-seconds": copies,
            "encode-seconds": encodes,
            "median-copy-seconds": copy_s,
            "median-encode-seconds": encode_s,
            "ratio": ratio,
            "ratio-best-of": best,
            "target": "<= 3",
            "met": ratio <= 3,
            "profile-seconds": steps,
            "whole-tensor-encoder-seconds": before,
            "whole-tensor-ratio": statistics.median(before) / copy_s,
        },
    )


if __name__ == "__main__":
    main()
