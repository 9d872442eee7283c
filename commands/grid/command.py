"""`fedsmix grid`: run a preset's grid through Flower simulation; write table, CSV and plot."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fedsmix.config import PROJECT_ROOT, SettingsError
from fedsmix.runs import link_latest

from .plan import make_plan
from .run import GridRun


def grid_dir(runs_dir: str, name: str) -> Path:
    root = Path(runs_dir or PROJECT_ROOT / "runs").expanduser().resolve() / "grid"
    path = root / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{name}"
    path.mkdir(parents=True, exist_ok=False)
    link_latest(root, path)
    return path


def cmd_grid(args: argparse.Namespace) -> int:
    from ..options import parse_sets, parse_value

    sets = parse_sets(args.set)
    axes = {
        k: [parse_value(v) for v in str(vals).split(",")] if isinstance(vals, str) else [vals]
        for k, vals in parse_sets(args.axis, "--axis").items()
    }
    if args.parties:
        axes["parties"] = [int(p) for p in args.parties.split(",")]
    seeds = None
    if args.seeds:
        try:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        except ValueError:
            raise SettingsError(f"--seeds: comma-separated integers, got {args.seeds!r}") from None
    plan = make_plan(args.preset, sets, axes, seeds)
    for cell, todo in plan.schedule():
        print(f"{cell.id}: {', '.join(todo) or '(all results reused)'}")
    if args.dry_run:
        return 0
    if args.report and not args.resume:
        raise SettingsError("--report: name the grid directory with --resume GRID_DIR")
    out = Path(args.resume).resolve() if args.resume else grid_dir(str(sets.get("runs-dir", "")), plan.name)
    grid = GridRun(plan, out, args.engine)
    if not args.report:
        grid.run()
    elif grid.state_path.is_file():  # several --resume passes with different axes, one table: nothing runs
        grid.write_report()
    else:
        raise SettingsError(f"--report: {out} holds no grid.json (not a grid directory)")
    print((out / "table.md").read_text() if (out / "table.md").exists() else "no results")
    print(f"grid results: {out}")
    return 0


def register(subparsers) -> None:
    grid = subparsers.add_parser(
        "grid", help="run a preset's grid (strategies x parties x axes, each cell once per seed) through Flower "
        "simulation"
    )
    grid.add_argument(
        "--preset", required=True, help="YAML preset with a `grid:` block, e.g. configs/table4-cifar10.yaml"
    )
    grid.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a run setting in every cell"
    )
    grid.add_argument("--axis", action="append", default=[], metavar="KEY=V1,V2", help="replace or add an axis")
    grid.add_argument("--parties", default="", help="comma-separated party counts (replaces the preset's)")
    grid.add_argument(
        "--seeds", default="", metavar="S1,S2,...",
        help="run every cell once per seed (replaces the preset's grid seeds); the tables give each cell the mean "
        "and a 95 %% interval over its seeds",
    )
    grid.add_argument(
        "--engine",
        choices=("simulate", "flwr", "inprocess", "direct"),
        default="simulate",
        help="Flower's simulation engine on Ray (default), the `flwr run` CLI per cell, or `inprocess`: the same "
        "ServerApp and ClientApp exchanging the same messages in one process, without Ray or a SuperLink "
        "(`direct` is its former name)",
    )
    grid.add_argument("--resume", default="", metavar="GRID_DIR", help="continue an interrupted grid in its directory")
    grid.add_argument(
        "--report", action="store_true",
        help="with --resume: rewrite the tables of this plan's finished cells in GRID_DIR, run nothing",
    )
    grid.add_argument("--dry-run", action="store_true", help="print the cells and what each runs, then stop")
    grid.set_defaults(func=cmd_grid)
