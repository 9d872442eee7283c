"""Pairing recovery against InstaHide uploads, T = 1, 4, 16 encodings per private image (issue 17).

Carlini et al. broke InstaHide by first learning which encodings share a private image. Here the
server sees one party's InstaHide upload (cross-dataset, k = 4: two private and two public images,
a fresh sign mask per pixel), its rows shuffled so that their order tells nothing, and ranks for
every encoding the others most likely to share a private image, from |x~| alone
(`server.adversary.pairing.instahide_neighbours`). Reported: the fraction of encodings whose
best-ranked neighbour does share a private image with it, next to chance (the fraction of all other
encodings that do), for MNIST and CIFAR-10 test images.

    .venv/bin/python benchmarks/pairing_instahide.py [--victims 250]
"""

from __future__ import annotations

import argparse
import time

import torch
from common import DATA_DIR, write

from fedsmix.config import load_settings
from fedsmix.party import encode_partition
from server.adversary.pairing import instahide_accuracy, instahide_neighbours
from server.adversary.sweep import victim_partition


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--victims", type=int, default=250)
    parser.add_argument("--encodings", default="1,4,16")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for dataset in ("mnist", "cifar10"):
        for T in (int(t) for t in args.encodings.split(",")):
            settings = load_settings({"dataset": dataset, "data-dir": DATA_DIR, "encoder": "instahide-cross",
                                      "mix-k": 4, "encodings-per-sample": T})
            part = victim_partition(settings, args.victims)
            enc, _ = encode_partition(settings, part)
            order = torch.randperm(len(enc), generator=torch.Generator().manual_seed(T))
            started = time.perf_counter()
            hit, chance = instahide_accuracy(instahide_neighbours(enc.x[order]), enc.sources[order])
            rows.append({"dataset": dataset, "encodings-per-sample": T, "encodings": len(enc),
                         "neighbour-precision": hit, "chance": chance, "seconds": time.perf_counter() - started})
            print(rows[-1], flush=True)
    write("pairing_instahide", {"victims": args.victims, "encoder": "instahide-cross, k = 4", "rows": rows})


if __name__ == "__main__":
    main()
