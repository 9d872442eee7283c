"""Benchmark 1: singularized mixup of the CIFAR-10 training set (pixel space) vs a plain copy.

Both run in this process on the same normalised (50000, 3, 32, 32) float32 tensor; each is
timed `--repeats` times, interleaved, and the medians are compared. Target: encode <= 3x copy.
The profile times each step of the encoder on the same tensor, to show where the time goes.

    .venv/bin/python benchmarks/encoding_throughput.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import DATA_DIR, write

import torch

from fedsmix import data as datalib
from fedsmix.encoders import singularized as sm
from fedsmix.seeding import generator


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profile(x: torch.Tensor, y: torch.Tensor, alpha: float, radius: float) -> dict[str, float]:
    """The encoder's steps one by one (same work as singularized_mixup, unfused)."""
    n, gen = len(x), generator(0, "bench", "profile")
    steps = {}
    steps["permutation"] = timed(lambda: sm.sample_permutation(n, gen))
    steps["weights"] = timed(lambda: sm.sample_weights(n, alpha, gen))
    steps["gaussian (randn)"] = timed(lambda: torch.randn(x.shape, generator=gen))
    perm = torch.randperm(n, generator=gen)
    steps["gather x[perm]"] = timed(lambda: x.index_select(0, perm))
    steps["copy (reference)"] = timed(lambda: x.clone())
    return steps


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
        encodes.append(timed(lambda: sm.singularized_mixup(x, y, alpha, radius, generator(0, i, "encode"))))
        print(f"repeat {i}: copy {copies[-1]:.3f} s, encode {encodes[-1]:.3f} s", flush=True)
    copy_s, encode_s = statistics.median(copies), statistics.median(encodes)
    steps = profile(x, y, alpha, radius)
    ratio = encode_s / copy_s
    print(f"encode / copy = {encode_s:.3f} s / {copy_s:.3f} s = {ratio:.2f}x (target <= 3x)")
    for name, seconds in steps.items():
        print(f"  {name:>20}: {seconds:.3f} s ({seconds / copy_s:.2f}x copy)")
    write(
        "encoding_throughput",
        {
            "command": "benchmarks/encoding_throughput.py --repeats %d" % args.repeats,
            "tensor": list(x.shape),
            "bytes": x.numel() * 4,
            "copy-seconds": copies,
            "encode-seconds": encodes,
            "median-copy-seconds": copy_s,
            "median-encode-seconds": encode_s,
            "ratio": ratio,
            "target": "<= 3",
            "met": ratio <= 3,
            "profile-seconds": steps,
        },
    )


if __name__ == "__main__":
    main()
