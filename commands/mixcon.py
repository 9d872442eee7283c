"""`fedsmix mixcon`: MixCon's experiments (Li et al., section 4), trained centrally as the paper does.

    fedsmix mixcon --dataset mnist,fashion-mnist --pairs 0:0,1:1e-4 --epochs 20 --victims 100
    fedsmix mixcon --synthetic

Benchmark (Table 3): LeNet-5 with L = L_CE + lambda L_mixcon on the output of its second conv block,
SGD lr 0.01, 20 epochs, no augmentation; then model inversion of the first `victims` test images from
h(x) (the white-box attack at the paper's and at our step size, and the decoder trained on public
images), scored like every attack (`server.adversary.analysis.attack_cases`): SNR/PSNR/SSIM beside the
trivial guess. Synthetic (Tables 1-2): two Gaussians in R^10, 800/200 samples, 5 % label flips, the
10 -> 500 -> 2 | -> 100 -> 2 network, SGD lr 0.1 for 20 epochs, inverted with ||h(s) - z||_1 by SGD
(lr 0.01, weight decay 1e-4, 500 steps) and scored by MSE and mean cosine similarity.
Writes <out>/<dataset>-mixcon.{md,csv,json,png} and synthetic-mixcon.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from fedsmix.config import PROJECT_ROOT, SettingsError

# Table 3 of the paper: accuracy % and SSIM mean, std, worst case (the best-recovered image)
PAPER = {
    ("mnist", 0.0, 0.0): (99.1, 0.64, 0.11, 0.83),
    ("mnist", 1.0, 1e-4): (98.6, 0.14, 0.11, 0.48),
    ("fashion-mnist", 0.0, 0.0): (89.8, 0.43, 0.17, 0.78),
    ("fashion-mnist", 1.0, 1e-4): (88.9, 0.17, 0.09, 0.52),
}
# Tables 1-2: train %, test %, inversion MSE, MCS (default network); Table 1's deeper/wider test %
PAPER_SYNTHETIC = {
    (0.0, 0.0): (91.5, 91.5, 1.92, 0.169),
    (0.1, 0.01): (88.9, 88.0, 2.08, 0.118),
    (0.1, 0.0): (50.0, 50.0, 2.35, 0.161),
}
PAPER_SYNTHETIC_HEADS = {("deeper", 0.1, 0.01): 88.5, ("wider", 0.1, 0.01): 90.5, ("deeper", 0.1, 0.0): 50.0,
                         ("wider", 0.1, 0.0): 50.0}


def parse_pairs(text: str) -> list[tuple[float, float]]:
    """'0:0,1:1e-4' -> [(lambda, beta), ...]; a bare lambda means beta 0."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lam, _, beta = part.partition(":")
        try:
            pair = (float(lam), float(beta or 0.0))
        except ValueError:
            raise SettingsError(f"--pairs: {part!r} is not lambda:beta") from None
        if pair[0] < 0 or pair[1] < 0:
            raise SettingsError(f"--pairs: lambda and beta must be >= 0, got {part!r}")
        pairs.append(pair)
    if not pairs:
        raise SettingsError("--pairs: give at least one lambda:beta")
    return pairs


def label(lam: float, beta: float) -> str:
    return "vanilla" if lam == 0 else f"MixCon({lam:g}, {beta:g})"


# ------------------------------------------------------------------------------------------- benchmark
def train_split(x, labels, num_classes: int, lam: float, beta: float, args, device: str, make_model, purpose):
    from fedsmix import data as datalib
    from fedsmix.seeding import generator
    from fedsmix.training import TrainConfig, train

    torch.manual_seed(args.seed)
    model = make_model()
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, weight_decay=0.0, optimizer="sgd",
                      cosine=False, momentum=args.momentum, device=device, mixcon_lambda=lam, mixcon_beta=beta,
                      mixcon_eps=args.eps, mixcon_normalize=getattr(args, "normalize", True), clip_grad_norm=args.clip)
    report = train(model, x, datalib.one_hot(labels, num_classes), cfg, generator(args.seed, *purpose))
    return model.cpu(), report


