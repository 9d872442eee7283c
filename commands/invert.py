"""`fedsmix invert`: image-level leakage of pretrained-feature uploads (Table 4's pipeline).

    fedsmix invert --preset configs/table4-cifar10.yaml --parties 10 --victims 100 \\
        --taus 1,1e-2,1e-6 --radius-mode theorem,pixel-mapped

The parties upload (mixed) EfficientNet-Lite0 features; leakage there has been scored in feature space
(`fedsmix attack --backbone ...`). This command takes the same victims (the parties' own partitions)
back to pixels: model inversion through the backbone (`server/adversary/inversion.py`, white box:
the backbone is public) of (1) the clean features, as a party would upload them with encoder `none`,
and (2) the features the linear and MMSE attacks estimated from the singularized-mixed uploads at each
tau and radius mode. Reconstructions are scored against the original images like every attack
(`attack_cases`: SNR/PSNR/SSIM and the gain over the public mean image). Writes <out>/invert.{md,csv,json}
and invert.png (originals and the strongest reconstruction of every source).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from fedsmix.config import PROJECT_ROOT, Settings, SettingsError, load_settings

INVERSIONS = ("inversion", "inversion-decoder")
ESTIMATORS = ("linear", "mmse")


def run_invert(settings: Settings, taus: list[float], modes: list[str], estimators: list[str], inversions: list[str],
               victims: int, parties: int, out: Path, device: str = "cpu", mmse_rank: int = 256,
               options: dict | None = None, figure: int = 8, log=print) -> dict:
    from fedsmix import data as datalib
    from fedsmix.encoders import calibrate, data_statistics
    from fedsmix.features import PixelBackbone, party_pixels, public_features
    from fedsmix.party import calibrate_party, encode_partition
    from fedsmix.seeding import generator
    from fedsmix.space import load_public_pool
    from fedsmix.tables import markdown, write_csv
    from server.adversary.analysis import attack_cases
    from server.adversary.cases import representation_case, upload_case, valid_bounds
    from server.adversary.figures import recovery_grid, unit_images
    from server.adversary.registry import build_attacks
    from server.adversary.sweep import victim_cases

    if settings.backbone == "none":
        raise SettingsError("invert: set a backbone (e.g. --preset configs/table4-cifar10.yaml): it inverts features")
    t_start = time.perf_counter()
    options = dict(options or {})
    cases = victim_cases(settings, victims, "test", 0, parties)  # (partition in feature space, scored rows)
    spec = cases[0][0].spec
    pixels = [party_pixels(settings, part.rows, part.split)[0] for part, _ in cases]  # what each feature saw
    truth = torch.cat([p[rows] for p, (_, rows) in zip(pixels, cases)])
    to_unit = (lambda t: datalib.denormalize(t, spec))
    h = PixelBackbone(settings, spec).eval()
    public_pixels = load_public_pool(settings, spec)
    codes = public_features(settings, settings.public_size)
    public_pixels = public_pixels[: len(codes)]
    prior_pixels, prior_codes = public_pixels.mean(dim=0), codes.mean(dim=0)
    inverters, skipped = build_attacks(inversions, settings, public_pixels, spec.sample_shape, device=device,
                                       public_codes=codes, **options)
    feature_attacks, skipped_f = build_attacks(estimators, settings, codes, tuple(codes.shape[1:]), device=device,
                                               mmse_rank=mmse_rank)
    log(f"[invert] {len(truth)} victims from {len(cases)} partition(s), {len(codes)} public images; inversions "
        f"{list(inverters)}, estimators {list(feature_attacks)}; skipped {({**skipped, **skipped_f}) or 'none'}")
    result = {"dataset": settings.dataset, "backbone": settings.backbone, "image-size": settings.image_size,
              "victims": len(truth), "parties": parties, "public-size": len(codes), "taus": taus, "modes": modes,
              "options": options, "device": device, "settings": json.loads(settings.to_json()), "sources": []}
    panels = {"original": unit_images(truth[:figure], to_unit)}

    def invert(source: str, estimates: list[torch.Tensor], info: dict) -> None:
        """Invert one set of feature estimates (one per case, the scored rows) back to pixels and score it."""
        pixel_cases = [
            representation_case(part, z, h, torch.arange(len(rows)), bounds=datalib.valid_range(spec),
                                prior_mean=prior_pixels, truth=p[rows], encoder_name=settings.backbone)
            for (part, rows), p, z in zip(cases, pixels, estimates)
        ]
        started = time.perf_counter()
        outcome = attack_cases(pixel_cases, inverters, prior_pixels, to_unit, device)
        if outcome.errors:
            raise RuntimeError(f"[invert] {source}: inversion failed: {outcome.errors}")
        entry = {"source": source, **info, "trivial": outcome.summary["trivial"], "attacks": {},
                 "seconds": outcome.seconds, "wall-seconds": time.perf_counter() - started}
        for name, e in outcome.summary["attacks"].items():
            entry["attacks"][name] = {**e, "ssim-best": float(outcome.per_image[name]["ssim"].max())}
        best = max(entry["attacks"], key=lambda n: entry["attacks"][n]["gain"]["ssim"])
        panels[f"{source}\n{best}"] = unit_images(outcome.estimates[best][:figure], to_unit)
        result["sources"].append(entry)
        log(f"[invert] {source}: " + ", ".join(
            f"{n} SSIM {e['score']['ssim_mean']:.3f} (gain {e['gain']['ssim']:+.3f}), PSNR gain "
            f"{e['gain']['psnr_db']:+.2f} dB" for n, e in entry["attacks"].items()))
        (out / "invert.json").write_text(json.dumps(result, indent=1))  # partial results survive a timeout

    invert("clean features", [part.x[rows] for part, rows in cases], {"tau": None, "mode": None, "estimator": None})
    stats = [data_statistics(part.x, generator(settings.seed, part.party, "calibrate")) for part, _ in cases]
    for mode in modes:
        for tau in taus:
            st = settings.replace(tau=tau, radius_mode=mode)
            calibrations = [calibrate(stat, tau, st.alpha) if mode == "theorem" else calibrate_party(st, part)
                            for stat, (part, _) in zip(stats, cases)]
            feature_cases = []
            for (part, rows), calibration in zip(cases, calibrations):
                enc, _ = encode_partition(st, part, calibration)
                feature_cases.append(upload_case(st, part, enc, calibration, rows, uploaded=enc.x,
                                                 bounds=valid_bounds(st, spec), prior_mean=prior_codes))
            outcome = attack_cases(feature_cases, feature_attacks, prior_codes, None, device)
            if outcome.errors:
                raise RuntimeError(f"[invert] tau={tau:g} {mode}: feature attacks failed: {outcome.errors}")
            sizes = [len(rows) for _, rows in cases]
            for name, estimate in outcome.estimates.items():
                gain = outcome.summary["attacks"][name]["gain"]["snr_db"]
                info = {"tau": tau, "mode": mode, "estimator": name, "feature-snr-gain-db": gain,
                        "radius": float(np.mean([c.radius for c in calibrations]))}
                invert(f"tau={tau:g} {mode} {name}", list(estimate.split(sizes)), info)
    rows_md, rows_csv = [], []
    for entry in result["sources"]:
        for name, e in entry["attacks"].items():
            sc, gain = e["score"], e["gain"]
            feature_gain = entry.get("feature-snr-gain-db")
            rows_md.append({
                "source": entry["source"], "feature": "-" if feature_gain is None else f"{feature_gain:+.2f}",
                "attack": name, "snr": f"{sc['snr_mean']:.2f}", "psnr": f"{sc['psnr_mean']:.2f}",
                "ssim": f"{sc['ssim_mean']:.3f} ± {sc['ssim_std']:.3f}", "best": f"{e['ssim-best']:.3f}",
                "gain_snr": f"{gain['snr_db']:+.2f}", "gain_psnr": f"{gain['psnr_db']:+.2f}",
                "gain_ssim": f"{gain['ssim']:+.3f}", "seconds": f"{entry['seconds'].get(name, 0):.0f}",
            })
            rows_csv.append({"source": entry["source"], "tau": entry["tau"], "mode": entry["mode"],
                             "estimator": entry["estimator"], "feature_snr_gain_db": feature_gain, "attack": name,
                             **{f"attack_{k}": v for k, v in sc.items()}, "ssim_best": e["ssim-best"],
                             **{f"gain_{k}": v for k, v in gain.items()},
                             **{f"trivial_{k}": v for k, v in entry["trivial"].items()}})
    columns = [("source", "upload (and feature-space estimator)"), ("feature", "estimator's feature SNR gain dB"),
               ("attack", "inversion to pixels"), ("snr", "SNR dB"), ("psnr", "PSNR dB"), ("ssim", "SSIM"),
               ("best", "best-image SSIM"), ("gain_snr", "gain SNR dB"), ("gain_psnr", "gain PSNR dB"),
               ("gain_ssim", "gain SSIM"), ("seconds", "s")]
    trivial = result["sources"][0]["trivial"]
    where = (f"{len(truth)} victims from {parties} parties' training partitions" if parties
             else f"the first {len(truth)} test images")
    budget = (f"{settings.dataset} through {settings.backbone} at {settings.image_size or 'default'} px: {where}. "
              f"White-box inversion {options.get('inversion_steps', 500)} SGD steps (lr "
              f"{options.get('inversion_lr', 1.0):g}, TV weight chosen on {options.get('inversion_probe', 16)} public "
              f"images among {', '.join(f'{t:g}' for t in options.get('inversion_tv', ()))}; chosen: "
              f"{inverters['inversion'].tv if 'inversion' in inverters else '-'}) through the backbone, "
              f"from the public mean image; decoder {options.get('decoder_epochs', 50)} epochs on {len(codes)} public "
              f"Tiny-ImageNet images and their features. Scored at {spec.image_size} px against the originals; trivial "
              f"guess (public mean image): SNR {trivial['snr_mean']:.2f} dB, PSSIM {trivial['ssim_mean']:.3f}. "
              f"Total {time.perf_counter() - t_start:.0f} s on {device}.").replace("PSSIM", "SSIM")
    (out / "invert.md").write_text(f"## Image-level leakage of {settings.backbone} feature uploads\n\n{budget}\n\n"
                                   + markdown(rows_md, columns))
    write_csv(out / "invert.csv", rows_csv)
    shown = min(figure, len(truth))
    recovery_grid(out / "invert.png", [f"victim {i}" for i in range(shown)], {k: v[:shown] for k, v in panels.items()},
                  f"{settings.dataset}: {settings.backbone} features inverted to pixels")
    result["files"] = [str(out / f"invert.{ext}") for ext in ("md", "csv", "json", "png")]
    (out / "invert.json").write_text(json.dumps(result, indent=1))
    return result


def choose(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in allowed]
    if unknown or not names:
        raise SettingsError(f"{flag}: choose from {', '.join(allowed)}, got {text!r}")
    return names


def cmd_invert(args: argparse.Namespace) -> int:
    from commands.attack import parse_taus
    from commands.options import parse_sets
    from fedsmix.device import select_device

    overrides = parse_sets(args.set)
    if args.preset:
        overrides["preset"] = args.preset
    settings = load_settings(overrides)
    taus = parse_taus(args.taus)
    modes = [m.strip() for m in args.radius_mode.split(",") if m.strip()]
    for mode in modes:
        if mode not in ("theorem", "pixel-mapped"):
            raise SettingsError(f"--radius-mode: {mode!r}; allowed: theorem, pixel-mapped")
    inversions, estimators = choose(args.attacks, INVERSIONS, "--attacks"), choose(args.estimators, ESTIMATORS,
                                                                                    "--estimators")
    if args.parties < 0:
        raise SettingsError(f"--parties: expected >= 0, got {args.parties}")
    device = select_device(args.device or settings.device)
    out = Path(args.out) if args.out else (
        PROJECT_ROOT / "runs" / "invert" / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{settings.dataset}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"fedsmix invert: writing to {out} (device {device})", flush=True)
    try:
        tvs = tuple(float(t) for t in args.tv.split(",") if t.strip())
    except ValueError:
        raise SettingsError(f"--tv: expected comma-separated numbers, got {args.tv!r}") from None
    options = {"inversion_steps": args.steps, "inversion_lr": args.lr, "inversion_tv": tvs,
               "inversion_probe": args.probe,
               "decoder_epochs": args.decoder_epochs, "decoder_code_weight": args.decoder_code_weight,
               "decoder_adversarial": args.decoder_adversarial}
    run_invert(settings, taus, modes, estimators, inversions, args.victims, args.parties, out, device, args.mmse_rank,
               options, args.figure)
    print("\n" + (out / "invert.md").read_text(), flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("invert", help="invert (estimated) backbone-feature uploads back to images: "
                                             "image-level leakage of Table 4's uploads")
    p.add_argument("--preset", default="configs/table4-cifar10.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run setting, e.g. public-size=2000")
    p.add_argument("--victims", type=int, default=100, help="spread over --parties (or the first N test images)")
    p.add_argument("--parties", type=int, default=10, help="P > 0: the P parties' own partitions; 0: test images")
    p.add_argument("--taus", default="1,1e-2,1e-6")
    p.add_argument("--radius-mode", default="theorem,pixel-mapped")
    p.add_argument("--estimators", default="linear,mmse", help="feature-space attacks on the mixed uploads")
    p.add_argument("--attacks", default="inversion,inversion-decoder", help="inversions to pixels")
    p.add_argument("--steps", type=int, default=500, help="white-box inversion steps")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--tv", default="1e-5,1e-2,1e-1", help="TV weights zeta; several: chosen on --probe public images")
    p.add_argument("--probe", type=int, default=8, help="public images the TV weight is chosen on")
    p.add_argument("--decoder-epochs", type=int, default=50)
    p.add_argument("--decoder-code-weight", type=float, default=0.0,
                   help="xi of the decoder's ||z - f(G(z))||_1 term (backpropagates through the backbone; 0: off)")
    p.add_argument("--decoder-adversarial", type=float, default=1.0, help="weight of the decoder's GAN term")
    p.add_argument("--mmse-rank", type=int, default=256)
    p.add_argument("--figure", type=int, default=8)
    p.add_argument("--device", default="")
    p.add_argument("--out", default="")
    p.set_defaults(func=cmd_invert)
