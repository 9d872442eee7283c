"""Command line: `python -m fedsmix run|grid|attack|frontier|show` (see README)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import PROJECT_ROOT, SettingsError, load_settings


def _parse_sets(pairs: list[str]) -> dict:
    """key=value pairs; values parsed as JSON when they look like it (numbers, true/false)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SettingsError(f"--set expects key=value, got {pair!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def _absolute_paths(values: dict) -> dict:
    """The ServerApp and ClientApps run from Flower's app folder: hand them absolute paths."""
    from .data import default_data_dir

    values = dict(values)
    data_dir = default_data_dir(str(values.get("data-dir", "")))
    if data_dir is not None:
        values["data-dir"] = str(data_dir.resolve())
    values["runs-dir"] = str(Path(values.get("runs-dir") or PROJECT_ROOT / "runs").expanduser().resolve())
    if values.get("feature-cache-dir"):
        values["feature-cache-dir"] = str(Path(values["feature-cache-dir"]).expanduser().resolve())
    return values


def cmd_run(args: argparse.Namespace) -> int:
    from .launch import flwr_run

    overrides = _parse_sets(args.set)
    if args.preset:
        overrides["preset"] = args.preset
    load_settings(overrides)  # fail here, before Flower starts, on any bad key or value
    overrides = _absolute_paths(overrides)
    federation = _parse_sets(args.federation)
    result = flwr_run(overrides, args.parties, federation)
    latest = Path(overrides["runs-dir"]) / "latest"
    if result.ok:
        print(f"\nrun {result.run_id}: {result.status}; results in {latest.resolve()}/results.json (runs/latest)")
        return 0
    print(f"\nrun {result.run_id}: {result.status} (flwr exit code {result.returncode}); see the log above", file=sys.stderr)
    return 1


def cmd_show(args: argparse.Namespace) -> int:
    from server.results import render

    path = Path(args.run_dir) / "results.json"
    render(json.loads(path.read_text()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedsmix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one experiment through `flwr run . --stream` (local simulation)")
    run.add_argument("--preset", default="configs/quickstart.yaml")
    run.add_argument("--parties", type=int, default=10, help="num-supernodes of the simulation")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override")
    run.add_argument("--federation", action="append", default=[], metavar="KEY=VALUE", help="federation-config override")
    run.set_defaults(func=cmd_run)
    show = sub.add_parser("show", help="print a run's results table")
    show.add_argument("run_dir", nargs="?", default=str(PROJECT_ROOT / "runs" / "latest"))
    show.set_defaults(func=cmd_show)
    for register in _extra_commands():
        register(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SettingsError as err:
        print(f"fedsmix: {err}", file=sys.stderr)
        return 2


def _extra_commands():
    """Sub-commands that live with their role (runner, adversary) register themselves here."""
    import importlib

    for module in ("fedsmix.runner", "server.adversary.cli", "server.frontier.command"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            continue
        yield mod.register


if __name__ == "__main__":
    sys.exit(main())