def benchmark(dataset: str, args, device: str, out: Path, log=print) -> dict:
    from fedsmix import data as datalib
    from fedsmix.config import load_settings
    from fedsmix.models import lenet5, represent
    from fedsmix.party import Partition, separability
    from fedsmix.seeding import generator
    from fedsmix.space import load_public_pool
    from fedsmix.tables import markdown, write_csv
    from fedsmix.training import evaluate
    from server.adversary.analysis import attack_cases
    from server.adversary.cases import representation_case
    from server.adversary.figures import recovery_grid, unit_images
    from server.adversary.inversion import ModelInversion
    from server.adversary.registry import INVERSION_TVS, build_attacks

    settings = load_settings({"dataset": dataset, "seed": args.seed, "data-dir": args.data_dir,
                              "public-size": args.public_size})
    train_raw = datalib.load_split(dataset, "train", settings.data_dir)
    test_raw = datalib.load_split(dataset, "test", settings.data_dir)
    spec = train_raw.spec
    rows = (np.sort(np.random.RandomState(args.seed).permutation(len(train_raw))[: args.train_subset])
            if args.train_subset else None)
    x, labels = datalib.normalized_tensors(train_raw, rows)
    xt, lt = datalib.normalized_tensors(test_raw)
    victims = min(args.victims, len(xt))
    to_unit = (lambda t: datalib.denormalize(t, spec))
    public = load_public_pool(settings, spec)
    public = public[: settings.public_size] if settings.public_size else public
    prior = public.mean(dim=0)
    result = {"dataset": dataset, "train-size": len(x), "test-size": len(xt), "victims": victims, "epochs": args.epochs,
              "batch-size": args.batch_size, "lr": args.lr, "momentum": args.momentum, "eps": args.eps,
              "attacks": args.attacks, "public-size": len(public), "seed": args.seed, "device": device, "settings": []}
    panels = {"original": unit_images(xt[: args.figure], to_unit)}
    record = out / f"{dataset}-mixcon.json"
    previous = json.loads(record.read_text())["settings"] if args.reuse and record.is_file() else []
    for lam, beta in args.pairs:
        t0 = time.perf_counter()
        saved = out / f"{dataset}-lenet5-l{lam:g}-b{beta:g}.pt"
        trained = any(e["lambda"] == lam and e["beta"] == beta for e in previous)
        if args.reuse and saved.is_file() and trained:  # the model a previous run of this command saved here
            model = lenet5(spec.sample_shape, spec.num_classes)
            model.load_state_dict(torch.load(saved, map_location="cpu", weights_only=True))
            report = next(argparse.Namespace(seconds=e["train-seconds"], losses=e["train-loss"])
                          for e in previous if e["lambda"] == lam and e["beta"] == beta)
        else:
            model, report = train_split(x, labels, spec.num_classes, lam, beta, args, device,
                                        lambda: lenet5(spec.sample_shape, spec.num_classes),
                                        ("mixcon", dataset, lam, beta))
        accuracy = evaluate(model, xt, lt)["accuracy"]
        h = model.encoder.eval()
        z = represent(h, xt)
        sep = separability(z, lt, generator(args.seed, "separability", dataset))
        torch.save(model.state_dict(), saved)
        log(f"[{dataset}] {label(lam, beta)}: test accuracy {100 * accuracy:.2f} % ({report.seconds:.0f} s), "
            f"mean dist {sep['separability-mean']:.4g}")
        part = Partition(0, xt[:victims], lt[:victims], spec.num_classes, spec, np.arange(victims), "test")
        case = representation_case(part, z[:victims], h, torch.arange(victims), bounds=datalib.valid_range(spec),
                                   prior_mean=prior)
        names = [a for a in args.attacks if a in ("inversion", "inversion-decoder")]
        attacks, skipped = build_attacks(names, settings, public, spec.sample_shape, device=device,
                                         inversion_lr=args.inversion_lr, decoder_epochs=args.decoder_epochs)
        if "inversion-zeta1e-5" in args.attacks:  # the paper's zeta at our step size
            attacks["inversion-zeta1e-5"] = ModelInversion(lr=args.inversion_lr, tv=1e-5, device=device)
        if "inversion-paper" in args.attacks:  # appendix C.2 exactly: SGD lr 10, no decay, zeta 1e-5
            attacks["inversion-paper"] = ModelInversion(lr=10.0, tv=1e-5, cosine=False, device=device)
        outcome = attack_cases([case], attacks, prior, to_unit, device)
        if outcome.errors:
            raise RuntimeError(f"[{dataset}] {label(lam, beta)}: attacks failed: {outcome.errors}")
        paper = PAPER.get((dataset, lam, beta))
        entry = {"lambda": lam, "beta": beta, "label": label(lam, beta), "accuracy": accuracy,
                 "train-seconds": report.seconds, "train-loss": report.losses, **sep,
                 "paper": None if paper is None else {"accuracy": paper[0], "ssim": paper[1], "ssim-std": paper[2],
                                                      "ssim-worst": paper[3]},
                 "trivial": outcome.summary["trivial"], "attacks": {}, "skipped": {**skipped, **outcome.skipped},
                 "seconds": outcome.seconds, "wall-seconds": time.perf_counter() - t0}
        for name, e in outcome.summary["attacks"].items():
            ssim = outcome.per_image[name]["ssim"]
            entry["attacks"][name] = {**e, "ssim-worst": float(ssim.max()),
                                      "ssim-normalised": float(((ssim + 1) / 2).mean())}
            panels[f"{label(lam, beta)}\n{name}"] = unit_images(outcome.estimates[name][: args.figure], to_unit)
            log(f"[{dataset}]   {name}: SSIM {e['score']['ssim_mean']:.3f} ± {e['score']['ssim_std']:.3f} "
                f"(best {float(ssim.max()):.3f}), PSNR {e['score']['psnr_mean']:.2f} dB, gain SSIM "
                f"{e['gain']['ssim']:+.3f} ({outcome.seconds[name]:.0f} s)")
        if "inversion-decoder" in attacks and attacks["inversion-decoder"].report:
            entry["decoder-training"] = attacks["inversion-decoder"].report
        if args.zeta_sweep:  # sensitivity: the white-box attack at every zeta, scored on the victims themselves
            sweep = {f"{tv:g}": ModelInversion(lr=args.inversion_lr, tv=tv, device=device) for tv in INVERSION_TVS}
            swept = attack_cases([case], sweep, prior, to_unit, device)
            entry["zeta-sweep"] = {tv: {"ssim": e["score"]["ssim_mean"], "ssim-std": e["score"]["ssim_std"],
                                        "psnr": e["score"]["psnr_mean"]} for tv, e in swept.summary["attacks"].items()}
            log(f"[{dataset}]   SSIM per zeta: " + ", ".join(f"{tv}: {v['ssim']:.3f}"
                                                          for tv, v in entry["zeta-sweep"].items()))
        if "inversion" in attacks:
            entry["inversion-zeta"] = attacks["inversion"].report
            log(f"[{dataset}]   inversion's zeta chosen on public probes: {attacks['inversion'].tv:g} "
                f"(probe SSIM per zeta {attacks['inversion'].report['zeta-selection']})")
        result["settings"].append(entry)
        (out / f"{dataset}-mixcon.json").write_text(json.dumps(result, indent=1))  # partial results survive
    rows_md, rows_csv = table_rows(result)
    columns = [("setting", "setting"), ("acc", "test acc %"), ("paper_acc", "paper acc %"), ("dist", "mean dist"),
               ("attack", "attack"), ("ssim", "SSIM mean ± std (best)"), ("ssim01", "(SSIM+1)/2"),
               ("paper_ssim", "paper SSIM"), ("psnr", "PSNR dB"), ("gain_ssim", "gain SSIM"),
               ("gain_psnr", "gain PSNR dB")]
    budget = (f"{dataset}: LeNet-5, {len(x)} training images, SGD lr {args.lr:g} momentum {args.momentum:g}, batch "
              f"{args.batch_size}, {args.epochs} epochs (paper: SGD lr 0.01, 20 epochs); first {victims} test images "
              f"inverted from h(x) (cut after the second conv block, 400 values); white-box inversion: SGD 500 steps, "
              f"weight decay 1e-4, lr {args.inversion_lr:g} with cosine decay and TV weight zeta chosen on 16 public "
              f"images (inversion) or zeta 1e-5 (inversion-zeta1e-5), or appendix C.2 exactly (lr 10, zeta 1e-5: "
              f"inversion-paper); decoder {args.decoder_epochs} epochs on {len(public)} public Tiny-ImageNet "
              f"images (grey, 28 px). Trivial guess: the public mean image (SSIM "
              f"{result['settings'][0]['trivial']['ssim_mean']:.3f}). Threat model: white box (h's weights known).")
    text = f"## {dataset}: MixCon against model inversion\n\n{budget}\n\n" + markdown(rows_md, columns)
    if any("zeta-sweep" in e for e in result["settings"]):
        grid = [f"{tv:g}" for tv in INVERSION_TVS]
        text += ("\nWhite-box inversion at each TV weight zeta (SSIM on the same victims: choosing zeta this way "
                 "uses the ground truth, an oracle; `inversion` above chooses on public images):\n\n"
                 + markdown([{"setting": e["label"], **{tv: f"{e['zeta-sweep'][tv]['ssim']:.3f}" for tv in grid}}
                             for e in result["settings"] if "zeta-sweep" in e],
                            [("setting", "setting")] + [(tv, f"zeta {tv}") for tv in grid]))
    (out / f"{dataset}-mixcon.md").write_text(text)
    write_csv(out / f"{dataset}-mixcon.csv", rows_csv)
    columns_fig = [f"victim {i}" for i in range(min(args.figure, victims))]
    recovery_grid(out / f"{dataset}-mixcon.png", columns_fig, {k: v[: len(columns_fig)] for k, v in panels.items()},
                  f"{dataset}: originals and model-inversion reconstructions from h(x)")
    result["files"] = [str(out / f"{dataset}-mixcon.{ext}") for ext in ("md", "csv", "json", "png")]
    (out / f"{dataset}-mixcon.json").write_text(json.dumps(result, indent=1))
    return result


