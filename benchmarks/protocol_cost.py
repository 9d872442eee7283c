"""Benchmark 3: mixup-union vs FedProx on the same partitions: bytes per party, time to accuracy.

One simulation runs both strategies on the same parties (real Flower messages, bytes counted
on the wire by the server). FedProx's curve (test accuracy after each round, with seconds since
the strategy started) gives its final accuracy, the target; mixup-union evaluates after every
central epoch (`eval-every=1`) and its clock includes the upload phase. A second simulation
repeats mixup-union with float16 uploads (same seed: the same encodings, rounded).
Targets: mixup-union sends >= 10x fewer bytes per party and reaches the target in <= 1/3 the time.

    .venv/bin/python benchmarks/protocol_cost.py [--dataset mnist] [--parties 10] [--rounds 10] [--epochs 8]
"""

from __future__ import annotations

import argparse

from common import DATA_DIR, PROJECT, write

from commands.simulate import simulate

RUNS = str(PROJECT / "benchmarks" / "runs")


def time_to(curve: list[dict], target: float) -> float | None:
    """Seconds until the curve first reaches `target` accuracy (None: never)."""
    return next((point["seconds"] for point in curve if point["accuracy"] >= target - 1e-12), None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="mlp", help="mlp: the paper's head (eq. 8) on flattened inputs")
    parser.add_argument("--parties", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--test-subset", type=int, default=2000)
    args = parser.parse_args()
    base = {
        "dataset": args.dataset, "model": args.model, "partitioner": "dirichlet", "dirichlet-alpha": 0.5,
        "tau": 1.0, "epochs": args.epochs, "eval-every": 1, "rounds": args.rounds, "local-epochs": 1,
        "test-subset": args.test_subset, "data-dir": DATA_DIR, "runs-dir": RUNS, "run-name": "protocol-cost",
    }
    both = simulate({**base, "strategies": "fedprox,mixup-union"}, num_parties=args.parties)
    prox, mix32 = both["strategies"]["fedprox"], both["strategies"]["mixup-union"]
    half = simulate({**base, "strategies": "mixup-union", "upload-dtype": "float16"}, num_parties=args.parties)
    mix16 = half["strategies"]["mixup-union"]
    target = prox["accuracy"]
    prox_time = time_to(prox["curve"], target)
    rows = {}
    for name, mix in (("mixup-union float32", mix32), ("mixup-union float16", mix16)):
        reached = time_to(mix["curve"], target)
        rows[name] = {
            "bytes-up-per-party": mix["mean-bytes-up-per-party"],
            "bytes-down-per-party": mix["mean-bytes-down-per-party"],
            "bytes-up-ratio (fedprox / mixup)": prox["mean-bytes-up-per-party"] / mix["mean-bytes-up-per-party"],
            "bytes-total-ratio (fedprox / mixup)": (prox["mean-bytes-up-per-party"] + prox["mean-bytes-down-per-party"])
            / (mix["mean-bytes-up-per-party"] + mix["mean-bytes-down-per-party"]),
            "final-accuracy": mix["accuracy"],
            "best-accuracy": max(p["accuracy"] for p in mix["curve"]),
            "seconds-to-target": reached,
            "time-ratio (fedprox / mixup)": (prox_time / reached) if reached else None,
            "upload-seconds": mix["upload-seconds"],
            "wall-seconds": mix["wall-seconds"],
            "curve": mix["curve"],
        }
    print(f"FedProx: {args.rounds} rounds, final accuracy {target:.4f} reached after {prox_time:.1f} s; "
          f"{prox['mean-bytes-up-per-party']:,.0f} bytes up per party")
    for name, row in rows.items():
        reached = row["seconds-to-target"]
        print(
            f"{name}: {row['bytes-up-per-party']:,.0f} bytes up per party "
            f"({row['bytes-up-ratio (fedprox / mixup)']:.2f}x fewer; target >= 10x); "
            + (
                f"target reached after {reached:.1f} s "
                f"({row['time-ratio (fedprox / mixup)']:.2f}x faster; target >= 3x)"
                if reached
                else f"target not reached (best {row['best-accuracy']:.4f})"
            )
        )
    milestones = {}
    for level in (0.90, 0.95, round(min(target, rows["mixup-union float32"]["best-accuracy"]) - 0.005, 3)):
        milestones[f"{level:.3f}"] = {
            "fedprox": time_to(prox["curve"], level),
            **{k: time_to(r["curve"], level) for k, r in rows.items()},
        }
        print(
            f"seconds to {level:.1%}: "
            + ", ".join(
                f"{k} {v:.1f}" if v is not None else f"{k} never" for k, v in milestones[f"{level:.3f}"].items()
            )
        )
    write(
        "protocol_cost",
        {
            "command": "benchmarks/protocol_cost.py "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
            "settings": base,
            "parties": args.parties,
            "fedprox": {
                "bytes-up-per-party": prox["mean-bytes-up-per-party"],
                "bytes-down-per-party": prox["mean-bytes-down-per-party"],
                "final-accuracy": target,
                "seconds-to-target": prox_time,
                "wall-seconds": prox["wall-seconds"],
                "curve": prox["curve"],
            },
            "mixup-union": rows,
            "seconds-to-accuracy": milestones,
            "targets": {"bytes": ">= 10x fewer", "time": ">= 3x less"},
        },
    )


if __name__ == "__main__":
    main()
