"""Benchmark 4: peak resident memory of the whole simulation for 10, 20 and 30 parties (CIFAR-10).

Each size is one `flwr run` (local SuperLink, flwr-simulation with the ServerApp, Ray's GCS,
raylet and client actors). A sampler sums RSS and PSS over every process in the tree (the
SuperLink `flwr run` detaches included) every 0.5 s. RSS counts shared pages once per process
(an upper bound); PSS shares them out. Target: peak <= 6 GB at 30 parties.

    .venv/bin/python benchmarks/peak_memory.py [--parties 10 20 30] [--epochs 1]
"""

from __future__ import annotations

import argparse
import json
import time

from common import DATA_DIR, PROJECT, TreeMemorySampler, write

from commands.federation import DEFAULT_FEDERATION
from commands.launch import flower_env, flwr_run, free_ports, superlink_pids

RUNS = PROJECT / "benchmarks" / "runs"


def measure(parties: int, epochs: int) -> dict:
    ports = tuple(free_ports(2))
    home = PROJECT / "benchmarks" / ".flwr"
    env = flower_env(home, ports)
    overrides = {
        "preset": "configs/cifar10.yaml", "strategies": "mixup-union", "epochs": epochs,
        "data-dir": DATA_DIR, "runs-dir": str(RUNS), "run-name": f"memory-{parties}",
    }
    federation = DEFAULT_FEDERATION
    t0 = time.perf_counter()
    with TreeMemorySampler(interval=0.5, extra_roots=lambda: superlink_pids(env)) as sampler:
        run = flwr_run(overrides, parties, federation, flwr_home=home, ports=ports, echo=False)
    if not run.ok:
        raise SystemExit(f"flwr run failed ({run.status}):\n{run.output[-3000:]}")
    mix = json.loads((RUNS / "latest" / "results.json").read_text())["strategies"]["mixup-union"]
    report = sampler.report()
    print(
        f"{parties} parties: peak RSS {report['peak-rss-gib']:.2f} GiB, "
        f"PSS at peak {report['pss-at-peak-gib']:.2f} GiB "
        f"({time.perf_counter() - t0:.0f} s; union {mix['union-size']} rows, accuracy {mix['accuracy']:.3f})",
        flush=True,
    )
    return {
        "parties": parties,
        "seconds": time.perf_counter() - t0,
        "union-size": mix["union-size"],
        "accuracy": mix["accuracy"],
        **report,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parties", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    rows = [measure(n, args.epochs) for n in args.parties]
    last = rows[-1]
    write(
        "peak_memory",
        {
            "command": f"benchmarks/peak_memory.py --parties {' '.join(map(str, args.parties))} --epochs {args.epochs}",
            "runs": rows,
            "target": "<= 6 GB at 30 parties",
            "peak-rss-gb-at-largest": last["peak-rss-gib"] * 2**30 / 1e9,
            "met": last["parties"] == 30 and last["peak-rss-gib"] * 2**30 <= 6e9,
        },
    )


if __name__ == "__main__":
    main()