def table_rows(result: dict) -> tuple[list[dict], list[dict]]:
    md, csv_rows = [], []
    for entry in result["settings"]:
        paper = entry["paper"] or {}
        for name, e in entry["attacks"].items():
            sc, gain = e["score"], e["gain"]
            md.append({
                "setting": entry["label"], "acc": f"{100 * entry['accuracy']:.2f}",
                "paper_acc": f"{paper['accuracy']:.1f}" if paper else "-",
                "dist": f"{entry['separability-mean']:.3g}", "attack": name,
                "ssim": f"{sc['ssim_mean']:.3f} ± {sc['ssim_std']:.3f} ({e['ssim-worst']:.2f})",
                "ssim01": f"{e['ssim-normalised']:.3f}",
                "paper_ssim": f"{paper['ssim']:.2f} ± {paper['ssim-std']:.2f} ({paper['ssim-worst']:.2f})"
                if paper else "-",
                "psnr": f"{sc['psnr_mean']:.2f}", "gain_ssim": f"{gain['ssim']:+.3f}",
                "gain_psnr": f"{gain['psnr_db']:+.2f}",
            })
            csv_rows.append({"dataset": result["dataset"], "lambda": entry["lambda"], "beta": entry["beta"],
                             "accuracy": entry["accuracy"], "separability_mean": entry["separability-mean"],
                             "separability_min": entry["separability-min"], "attack": name,
                             **{f"attack_{k}": v for k, v in sc.items()}, "ssim_worst": e["ssim-worst"],
                             "ssim_normalised": e["ssim-normalised"],
                             **{f"gain_{k}": v for k, v in gain.items()},
                             "paper_accuracy": paper.get("accuracy"), "paper_ssim": paper.get("ssim")})
    return md, csv_rows


