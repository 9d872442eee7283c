"""Scoring reconstructions against the ground truth, next to the best data-independent guess.

A negative SNR only says the attacker did worse than guessing; the trivial guess (the public
data's mean sample, in the same normalisation) scores about 0 dB without looking at the upload.
Leakage is therefore reported as the attack's gain over that guess.
"""

from __future__ import annotations

import math
import time
import traceback
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import torch

from fedsmix.metrics import ST_LPIPS_MIN_SIDE, Score, score, st_lpips_pairwise, theorem41_bound

from .base import Attack, Observation

KNOWN_W = ("linear", "mmse")  # attacks Theorem 4.1's bound speaks about (they invert W)


BLIND_POOL = 64  # public images the perceptual blind guess is chosen among


def trivial_guess(public_mean: torch.Tensor, n: int) -> torch.Tensor:
    """The same public mean sample guessed for every victim."""
    return public_mean.unsqueeze(0).expand(n, *public_mean.shape).clone()


@dataclass
class Blind:
    """The best guesses made without looking at any upload, one per kind of metric: the public mean sample (the
    best blind guess in squared error: SNR, PSNR; and SSIM), and for ST-LPIPS the public image closest to the other
    public images (`perceptual`: a blurred mean image is far from every natural image in a perceptual metric,
    so a gain over it overstates leakage). Both come from public data only."""

    mean: torch.Tensor
    perceptual: torch.Tensor | None = None

    @classmethod
    def of(cls, public: torch.Tensor, to_unit=None, pool: int = BLIND_POOL) -> Blind:
        return cls(public.mean(dim=0), st_lpips_medoid(public, to_unit, pool))


def st_lpips_medoid(public: torch.Tensor, to_unit=None, pool: int = BLIND_POOL) -> torch.Tensor | None:
    """The image of the first `pool` public images with the least mean ST-LPIPS distance to the others; None where
    ST-LPIPS does not apply (features, images under 28 px)."""
    if to_unit is None or public.dim() != 4 or min(public.shape[-2:]) < ST_LPIPS_MIN_SIDE or len(public) < 2:
        return None
    distance = st_lpips_pairwise(to_unit(public[:pool].float()).clamp(0, 1))
    return public[int(distance.mean(dim=1).argmin())]


def blind_score(x: torch.Tensor, blind: Blind | torch.Tensor, to_unit=None) -> tuple[Score, dict, dict]:
    """The blind guesses' score on victims x: SNR/PSNR/SSIM of the mean guess, ST-LPIPS of whichever guess is closer
    (the report names it), and the per-image metrics of that choice."""
    blind = blind if isinstance(blind, Blind) else Blind(blind)
    result, per_image = score(x, trivial_guess(blind.mean.to(x), len(x)), to_unit)
    named = {"st_lpips_guess": "public mean"}
    if blind.perceptual is not None and result.st_lpips_mean is not None:
        other, other_per_image = score(x, trivial_guess(blind.perceptual.to(x), len(x)), to_unit)
        if other.st_lpips_mean < result.st_lpips_mean:
            result = replace(result, st_lpips_mean=other.st_lpips_mean, st_lpips_std=other.st_lpips_std)
            per_image = {**per_image, "st_lpips": other_per_image["st_lpips"]}
            named["st_lpips_guess"] = "public medoid (ST-LPIPS)"
    return result, per_image, named


def gain(attack: Score, blind: Score) -> dict[str, float | None]:
    """What the upload taught the attacker: dB over the trivial guess for SNR/PSNR, difference for SSIM, and how
    much closer than the guess it came in ST-LPIPS distance (guess minus attack: positive is leakage). None where a
    metric does not apply (PSNR/SSIM/ST-LPIPS for feature vectors, ST-LPIPS under 28 px)."""
    diff = (lambda a, b: None if a is None or b is None else a - b)
    return {
        "snr_db": attack.snr_mean - blind.snr_mean,
        "psnr_db": diff(attack.psnr_mean, blind.psnr_mean),
        "ssim": diff(attack.ssim_mean, blind.ssim_mean),
        "st_lpips": diff(blind.st_lpips_mean, attack.st_lpips_mean),
    }


