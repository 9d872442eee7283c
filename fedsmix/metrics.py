"""Leakage metrics: per-image SNR (paper), PSNR/SSIM (torchmetrics), shift-tolerant LPIPS, Theorem 4.1's bound.

SNR is computed in the space the attack works in (normalised pixels or features), as the
paper reports it. PSNR, SSIM and ST-LPIPS are computed on images mapped back to [0, 1].
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure


def snr_db(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """Per-sample 10 log10(||x||^2 / ||x - x_hat||^2)."""
    x, x_hat = x.reshape(len(x), -1).double(), x_hat.reshape(len(x_hat), -1).double()
    signal = x.pow(2).sum(dim=1)
    error = (x - x_hat).pow(2).sum(dim=1).clamp_min(1e-30)
    return (10 * torch.log10(signal / error)).float()


def psnr_db(x01: torch.Tensor, x_hat01: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR with data range 1 (images in [0, 1])."""
    return torch.stack(
        [peak_signal_noise_ratio(b.unsqueeze(0), a.unsqueeze(0), data_range=1.0) for a, b in zip(x01, x_hat01)]
    ).float()


def ssim(x01: torch.Tensor, x_hat01: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """Per-image SSIM (Gaussian window 11, sigma 1.5; smaller kernel for tiny images), `batch` images at a time
    (torchmetrics holds a dozen float64 copies of what it is given: 40 GB for 500 images at 128 px at once)."""
    side = min(x01.shape[-2:])
    kernel = 11 if side >= 11 else (side if side % 2 else side - 1)
    values = [
        structural_similarity_index_measure(  # float64: in float32 identical flat images score 0.9996
            x_hat01[i : i + batch].double(), x01[i : i + batch].double(), data_range=1.0, kernel_size=kernel,
            reduction="none",
        ).reshape(-1)
        for i in range(0, len(x01), batch)
    ]
    return torch.cat(values).float() if values else torch.empty(0)


ST_LPIPS_MIN_SIDE = 28  # AlexNet's stem (11x11, stride 4, then pooling) needs images of at least this side


@functools.lru_cache(maxsize=1)
def _st_lpips_net() -> torch.nn.Module:
    from stlpips_pytorch import stlpips

    return stlpips.LPIPS(net="alex", variant="shift_tolerant", verbose=False).eval()


@torch.no_grad()
def st_lpips(x01: torch.Tensor, x_hat01: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """Per-image shift-tolerant LPIPS distance (Ghildyal & Liu 2022, `stlpips-pytorch`: AlexNet with anti-aliased
    pooling and its own linear weights, both shipped in the wheel, nothing downloaded); 0 for identical images,
    lower is closer. It is not numerically LPIPS (Zhang et al. 2018, the appendix's metric): a one-pixel shift
    costs it almost nothing where LPIPS counts it. NaN for images under ST_LPIPS_MIN_SIDE px, or not RGB/grey."""
    if x01.dim() != 4 or min(x01.shape[-2:]) < ST_LPIPS_MIN_SIDE or x01.shape[1] not in (1, 3):
        return torch.full((len(x01),), float("nan"))
    if x01.shape[1] == 1:
        x01, x_hat01 = x01.expand(-1, 3, -1, -1), x_hat01.expand(-1, 3, -1, -1)
    net = _st_lpips_net().to(x01.device)
    return torch.cat([
        net(x01[s : s + batch].float(), x_hat01[s : s + batch].float(), normalize=True).reshape(-1)
        for s in range(0, len(x01), batch)
    ]).float().cpu()


@torch.no_grad()
def st_lpips_pairwise(x01: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """ST-LPIPS distance between every two of `x01`'s images, (n, n): what `st_lpips` gives each pair, with the
    network run once per image instead of once per pair (n forward passes, not n^2: a minute instead of 15 for
    64 images at 128 px)."""
    from stlpips_pytorch.utils import normalize_tensor

    if x01.shape[1] == 1:
        x01 = x01.expand(-1, 3, -1, -1)
    net = _st_lpips_net().to(x01.device)
    features = [[] for _ in range(net.L)]
    for s in range(0, len(x01), batch):
        inputs = 2 * x01[s : s + batch].float() - 1  # as `normalize=True`
        outs = net.net.forward(net.scaling_layer(inputs) if net.version == "0.1" else inputs)
        for layer in range(net.L):
            features[layer].append(normalize_tensor(outs[layer]))
    features = [torch.cat(f) for f in features]
    rows = []
    for i in range(len(x01)):
        rows.append(sum(net.lins[layer]((f - f[i : i + 1]) ** 2).mean(dim=(2, 3)).reshape(-1)
                        for layer, f in enumerate(features)))
    return torch.stack(rows).float().cpu()


@dataclass
class Score:
    """Mean/std of each metric, and which victim was recovered best (worst case for privacy).

    PSNR and SSIM are None for samples that are not images (feature vectors): they do not apply.
    """

    snr_mean: float
    snr_std: float
    psnr_mean: float | None
    psnr_std: float | None
    ssim_mean: float | None
    ssim_std: float | None
    best_index: int
    best_snr: float
    best_ssim: float | None
    st_lpips_mean: float | None = None  # shift-tolerant LPIPS distance (lower: closer); None where it does not apply
    st_lpips_std: float | None = None

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def score(x: torch.Tensor, x_hat: torch.Tensor, to_unit=None) -> tuple[Score, dict[str, torch.Tensor]]:
    """Score reconstructions; `to_unit` maps normalised tensors to [0, 1] images (None: not images)."""
    snr = snr_db(x, x_hat)
    images = to_unit is not None and x.dim() == 4
    if images:
        a, b = to_unit(x).clamp(0, 1), to_unit(x_hat).clamp(0, 1)
        p, s, lp = psnr_db(a, b), ssim(a, b), st_lpips(a, b)
    else:  # per-sample arrays stay aligned (NaN); the summary says "does not apply" (None)
        p = s = lp = torch.full_like(snr, float("nan"))
    best = int(torch.argmax(snr))
    std = (lambda t: float(t.std()) if len(t) > 1 else 0.0)
    mean = (lambda t: float(t.mean()) if images and not torch.isnan(t).all() else None)
    spread = (lambda t: std(t) if images and not torch.isnan(t).all() else None)
    result = Score(
        float(snr.mean()), std(snr), mean(p), spread(p), mean(s), spread(s), best, float(snr[best]),
        float(s[best]) if images else None, mean(lp), spread(lp),
    )
    return result, {"snr": snr, "psnr": p, "ssim": s, "st_lpips": lp}


def cycles(perm: np.ndarray) -> list[np.ndarray]:
    """Cycles of a permutation, each listed in order i, perm[i], perm[perm[i]], ..."""
    perm = np.asarray(perm)
    seen = np.zeros(len(perm), dtype=bool)
    out = []
    for start in range(len(perm)):
        if seen[start]:
            continue
        cycle = []
        i = start
        while not seen[i]:
            seen[i] = True
            cycle.append(i)
            i = perm[i]
        out.append(np.asarray(cycle))
    return out


def theorem41_T(weights: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """T_i = sum_l (W^{-1})_{il}^2 w_{l2}^2 for W = diag(w1) + diag(w2) P_pi, exactly per cycle.

    Along a cycle i_0 -> i_1 = pi(i_0) -> ..., W x = b gives x_i = b_i / w1_i + a_i x_pi(i) with
    a_i = -w2_i / w1_i, hence (W^{-1})_{i_0, i_m} = (prod_{j<m} a_{i_j}) / (w1_{i_m} (1 - prod_cycle a)).
    """
    w = weights.double().numpy()
    w1, w2 = w[:, 0], w[:, 1]
    T = np.zeros(len(w))
    for cyc in cycles(perm.numpy()):
        L = len(cyc)
        log_a = np.log(w2[cyc] / w1[cyc])  # log |a_i|
        log_p, sign_p = log_a.sum(), (-1.0) ** L  # prod_cycle a = sign_p * exp(log_p)
        if log_p > 0:  # |1 - P| = |P| |1 - 1/P|, computed without overflow
            log_den = log_p + math.log(abs(1 - sign_p * math.exp(-log_p)) or 1e-300)
        else:
            log_den = math.log(abs(1 - sign_p * math.exp(log_p)) or 1e-300)
        log_ratio2 = 2 * np.concatenate([log_a, log_a])  # log (w2/w1)^2 of i_m, cycle written twice
        cum = np.concatenate([[0.0], np.cumsum(np.concatenate([log_a, log_a]))])  # cum[k] = sum_{j<k} log|a_j|
        for s in range(L):
            logs = 2 * (cum[s : s + L] - cum[s]) + log_ratio2[s : s + L] - 2 * log_den
            T[cyc[s]] = float(np.exp(logs).sum())
    return torch.from_numpy(T)


def theorem41_bound(weights: torch.Tensor, perm: torch.Tensor, radius: float) -> torch.Tensor:
    """Lower bound r^2 T_i on any prior-free estimator's expected squared error for sample i."""
    return radius**2 * theorem41_T(weights, perm)