# ------------------------------------------------------------------------------------------- synthetic
def two_gaussians(seed: int, n_train: int = 800, n_test: int = 200, d: int = 10, flip: float = 0.05,
                  flip_test: bool = False):
    """Positives from N(0, I), negatives from N(-1, I) (label 1 and 0, half each, shuffled; the first
    n_train are the training split); `flip` of the training labels flipped at random (`flip_test`: of
    the test labels too). The Bayes classifier scores Phi(sqrt(10)/2) = 94.3 % on clean labels."""
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_test
    y = torch.arange(n) % 2
    x = torch.randn(n, d, generator=g) - (1 - y).float().unsqueeze(1)
    order = torch.randperm(n, generator=g)
    x, y = x[order], y[order]
    for lo, hi in ((0, n_train), (n_train, n)) if flip_test else ((0, n_train),):
        flipped = lo + torch.randperm(hi - lo, generator=g)[: round(flip * (hi - lo))]
        y[flipped] = 1 - y[flipped]
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def synthetic_run(args, seed: int, head: str, options: dict, lam: float, beta: float) -> dict:
    """One seed of one (network, lambda, beta): accuracies and, for the default network, Table 2's inversion."""
    from fedsmix.models import SyntheticSplitNet
    from fedsmix.training import evaluate
    from server.adversary.base import Observation
    from server.adversary.inversion import ModelInversion

    (x, y), (xt, yt) = two_gaussians(seed, flip_test=args.flip_test)
    params = argparse.Namespace(**{**vars(args), "seed": seed, "epochs": args.synthetic_epochs, "lr": 0.1,
                                   "momentum": 0.0, "batch_size": args.synthetic_batch_size,
                                   "normalize": args.synthetic_normalize, "clip": args.synthetic_clip})

    def make():
        g = torch.Generator().manual_seed(seed) if args.init_alpha is not None else None
        return SyntheticSplitNet(init_alpha=args.init_alpha, generator=g, **options)

    model, report = train_split(x, y, 2, lam, beta, params, "cpu", make, ("synthetic", head, lam, beta))
    run = {"train": evaluate(model, x, y)["accuracy"], "test": evaluate(model, xt, yt)["accuracy"],
           "final-loss": report.losses[-1]}
    if head == "default":  # Table 2: inversion of all 200 test points, l1 loss, no prior, from 0
        h = model.encoder.eval()
        with torch.no_grad():
            z = h(xt)
        attack = ModelInversion(steps=500, lr=0.01, weight_decay=1e-4, tv=0.0, norm="l1", box=False, cosine=False,
                                batch_size=len(xt))
        x_hat = attack.reconstruct(Observation(x_tilde=z, n_private=len(xt), encoder=h, input_shape=(10,)))
        run["mse"] = float((x_hat - xt).pow(2).mean())  # per coordinate
        run["mcs"] = float(torch.nn.functional.cosine_similarity(x_hat, xt, dim=1).mean())
        run["code-spread"] = float(z.std(dim=0).norm())
    return run


