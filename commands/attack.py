"""`fedsmix attack`: the tau sweep of the paper's security tables, tables and figures.

    fedsmix attack --dataset mnist,cifar10 --victims 1000 --taus 1,1e-1,...,1e-6 \
        --attacks linear,mmse,unet
    fedsmix attack --preset configs/table4-cifar10.yaml --parties 10 --victims 1000 \
        --radius-mode theorem,pixel-mapped --attacks linear,mmse      # in EfficientNet-Lite0 feature space
    fedsmix attack --preset configs/paper-tables-1-2.yaml --dataset mnist,cifar10 --victims 500 \
        --attacks linear --variant mixing-weights=algorithm1          # the paper's encoder beside Algorithm 1
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from fedsmix.config import PROJECT_ROOT, SettingsError, load_settings
from fedsmix.registry import ATTACKS


def parse_taus(text: str) -> list[float]:
    """Comma-separated values; '...' between two powers of ten fills in every decade."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    taus: list[float] = []
    for i, part in enumerate(parts):
        if part == "...":
            if i == 0 or i == len(parts) - 1:
                raise SettingsError("--taus: '...' needs a value on each side, e.g. 1,1e-1,...,1e-6")
            ratio = taus[-1] / taus[-2] if len(taus) >= 2 else (0.1 if float(parts[i + 1]) < taus[-1] else 10.0)
            steps = math.log(float(parts[i + 1]) / taus[-1]) / math.log(ratio) if ratio != 1 else -1
            if steps < 1 or abs(steps - round(steps)) > 1e-6:
                raise SettingsError(f"--taus: cannot step from {taus[-1]:g} to {parts[i + 1]} by factors of {ratio:g}")
            start = taus[-1]
            taus += [float(f"{start * ratio**k:.12g}") for k in range(1, round(steps))]
            continue
        try:
            value = float(part)
        except ValueError:
            raise SettingsError(f"--taus: {part!r} is not a number") from None
        if not value > 0 or not math.isfinite(value):
            raise SettingsError(f"--taus: tau must be > 0, got {part}")
        taus.append(value)
    if not taus:
        raise SettingsError("--taus: give at least one value")
    return taus


def cmd_attack(args: argparse.Namespace) -> int:
    from commands.options import parse_sets
    from fedsmix.device import select_device
    from server.adversary.sweep import run_sweep, write_comparison

    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    for name in attacks:
        if name not in ATTACKS:
            raise SettingsError(f"--attacks: {ATTACKS.unknown(name)}")
    taus = parse_taus(args.taus)
    if args.parties < 0:
        raise SettingsError(f"--parties: expected >= 0, got {args.parties}")
    if args.parties and args.split:
        raise SettingsError("--split: with --parties the victims are the parties' training rows; drop one of the two")
    overrides = parse_sets(args.set)
    if args.preset:
        overrides["preset"] = args.preset
    for key, value in (("backbone", args.backbone), ("image-size", args.image_size)):
        if value is not None:
            overrides[key] = value
    modes = [m.strip() for m in (args.radius_mode or "").split(",") if m.strip()] or [None]
    datasets = [d.strip() for d in args.dataset.split(",") if d.strip()]
    variants = [{}] + [parse_sets([v for v in text.split(",") if v.strip()], "--variant") for text in args.variant]
    runs = [  # (dataset, radius mode, variant) triples; every one validated before any work
        load_settings({**overrides, "dataset": d, **({"radius-mode": m} if m else {}), **variant})
        for d in datasets for m in modes for variant in variants
    ]
    first = runs[0]
    device = select_device(args.device or first.device)
    if device == "cuda":
        import torch

        torch.backends.cudnn.benchmark = True  # fixed image sizes: let cuDNN pick its fastest convolutions
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = (
        Path(args.out) if args.out else Path(first.runs_dir).expanduser() / "attacks" / f"{stamp}-{'-'.join(datasets)}"
    )
    if not out.is_absolute() and not args.out:
        out = PROJECT_ROOT / out
    out.mkdir(parents=True, exist_ok=True)
    print(f"fedsmix attack: writing to {out} (device {device})", flush=True)
    from fedsmix.progress import FILE, Progress

    # the sweep prints its own line per tau; the events go to the file for `fedsmix show --follow <out>`
    progress = Progress(out / FILE, echo=False, interval=first.progress_interval)
    progress.emit("run-start", **{"run-dir": str(out), "strategies": ["attack"], "dataset": ",".join(datasets)})
    tables, results = [], []
    for settings in runs:
        result = run_sweep(
            settings,
            taus,
            attacks,
            args.victims,
            out,
            device,
            args.mmse_rank,
            args.split or "test",
            args.resize,
            parties=args.parties,
            progress=progress.bind(strategy=f"attack {settings.dataset} {settings.radius_mode}"),
            unet_curve=args.unet_curve,
        )
        tables.append(Path(result["files"][0]).read_text())
        results.append(result)
    if args.variant:  # several settings per data set: every variant beside the base and the paper
        tables.append(Path(write_comparison(out, results)).read_text())
    (out / "tables.md").write_text("\n".join(tables))
    progress.emit("run-end", failures=[])
    print("\n" + "\n".join(tables), flush=True)
    print(f"tables, CSV and figures in {out}", flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "attack", help="tau sweep of the reconstruction attacks (paper Tables 1-2), tables and figures"
    )
    p.add_argument("--dataset", default="cifar10", help="one or more, comma-separated (e.g. mnist,cifar10)")
    p.add_argument("--victims", type=int, default=1000, help="first N images of --split, or N spread over --parties")
    p.add_argument("--split", default=None, choices=("test", "train"), help="the first N victims' split (default test)")
    p.add_argument(
        "--parties",
        type=int,
        default=0,
        help="P > 0: attack the P parties' own partitions (partitioner, seed), N / P victims each",
    )
    p.add_argument("--taus", default="1,1e-1,...,1e-6")
    p.add_argument("--attacks", default="linear,mmse,unet", help="comma-separated names of registered attacks")
    p.add_argument(
        "--backbone",
        default=None,
        help="mix, attack and score in this backbone's feature space (e.g. efficientnet-lite0)",
    )
    p.add_argument("--image-size", type=int, default=None, help="the backbone's input size in px (0: its default)")
    p.add_argument(
        "--radius-mode", default=None, help="theorem, pixel-mapped or fixed; comma-separated for one sweep per mode"
    )
    p.add_argument(
        "--resize", type=int, default=0, help="upsample victims and public images to N px first (paper: 224)"
    )
    p.add_argument(
        "--unet-curve", action="store_true",
        help="score the victims after every U-Net epoch (a learning curve for analysis; the attack keeps its last "
        "epoch). U-Net fits are checkpointed per epoch in --out: the same command continues an interrupted one",
    )
    p.add_argument("--mmse-rank", type=int, default=256, help="rank of the MMSE prior's covariance (plus a diagonal)")
    p.add_argument("--device", default="", help="auto, cpu or cuda (default: the settings' device)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="also sweep with these settings (repeatable); comparison.md puts every variant beside the paper, e.g. "
        "--preset configs/paper-tables-1-2.yaml --variant mixing-weights=algorithm1",
    )
    p.add_argument("--preset", default="")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run setting, e.g. unet-epochs=5, attack-steps=200, alpha=0.7, seed=0, public-size=2000",
    )
    p.add_argument("--out", default="", help="output folder (default runs/attacks/<time>-<datasets>)")
    p.set_defaults(func=cmd_attack)