def score_with_baseline(x: torch.Tensor, x_hat: torch.Tensor, public_mean: Blind | torch.Tensor, to_unit=None) -> dict:
    """The attack's scores, the blind guesses', and the gain (dB for SNR/PSNR, difference for SSIM and ST-LPIPS)."""
    attack, per_image = score(x, x_hat, to_unit)
    blind, _, named = blind_score(x, public_mean, to_unit)
    return {"attack": attack.as_dict(), "trivial": {**blind.as_dict(), **named}, "gain": gain(attack, blind),
            "per_image": per_image}


def leakage(
    x: torch.Tensor, estimates: dict[str, torch.Tensor], public_mean: Blind | torch.Tensor | None, to_unit=None
) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """Every attack scored beside the blind guesses (`Blind`, or a public mean sample alone; JSON-ready), and the
    per-image metrics.

    Without a public mean (no public data in this space) the gains are left out, never faked.
    """
    x = x.float()  # scored where x lives (a GPU for 224 px images)
    report, per_image = {"attacks": {}}, {}
    blind = None
    if public_mean is not None:
        blind, per_image["trivial"], named = blind_score(x, public_mean, to_unit)
        report["trivial"] = {**blind.as_dict(), **named}
    for name, x_hat in estimates.items():
        result, per_image[name] = score(x, x_hat.to(x), to_unit)
        report["attacks"][name] = {"score": result.as_dict(), **({"gain": gain(result, blind)} if blind else {})}
    return report, per_image


