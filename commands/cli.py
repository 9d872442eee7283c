"""Command line: `fedsmix run|show|features|grid|attack|frontier|mixcon|invert` (see README)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from fedsmix.config import PROJECT_ROOT, SettingsError, load_settings

from .options import absolute_paths, parse_sets


def check_dataset(settings) -> None:
    """Before Flower starts: a registered data set can be found (its test split is read once; else one message
    says where it was looked for and how to get it), and a data set given as a path is read and checked
    (DatasetError names the file and the problem), printing what was inferred. The launching process keeps
    neither."""
    from fedsmix.data import DatasetUnavailable, _read_user_dataset, describe_dataset, is_path_dataset, load_split

    if not is_path_dataset(settings.dataset):
        try:
            load_split.__wrapped__(settings.dataset, "test", settings.data_dir, settings.download)
        except DatasetUnavailable as err:
            raise SettingsError(f"dataset: {err}") from None
        return
    from fedsmix.progress import describe

    print(describe({"kind": "dataset", **describe_dataset(settings)}), flush=True)
    _read_user_dataset.cache_clear()


def cmd_run(args: argparse.Namespace) -> int:
    from fedsmix.data import is_path_dataset
    from fedsmix.partition import check_poor_party
    from fedsmix.progress import FILE as PROGRESS_FILE
    from fedsmix.progress import Progress

    from .federation import environment as federation_environment
    from .federation import federation_config, flower_part
    from .launch import flwr_run, interrupt

    overrides = parse_sets(args.set)
    if args.preset:
        overrides["preset"] = args.preset
    settings = load_settings(overrides)  # fail here, before Flower starts, on any bad key or value
    check_dataset(settings)  # and on a bad data set of your own
    if is_path_dataset(settings.dataset):  # the absolute path: the ServerApp runs from Flower's app folder
        overrides["dataset"] = settings.dataset
    overrides = absolute_paths(overrides)
    federation = federation_config(overrides.get("preset", ""), parse_sets(args.federation, "--federation"))
    parties = args.parties if args.parties is not None else federation.get("num-supernodes") or 10
    if parties < settings.min_parties:  # refused here in seconds, not after Flower waited for parties
        raise SettingsError(f"--parties: {parties} parties; min-parties is {settings.min_parties} (at least "
                            f"{settings.min_parties} parties must take part)")
    check_poor_party(settings.partitioner, settings.poor_party, parties)  # a party the federation lacks
    latest = Path(overrides["runs-dir"]) / "latest"
    before = latest.resolve() if latest.exists() else None

    def this_run() -> Path | None:  # the run directory this run made (runs/latest moved), if it got that far
        return latest.resolve() if latest.exists() and latest.resolve() != before else None

    previous = signal.signal(signal.SIGTERM, interrupt)  # SIGTERM stops the run as Ctrl-C does
    try:
        result = flwr_run(overrides, parties, flower_part(federation), environment=federation_environment(federation),
                          verbose=args.verbose)
    except KeyboardInterrupt:  # flwr_run has stopped the SuperLink, the simulation and Ray by now
        run_dir = this_run()
        if run_dir is not None:
            Progress(run_dir / PROGRESS_FILE, echo=False).emit("run-interrupted", reason="stopped by a signal")
        print("\nfedsmix: interrupted; stopped the SuperLink, the simulation and Ray"
              + (f"; partial results in {run_dir}" if run_dir else ""), file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if (run_dir := this_run()) is not None:  # the whole stream, the lines hidden from the console too
        (run_dir / "flwr-run.log").write_text(result.output)
    if result.ok:
        print(f"\nrun {result.run_id}: {result.status}; results in {latest.resolve()}/results.json (runs/latest)")
        return 0
    print(
        f"\nrun {result.run_id}: {result.status} (flwr exit code {result.returncode}); see the log above",
        file=sys.stderr,
    )
    return 1


def cmd_show(args: argparse.Namespace) -> int:
    """A run's results table (what has finished so far) and its progress: the last events, or, with
    --follow, every event as it is written until the run ends."""
    from fedsmix.progress import FILE, clock, describe, follow, read_events
    from server.results import render

    run_dir = Path(args.run_dir)
    results_path, events_path = run_dir / "results.json", run_dir / FILE
    if run_dir.name == "latest" and not run_dir.exists():
        raise SettingsError(f"show: no run yet ({run_dir} does not exist): start one with `make run` or "
                            "`fedsmix run`, or name a run directory")
    if args.follow:
        follow(events_path, timeout=args.timeout)
    elif not results_path.is_file() and not events_path.is_file():
        raise SettingsError(f"show: {run_dir} has neither results.json nor {FILE}: not a run directory (yet)")
    results = json.loads(results_path.read_text()) if results_path.is_file() else None
    if results is not None:
        render(results)
    events = read_events(events_path)
    if not args.follow and events:
        ended = any(e.get("kind") in ("run-end", "run-interrupted") for e in events)
        running = [e.get("strategy") for e in events if e.get("kind") == "strategy-start"]
        finished = {e.get("strategy") for e in events if e.get("kind") in ("strategy-end", "strategy-failed")}
        if not ended:
            current = [name for name in running if name not in finished]
            print(f"run in progress ({len(finished)} strategies finished"
                  + (f", running {current[-1]}" if current else "") + f"); last events of {events_path}:")
        for event in events[-args.events:] if args.events else events:
            print(describe(event))
        clocks = [float(e.get("clock", 0.0)) for e in events]
        silence = max((b - a for a, b in zip(clocks, clocks[1:])), default=0.0)
        print(f"progress: {len(events)} events over {clock(clocks[-1])}; longest silence between two: {silence:.1f}s")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    from fedsmix.trainers import ensure_run_features

    settings = load_settings({**({"preset": args.preset} if args.preset else {}), **parse_sets(args.set)})
    if settings.backbone == "none":
        raise SettingsError("features: set a backbone (e.g. --set backbone=efficientnet-lite0)")
    for path in ensure_run_features(settings):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    from . import attack, bound, grid, invert, mixcon
    from .frontier import command as frontier

    parser = argparse.ArgumentParser(prog="fedsmix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one experiment through `flwr run . --stream` (local simulation)")
    run.add_argument("--preset", default="configs/quickstart.yaml")
    run.add_argument(
        "--parties", type=int, default=None, help="num-supernodes (default: the preset's federation block, else 10)"
    )
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override")
    run.add_argument(
        "--federation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="federation-config override, beats the preset's `federation:` block (e.g. client-resources-num-gpus=0.25)",
    )
    run.add_argument("--verbose", action="store_true",
                     help="print every line of Flower's and Ray's output (by default those that do not concern a "
                     "fedsmix run are hidden; the run directory's flwr-run.log keeps them all)")
    run.set_defaults(func=cmd_run)
    show = sub.add_parser("show", help="print a run's results table and progress (a run still going, too)")
    show.add_argument("run_dir", nargs="?", default=str(PROJECT_ROOT / "runs" / "latest"))
    show.add_argument("--follow", action="store_true", help="print progress events as the run writes them, to its end")
    show.add_argument("--events", type=int, default=10, help="how many of the last progress events to print (0: all)")
    show.add_argument("--timeout", type=float, default=None,
                      help="with --follow: stop after this many seconds without a new event")
    show.set_defaults(func=cmd_show)
    feats = sub.add_parser("features", help="extract and cache a preset's backbone features (train and test)")
    feats.add_argument("--preset", default="")
    feats.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    feats.set_defaults(func=cmd_features)
    for module in (grid, attack, frontier, mixcon, invert, bound):
        module.register(sub)
    args = parser.parse_args(argv)
    from fedsmix.data import DatasetUnavailable

    try:
        return args.func(args)
    except (SettingsError, DatasetUnavailable) as err:  # what the user can fix: one message, no traceback
        print(f"fedsmix: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
