"""The published version's post-processing screen: what fraction of encodings it discards per tau.

The published paper discards encodings whose LPIPS distance to their source is below a threshold
(0.7 in the text, 0.9 in a caption) and reports the fraction discarded per tau. LPIPS needs
torchvision's ImageNet AlexNet/VGG weights, which this machine cannot download, so the party's
screen (`screen = "ssim" | "snr"`, fedsmix/party.py) uses a measure available offline; this script
reports, for the paper's encoder (configs/paper-tables-1-2.yaml) on the first N test images, the
fraction each measure would discard at several thresholds, beside the paper's LPIPS fractions.

    .venv/bin/python benchmarks/screen_fraction.py [--victims 500]
"""

from __future__ import annotations

import argparse

import torch
from common import DATA_DIR, write

from fedsmix.config import load_settings
from fedsmix.party import calibrate_party, encode_partition, screen_scores
from server.adversary.sweep import PAPER_TAUS, victim_partition

# the published version's fraction discarded (%) at LPIPS < threshold, tau = 1 (0 at every smaller tau)
PAPER_DISCARDED = {"mnist": 100.0, "cifar10": 0.15}
SSIM_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
SNR_THRESHOLDS = (0.0, 5.0, 10.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--victims", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for dataset in ("mnist", "cifar10"):
        settings = load_settings({"preset": "configs/paper-tables-1-2.yaml", "dataset": dataset, "data-dir": DATA_DIR})
        part = victim_partition(settings, args.victims)
        for tau in PAPER_TAUS:
            st = settings.replace(tau=tau)
            enc, _ = encode_partition(st, part, calibrate_party(st, part))
            paper = PAPER_DISCARDED[dataset] if tau == 1 else 0.0
            row = {"dataset": dataset, "tau": tau, "paper-lpips-discarded-%": paper}
            ssim = screen_scores(st, part, enc, "ssim")
            snr = screen_scores(st, part, enc, "snr")
            row.update({f"ssim>={t}-%": 100 * float((ssim >= t).double().mean()) for t in SSIM_THRESHOLDS})
            row.update({f"snr>={t:g}dB-%": 100 * float((snr >= t).double().mean()) for t in SNR_THRESHOLDS})
            row.update({"ssim-max": float(ssim.max()), "snr-max-db": float(snr.max())})
            rows.append(row)
            print(row, flush=True)
    write("screen_fraction", {"victims": args.victims, "preset": "configs/paper-tables-1-2.yaml", "rows": rows})


if __name__ == "__main__":
    main()