def theorem41_samples(x: torch.Tensor, x_hat: torch.Tensor, weights: torch.Tensor, perm: torch.Tensor, radius: float,
                      rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per sample: Theorem 4.1's bound r^2 T_i, the attack's ||x_i - x_hat_i||^2 and ||x_i||^2.

    T_i needs the whole permutation (its cycles), so weights/perm cover the party and `rows`
    picks the samples that x and x_hat hold.
    """
    bound = theorem41_bound(weights.cpu(), perm.cpu(), radius)
    if rows is not None:
        bound = bound[rows.cpu()]
    flat, flat_hat = x.cpu().double().reshape(len(x), -1), x_hat.cpu().double().reshape(len(x), -1)
    return {"bound": bound, "error": (flat - flat_hat).pow(2).sum(dim=1), "signal": flat.pow(2).sum(dim=1)}


def theorem41_summary(samples: dict[str, torch.Tensor]) -> dict[str, float | None]:
    """The bound beside the measured error.

    The bound holds for estimators without a prior, in the worst case over X; an attack with
    priors (TV, clamping, a Gaussian prior) may fall below it on real images. T_i explodes where
    W is nearly singular (a cycle whose weight product is near 1), so medians are reported too.
    """
    bound, error, signal = samples["bound"], samples["error"], samples["signal"]
    bound_snr = torch.where(bound > 0, 10 * torch.log10(signal / bound.clamp_min(1e-300)), torch.inf)
    median_snr = float(bound_snr.median())
    return {
        "bound-mean": float(bound.mean()),
        "bound-median": float(bound.median()),
        "error-mean": float(error.mean()),
        "error-median": float(error.median()),
        "fraction-below-bound": float((error < bound).double().mean()),
        # per sample, the SNR a prior-free attacker cannot beat in the worst case (median over samples)
        "bound-snr-db-median": median_snr if math.isfinite(median_snr) else None,
    }


def theorem41(x, x_hat, weights, perm, radius, rows=None) -> dict[str, float | None]:
    return theorem41_summary(theorem41_samples(x, x_hat, weights, perm, radius, rows))


@dataclass
class Outcome:
    """Every attack on every case, pooled over the cases, scored beside the trivial guess."""

    summary: dict  # leakage() of the pooled victims, theorem41, victims
    truth: torch.Tensor  # the pooled victims (cpu)
    estimates: dict[str, torch.Tensor]  # per attack that ran on every case (cpu)
    per_image: dict[str, dict[str, torch.Tensor]]
    mixed: torch.Tensor | None = None  # the victims' uploaded rows, when the cases carry them
    per_case: list[dict] = field(default_factory=list)  # leakage() per case (when asked for)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # attack -> why it does not apply here
    errors: dict[str, str] = field(default_factory=dict)  # attack -> traceback of a failure

    def best(self) -> str | None:
        """The strongest attack: the highest mean SNR gain over the trivial guess (chosen with the
        ground truth, which is conservative for the defender)."""
        attacks = self.summary.get("attacks", {})
        gains = {name: entry.get("gain", {}).get("snr_db") for name, entry in attacks.items()}
        gains = {name: g for name, g in gains.items() if g is not None}
        return max(gains, key=gains.get) if gains else None


def attack_cases(cases: Iterable, attacks: dict[str, Attack], public_mean: Blind | torch.Tensor | None, to_unit=None,
                 device: str = "cpu", per_case: bool = False) -> Outcome:
    """The one attack-and-score loop (in-run adversary, tau sweep, frontier).

    Each attack reconstructs each case's observation; its rows are picked (and aligned, for batch
    reconstructions), pooled over the cases and scored with `leakage` against the trivial guess.
    An attack that does not apply raises ValueError and is listed in `skipped`; one that fails is
    listed in `errors` with its traceback and the others go on.
    """
    pooled: dict[str, list[torch.Tensor]] = defaultdict(list)
    t41: dict[str, list[dict]] = defaultdict(list)
    seconds: dict[str, float] = dict.fromkeys(attacks, 0.0)
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}
    reports: list[dict] = []
    for case in cases:
        obs = case.observation.to(device) if isinstance(case.observation, Observation) else case.observation
        truth = case.truth.float()
        estimates = {}
        for name, attack in attacks.items():
            if name in errors or name in skipped:
                continue
            started = time.perf_counter()
            try:
                estimate = attack.reconstruct(obs)[case.rows.to(device) if isinstance(obs, Observation) else case.rows]
                estimate = estimate.detach().cpu().float()
                if case.align is not None:
                    estimate = case.align(truth, estimate)
                estimates[name] = estimate
            except ValueError as err:  # the attack does not apply to this encoder or shape
                skipped[name] = str(err)
            except Exception as err:  # a failing attack must not cost the others their results
                errors[name] = f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
            seconds[name] += time.perf_counter() - started
        if per_case:
            report, _ = leakage(truth.to(device), estimates, public_mean, to_unit)
            report["seconds"] = {name: seconds[name] for name in estimates}
            reports.append(report)
        if case.weights is not None:
            for name in KNOWN_W:
                if name in estimates:
                    samples = theorem41_samples(truth, estimates[name], case.weights, case.perm, case.radius, case.rows)
                    t41[name].append(samples)
                    if per_case:
                        reports[-1].setdefault("theorem41", {})[name] = theorem41_summary(samples)
        pooled["truth"].append(truth.cpu())
        if case.mixed is not None:
            pooled["mixed"].append(case.mixed.detach().cpu().float())
        for name, estimate in estimates.items():
            pooled[name].append(estimate)
    truth = torch.cat(pooled.pop("truth")) if pooled.get("truth") else torch.empty(0)
    mixed = torch.cat(pooled.pop("mixed")) if pooled.get("mixed") else None
    complete = {  # attacks that ran on every case
        name: torch.cat(pooled[name]) for name in attacks
        if pooled.get(name) and sum(map(len, pooled[name])) == len(truth) > 0
    }
    summary, per_image = leakage(truth.to(device), complete, public_mean, to_unit) if len(truth) else ({}, {})
    if len(truth):
        summary["theorem41"] = {
            name: theorem41_summary({k: torch.cat([p[k] for p in parts]) for k in ("bound", "error", "signal")})
            for name, parts in t41.items() if name in complete
        }
        summary["victims"] = len(truth)
    return Outcome(summary, truth, complete, per_image, mixed, reports, seconds, skipped, errors)


__all__ = [
    "BLIND_POOL",
    "KNOWN_W",
    "Blind",
    "Outcome",
    "Score",
    "attack_cases",
    "blind_score",
    "gain",
    "leakage",
    "score",
    "score_with_baseline",
    "st_lpips_medoid",
    "theorem41",
    "theorem41_samples",
    "theorem41_summary",
    "trivial_guess",
]
