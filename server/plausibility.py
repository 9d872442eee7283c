"""Plausibility checks: an upload can pass every validation check (server/validation.py) and still be wrong.

One party whose encodings are multiplied by 100 (a misconfigured radius, 0-255 pixels, a malicious
party) sinks the union from 96.94 % to 57.22 %. The checks below use only what the server legitimately knows:
the run's settings (encoder, alpha, tau, radius mode), what each party reports with its upload (n, V, D, c,
m_f, r, its validation split's class counts) and the uploads themselves. A party that fails one is quarantined: its
upload is not used, it is named with the check and the reason in results.json, and the run goes on (min-parties
still applies).

Per upload (`examine`, flat guard clauses like validation.py):
- `report`: the reported alpha and tau are the run's; r follows from the reported D, c, tau and alpha as
  Theorem 4.2 says (radius-mode theorem) or is the configured radius (fixed); c = D^2 / (2V).
- `labels`: the encoder's soft-label structure. Singularized mixup mixes two one-hot labels with weights in
  [1 - alpha, alpha]: at most two non-zero entries, each in [1 - alpha, alpha], or one entry 1 when both
  sources share a class. No encoder (`none`): one-hot rows. Mixup/InstaHide: at most mix-k (cross: 2).
- `domain`: what data of its kind could produce, whatever another party holds. Every image of the data set
  lies in its valid box (normalised pixels of 0 and 1 per channel; a bounded backbone's feature range), so
  a party's D (a mean distance between its samples) cannot exceed the box's diagonal, and every encoded
  row w1 x_i + w2 (x_j + e) lies within w2 |e| <= alpha r of the box (mixup: inside it; InstaHide: inside
  its sign-symmetric hull). A party whose images are darker, blurrier or rotated (feature skew) stays
  inside; one that multiplies its inputs, or its inputs and its report together, leaves it. An upload is
  judged against its own report and its data set, never against the other parties' scale.
- `energy`: the mean squared distance of a row to the upload's mean against the one the report predicts.
  For x~ = w1 x_i + w2 (x_pi(i) + e_i) with |e| = r, over n rows: E||x~ - mean||^2 = E[w1^2 + w2^2] V
  + E[w2^2] r^2 (1 - 1/n) - 2 E[w1 w2] V / (n - 1) (the cross term averages to -V/(n-1) under a derangement),
  E[w^2] from trainers.weight_moments(alpha). Flagged outside [1/2, 2] and beyond 4 standard errors of the
  measured mean (a party of a handful of rows cannot be judged finely).
- `norm-spread`: how much the rows' squared distances to their mean vary, against the least the report allows. Given
  the weights, a row's expected squared distance is f(w2) = ((1 - w2)^2 + w2^2) V + w2^2 r^2, and by the law of
  total variance the distances vary at least as f(w2) does over Algorithm 1's weights (`weight_spread`); at small tau
  that is the sphere noise scaled by w2 in [1 - alpha, alpha]. Random rows of the upload's own per-coordinate mean
  and spread (garbage) have nearly equal norms in many dimensions. Flagged below 1/SPREAD_FACTOR of the floor and by
  more than SPREAD_SIGMAS standard errors of the measured variance (from its fourth moment), over at least
  SPREAD_ROWS rows. It decides at every tau, where the label checks abstain; it abstains for fixed weights, a screen
  (which keeps rows by their weights) and the other encoders.

Across parties (`quarantine`, after every upload arrived; all but `label-mix` and `replay` need at least MIN_PEERS
parties):
- `label-mix`: the upload's label mix against the party's own validation split, whose class counts it reports with
  the upload (its clean rows, never encoded: a fault in what it uploads does not reach them). The split is a random
  subset of the party's rows, so each class's share in it is hypergeometric around the party's share, which the
  upload's label mass carries up to the encoder's bounded weight noise; a class whose two shares differ more than an
  honest party's would with a chance below FALSE_ALARM / (4 x the classes x the parties) (Chernoff's bound, valid
  without replacement; half of the budget goes to the weight noise) names the party. The noise of a small tau does
  not touch the labels: it decides at every tau. It cannot see a party that tells the same lie in both (a consistent
  liar), nor a label permutation under IID labels (which leaves the mix as it is), and its power grows with the
  split (a few dozen rows say little). A party whose reported split is not the size its rows and
  `validation-fraction` give is named too.
- `replay`: rows that (nearly) repeat another party's: a random projection of every row, nearest rows of
  each earlier-arrived party. Content cannot tell which of two copies is the original: the upload that
  arrived first is kept and the later one quarantined, naming both.
- `labels-vs-inputs`: a ridge head fitted on a balanced sample of every remaining party's rows predicts each
  upload row's class; an honest party's predictions fall in its rows' label support about as often as other
  parties' rows of the same classes do (class by class: under label skew a party holding a hard class is
  not suspect), random inputs (garbage) or permuted classes (label flipping) far less; flagged only where an
  honest party's chance of so few hits (Chernoff's bound) is below FALSE_ALARM / the parties judged, so the
  federation as a whole has that chance of one false alarm whatever its size. Decided only
  when the parties' agreement is well above chance (at tiny tau the noise hides the labels from any linear
  head, and the check abstains; on features, where mixup-union still learns at tau 1e-3, a label-flipped
  party then costs points: docs/results/robustness.md measures how many).
- `labels-vs-peers`: each party's class means, as its soft labels recover them from all its rows (the covariance
  of rows and labels over the label mass, as `lda` recovers the union's), against the other parties' class means:
  honest class means point where the others' means of the same classes point, a party whose labels name other
  classes than its inputs hold (a permutation, a relabelled class) has class means that point to other classes'.
  Inner products of the two sides' independent estimates are unbiased by either's noise; the party's class means
  are moved by its acquisition offset (its overall mean against the mean its label mix has among the others'), so
  a darker or blurrier camera keeps its alignment, and a party that holds a single class is not judged (its one
  class mean is its overall mean: nothing of its labels is left).
  Decided only when the parties' class means are resolved (the median party's alignment at least PEER_SIGNAL and
  its standard error at most PEER_NOISE; at small tau one party's class means are below the noise and the check
  abstains: a median inflated by parties of one dominant class, whose alignment is near 1 by construction, does
  not make it decide), and flags a party aligned
  less than half as well as the median party, by more than SPREAD_Z robust standard deviations of the parties'
  values (parties that differ in acquisition or labels spread them) and by more than PEER_SIGMAS standard errors
  of its own (the noise of its class means: a party of few rows per class at small tau is noisy, not lying).
- `structure`: real encodings put a good share of their (centred) energy into the few principal directions
  the parties' rows share; random values spread it over every direction (the sphere noise of a small tau
  does too, and then the check abstains). Catches garbage whose mean alone carries the party's classes
  (strongly non-IID parties), which labels-vs-inputs cannot.

Thresholds were set from honest uploads (benchmarks/plausibility.py: data sets, partitions, tau and
radius modes; with --group heterogeneity every check's false alarms over honest parties that differ in
acquisition, size and labels; both counts are in docs/results/robustness.md) with a wide margin.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from fedsmix.config import INSTAHIDE, Settings
from fedsmix.encoders import noise_multiplier
from fedsmix.seeding import generator
from fedsmix.trainers import Moments, linear_heads, weight_moments, weight_spread

REPORTED = ("alpha", "tau", "radius", "V", "D", "c")  # what every party reports with its upload (party.py)
LABEL_TOLERANCE = 1e-4  # float32 soft labels computed from float64 weights
REPORT_TOLERANCE = 1e-3  # relative: the radius against Theorem 4.2 from the reported D, c, tau, alpha
ENERGY_FACTOR = 2.0  # measured / predicted E||x~ - mean||^2 beyond [1/2, 2]: the report does not fit ...
ENERGY_SIGMAS = 4.0  # ... by more than 4 standard errors of the measured mean (a handful of rows says little)
SPREAD_FACTOR = 3.0  # norm-spread: the rows' energies vary less than 1/3 of what the mixing weights alone give ...
SPREAD_SIGMAS = 4.0  # ... by more than 4 standard errors of the measured variance ...
SPREAD_ROWS = 50  # ... over at least this many rows (a variance, and its error, of a handful of rows say nothing)
MIN_PEERS = 3  # cross-party checks need a majority to compare with
DOMAIN_TOLERANCE = 1e-3  # relative to a row's norm: float16 uploads round every value by up to 2^-11 of it
SKETCH_DIM = 16  # random projection of every row over the upload's spread, in float16: 32 bytes a row
SKETCH_ROWS = 256  # rows of each upload looked up among earlier uploads
DUPLICATE_DISTANCE = 1e-2  # a near-duplicate row: closer than this x the upload's spread sqrt(energy), projected
DUPLICATE_SHARE = 0.5  # ... for at least half of the looked-up rows
FIT_DIM = 512  # the ridge head of labels-vs-inputs works on at most this many (projected) dimensions
FIT_ROWS = 500  # rows of each upload in its balanced fit
FIT_GAMMA = 0.1  # relative ridge penalty
MIN_CLASS_ROWS = 20  # labels-vs-inputs judges a row when other parties' samples hold its classes this often
SIGNAL = 0.3  # labels-vs-inputs decides only when the median party's expected agreement beats chance by this
AGREEMENT_GAP = 0.5  # ... and flags a party that misses more than half of its expected lift over chance,
FALSE_ALARM = 1e-3  # ... where so few hits have a chance below this / the number of parties judged (Chernoff)
SPREAD_Z = 5.0  # ... and by more than 5 robust standard deviations (1.4826 MAD) of the parties' values
PEER_SIGNAL = 0.6  # labels-vs-peers decides only when the median party's alignment is at least this ...
PEER_NOISE = 0.05  # ... and the median party's standard error of it at most this ...
PEER_GAP = 0.5  # ... and flags a party aligned less than this x the median, by more than SPREAD_Z robust std devs
PEER_JUDGED = 5  # ... among at least this many parties it can judge (a spread of three values says nothing),
PEER_SIGMAS = 4.0  # ... and by more than 4 standard errors of its own alignment
STRUCTURE_K = 10  # principal directions shared by the parties' rows
STRUCTURE_SIGNAL = 0.06  # structure decides only when the median party's share beats the isotropic k/d by this
STRUCTURE_GAP = 0.5  # ... and flags a party whose excess share is below half the median's, by more than
STRUCTURE_SIGMAS = 4.0  # ... 4 standard errors of its sample and SPREAD_Z robust standard deviations


class Implausible(ValueError):
    """An upload failed a plausibility check; names the party, the check and the reason."""

    def __init__(self, party: int, check: str, reason: str):
        super().__init__(f"party {party}: {check}: {reason}")
        self.party, self.check, self.reason = party, check, reason


@dataclass
class Evidence:
    """What the checks keep of one upload (small: statistics, a sketch of every row, a row sample)."""

    party: int
    rows: int
    energy: float  # mean squared distance of a row to the upload's mean
    energy_error: float  # its standard error over the rows
    energy_var: float  # the variance of a row's squared distance to the upload's mean, over the rows
    energy_var_error: float  # its standard error
    spread_floor: float | None  # the least variance an honest upload's report allows (None: no bound)
    expected: float | None  # the same, predicted from the party's report (None: no prediction for the encoder)
    outside: float  # the largest distance of a row beyond the data's valid box, less its rounding tolerance
    sketch: np.ndarray  # (rows, SKETCH_DIM) random projection of every row over sqrt(energy), float16
    fit_x: np.ndarray  # (<= FIT_ROWS, <= FIT_DIM) rows for the labels-vs-inputs and structure checks
    fit_y: np.ndarray
    label_sums: np.ndarray  # (C,) every row's soft labels summed: each class's label mass
    class_sums: np.ndarray  # (C, <= FIT_DIM) Y'X over every row, projected as fit_x, float32 (no mass: 0)
    row_sum: np.ndarray  # (<= FIT_DIM,) every row summed, projected as fit_x
    validation_counts: np.ndarray | None = None  # (C,) the class counts of the party's own validation split, reported
    training_rows: float = 0.0  # the clean rows it encoded: rows / (encodings per sample x (1 - screened share))
    label_spread: float | None = None  # how far a clean sample's total label weight strays from 1 (None: no bound)
    screened: float = 0.0  # the share of encodings the run's screen dropped (0 unless `screen` is on)
    validation_sizes: tuple[int, ...] = ()  # the split sizes its training rows and validation-fraction allow (): any
    share_factors: tuple[float, float] | None = None  # a class's sample share lies surely in these x its label share
    problem: Implausible | None = None  # the upload's own checks


def examine(party: int, x: np.ndarray, y: np.ndarray, metrics: dict, settings: Settings) -> Evidence:
    """Summarise one validated upload and run its own checks (the report, the labels, the energy). What it
    keeps is small: 32 bytes a row (the sketch) and FIT_ROWS rows of at most FIT_DIM values; an upload that
    fails its own checks keeps neither (it takes no part in the cross-party checks)."""
    flat = x.reshape(len(x), -1)
    energy, energy_error, energy_var, energy_var_error = _energy(flat)
    box = domain(settings, flat.shape[1])
    sketch_matrix, fit_matrix = _projections(settings, flat.shape[1])
    sample = np.sort(
        torch.randperm(len(flat), generator=generator(settings.seed, party, "plausibility"))[:FIT_ROWS].numpy()
    )
    fit_x = np.asarray(flat[sample], dtype=np.float64)
    label_sums, class_sums, row_sum = _class_sums(flat, y, fit_matrix)
    evidence = Evidence(
        party=party,
        rows=len(flat),
        energy=energy,
        energy_error=energy_error,
        energy_var=energy_var,
        energy_var_error=energy_var_error,
        spread_floor=spread_floor(metrics, settings),
        expected=expected_energy(metrics, settings.encoder, len(flat)),
        outside=_outside(flat, *box) if box is not None else 0.0,
        sketch=(_project(flat, sketch_matrix) / math.sqrt(max(energy, 1e-30))).astype(np.float16),
        fit_x=(fit_x if fit_matrix is None else fit_x @ fit_matrix).astype(np.float32),
        fit_y=np.asarray(y[sample], dtype=np.float32),
        label_sums=label_sums, class_sums=class_sums, row_sum=row_sum,
        **_label_mix_terms(len(flat), metrics, settings),
    )
    try:
        check_upload(evidence, y, metrics, settings)
    except Implausible as err:
        evidence.problem = err
        evidence.sketch, evidence.fit_x, evidence.fit_y, evidence.class_sums = (np.empty((0, 0)),) * 4
    return evidence


def check_upload(evidence: Evidence, y: np.ndarray, metrics: dict, settings: Settings) -> None:
    """The upload's own checks (UPLOAD_CHECKS, in order); raise Implausible at the first that fails."""
    for check in UPLOAD_CHECKS.values():
        check(evidence, y, metrics, settings)