def synthetic(args, out: Path, log=print) -> dict:
    seeds = list(range(args.seed, args.seed + args.synthetic_seeds))
    result = {"seeds": seeds, "epochs": args.synthetic_epochs, "batch-size": args.synthetic_batch_size,
              "lr": 0.1, "init-alpha": args.init_alpha, "normalize": args.synthetic_normalize,
              "clip": args.synthetic_clip, "eps": args.eps, "flip-test": args.flip_test, "settings": []}
    heads = {"default": {}, "deeper": {"deeper": True}, "wider": {"width": 2048}}
    for head, options in heads.items():
        for lam, beta in ((0.0, 0.0), (0.1, 0.01), (0.1, 0.0)):
            runs = [synthetic_run(args, seed, head, options, lam, beta) for seed in seeds]
            entry = {"head": head, "lambda": lam, "beta": beta, "label": label(lam, beta), "runs": runs}
            for key in runs[0]:
                values = np.array([r[key] for r in runs], dtype=np.float64)
                entry[key], entry[f"{key}-std"] = float(np.median(values)), float(values.std())
            paper = PAPER_SYNTHETIC.get((lam, beta)) if head == "default" else None
            entry["paper"] = (dict(zip(("train", "test", "mse", "mcs"), paper)) if paper
                              else {"test": PAPER_SYNTHETIC_HEADS.get((head, lam, beta))})
            result["settings"].append(entry)
            per_seed = ", ".join(f"{100 * r['test']:.0f}" for r in runs)
            log(f"[synthetic] {head} {label(lam, beta)}: train {100 * entry['train']:.1f} %, test "
                f"{100 * entry['test']:.1f} % (median of {len(seeds)} seeds; per seed {per_seed})"
                + (f", inversion MSE {entry['mse']:.3f}, MCS {entry['mcs']:.3f}" if "mse" in entry else ""))
    clip = f"gradient norm clipped at {args.synthetic_clip:g}" if args.synthetic_clip else "no gradient clipping"
    lines = [
        "## Synthetic two-Gaussian experiment (MixCon's Tables 1-2)", "",
        f"800/200 samples of N(0, I) vs N(-1, I) in R^10, 5 % of the {'' if args.flip_test else 'training '}labels "
        f"flipped; L_mixcon on {'normalised' if args.synthetic_normalize else 'raw'} h, eps {args.eps:g}; "
        f"10 -> 500 -> 2 | -> 100 -> 2 (deeper: +2 x 100 in g; wider: 2048 in g), SGD lr 0.1, batch "
        f"{args.synthetic_batch_size}, {args.synthetic_epochs} epochs, {clip}, init "
        + ("PyTorch's default" if args.init_alpha is None else f"N(u_k, 1), u_k ~ N(0, {args.init_alpha:g})")
        + f"; median (± std) over seeds {seeds[0]}-{seeds[-1]}. Inversion: SGD on ||h(s) - z||_1, lr 0.01, weight "
        "decay 1e-4, 500 steps, from 0; MSE per coordinate, MCS = mean cosine similarity over the 200 test points.",
        "",
        "| g | setting | train % | paper train % | test % | paper test % | MSE | paper MSE | MCS | paper MCS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in result["settings"]:
        p = e["paper"] or {}
        f = (lambda v, spec: "-" if v is None else format(v, spec))
        spread = (lambda key, scale, spec, e=e: "-" if key not in e else
                  f"{format(scale * e[key], spec)} ± {format(scale * e[key + '-std'], spec)}")
        lines.append(
            f"| {e['head']} | {e['label']} | {spread('train', 100, '.1f')} | {f(p.get('train'), '.1f')} "
            f"| {spread('test', 100, '.1f')} | {f(p.get('test'), '.1f')} | {spread('mse', 1, '.3g')} "
            f"| {f(p.get('mse'), '.2f')} | {spread('mcs', 1, '.3f')} | {f(p.get('mcs'), '.3f')} |")
    (out / "synthetic-mixcon.md").write_text("\n".join(lines) + "\n")
    (out / "synthetic-mixcon.json").write_text(json.dumps(result, indent=1))
    return result


# ------------------------------------------------------------------------------------------------ CLI
def cmd_mixcon(args: argparse.Namespace) -> int:
    from fedsmix.device import select_device

    args.pairs = parse_pairs(args.pairs)
    args.attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    allowed = ("inversion", "inversion-decoder", "inversion-zeta1e-5", "inversion-paper")
    for name in args.attacks:
        if name not in allowed:
            raise SettingsError(f"--attacks: {name!r} does not invert representations; allowed: {', '.join(allowed)}")
    datasets = [d.strip() for d in args.dataset.split(",") if d.strip()]
    for d in datasets:
        if d not in ("mnist", "fashion-mnist"):
            raise SettingsError(f"--dataset: MixCon's benchmarks here are mnist and fashion-mnist (SVHN is not "
                                f"available offline), got {d!r}")
    device = select_device(args.device)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.out) if args.out else PROJECT_ROOT / "runs" / "mixcon" / stamp
    out.mkdir(parents=True, exist_ok=True)
    print(f"fedsmix mixcon: writing to {out} (device {device})", flush=True)
    tables = []
    if args.synthetic:
        synthetic(args, out)
        tables.append((out / "synthetic-mixcon.md").read_text())
    for dataset in datasets if not args.synthetic or args.dataset_given else []:
        benchmark(dataset, args, device, out)
        tables.append((out / f"{dataset}-mixcon.md").read_text())
    (out / "tables.md").write_text("\n".join(tables))
    print("\n" + "\n".join(tables), flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("mixcon", help="MixCon's experiments: LeNet-5 on MNIST/Fashion-MNIST against model "
                                             "inversion (Table 3), the synthetic two-Gaussian experiment (Tables 1-2)")
    p.add_argument("--dataset", default=None, help="mnist and/or fashion-mnist, comma-separated (default: both)")
    p.add_argument("--pairs", default="0:0,1:1e-4", help="lambda:beta settings, comma-separated (0:0 = vanilla)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (paper: not stated; PyTorch's default 0)")
    p.add_argument("--eps", type=float, default=1e-6, help="pair distances clamped to [eps, 1/eps]")
    p.add_argument("--train-subset", type=int, default=0, help="a fixed random subset of the training split (0: all)")
    p.add_argument("--victims", type=int, default=100, help="first N test images inverted (paper: 100)")
    p.add_argument("--attacks", default="inversion,inversion-zeta1e-5,inversion-paper,inversion-decoder",
                   help="inversion (zeta chosen on public probes), inversion-zeta1e-5 (the paper's zeta), "
                        "inversion-paper (appendix C.2 exactly: lr 10), inversion-decoder")
    p.add_argument("--inversion-lr", type=float, default=1.0)
    p.add_argument("--decoder-epochs", type=int, default=50)
    p.add_argument("--public-size", type=int, default=0, help="public images for the decoder (0: all 8,000)")
    p.add_argument("--figure", type=int, default=8, help="victims shown in the figure")
    p.add_argument("--zeta-sweep", action="store_true", help="also invert at every TV weight of the grid (oracle)")
    p.add_argument("--reuse", action="store_true", help="reuse the models a previous run saved in --out")
    p.add_argument("--synthetic", action="store_true", help="run the synthetic experiment (with --dataset: both)")
    p.add_argument("--synthetic-epochs", type=int, default=20)
    p.add_argument("--synthetic-batch-size", type=int, default=32)
    p.add_argument("--clip", type=float, default=0.0, help="clip the gradient norm (0: off, as the paper)")
    p.add_argument("--synthetic-seeds", type=int, default=5, help="seeds of the synthetic runs (data and init)")
    p.add_argument("--synthetic-clip", type=float, default=10.0,
                   help="gradient-norm clip of the synthetic runs (0: off; beta/dist explodes without it)")
    p.add_argument("--synthetic-normalize", action="store_true",
                   help="L_mixcon on L2-normalised h in the synthetic run too (default raw h: in R^2 normalising "
                        "leaves only the angle, and beta = 0 cannot collapse h to (0, 0) as the paper's Fig. 2 shows)")
    p.add_argument("--flip-test", action="store_true", help="flip 5 %% of the test labels too")
    p.add_argument("--init-alpha", type=float, default=None,
                   help="synthetic init N(u_k, 1), u_k ~ N(0, alpha) (the paper's; alpha unstated); default PyTorch's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default="")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="", help="output folder (default runs/mixcon/<time>)")
    p.set_defaults(func=_entry)


def _entry(args: argparse.Namespace) -> int:
    args.dataset_given = args.dataset is not None
    args.dataset = args.dataset or "mnist,fashion-mnist"
    return cmd_mixcon(args)
