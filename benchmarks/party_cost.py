"""Benchmark: the cost of one more party. mixup-union on MNIST, IID partitions, 2 epochs, through `fedsmix run`
(Flower's simulation engine behind `flwr run`, as a user runs it) at each party count, one after another.

Per run: wall seconds end to end, the split by phase read from the run's progress.jsonl (before the ServerApp:
the `flwr` CLI, SuperLink and Ray; the hello, with the parties' cold start; uploads; selection; central training;
the model's return; the rest; after the ServerApp), seconds per party of the upload phase, each round's messages,
bytes and seconds, honest parties quarantined, and the peak memory of the process tree.

    .venv/bin/python benchmarks/party_cost.py [--parties 100,1000] [--epochs 2]
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from common import DATA_DIR, PROJECT, through_flower, write

from fedsmix.progress import read_events

RUNS = PROJECT / "benchmarks" / "runs"


def settings_for(epochs: int) -> dict:
    return {"preset": "configs/quickstart.yaml", "dataset": "mnist", "partitioner": "iid",
            "strategies": "mixup-union", "epochs": epochs, "data-dir": DATA_DIR, "runs-dir": str(RUNS),
            "run-name": "party-cost", "tensorboard": False}


def phases(events: list[dict]) -> dict[str, float]:
    """Seconds between the run's milestones (each event's `clock`: seconds since the run started)."""
    def first(kind: str, **match) -> float | None:
        return next((e["clock"] for e in events if e["kind"] == kind
                     and all(e.get(k) == v for k, v in match.items())), None)

    def last(kind: str) -> float | None:
        return next((e["clock"] for e in reversed(events) if e["kind"] == kind), None)

    marks = [("hello", first("strategy-start")), ("uploads", first("selection-start") or first("epoch")),
             ("selection", last("selection")), ("central training", first("answers", phase="model return")),
             ("model return", first("returned")), ("rest", last("run-end"))]
    out, before = {}, 0.0
    for name, at in marks:
        if at is not None:
            out[name], before = round(at - before, 2), at
    return out


def one_run(overrides: dict, parties: int) -> dict:
    called = time.time()
    seconds, results, memory = through_flower(overrides, parties, RUNS)
    mix = results["strategies"]["mixup-union"]
    events = read_events(RUNS / "latest" / "progress.jsonl")
    split = phases(events)
    outside = seconds - (split and sum(split.values()))
    # the ServerApp's first event is stamped to the second: the rest of `outside` is after its last event
    started = datetime.strptime(events[0]["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    split["before the ServerApp (flwr CLI, SuperLink, Ray start; +-1 s)"] = round(started - called, 1)
    split["after the ServerApp (SuperLink and Ray stop; +-1 s)"] = round(outside - (started - called), 1)
    row = {"parties": parties, "wall-seconds": round(seconds, 1), "accuracy": mix["accuracy"],
           "parties-used": mix["parties-used"], "quarantined": len(mix["quarantined"]),
           "upload-seconds-per-party": round(mix["upload-seconds"] / parties, 4), "phases-seconds": split,
           "voters": mix["selection"].get("voters"), "returned": (mix.get("returned") or {}).get("sampled"),
           "round-costs": mix.get("round-costs"), "memory": memory}
    print(f"{parties} parties: {seconds:.1f} s, {row['upload-seconds-per-party']:.3f} s/party uploading, "
          f"accuracy {mix['accuracy']:.4f}, phases {split}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parties", default="100,1000")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    overrides = settings_for(args.epochs)
    rows = [one_run(overrides, int(p)) for p in args.parties.split(",")]
    write("party_cost", {"command": f"benchmarks/party_cost.py --parties {args.parties} --epochs {args.epochs}",
                         "settings": overrides, "engine": "fedsmix run (flwr run, Flower's simulation engine)",
                         "rows": rows})


if __name__ == "__main__":
    main()