def _report(evidence: Evidence, y: np.ndarray, metrics: dict, settings: Settings) -> None:
    if settings.encoder != "mixcon":  # h(x) has no calibration to report: its labels and the cross-party checks
        check_report(evidence.party, metrics, settings)


def _labels(evidence: Evidence, y: np.ndarray, metrics: dict, settings: Settings) -> None:
    if bad := label_violations(y, settings):
        raise Implausible(evidence.party, "labels",
                          f"{bad} of {len(y)} soft-label rows cannot come from {settings.encoder}")


def check_energy(evidence: Evidence, y: np.ndarray, metrics: dict, settings: Settings) -> None:
    """The upload's spread against the one its report predicts (the module's `energy` check)."""
    if evidence.expected is None:
        return
    ratio = evidence.energy / evidence.expected
    if not 1 / ENERGY_FACTOR <= ratio <= ENERGY_FACTOR \
            and abs(evidence.energy - evidence.expected) > ENERGY_SIGMAS * evidence.energy_error:
        raise Implausible(
            evidence.party,
            "energy",
            f"mean squared row norm (centred) {evidence.energy:.4g} is {ratio:.3g}x what its report predicts "
            f"({evidence.expected:.4g} from V, r and alpha)",
        )


def check_spread(evidence: Evidence, y: np.ndarray, metrics: dict, settings: Settings) -> None:
    """How much the rows' energies vary against the least the mixing weights make them vary (the module's
    `norm-spread` check)."""
    floor = evidence.spread_floor
    if floor is None or floor <= 0 or evidence.rows < SPREAD_ROWS:
        return
    if evidence.energy_var < floor / SPREAD_FACTOR \
            and floor - evidence.energy_var > SPREAD_SIGMAS * evidence.energy_var_error:
        raise Implausible(
            evidence.party,
            "norm-spread",
            f"its rows' squared distances to their mean vary by {evidence.energy_var:.4g} (variance); its report's "
            f"V, r and alpha make them vary by at least {floor:.4g} (the mixing weights alone)",
        )


