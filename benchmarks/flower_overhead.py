"""Benchmark 2: mixup-union through `flwr run` (simulation) vs the same pipeline in-process.

Same settings, same seed: 30 parties of CIFAR-10 encode (singularized mixup, pixel space) and
the server trains the CNN on the union for `--epochs`. The in-process side is the in-process transport
(commands/inprocess.py: the same ServerApp and ClientApp, the same messages, without Ray, a SuperLink or the
`flwr` CLI); it runs before and after the Flower run and the mean is the reference. Both sides train the same
weights (the digest is compared). Target: Flower run <= 1.3x in-process.

    .venv/bin/python benchmarks/flower_overhead.py [--parties 30] [--epochs 1]
"""

from __future__ import annotations

import argparse
import time

from common import DATA_DIR, PROJECT, write
from common import through_flower as flower_run

from commands import inprocess

RUNS = PROJECT / "benchmarks" / "runs"


def settings_for(args) -> dict:
    return {
        "preset": "configs/cifar10.yaml",
        "strategies": "mixup-union",
        "epochs": args.epochs,
        "data-dir": DATA_DIR,
        "runs-dir": str(RUNS),
        "run-name": "flower-overhead",
    }


def in_process(overrides: dict, parties: int) -> dict:
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = inprocess.run(overrides, parties)["strategies"]["mixup-union"]
    result["process-seconds"] = time.perf_counter() - t0
    result["cpu-seconds"] = time.process_time() - cpu0
    print(f"in-process: {result['process-seconds']:.1f} s, accuracy {result['accuracy']:.4f}", flush=True)
    return result


def through_flower(overrides: dict, parties: int) -> dict:
    seconds, results, memory = flower_run(overrides, parties, RUNS)
    mix = results["strategies"]["mixup-union"]
    print(
        f"flwr run: {seconds:.1f} s end to end, strategy {mix['wall-seconds']:.1f} s, accuracy {mix['accuracy']:.4f}",
        flush=True,
    )
    return {"process-seconds": seconds, "strategy": mix, "memory": memory, "run-dir": results["run-dir"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parties", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    overrides = settings_for(args)
    before = in_process(overrides, args.parties)
    flower = through_flower(overrides, args.parties)
    after = in_process(overrides, args.parties)
    reference = (before["process-seconds"] + after["process-seconds"]) / 2
    mix = flower["strategy"]
    ratio = flower["process-seconds"] / reference
    same = mix["weights-sha256"] == before["weights-sha256"] == after["weights-sha256"]
    print(
        f"flwr run / in-process = {flower['process-seconds']:.1f} / {reference:.1f} s = {ratio:.2f}x (target <= 1.3x)"
    )
    print(f"  strategy only (ServerApp, excluding SuperLink/Ray start): {mix['wall-seconds'] / reference:.2f}x")
    print(f"  same trained weights: {same}")
    write(
        "flower_overhead",
        {
            "command": f"benchmarks/flower_overhead.py --parties {args.parties} --epochs {args.epochs}",
            "settings": overrides,
            "parties": args.parties,
            "in-process": [before, after],
            "in-process-mean-seconds": reference,
            "flower": flower,
            "ratio": ratio,
            "ratio-strategy-only": mix["wall-seconds"] / reference,
            "breakdown-seconds": {
                "in-process encode (sequential)": (before["upload-seconds"] + after["upload-seconds"]) / 2,
                "in-process train": (before["train-seconds"] + after["train-seconds"]) / 2,
                "flower upload phase (Ray actors encode, send, validate, store)": mix["upload-seconds"],
                "flower train (memory-mapped union)": mix["train-seconds"],
                "flower outside the strategy (flwr CLI, SuperLink, Ray start/stop)": flower["process-seconds"]
                - mix["wall-seconds"],
            },
            "same-weights": same,
            "target": "<= 1.3",
            "met": ratio <= 1.3,
        },
    )


if __name__ == "__main__":
    main()
