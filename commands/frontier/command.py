"""`fedsmix frontier`: every strategy of a preset, its accuracy, cost and leakage on one table.

Writes frontier.md, frontier.csv, attacks.csv, reencoding.csv, frontier.png, reconstructions.png
and frontier.json into runs/<time>-frontier-<dataset>/ (see commands/frontier/run.py).
"""

from __future__ import annotations

import argparse


def cmd_frontier(args: argparse.Namespace) -> int:
    from ..options import absolute_paths, parse_sets
    from .run import run_frontier

    overrides = absolute_paths({**parse_sets(args.set), "preset": args.preset})
    plan = parse_sets(args.plan)
    if args.parties:
        plan["parties"] = args.parties
    seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()] if args.seeds else []
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds: a seed is given twice ({args.seeds})")
    summaries = []
    for seed in seeds or [None]:  # each seed a whole frontier: its partitions, initialisation, victims and attacks
        given = overrides if seed is None else {**overrides, "seed": seed}
        summaries.append(run_frontier(args.preset, given, plan, reuse=args.reuse or None))
        print(f"frontier written to {summaries[-1]['run-dir']} (frontier.md, frontier.csv, frontier.png)")
    if len(summaries) > 1:
        from pathlib import Path

        from .report import write_seeds

        out = Path(summaries[-1]["run-dir"])
        write_seeds(out, summaries)
        print(f"over seeds {args.seeds}: {out / 'frontier-seeds.md'} (mean and 95 % interval per row)")
    return 0


def register(subparsers) -> None:
    frontier = subparsers.add_parser("frontier", help="accuracy, bytes and leakage of every strategy on one table")
    frontier.add_argument("--preset", default="configs/frontier-mnist.yaml")
    frontier.add_argument(
        "--parties", type=int, default=0, help="number of parties (default: the preset's frontier.parties)"
    )
    frontier.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run setting override")
    frontier.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="frontier section override, e.g. rows=fedavg,mixup-k2, gradient-steps=200 or features.image-size=128",
    )
    frontier.add_argument(
        "--reuse",
        default="",
        metavar="DIR",
        help="an earlier frontier's directory: its finished rows with the same settings are not run again",
    )
    frontier.add_argument(
        "--seeds", default="", metavar="S,S,...",
        help="run the whole frontier once per seed, then frontier-seeds.md: each row's mean and 95 %% interval",
    )
    frontier.set_defaults(func=cmd_frontier)
