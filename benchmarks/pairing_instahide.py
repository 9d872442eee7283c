"""Pairing recovery against InstaHide uploads, T = 1, 4, 16 encodings per private image.

Carlini et al. broke InstaHide by first learning which encodings share a private image. Here the
server sees one party's InstaHide upload (cross-dataset, k = 4: two private and two public images,
a fresh sign mask per pixel), its rows shuffled so that their order tells nothing, and ranks for
every encoding the others most likely to share a private image, from |x~| alone
(`server.adversary.pairing.instahide_neighbours`). Reported: the fraction of encodings whose
best-ranked neighbour does share a private image with it, next to chance (the fraction of all other
encodings that do), for MNIST and CIFAR-10 test images; and what that costs the leakage: the
averaging attack's mean SNR gain over the trivial guess (the public mean) on the same victims with
the oracle's sources and weights, and with the membership `InstaHidePairing` recovers from (x~, y~)
alone (the image leading each encoding, averaged over its believed appearances); and, as the floor, the
recovered path on noise (each pixel's values permuted across the rows): the private mean alone, which
beats the public mean on MNIST.

    .venv/bin/python benchmarks/pairing_instahide.py [--victims 250]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from common import DATA_DIR, write

from fedsmix.config import load_settings
from fedsmix.party import encode_partition, encoder_params
from fedsmix.space import load_public_pool
from server.adversary.analysis import leakage
from server.adversary.averaging import Averaging
from server.adversary.cases import observation, public_samples, valid_bounds
from server.adversary.pairing import InstaHidePairing, instahide_accuracy, instahide_neighbours
from server.adversary.sweep import victim_partition


def gains(part, enc, order, settings) -> dict:
    """The averaging attack's SNR gain (dB over the trivial guess) under the oracle and the recovered membership."""
    spec, n = part.spec, len(part.x)
    public_mean = public_samples(settings, spec).mean(dim=0)
    common = {
        "bounds": valid_bounds(settings, spec),
        "public": load_public_pool(settings, spec),
        "prior_mean": public_mean,
    }
    oracle = observation(enc, None, **common)
    shuffled = observation(enc, None, x_tilde=enc.x[order], **common)
    recovery = InstaHidePairing(encoder_params(settings, 0.0))
    recovered = recovery.observation(shuffled, enc.y[order], truth=enc.sources[order])
    attack = Averaging()
    started = time.perf_counter()
    by_oracle = attack.reconstruct(oracle)[:n]
    # pseudo image p leads encoding order[p]: victim i is scored on the pseudo image of its first encoding
    first = torch.argsort(order)[:n]
    by_recovery = attack.reconstruct(recovered)[first]
    # the same recovery on noise (each pixel's values permuted across the rows): what the private mean alone gives
    g = torch.Generator().manual_seed(0)
    flat = shuffled.x_tilde.reshape(len(order), -1)
    noise = flat.gather(0, torch.rand(flat.shape, generator=g).argsort(dim=0))
    noisy = recovery.observation(replace(shuffled, x_tilde=noise.reshape(shuffled.x_tilde.shape)), enc.y[order])
    by_noise = attack.reconstruct(noisy)[first]
    report, _ = leakage(part.x, {"oracle": by_oracle, "recovered": by_recovery, "noise": by_noise}, public_mean)
    extras = recovered.extras
    return {
        "gain-oracle": report["attacks"]["oracle"]["gain"]["snr_db"],
        "gain-recovered": report["attacks"]["recovered"]["gain"]["snr_db"],
        "gain-recovered-on-noise": report["attacks"]["noise"]["gain"]["snr_db"],
        "trivial-snr": report["trivial"]["snr_mean"],
        "membership-precision": extras["membership-precision"],
        "membership-recall": extras["membership-recall"],
        "members": extras["pairing-candidates"],
        "attack-seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--victims", type=int, default=250)
    parser.add_argument("--encodings", default="1,4,16")
    parser.add_argument("--datasets", default="mnist,cifar10")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for dataset in args.datasets.split(","):
        for T in (int(t) for t in args.encodings.split(",")):
            settings = load_settings(
                {
                    "dataset": dataset,
                    "data-dir": DATA_DIR,
                    "encoder": "instahide-cross",
                    "mix-k": 4,
                    "encodings-per-sample": T,
                }
            )
            part = victim_partition(settings, args.victims)
            enc, _ = encode_partition(settings, part)
            order = torch.randperm(len(enc), generator=torch.Generator().manual_seed(T))
            started = time.perf_counter()
            hit, chance = instahide_accuracy(instahide_neighbours(enc.x[order]), enc.sources[order])
            rows.append(
                {
                    "dataset": dataset,
                    "encodings-per-sample": T,
                    "encodings": len(enc),
                    "neighbour-precision": hit,
                    "chance": chance,
                    "seconds": time.perf_counter() - started,
                    **gains(part, enc, order, settings),
                }
            )
            print(rows[-1], flush=True)
    write(
        "pairing_instahide",
        {
            "victims": args.victims,
            "encoder": "instahide-cross, k = 4",
            "attack": "averaging; gains in dB of mean SNR over the trivial guess (public mean)",
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
