"""InstaHide at its own protocol, against clean training of the same model, data and budget.

InstaHide's paper (../shared/papers/instahide.txt, its code `train_inside.py`) re-encrypts every training image in
every epoch (k = 4 inside-dataset: mixed with 3 partners of the private set, coefficients capped at 0.65, every
pixel's sign flipped by a fresh mask), trains ResNet-18 with SGD (lr 0.1, momentum 0.9) for 200 epochs, and
tests on clean test images (its "not in inference" rows; the "in inference" rows average 10 encryptions of each
test image). fedsmix's InstaHide rows upload one encoding of each image, once. This script measures, with the
same model, optimiser and epochs for every row:

  clean            the model on the clean training images
  upload-once      one InstaHide encoding of the training set, trained on for every epoch (fedsmix's upload)
  per-epoch        a fresh encoding of every image at every step (InstaHide's protocol: the encoders' own
                   `instahide` through the training loop's batch hook, as the Intra-InstaHide defence)
  per-epoch-abs    the same, the model reading |x| (a fixed first layer): the sign mask is uniform and independent
                   of the image, so |x~| holds everything the encoding says about the image (a sufficient
                   statistic); test images go through the same |.|
  upload-once-abs  the upload with the |x| first layer

Test images are clean (the paper's "not in inference" treatment). With `--in-inference T`, every model trained on
encodings is also scored the paper's other way ("in inference"): each test image mixed with k - 1 training images
(coefficients as in training, a fresh sign mask), T times, the logits summed. Writes
benchmarks/results/instahide_protocol.json.

    ../.venv/bin/python instahide_protocol.py --dataset mnist --model cnn --train-subset 20000 --epochs 10
    ../.venv/bin/python instahide_protocol.py --dataset cifar10 --model resnet18 --train-subset 10000 --epochs 15
    ../.venv/bin/python instahide_protocol.py --dataset cifar10 --model resnet18 --stem cifar --train-subset 10000 \
        --epochs 10 --variants clean,per-epoch-abs      # InstaHide's own stem (its models/resnet.py)
"""

from __future__ import annotations

import argparse
import json
import time

import common  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads)
import torch
import torchvision
from torch import nn

from fedsmix import data as datalib
from fedsmix.defences import mix_batch
from fedsmix.encoders.instahide import instahide, sign_masks
from fedsmix.encoders.mixup import weighted_sum
from fedsmix.encoders.singularized import sample_weights
from fedsmix.models import Absolute, build_classifier
from fedsmix.seeding import generator
from fedsmix.training import TrainConfig, evaluate, predict, train

VARIANTS = ("clean", "upload-once", "per-epoch", "per-epoch-abs", "upload-once-abs")


def model_for(kind: str, shape: tuple[int, ...], num_classes: int, absolute: bool, seed: int,
              stem: str = "imagenet") -> nn.Module:
    torch.manual_seed(seed)  # the same initial weights for every row of a seed
    if kind == "resnet18":  # torchvision's ResNet-18 (basic blocks), from scratch
        model = torchvision.models.resnet18(num_classes=num_classes)
        if stem == "cifar":  # InstaHide's code (models/resnet.py): a 3x3 stride-1 stem and no max-pool, so a 32 px
            # image keeps 32 x 32 maps into the first stage (the ImageNet stem leaves 8 x 8: 16x less compute)
            model.conv1, model.maxpool = nn.Conv2d(shape[0], 64, 3, 1, 1, bias=False), nn.Identity()
        elif shape[0] != 3:
            model.conv1 = nn.Conv2d(shape[0], 64, 7, 2, 3, bias=False)
    else:
        model = build_classifier(kind, shape, num_classes)
    return nn.Sequential(Absolute(), model) if absolute else model


def recipe(kind: str, epochs: int, batch_size: int, k: int) -> TrainConfig:
    """The model's own recipe, the same for every row: InstaHide's SGD for ResNet-18 (cosine instead of its
    steps at epochs 100 and 150, which a short budget never reaches), fedsmix's central AdamW for the others."""
    if kind == "resnet18":
        return TrainConfig(epochs=epochs, batch_size=batch_size, lr=0.1, weight_decay=1e-4, optimizer="sgd",
                           batch_mix="instahide", mix_cap=0.65, batch_mix_k=k)
    return TrainConfig(epochs=epochs, batch_size=batch_size, lr=1e-3, batch_mix="instahide", mix_cap=0.65,
                       batch_mix_k=k)


def in_inference(model: nn.Module, x: torch.Tensor, test: tuple, k: int, cap: float, draws: int,
                 gen: torch.Generator) -> float:
    """InstaHide "in inference": each test image mixed with k - 1 training images of `x` (coefficients drawn as in
    training, at most `cap`), its sign mask fresh, `draws` times; the class of the summed logits."""
    test_x, labels = test
    n, pool = len(test_x), torch.cat([test_x, x])
    logits = 0
    for _ in range(draws):
        sources = torch.stack([torch.arange(n)] + [n + torch.randint(len(x), (n,), generator=gen)
                                                   for _ in range(k - 1)], dim=1)
        encoded = weighted_sum(pool, sources, sample_weights(n, cap, gen, k=k)) * sign_masks(tuple(test_x.shape), gen)
        logits = logits + predict(model, encoded)
    return (logits.argmax(dim=1) == labels.long()).float().mean().item()