def spread_floor(metrics: dict, settings: Settings) -> float | None:
    """The least variance of a row's squared distance to the mean that an honest singularized upload has: by the law
    of total variance at least that of its mean given the weights, f(w2) = ((1 - w2)^2 + w2^2) V + w2^2 r^2 (the
    sample, its partner and the sphere noise, cross terms averaging 0), over Algorithm 1's weights. None where
    nothing bounds it: other encoders, fixed weights (f is constant), a screen (it keeps rows by their weights)."""
    if settings.encoder != "singularized" or settings.mixing_weights == "fixed" or settings.screen != "none":
        return None
    alpha, V, radius = (float(metrics.get(k, math.nan)) for k in ("alpha", "V", "radius"))
    if not (0.5 <= alpha < 1 and V >= 0 and radius >= 0):  # missing or impossible: the report check names it
        return None
    mix, square, cross = weight_spread(alpha)
    return V * V * mix + radius**4 * square + 2 * V * radius**2 * cross


def check_domain(evidence: Evidence, y: np.ndarray, metrics: dict, settings: Settings) -> None:
    """The report and the rows against the data set's valid box (the module's `domain` check)."""
    box = domain(settings, None)
    if box is None:
        return
    lo, hi = box
    diameter = float(np.sqrt(((hi - lo) ** 2).sum())) if np.isfinite(hi).all() else math.inf
    D = float(metrics.get("D", 0.0))
    if D > diameter * (1 + REPORT_TOLERANCE):
        raise Implausible(
            evidence.party, "domain",
            f"reports D {D:.4g}; no two samples of {settings.dataset} "
            f"({'features' if settings.backbone != 'none' else 'pixels'}) are farther apart than {diameter:.4g} "
            "(the valid range's diagonal)",
        )
    allowed = domain_allowance(metrics, settings)
    if evidence.outside > allowed:
        raise Implausible(
            evidence.party, "domain",
            f"a row lies {evidence.outside:.4g} beyond the valid range of the "
            f"{'features' if settings.backbone != 'none' else 'pixels'} of {settings.dataset}; its encoding "
            f"reaches at most {allowed:.4g} " + ("(alpha r)" if settings.encoder == "singularized" else "beyond it"),
        )