def run_variant(variant: str, args, x, y, test) -> dict:
    num_classes = int(y.shape[1])
    cfg = recipe(args.model, args.epochs, args.batch_size, args.k)
    model = model_for(args.model, tuple(x.shape[1:]), num_classes, variant.endswith("-abs"), args.seed, args.stem)
    gen = generator(args.seed, "instahide-protocol", variant)
    inputs, targets, hook = x, y, None
    if variant.startswith("upload-once"):
        encoded = instahide(x, y, args.k, cfg.mix_cap, generator(args.seed, "instahide-protocol", "upload"))
        inputs, targets = encoded.x, encoded.y
    elif variant.startswith("per-epoch"):
        hook = mix_batch
    curve = []

    def on_epoch(epoch: int, loss: float) -> None:
        if epoch % args.test_every == 0 or epoch == args.epochs:
            curve.append({"epoch": epoch, "loss": loss, "accuracy": evaluate(model, *test)["accuracy"]})
            print(f"  {variant} epoch {epoch}: loss {loss:.4f}, test {100 * curve[-1]['accuracy']:.2f}%", flush=True)

    t0 = time.perf_counter()
    report = train(model, inputs, targets, cfg, gen, on_epoch=on_epoch, mix_batch=hook)
    row = {"variant": variant, "accuracy": curve[-1]["accuracy"], "best-accuracy": max(c["accuracy"] for c in curve),
           "curve": curve, "seconds": round(time.perf_counter() - t0, 1), "steps": report.steps}
    if args.in_inference and variant != "clean":
        row["in-inference-accuracy"] = in_inference(model, x, test, args.k, cfg.mix_cap, args.in_inference,
                                                    generator(args.seed, "instahide-protocol", "in-inference"))
        print(f"  {variant} in inference ({args.in_inference} encodings): {100 * row['in-inference-accuracy']:.2f}%")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="cnn", choices=("cnn", "mlp", "resnet18"))
    parser.add_argument("--stem", default="imagenet", choices=("imagenet", "cifar"),
                        help="resnet18's stem: torchvision's ImageNet stem, or InstaHide's 3x3 CIFAR stem")
    parser.add_argument("--train-subset", type=int, default=20000, help="a class-balanced seeded subset (0: all)")
    parser.add_argument("--test-subset", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-every", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--in-inference", type=int, default=0,
                        help="also score each model on test images encoded this many times, logits summed (0: off)")
    parser.add_argument("--name", default="", help="the run's key in the results file (default dataset-model)")
    args = parser.parse_args()
    torch.set_num_threads(2)

    raw = datalib.load_split(args.dataset, "train", common.DATA_DIR)
    raw_test = datalib.load_split(args.dataset, "test", common.DATA_DIR)
    pick = torch.Generator().manual_seed(args.seed)
    index = torch.randperm(len(raw.labels), generator=pick)[: args.train_subset or None].sort().values.numpy()
    x, labels = datalib.normalized_tensors(raw, index)
    test_index = (torch.randperm(len(raw_test.labels), generator=pick)[: args.test_subset].sort().values.numpy()
                  if args.test_subset else None)
    test = datalib.normalized_tensors(raw_test, test_index)
    y = datalib.one_hot(labels, raw.spec.num_classes)
    print(f"{args.dataset}: {len(x)} training images, {len(test[1])} test, model {args.model}, {args.epochs} epochs")

    rows = []
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"--variants: unknown {variant!r}; allowed: {', '.join(VARIANTS)}")
        rows.append(run_variant(variant, args, x, y, test))
    clean = next((r["accuracy"] for r in rows if r["variant"] == "clean"), None)
    for r in rows:
        r["ratio-to-clean"] = r["accuracy"] / clean if clean else None
        if clean and "in-inference-accuracy" in r:
            r["in-inference-ratio-to-clean"] = r["in-inference-accuracy"] / clean
        print(f"{r['variant']:>16}: {100 * r['accuracy']:.2f}%"
              + (f" ({100 * r['ratio-to-clean']:.1f} % of clean)" if clean else "") + f", {r['seconds']} s")

    path = common.RESULTS / "instahide_protocol.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    runs = {k: v for k, v in old.get("runs", {}).items()}
    name = args.name or f"{args.dataset}-{args.model}" + (
        "-cifar-stem" if args.model == "resnet18" and args.stem == "cifar" else "")
    runs[name] = {"command": "benchmarks/instahide_protocol.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()), "train-images": len(x),
        "test-images": len(test[1]), "rows": rows}
    common.write("instahide_protocol", {"runs": runs})


if __name__ == "__main__":
    main()