def domain(settings: Settings, dim: int | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-coordinate (lo, hi) that every clean sample of the run's data respects (hi may be inf), widened to
    be sign-symmetric for InstaHide; None when nothing bounds the uploads (mixcon's h(x)). `dim`: the row
    width the box must have (None: the run's own)."""
    if settings.encoder == "mixcon":
        return None
    if settings.backbone != "none":
        from fedsmix.features import feature_dim, feature_range

        width = dim or feature_dim(settings)
        low, high = feature_range(settings)  # scalars, or per coordinate under a projection
        if low.ndim and len(low) != width:
            return None  # a malformed width: validation names it
        lo = np.broadcast_to(low.double().numpy(), (width,)).copy()
        hi = np.full(width, math.inf) if high is None else np.broadcast_to(high.double().numpy(), (width,)).copy()
    else:
        lo, hi = _pixel_box(settings.to_json())
        if dim is not None and dim != len(lo):
            return None  # a malformed width: validation names it
    if settings.encoder in INSTAHIDE:
        edge = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -edge, edge
    return lo, hi


@functools.lru_cache(maxsize=4)
def _pixel_box(settings_json: str) -> tuple[np.ndarray, np.ndarray]:
    from fedsmix import data as datalib
    from fedsmix.space import pixel_spec

    spec = pixel_spec(Settings.from_json(settings_json))
    lo, hi = (b.expand(1, *spec.sample_shape).reshape(-1).double().numpy() for b in datalib.valid_range(spec))
    for bound in (lo, hi):
        bound.flags.writeable = False
    return lo, hi


def domain_allowance(metrics: dict, settings: Settings) -> float:
    """How far beyond the valid box an honest row can lie: the noise's share alpha r (singularized), else 0."""
    if settings.encoder == "singularized":
        return max(settings.alpha, 1 - settings.alpha) * float(metrics.get("radius", 0.0))
    return 0.0


def check_report(party: int, metrics: dict, settings: Settings) -> None:
    """The party's reported calibration against the run's settings and Theorem 4.2."""
    if missing := [k for k in REPORTED if k not in metrics]:
        raise Implausible(party, "report", f"does not report {', '.join(missing)}")
    alpha, tau, radius = (float(metrics.get(k, math.nan)) for k in ("alpha", "tau", "radius"))
    V, D, c = (float(metrics.get(k, math.nan)) for k in ("V", "D", "c"))
    if settings.encoder == "singularized":
        if not math.isclose(alpha, settings.alpha, rel_tol=1e-9):
            raise Implausible(party, "report", f"reports alpha {alpha:g}; the run's alpha is {settings.alpha:g}")
        if not math.isclose(tau, settings.tau, rel_tol=1e-9):
            raise Implausible(party, "report", f"reports tau {tau:g}; the run's tau is {settings.tau:g}")
    if not (V > 0 and D > 0 and radius >= 0):
        raise Implausible(party, "report", f"reports V {V:g}, D {D:g}, r {radius:g}: need V > 0, D > 0, r >= 0")
    if not math.isclose(c, D * D / (2 * V), rel_tol=REPORT_TOLERANCE):
        raise Implausible(party, "report", f"reports c {c:.4g}; its D and V give D^2/(2V) = {D * D / (2 * V):.4g}")
    if settings.encoder == "singularized" and settings.radius_mode == "theorem":
        theorem = noise_multiplier(settings.tau, settings.alpha, c) * D
        if not math.isclose(radius, theorem, rel_tol=REPORT_TOLERANCE, abs_tol=1e-9):
            raise Implausible(
                party, "report", f"reports r {radius:.4g}; Theorem 4.2 gives {theorem:.4g} for its D and c"
            )
    if settings.encoder == "singularized" and settings.radius_mode == "fixed":
        if not math.isclose(radius, settings.radius, rel_tol=1e-6):
            raise Implausible(party, "report", f"reports r {radius:.4g}; the run's fixed radius is {settings.radius:g}")


def label_violations(y: np.ndarray, settings: Settings) -> int:
    """Rows whose soft label the encoder cannot produce (see the module's `labels` check)."""
    y = np.asarray(y, dtype=np.float64)
    nonzero = y > LABEL_TOLERANCE
    count = nonzero.sum(axis=1)
    if settings.encoder == "singularized":
        low, high = 1 - settings.alpha - LABEL_TOLERANCE, settings.alpha + LABEL_TOLERANCE
        weight_ok = ((y >= low) & (y <= high)) | (y >= 1 - LABEL_TOLERANCE) | ~nonzero
        return int(((count > 2) | ~weight_ok.all(axis=1)).sum())
    if settings.encoder in ("none", "mixcon"):  # one-hot labels
        return int(((count != 1) | (y.max(axis=1) < 1 - LABEL_TOLERANCE)).sum())
    most = 2 if settings.encoder == "instahide-cross" else settings.mix_k
    return int((count > most).sum())


def expected_energy(metrics: dict, encoder: str, rows: int = 0) -> float | None:
    """E||x~ - mean||^2 over `rows` rows from the report: E[w1^2 + w2^2] V + E[w2^2] r^2 (1 - 1/n)
    - 2 E[w1 w2] V / (n - 1) (singularized: the noise loses its own mean, and a derangement pairs each sample with
    another, whose centred inner products average -V / (n - 1); both vanish for large n), V (none). V is the
    party's own, over the same rows (divisor n)."""
    V, alpha = float(metrics.get("V", math.nan)), float(metrics.get("alpha", math.nan))
    if encoder == "singularized":
        if not 0.5 <= alpha < 1:  # missing or impossible: the report check names it
            return None
        partner, mixed = weight_moments(alpha)
        noise = partner * float(metrics.get("radius", 0.0)) ** 2
        if rows < 2:
            return mixed * V + noise
        return mixed * V + noise * (1 - 1 / rows) - (1 - mixed) * V / (rows - 1)  # w1 + w2 = 1: 2 E[w1 w2] = 1 - mixed
    if encoder == "none":
        return V
    return None  # mixup/InstaHide: many weights, signs, public images; the cross-party checks still apply


def quarantine(evidence: list[Evidence], settings: Settings) -> list[dict]:
    """Every party to quarantine, with the check and the reason; `evidence` in arrival order. The cross-party
    checks run in order (CROSS_CHECKS), each on the parties that passed every check before it."""
    verdicts = [_verdict(e.problem) for e in evidence if e.problem is not None]
    kept = evidence
    for check in CROSS_CHECKS.values():
        kept = [e for e in kept if e.party not in {v["party"] for v in verdicts}]
        verdicts += check(kept)
    return verdicts


def _label_mix_terms(rows: int, metrics: dict, settings: Settings) -> dict:
    """What `label-mix` needs of an upload: the reported validation counts, the clean rows encoded, and how far the
    encoder lets a sample's label weight stray. Singularized mixup gives row r weight w_r1 in [1 - alpha, alpha] to
    its own sample and 1 - w_r1 to its partner, so a class's label mass is its count plus sum_r (w_r1 - E w1)
    (a_r - b_r), bounded terms of width 2 alpha - 1; one-hot uploads (`none`, `mixcon`) carry the counts exactly;
    mixup and InstaHide mix public images or many partners, and the check abstains. Beside that probable bound, a sure
    one: each sample is the own sample of one row and the partner of another in every pass, so its total label
    weight lies in [2 (1 - alpha), 2 alpha] a pass, and a class's share of the samples in [share / (2 alpha),
    share / (2 (1 - alpha))] of its share of the label mass (no screen: a screen drops rows by their content)."""
    counts = metrics.get("validation-counts")
    screened = float(metrics.get("screened-fraction", 0.0)) if settings.screen != "none" else 0.0
    spread = {"singularized": 2 * settings.alpha - 1, "none": 0.0, "mixcon": 0.0}.get(settings.encoder)
    per_sample = settings.encodings_per_sample if settings.encoder == "singularized" else 1
    screened = min(max(screened, 0.0), 0.99)
    training = rows / (per_sample * (1.0 - screened))
    return {
        "validation_counts": None if counts is None else np.asarray(counts, dtype=np.float64),
        "training_rows": training, "label_spread": spread, "screened": screened,
        "share_factors": (None if spread is None or screened else (1.0, 1.0) if spread == 0
                          else (1 / (2 * settings.alpha), 1 / (2 * (1 - settings.alpha)))),
        "validation_sizes": tuple(sorted(set().union(*(  # under a screen, `training` is rows over the reported kept
            validation_rows(n, settings.validation_fraction)  # share: up to rounding, the rows it encoded
            for n in {math.floor(training), math.ceil(training)} if n >= 1)))),
    }


def validation_rows(training_rows: int, fraction: float) -> set[int]:
    """The validation split sizes a party of `training_rows` rows to train on keeps (`party.validation_split`:
    ceil(fraction n) of its n rows, at least one left to train on); usually one size, two where n - ceil(fraction n)
    repeats."""
    if fraction <= 0:
        return {0}
    guess = round(training_rows / (1 - fraction))
    sizes = set()
    for n in range(max(1, guess - 3), guess + 4):
        k = min(math.ceil(fraction * n), n - 1) if n > 1 else 0
        if n - k == training_rows:
            sizes.add(k)
    return sizes


@dataclass
class LabelMix:
    """The class whose share an upload's label mass and its party's validation split disagree on most."""

    chance: float  # a bound on an honest party's chance of a disagreement this large (1: none)
    label: int = -1
    upload_share: float = 0.0
    validation_share: float = 0.0
    validation_count: int = 0


def label_mix(e: Evidence, delta: float) -> LabelMix:
    """How plausible the upload's label mix is against the party's own validation split (the module's `label-mix`).

    The validation split is a uniformly random subset of the party's rows; the upload encodes the rest. For class c
    with K_c of the party's N rows, the split's count v_c is hypergeometric (m draws, mean m K_c / N), and the
    upload's label share q_c is the rest's share (N p_c - v_c) / (N - m) up to the encoder's weight noise, which
    Hoeffding's bound keeps within eta = spread sqrt(ln(4 C / delta) / (2 rows)) for every class with chance
    1 - delta / 2 (plus what a screen that dropped a share s of the rows can move: s / (1 - s)). So K_c / N lies in
    [(n q_lo + v_c) / N, (n q_hi + v_c) / N] (n the rows encoded); a split share outside it has a chance below
    Chernoff's exp(-m KL(v_c / m || nearest)) (Hoeffding: it holds for draws without replacement too)."""
    if e.validation_counts is None or e.label_spread is None:
        return LabelMix(1.0)
    counts, total = e.validation_counts, float(e.label_sums.sum())
    m = float(counts.sum())
    if m <= 0 or total <= 0:
        return LabelMix(1.0)
    classes = len(counts)
    share = e.label_sums / total
    eta = e.label_spread * math.sqrt(math.log(4 * classes / delta) / (2 * e.rows)) + e.screened / (1 - e.screened)
    n = e.training_rows
    worst = LabelMix(1.0)
    for c in range(classes):
        observed = counts[c] / m
        low, high = max(share[c] - eta, 0.0), min(share[c] + eta, 1.0)
        if e.share_factors is not None:  # the sure bound: a class without label mass has no sample
            low, high = max(low, share[c] * e.share_factors[0]), min(high, share[c] * e.share_factors[1])
        low, high = (n * low + counts[c]) / (n + m), (n * high + counts[c]) / (n + m)
        if low <= observed <= high:
            continue
        chance = tail_chance(observed, m, low if observed < low else high)
        if chance < worst.chance:
            worst = LabelMix(chance, c, float(share[c]), float(observed), int(counts[c]))
    return worst


def mixed_labels(evidence: list[Evidence]) -> list[dict]:
    """Parties whose upload's label mix their own validation split contradicts (the module's `label-mix`); a party
    whose reported split is not the size its training rows and `validation-fraction` give is named too (reporting
    an empty split would otherwise silence the check)."""
    delta = FALSE_ALARM / max(len(evidence), 1)
    verdicts = []
    for e in evidence:
        if e.label_spread is None:
            continue
        if e.validation_counts is None:
            verdicts.append(_verdict(Implausible(e.party, "label-mix", "does not report validation-counts")))
            continue
        if e.validation_sizes and int(e.validation_counts.sum()) not in e.validation_sizes:
            verdicts.append(_verdict(Implausible(
                e.party, "label-mix",
                f"reports a validation split of {int(e.validation_counts.sum())} rows; a party with its "
                f"{round(e.training_rows)} training rows keeps {' or '.join(map(str, e.validation_sizes))} "
                "(validation-fraction)",
            )))
            continue
        mix = label_mix(e, delta)
        if mix.chance < delta / (4 * len(e.validation_counts)):
            verdicts.append(_verdict(Implausible(
                e.party, "label-mix",
                f"class {mix.label} holds {100 * mix.upload_share:.1f}% of its upload's label mass but "
                f"{100 * mix.validation_share:.1f}% of its own validation split ({mix.validation_count} of "
                f"{int(e.validation_counts.sum())} rows): an honest split differs this much with a chance below "
                f"{mix.chance:.1g}",
            )))
    return verdicts


def replays(evidence: list[Evidence], block: int = 32_768) -> list[dict]:
    """Uploads whose rows (nearly) repeat an earlier upload's; the earlier one is kept.

    A row of the later upload repeats an earlier upload when one of the earlier's rows lies within
    DUPLICATE_DISTANCE x the later's spread (in the sketches' projected space, both on the rows' own scale). The
    earlier rows go into k-d trees of `block` rows at a time, each asked for every later upload's looked-up rows: a
    federation of 10,000 uploads is checked in a few passes, not pair by pair, in memory that does not grow with it.
    """
    from scipy.spatial import cKDTree

    pool = [(i, e) for i, e in enumerate(evidence) if e.problem is None and len(e.sketch)]  # in arrival order
    if len(pool) < 2:
        return []
    scale = {i: math.sqrt(max(e.energy, 1e-30)) for i, e in pool}
    looked = {i: e.sketch[:: max(1, len(e.sketch) // SKETCH_ROWS)][:SKETCH_ROWS] for i, e in pool}
    matched: dict[tuple[int, int], set[int]] = {}  # (later, earlier) -> the later's looked-up rows it repeats
    chunk: list[tuple[int, Evidence]] = []
    for n, (i, e) in enumerate(pool):
        chunk.append((i, e))
        if n + 1 < len(pool) and sum(len(c.sketch) for _, c in chunk) < block:
            continue
        rows = np.concatenate([c.sketch.astype(np.float64) * scale[k] for k, c in chunk])  # each on its own scale
        owner = np.concatenate([np.full(len(c.sketch), k) for k, c in chunk])
        tree = cKDTree(rows)
        for later, _ in pool:
            if later <= chunk[0][0]:
                continue  # only uploads after the chunk's first can repeat one of its uploads
            near = tree.query_ball_point(looked[later].astype(np.float64) * scale[later],
                                         r=DUPLICATE_DISTANCE * scale[later])
            for row, found in enumerate(near):
                for k in {int(owner[j]) for j in found if owner[j] < later}:
                    matched.setdefault((later, k), set()).add(row)
        chunk, tree, rows = [], None, None
    by_later: dict[int, list[int]] = {}
    for (later, k), rows in matched.items():
        if len(rows) / len(looked[later]) >= DUPLICATE_SHARE:
            by_later.setdefault(later, []).append(k)
    verdicts = []
    for later, e in pool:
        repeated = sorted(by_later.get(later, []))
        if repeated:
            share = len(matched[(later, repeated[0])]) / len(looked[later])
            verdicts.append(_verdict(Implausible(
                e.party, "replay",
                f"{100 * share:.0f}% of its rows repeat party {evidence[repeated[0]].party}'s upload (which arrived "
                "first and is kept; content alone cannot tell the original from the copy)",
            )))
    return verdicts


@dataclass
class Agreement:
    """How well one party's labels match what a ridge head reads from its inputs, class by class."""

    rows: int  # sampled rows judged (their classes also occur in other parties' samples)
    hits: float  # rows whose predicted class is in the row's label support
    expected: float  # the same, at the hit rates that other parties' rows of the same classes reach
    chance: float  # the same, for a uniformly random class

    @property
    def shortfall(self) -> float:
        """Share of the expected lift over chance that the party misses (about 0 when honest)."""
        return (self.expected - self.hits) / max(self.expected - self.chance, 1e-9)


def agreement(evidence: list[Evidence]) -> dict[int, Agreement]:
    """One ridge head fitted on a balanced sample of every party's rows predicts each sampled row's class; a
    row is a hit when the class is in its label support. A party is compared with the other parties' rows of
    the same classes (a hard class is hard for everybody), so label skew alone does not make it look bad."""
    x = np.concatenate([e.fit_x for e in evidence])
    y = np.concatenate([e.fit_y for e in evidence])
    head = linear_heads("ridge", Moments.of(x, y), (FIT_GAMMA,))[f"ridge@{FIT_GAMMA:g}"]
    support, hits = {}, {}
    with torch.no_grad():
        for e in evidence:
            predicted = head(torch.from_numpy(e.fit_x).float()).argmax(dim=1).numpy()
            support[e.party] = e.fit_y > LABEL_TOLERANCE
            hits[e.party] = support[e.party][np.arange(len(predicted)), predicted].astype(np.float64)
    class_hits = {p: hits[p] @ support[p] for p in support}  # per class: hits among rows holding the class
    class_rows = {p: support[p].sum(axis=0).astype(np.float64) for p in support}
    total_hits, total_rows = sum(class_hits.values()), sum(class_rows.values())
    out = {}
    for p in support:
        others = total_rows - class_rows[p]
        known = others >= MIN_CLASS_ROWS
        rate = np.where(known, (total_hits - class_hits[p]) / np.maximum(others, 1), np.nan)
        judged = (support[p] & known).sum(axis=1) == support[p].sum(axis=1)  # every class of the row known
        expected = np.nanmean(np.where(support[p][judged], rate, np.nan), axis=1)
        out[p] = Agreement(
            rows=int(judged.sum()), hits=float(hits[p][judged].sum()), expected=float(expected.sum()),
            chance=float(support[p][judged].sum() / support[p].shape[1]),
        )
    return out


def disagreements(evidence: list[Evidence]) -> list[dict]:
    """Parties whose labels the inputs do not explain as well as other parties' rows of the same classes
    (garbage inputs, permuted classes)."""
    if len(evidence) < MIN_PEERS:
        return []
    scores = {p: a for p, a in agreement(evidence).items() if a.rows}
    if len(scores) < MIN_PEERS:
        return []
    lift = float(np.median([(a.expected - a.chance) / a.rows for a in scores.values()]))
    if lift < SIGNAL:  # the labels are hidden from a linear head (tiny tau): no decision
        return []
    shortfall = {p: a.shortfall for p, a in scores.items()}
    median, spread = float(np.median(list(shortfall.values()))), _robust_spread(list(shortfall.values()))
    verdicts, alarm = [], FALSE_ALARM / len(scores)
    for party, a in scores.items():
        if shortfall[party] > AGREEMENT_GAP and fewer_hits_chance(a.hits, a.rows, a.expected) < alarm \
                and shortfall[party] - median > SPREAD_Z * spread:
            verdicts.append(_verdict(Implausible(
                party, "labels-vs-inputs",
                f"a ridge head fitted on every party's rows puts {100 * a.hits / a.rows:.0f}% of its rows in their "
                f"label support, where other parties' rows of the same classes reach {100 * a.expected / a.rows:.0f}% "
                f"(chance {100 * a.chance / a.rows:.0f}%)",
            )))
    return verdicts


def fewer_hits_chance(hits: float, rows: int, expected: float) -> float:
    """A bound on the chance that an honest party's rows hit at most `hits` times where `expected` hits are
    expected (its rows independent, each with its own chance): Chernoff's exp(-rows KL(hits/rows || expected/rows)).
    Five rows that all miss at an 82 % rate have a chance of 2e-4: at 10,000 parties, several honest ones would;
    garbage in 54 rows at chance (16 %) has about e^-54."""
    if rows <= 0 or hits >= expected:
        return 1.0
    return tail_chance(hits / rows, rows, expected / rows)


def tail_chance(observed: float, rows: float, expected: float) -> float:
    """Chernoff's bound exp(-rows KL(observed || expected)) on the chance that `rows` draws of a share `expected`
    land at a share `observed` or beyond it (either side)."""
    q, p = min(max(observed, 0.0), 1.0), min(max(expected, 1e-300), 1 - 1e-12)
    kl = (q * math.log(q / p) if q > 0 else 0.0) + ((1 - q) * math.log((1 - q) / (1 - p)) if q < 1 else 0.0)
    return math.exp(-rows * kl)


def class_offsets(label_sums: np.ndarray, class_sums: np.ndarray, row_sum: np.ndarray, rows: float) -> np.ndarray:
    """(C, k) each class's mean less the overall mean, from soft labels: the rows' covariance with the class's
    label over the class's label mass (mixing shrinks every class towards the overall mean by the same factor,
    which no comparison of directions below depends on). Classes without mass: 0."""
    centred = class_sums - np.outer(label_sums, row_sum / max(rows, 1.0))
    return centred / np.maximum(label_sums, 1e-12)[:, None]


@dataclass
class Alignment:
    """How well one party's class means point where the other parties' means of the same classes point."""

    score: float  # 1: every class to its own; a permuted party near 0 or below
    error: float  # its standard error from the noise of the party's class means (its rows' spread over their mass)


def peer_class_means(evidence: list[Evidence]):
    """Per party that holds more than (nearly) one class: (evidence, a, b, known, held). b (C, k): the other parties'
    pooled class means about their overall mean; a (C, k): the party's class means about its own overall mean, plus
    the mean its label mix has among the others' (an acquisition offset common to its rows drops out); known: the
    classes the others hold MIN_CLASS_ROWS of label mass of; held: those the party holds as much of too. A party
    whose classes carry less than MIN_CLASS_ROWS of label mass beyond its commonest share (sum_c m_c (1 - share_c))
    is skipped: a class it holds nearly alone of its rows is its overall mean and says nothing of its labels."""
    total_labels = sum(e.label_sums for e in evidence)
    total_classes = sum(e.class_sums.astype(np.float64) for e in evidence)
    total_rows, total_sum = sum(e.rows for e in evidence), sum(e.row_sum for e in evidence)
    for e in evidence:
        their_labels = total_labels - e.label_sums
        theirs = class_offsets(their_labels, total_classes - e.class_sums.astype(np.float64), total_sum - e.row_sum,
                               total_rows - e.rows)
        share = e.label_sums / max(float(e.label_sums.sum()), 1e-12)  # its label mix
        mine = class_offsets(e.label_sums, e.class_sums.astype(np.float64), e.row_sum, e.rows) + share @ theirs
        known = their_labels >= MIN_CLASS_ROWS  # classes the others' means place
        held = np.flatnonzero((e.label_sums >= MIN_CLASS_ROWS) & known)  # ... and the party's own do too
        if float(e.label_sums[held] @ (1 - share[held])) >= MIN_CLASS_ROWS:  # not (nearly) one class
            yield e, mine, theirs, known, held


def alignment(evidence: list[Evidence]) -> dict[int, Alignment]:
    """Per party: how well its class means point where the other parties' means of the same classes point, as
    sum_c m_c <a_c, b_c> / sum_c m_c max_c' <a_c, b_c'> over the classes both sides hold MIN_CLASS_ROWS of label
    mass (m_c: the party's mass of class c), a and b as `peer_class_means` gives them (a party of one class is not
    judged). 1: every class points to its own; a permuted party near 0 or below. Its error: each class mean's noise
    per coordinate is at most the party's spread per coordinate (energy / k) over the class's label mass, carried
    through the numerator."""
    out = {}
    for e, mine, theirs, known, held in peer_class_means(evidence):
        mass = e.label_sums[held]
        inner = np.where(known, mine[held] @ theirs.T, -np.inf)  # its class c against every class c' they place
        denominator = float(mass @ inner.max(axis=1))
        if denominator > 0:
            noise = e.energy / mine.shape[1] * float(mass @ (theirs[held] ** 2).sum(axis=1))  # var of the numerator
            out[e.party] = Alignment(float(mass @ inner[np.arange(len(held)), held]) / denominator,
                                     math.sqrt(noise) / denominator)
    return out


def misaligned(evidence: list[Evidence]) -> list[dict]:
    """Parties whose class means point to other classes than the other parties' means of the same labels. One
    party at a time, the least aligned first, each judged against the parties not yet named: a permuted party's
    rows pull the others' means of the classes it holds much of, and must not make an honest holder of them look
    misaligned in turn."""
    verdicts, left = [], list(evidence)
    while len(left) >= MIN_PEERS:
        judged = alignment(left)
        if len(judged) < PEER_JUDGED:
            break
        scores = {p: a.score for p, a in judged.items()}
        median = float(np.median(list(scores.values())))
        if median < PEER_SIGNAL or np.median([a.error for a in judged.values()]) > PEER_NOISE:
            break  # the parties' class means are not resolved (small tau, few rows a class): no decision
        spread = _robust_spread(list(scores.values()))
        party, score = min(scores.items(), key=lambda item: item[1])
        if not (score < PEER_GAP * median and median - score > SPREAD_Z * spread
                and 1 - score > PEER_SIGMAS * judged[party].error):  # its own noise does not explain it
            break
        verdicts.append(_verdict(Implausible(
            party, "labels-vs-peers",
            f"its class means, as its labels recover them, point to the other parties' means of the same classes "
            f"{score:.2f} as well as to their best-matching class's (parties' median {median:.2f}): its labels "
            "name other classes than its inputs hold",
        )))
        left = [e for e in left if e.party != party]
    return verdicts


def structure(evidence: list[Evidence]) -> tuple[dict[int, tuple[float, float]], float]:
    """Per party: (share of its centred energy in the STRUCTURE_K principal directions of every party's
    centred rows, the standard error of that share), and the share an isotropic upload would have."""
    centred = [e.fit_x.astype(np.float64) - e.fit_x.mean(axis=0, dtype=np.float64) for e in evidence]
    pooled = sum(x.T @ x for x in centred) / sum(len(x) for x in centred)
    k = min(STRUCTURE_K, pooled.shape[0] - 1)
    directions = np.linalg.eigh(pooled)[1][:, ::-1][:, :k]
    out = {}
    for e, x in zip(evidence, centred):
        inside, total = ((x @ directions) ** 2).sum(axis=1), (x * x).sum(axis=1)
        share = float(inside.sum() / total.sum())
        error = float((inside - share * total).std() / total.mean() / math.sqrt(len(x)))  # delta method
        out[e.party] = (share, error)
    return out, k / pooled.shape[0]


def unstructured(evidence: list[Evidence]) -> list[dict]:
    """Parties whose rows lack the principal directions every other party's rows share (random inputs)."""
    if len(evidence) < MIN_PEERS:
        return []
    shares, isotropic = structure(evidence)
    excess = {p: share - isotropic for p, (share, _) in shares.items()}
    median = float(np.median(list(excess.values())))
    if median < STRUCTURE_SIGNAL:  # noise dominates every upload (small tau): no decision
        return []
    spread = _robust_spread(list(excess.values()))
    verdicts = []
    for party, (share, error) in shares.items():
        gap = median - excess[party]
        if excess[party] < STRUCTURE_GAP * median and gap > max(STRUCTURE_SIGMAS * max(error, 1e-3), SPREAD_Z * spread):
            verdicts.append(_verdict(Implausible(
                party, "structure",
                f"{100 * share:.0f}% of its energy lies in the {STRUCTURE_K} principal directions the parties' rows "
                f"share (isotropic: {100 * isotropic:.0f}%); the parties' median is {100 * (median + isotropic):.0f}%",
            )))
    return verdicts


UPLOAD_CHECKS = {"report": _report, "labels": _labels, "domain": check_domain, "energy": check_energy,
                 "norm-spread": check_spread}
CROSS_CHECKS = {"label-mix": mixed_labels, "replay": replays, "labels-vs-inputs": disagreements,
                "labels-vs-peers": misaligned, "structure": unstructured}


# ------------------------------------------------------------------------------------------ helpers
def _verdict(err: Implausible) -> dict:
    return {"party": err.party, "check": err.check, "reason": err.reason}


def _robust_spread(values: list[float]) -> float:
    """1.4826 x the median absolute deviation: the standard deviation, were the values normal."""
    median = float(np.median(values))
    return 1.4826 * float(np.median([abs(v - median) for v in values]))


def _energy(flat, block: int = 4096) -> tuple[float, float, float, float]:
    """Mean squared distance of a row to the mean row and its standard error over the rows, and the distances'
    variance and its standard error (from their fourth central moment); in float64 blocks (the upload may be
    memory-mapped: two passes, the mean first)."""
    n, total = len(flat), np.zeros(flat.shape[1])
    for start in range(0, n, block):
        total += np.asarray(flat[start : start + block], dtype=np.float64).sum(axis=0)
    mean = total / n
    distances = np.concatenate([((np.asarray(flat[start : start + block], dtype=np.float64) - mean) ** 2).sum(axis=1)
                                for start in range(0, n, block)])
    if n < 2:
        return float(distances.mean()), math.inf, 0.0, math.inf
    centred = distances - distances.mean()
    var = float(centred.var(ddof=1))
    var_error = math.sqrt(max(float((centred**4).mean()) - var * var, 0.0) / n)
    return float(distances.mean()), float(distances.std(ddof=1) / math.sqrt(n)), var, var_error


def _class_sums(flat, y: np.ndarray, matrix: np.ndarray | None,
                block: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(label mass per class, Y'X, the rows' sum) over every row, X projected by `matrix` (None: as it is)."""
    labels = np.asarray(y, dtype=np.float64)
    width = flat.shape[1] if matrix is None else matrix.shape[1]
    class_sums, row_sum = np.zeros((labels.shape[1], width)), np.zeros(width)
    for start in range(0, len(flat), block):
        rows = np.asarray(flat[start : start + block], dtype=np.float64)
        rows = rows if matrix is None else rows @ matrix
        class_sums += labels[start : start + block].T @ rows
        row_sum += rows.sum(axis=0)
    return labels.sum(axis=0), class_sums.astype(np.float32), row_sum  # float32: C x 512 values a party


def _outside(flat, lo: np.ndarray, hi: np.ndarray) -> float:
    """The largest distance of a row beyond the box [lo, hi], less DOMAIN_TOLERANCE x the row's norm (in blocks of
    about 32 MB of float64: a 224 px row is 150,528 values)."""
    worst, block = 0.0, max(1, 2**22 // flat.shape[1])
    for start in range(0, len(flat), block):
        rows = np.asarray(flat[start : start + block], dtype=np.float64)
        beyond = np.maximum(rows - hi, 0.0) + np.maximum(lo - rows, 0.0)
        excess = np.sqrt((beyond * beyond).sum(axis=1)) - DOMAIN_TOLERANCE * np.sqrt((rows * rows).sum(axis=1))
        worst = max(worst, float(excess.max(initial=0.0)))
    return worst


def _projections(settings: Settings, dim: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The server's own random projections (seeded by the run): a sketch for near-duplicates, and one to
    FIT_DIM dimensions for the ridge head when the rows are wider. Columns scaled to keep norms. Drawn once per
    run seed and row width (not once per upload: at 1,000 parties the draws were a fifth of the server's time
    while uploads arrived); read-only, shared by every upload of the run."""
    return _seeded_projections(settings.seed, dim)


@functools.lru_cache(maxsize=1)  # one run, one row width (a 224 px fit matrix is 600 MB: never keep two)
def _seeded_projections(seed: int, dim: int) -> tuple[np.ndarray, np.ndarray | None]:
    gen = generator(seed, "plausibility", dim)
    sketch = torch.randn(dim, SKETCH_DIM, generator=gen, dtype=torch.float64).numpy() / math.sqrt(SKETCH_DIM)
    fit = None if dim <= FIT_DIM else (
        torch.randn(dim, FIT_DIM, generator=gen, dtype=torch.float64).numpy() / math.sqrt(FIT_DIM))
    for matrix in (sketch, fit):
        if matrix is not None:
            matrix.flags.writeable = False
    return sketch, fit


def _project(flat, matrix: np.ndarray, block: int = 4096) -> np.ndarray:
    out = np.empty((len(flat), matrix.shape[1]), dtype=np.float64)
    for start in range(0, len(flat), block):
        out[start : start + block] = np.asarray(flat[start : start + block], dtype=np.float64) @ matrix
    return out
