"""The party's work, in one place (the role of `task.py` in Flower's examples).

load_partition -> prepare_upload (calibrate, encode, upload dtype, report) for mixup-union (with
encoder=mixcon the encoding is the cut-layer representation h(x) under the h the server shipped);
train_local for local-only training and for one FedAvg/FedProx round. The ClientApp handlers (on
Flower's runtime or the in-process transport), the benchmarks, the frontier's replay and the simulation
oracle call these functions and nothing else, so a replay is bit-for-bit what the party sent.

Everything is a pure function of (settings, party, number of parties): every random choice
draws from a generator seeded with (seed, party, purpose).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from . import data as datalib
from .config import Settings
from .defences import active
from .encoders import (
    Calibration,
    DataStatistics,
    Encoded,
    EncoderParams,
    calibrate,
    data_statistics,
    empirical_snr,
    encode,
    fixed_radius,
)
from .faults import RELABELS, UPDATE_FAULTS, corrupt, corruption, falsify_update, flip_classes, listed, relabel
from .models import new_classifier, represent
from .partition import partition_indices
from .seeding import generator
from .space import load_public_pool, load_train_all, pixel_spec, to_space, train_subset_rows
from .training import StepTrace, TrainReport, dp_sgd_noise_multiplier, train, train_config


@dataclass
class Partition:
    """One party's private data in the space where mixing happens (normalised pixels or features)."""

    party: int
    x: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    spec: datalib.DatasetSpec
    rows: np.ndarray  # rows of the training split (never uploaded)
    split: str = "train"  # the split `rows` index (attack sweeps take victims from the test split)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def one_hot(self) -> torch.Tensor:
        return datalib.one_hot(self.labels, self.num_classes)

    def subset(self, index: torch.Tensor) -> Partition:
        """The same party holding only `index` of its rows (an attacked batch, say)."""
        index = torch.as_tensor(index)
        return Partition(self.party, self.x[index], self.labels[index], self.num_classes, self.spec,
                         self.rows[index.numpy()], self.split)


def validation_split(settings: Settings, party: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of a party's n rows that it trains on and that it keeps for validation (`validation-fraction`,
    seeded per party; never encoded, uploaded or trained on). A party keeps at least one row to train on."""
    k = min(math.ceil(settings.validation_fraction * n), n - 1) if n > 1 else 0
    order = torch.randperm(n, generator=generator(settings.seed, party, "validation-split")).numpy()
    return np.sort(order[k:]), np.sort(order[:k])


def load_partition(settings: Settings, party: int, num_parties: int, part: str = "train") -> Partition:
    """A party's rows of the training split in the mixing space: the rows it trains on (`part="train"`), or the
    validation split it keeps for selection (`"validation"`, see `validation_split`)."""
    raw, rows, labels = _partition_rows(settings, party, num_parties, part)
    x = to_space(settings, raw, "train", rows, party)
    return Partition(party, x, labels, raw.spec.num_classes, pixel_spec(settings, raw.spec), rows)


def validation_counts(settings: Settings, party: int, num_parties: int) -> list[int]:
    """The class counts of the party's validation split (labels only, nothing loaded into the mixing space): what
    it reports with its upload, so that the server can hold the upload's label mix against its own clean rows'
    (server/plausibility.py, `label-mix`). Its upload's soft labels already carry its label mix."""
    raw, _, labels = _partition_rows(settings, party, num_parties, "validation")
    return np.bincount(labels.numpy(), minlength=raw.spec.num_classes).tolist()


def _partition_rows(settings: Settings, party: int, num_parties: int,
                    part: str) -> tuple[datalib.RawSplit, np.ndarray, torch.Tensor]:
    """The training split, the rows of it that the party's `part` holds, and their labels as the party holds them
    (a consistent liar's relabelled, fedsmix.faults.relabel, over all its rows so both parts tell one lie)."""
    if part not in ("train", "validation"):
        raise ValueError(f"part: unknown {part!r}; allowed: train, validation")
    raw = datalib.load_dataset(settings, "train")
    subset = train_subset_rows(settings, len(raw))
    rows = partition_indices(
        raw.labels if subset is None else raw.labels[subset],
        party,
        num_parties,
        settings.partitioner,
        settings.seed,
        settings.dirichlet_alpha,
        settings.classes_per_party,
        settings.min_partition_size,
        settings.poor_party_ratio,
        settings.poor_party,
    )
    if subset is not None:
        rows = subset[rows]
    labels = raw.labels[rows].astype(np.int64)
    lie = listed(settings.fault, party, RELABELS)
    if lie:
        labels = relabel(lie, labels, raw.spec.num_classes, settings.fault_strength,
                         generator(settings.seed, party, "relabel"))
    keep = validation_split(settings, party, len(rows))[0 if part == "train" else 1]
    return raw, rows[keep], torch.from_numpy(labels[keep])


def pooled_data(settings: Settings, num_parties: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What pooling every party's data in the clear gives (the centralised bound): the whole training split, or
    under `feature-skew` the union of the `num_parties` parties' rows, each as its party's acquisition records it."""
    if settings.feature_skew <= 0:
        return load_train_all(settings)
    parts = [load_partition(settings, p, num_parties, part)
             for p in range(num_parties) for part in ("train", "validation")]
    return torch.cat([p.x for p in parts]), torch.cat([p.labels for p in parts])


# --------------------------------------------------------------------------------- mixup-union
def party_statistics(settings: Settings, part: Partition) -> DataStatistics:
    """V, D (and lambda_max for `calibration = "directional-eig"`) of the party's own data."""
    return data_statistics(part.x, generator(settings.seed, part.party, "calibrate"),
                           eigenvalue=settings.calibration == "directional-eig", centring=settings.variance_centring)


def calibrate_party(settings: Settings, part: Partition, stats: DataStatistics | None = None) -> Calibration:
    """Theorem 4.2 (in the `calibration` asked for) on the party's own data, or the configured radius,
    reported with that calibration's bound. `stats`: the party's statistics when already estimated."""
    stats = stats or party_statistics(settings, part)
    if settings.radius_mode == "fixed":
        return fixed_radius(stats, settings.radius, settings.tau, settings.alpha, calibration=settings.calibration)
    if settings.radius_mode == "pixel-mapped":
        from .features import pixel_mapped_radius

        radius = pixel_mapped_radius(settings, part, generator(settings.seed, part.party, "pixel-mapped"))
        return fixed_radius(stats, radius, settings.tau, settings.alpha, mode="pixel-mapped",
                            calibration=settings.calibration)
    return calibrate(stats, settings.tau, settings.alpha, settings.calibration)


def encoder_params(settings: Settings, radius: float) -> EncoderParams:
    return EncoderParams(
        name=settings.encoder,
        alpha=settings.alpha,
        radius=radius,
        derangement=settings.permutation == "derangement",
        k=settings.mix_k,
        cap=settings.coefficient_cap,
        private_min=settings.private_mass_min,
        encodings_per_sample=settings.encodings_per_sample,
        fixed_weights=settings.mixing_weights == "fixed",
    )


def cut_encoder(settings: Settings, sample_shape: tuple[int, ...], num_classes: int,
                state: dict[str, torch.Tensor] | None) -> torch.nn.Module:
    """encoder=mixcon: the split model's h (up to the cut layer), with the weights the server shipped."""
    if state is None:
        raise ValueError("encoder 'mixcon': the party needs the cut-layer weights h from the server (encoder_state)")
    encoder = new_classifier(settings, sample_shape, num_classes).encoder
    encoder.load_state_dict(state)
    return encoder.eval()


def separability(z: torch.Tensor, labels: torch.Tensor, generator: torch.Generator, pairs: int = 20000) -> dict:
    """MixCon's dist = ||h_i - h_j||^2 of L2-normalised representations over random pairs of different classes:
    mean (the separability of Fig. 3) and minimum (delta_h of Definition 3.1, over the sampled pairs)."""
    n = len(z)
    if n < 2 or len(labels.unique()) < 2:
        return {"separability-mean": float("nan"), "separability-min": float("nan")}
    unit = torch.nn.functional.normalize(z.flatten(1).double(), dim=1)
    i = torch.randint(0, n, (pairs,), generator=generator)
    j = torch.randint(0, n, (pairs,), generator=generator)
    keep = labels[i] != labels[j]
    if not bool(keep.any()):
        return {"separability-mean": float("nan"), "separability-min": float("nan")}
    dist = (unit[i[keep]] - unit[j[keep]]).pow(2).sum(dim=1)
    return {"separability-mean": float(dist.mean()), "separability-min": float(dist.min())}


def represent_partition(settings: Settings, part: Partition, encoder_state: dict[str, torch.Tensor] | None,
                        device: str = "cpu") -> Encoded:
    """encoder=mixcon: the party's upload is h(x) of its whole partition (flattened), labels one-hot."""
    encoder = cut_encoder(settings, part.sample_shape, part.num_classes, encoder_state)
    z = represent(encoder, part.x, device)
    n = len(z)
    return Encoded(x=z, y=part.one_hot(), weights=torch.ones(n, 1), sources=torch.arange(n).unsqueeze(1))


def encode_partition(
    settings: Settings, part: Partition, calibration: Calibration | None = None,
    encoder_state: dict[str, torch.Tensor] | None = None,
) -> tuple[Encoded, Calibration | None]:
    """Calibrate and encode the whole partition once, from the party's own seed, then screen it
    (`screen`): the oracle's replay runs this same function, so it reproduces a screened upload too.

    encoder=mixcon has nothing to calibrate: the encoding is h(x) under `encoder_state` (calibration None).
    """
    if settings.encoder == "mixcon":
        return represent_partition(settings, part, encoder_state), None
    calibration = calibration or calibrate_party(settings, part)
    public = load_public_pool(settings, part.spec) if settings.encoder == "instahide-cross" else None
    enc = encode(
        part.x,
        part.one_hot(),
        encoder_params(settings, calibration.radius),
        generator(settings.seed, part.party, "encode"),
        public=public,
    )
    if settings.screen != "none":
        enc = enc.select(screen_keep(settings, part, enc))
    return enc, calibration


# ------------------------------------------------------------------------------ post-processing screen
SCREENS = ("ssim", "snr", "lpips")


def screen_scores(settings: Settings, part: Partition, enc: Encoded, measure: str | None = None) -> torch.Tensor:
    """How similar each encoding is to the private sample that leads it (the published version's screen).

    ssim: SSIM of the upload and its source as [0, 1] images (the upload clamped to the valid range);
    snr: 10 log10(||x||^2 / ||x - x~||^2) in the mixing space, the upload taken as a guess of its source;
    lpips: shift-tolerant LPIPS distance (AlexNet; stlpips-pytorch ships its weights), images of 28 px and more.
    """
    measure = measure or settings.screen
    lead = part.x[enc.sources[:, 0]]
    if measure == "snr":
        from .metrics import snr_db

        return snr_db(lead, enc.x)
    if len(part.sample_shape) != 3:
        raise ValueError(f"screen {measure!r}: needs images (C, H, W); use 'snr' for feature vectors")
    lo, hi = datalib.valid_range(part.spec)
    unit = (lambda t: datalib.denormalize(torch.maximum(torch.minimum(t, hi), lo), part.spec).clamp(0, 1))
    if measure == "ssim":
        from .metrics import ssim

        return torch.cat([ssim(unit(lead[s : s + 1024]), unit(enc.x[s : s + 1024])) for s in range(0, len(lead), 1024)])
    if measure == "lpips":
        return lpips_distance(unit(lead), unit(enc.x))
    raise ValueError(f"screen: unknown {measure!r}; allowed: none, {', '.join(SCREENS)}")


def screen_keep(settings: Settings, part: Partition, enc: Encoded) -> torch.Tensor:
    """Rows that pass the screen: similarity below `screen-threshold` (LPIPS: distance at or above it)."""
    scores = screen_scores(settings, part, enc)
    keep = scores >= settings.screen_threshold if settings.screen == "lpips" else scores < settings.screen_threshold
    return keep.nonzero().squeeze(1)


def lpips_distance(a01: torch.Tensor, b01: torch.Tensor) -> torch.Tensor:
    """Per-image shift-tolerant LPIPS distance (fedsmix.metrics.st_lpips: AlexNet weights shipped with
    stlpips-pytorch, nothing downloaded); images under its minimum side are refused, naming the key."""
    from .metrics import ST_LPIPS_MIN_SIDE, st_lpips

    if min(a01.shape[-2:]) < ST_LPIPS_MIN_SIDE:
        raise ValueError(f"screen 'lpips': ST-LPIPS needs images of at least {ST_LPIPS_MIN_SIDE} px, these are "
                         f"{tuple(a01.shape[-2:])}; use screen = 'ssim' or 'snr'")
    return st_lpips(a01, b01)


def upload_inputs(x: torch.Tensor, dtype: str) -> np.ndarray:
    """Encoded inputs in the agreed upload dtype; float16 halves the bytes (relative error <= 2^-11)."""
    array = x.numpy()
    if dtype == "float32":
        return array.astype(np.float32, copy=False)
    limit = float(np.finfo(np.float16).max)
    peak = float(np.abs(array).max()) if array.size else 0.0
    if peak > limit:
        raise ValueError(
            f"upload-dtype float16: encoded values reach {peak:.3g}, beyond float16's {limit:.0f}; use float32"
        )
    return array.astype(np.float16)


@dataclass
class Upload:
    """What a party sends (`arrays`, `metrics`) and what stays with it (`encoded`: pairing, weights, noise)."""

    arrays: dict[str, np.ndarray]  # "x" (upload dtype) and "y" (float32 soft labels)
    metrics: dict[str, float | int]
    partition: Partition
    encoded: Encoded
    calibration: Calibration | None  # None for encoder=mixcon

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def prepare_upload(settings: Settings, party: int, num_parties: int,
                   encoder_state: dict[str, torch.Tensor] | None = None) -> Upload:
    """Load the partition, calibrate, encode once, and build the upload and its report.

    encoder=mixcon: the upload is h(x) of the partition under `encoder_state` (the cut-layer weights
    the server shipped), reported with its separability instead of a calibration.
    A party listed in the run's fault spec (a corruption kind) sends a dishonest copy instead;
    its secrets stay those of the honest encoding.
    """
    t0 = time.perf_counter()
    part = load_partition(settings, party, num_parties)
    enc, cal = encode_partition(settings, part, encoder_state=encoder_state)
    arrays = {"x": upload_inputs(enc.x, settings.upload_dtype), "y": enc.y.numpy().astype(np.float32, copy=False)}
    metrics: dict[str, float | int | list[int]] = {"party": party, "num-examples": len(enc),
                                                   "validation-counts": validation_counts(settings, party, num_parties)}
    if cal is None:  # mixcon: how separable the uploaded representations are
        metrics.update(separability(enc.x, part.labels, generator(settings.seed, party, "separability")))
    else:
        metrics.update({
            "tau": cal.tau,
            "alpha": cal.alpha,
            "radius": cal.radius,
            "m-f": cal.m_f,
            "D": cal.D,
            "V": cal.V,
            "c": cal.c,
            "snr-bound": cal.snr_bound,
            "calibration-variance": cal.variance,  # V_eff: V (scalar), d V (directional), d lambda_max (-eig)
            "snr-empirical": empirical_snr(part.x, enc),
            "screened-fraction": 1.0 - len(enc) / (len(part.x) * settings.encodings_per_sample),
        })
        if cal.lambda_max is not None:
            metrics["lambda-max"] = cal.lambda_max
    metrics["encode-seconds"] = time.perf_counter() - t0
    kind = corruption(settings.fault, party)  # fault injection: a dishonest party
    if kind == "replay":
        arrays, metrics = replayed_upload(settings, party, num_parties)
    elif kind:
        arrays, metrics = corrupt(kind, arrays, metrics, settings.fault_scale, generator(settings.seed, party, "fault"),
                                  settings.fault_strength)
    return Upload(arrays, metrics, part, enc, cal)


def replayed_upload(settings: Settings, party: int, num_parties: int) -> tuple[dict[str, np.ndarray], dict]:
    """Fault `replay`: what party `party` sends instead of its own upload, the upload of the party before it.

    In a simulation a party cannot read another's upload, so it re-encodes the neighbour's partition with the
    neighbour's seed: the bytes are the neighbour's honest upload exactly. In a real attack this is a colluding
    party's copy (or an eavesdropped one). Only the party id is its own; every reported statistic is copied.
    """
    source = (party - 1) % num_parties
    honest = prepare_upload(settings.replace(fault=""), source, num_parties)
    return honest.arrays, {**honest.metrics, "party": party}


def score_candidates(settings: Settings, states: dict[str, dict], validation: Partition,
                     device: str = "cpu") -> dict[str, dict[str, int]]:
    """Selection: each candidate's correct predictions on the party's own validation split (the server names
    no rows). Only these counts leave the party."""
    from .trainers import build_model, score_models

    models = {}
    for name, state in states.items():
        models[name] = build_model(name, settings, validation.sample_shape, validation.num_classes)
        models[name].load_state_dict(state)
    return score_models(models, validation.x, validation.labels, device)


def score_model(settings: Settings, state: dict[str, torch.Tensor], validation: Partition,
                device: str = "cpu") -> dict[str, int]:
    """A FedAvg/FedProx global model's correct predictions on the party's own validation split."""
    from .trainers import score_models

    model = new_classifier(settings, validation.sample_shape, validation.num_classes)
    model.load_state_dict(state)
    return score_models({"model": model}, validation.x, validation.labels, device)["model"]


def tune_local(settings: Settings, part: Partition, validation: Partition, initial: dict[str, torch.Tensor],
               device: str = "cpu", on_epoch=None) -> tuple[LocalResult, int, list[float]]:
    """Local-only training under the tuning budget (fedsmix/tuning.py): each drawn setting trained from the same
    initial model, the one with the most correct predictions on the party's own validation split kept. Returns
    it, its index among the drawn settings, and each setting's validation accuracy (none tried: no split)."""
    from . import tuning

    tried = tuning.draw(settings, "local-only") if len(validation.labels) else [{}]
    results, counts = [], {}
    for i, setting in enumerate(tried):
        results.append(train_local(tuning.apply(settings, setting), part, initial, mode="local-only",
                                   device=device, on_epoch=on_epoch if i == 0 else None))
        if len(tried) == 1:
            return results[0], 0, []
        counts[i] = score_model(settings, results[-1].state(), validation, device)
    best, accuracy = tuning.pooled({part.party: counts}, list(range(len(tried))))  # the one rule, one voter
    return results[best], best, [accuracy[i] for i in range(len(tried))]


def personalize(settings: Settings, part: Partition, name: str, state: dict, device: str = "cpu") -> torch.nn.Module:
    """The central model as the party ends up with it: BatchNorm statistics recalibrated on the party's
    own clean partition (a linear head has none and is returned as sent)."""
    from .trainers import build_model, recalibrate_batchnorm

    model = build_model(name, settings, part.sample_shape, part.num_classes)
    model.load_state_dict(state)
    return recalibrate_batchnorm(model, part.x, device)


# ------------------------------------------------------------------------------ local training
@dataclass
class LocalResult:
    model: torch.nn.Module
    report: TrainReport
    num_examples: int

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}


def train_local(
    settings: Settings,
    part: Partition,
    global_state: dict[str, torch.Tensor],
    *,
    mode: str = "federated",
    server_round: int = 0,
    proximal_mu: float = 0.0,
    device: str = "cpu",
    rows: torch.Tensor | None = None,
    trace: StepTrace | None = None,
    dp_noise_multiplier: float | None = None,
    on_epoch=None,
) -> LocalResult:
    """Local-only training (`mode="local-only"`: the central recipe, alone) or one FedAvg/FedProx
    round (`"federated"`: `local-epochs` of SGD from the global weights, plus (mu/2)||w - w_global||^2).

    A federated round carries the run's active defences (fedsmix/defences.py): their batch and private
    hooks in the training loop, then their update hooks, in registration order, each with a generator of its
    own for this party and round (pruning, `prune-ratio`, is one). `rows` replays a round on
    those samples only (the attack's victims; mixing partners still come from the whole partition), with
    `dp_noise_multiplier` the party's own DP-SGD noise level (`party_dp_sgd_noise`) rather than one solved
    for a set of len(rows) samples; `trace` records each step for the simulation's oracle;
    `on_epoch(epoch, loss)` hears each epoch (the party's progress line).
    """
    model = new_classifier(settings, part.sample_shape, part.num_classes)
    model.load_state_dict(global_state)
    split = hasattr(model, "encoder")  # encoder=mixcon's split model: the MixCon term joins the loss
    if mode == "local-only":
        cfg, purpose, reference = train_config(settings, device, split=split), ("local-only", part.party), None
    elif mode == "federated":
        cfg = train_config(settings, device, federated_client=True, proximal_mu=proximal_mu,
                           dp_noise_multiplier=dp_noise_multiplier, split=split)
        purpose = ("federated", part.party, server_round)
        reference = [p.detach().clone() for p in model.parameters()]  # the global weights, before training
    else:
        raise ValueError(f"mode: unknown {mode!r}; allowed: local-only, federated")
    targets = part.one_hot()
    if mode == "federated" and listed(settings.fault, part.party, ("label-flip",)):  # fault: permuted classes
        targets = flip_classes(targets, generator(settings.seed, part.party, "fault"))
    defences = active(settings) if mode == "federated" else []
    mix = next((d.batch for _, d in defences if d.batch), None)  # one of each at most: the settings refuse two
    private = next((d.private for _, d in defences if d.private), None)
    torch.manual_seed(settings.seed + part.party)
    report = train(model, part.x, targets, cfg, generator(settings.seed, *purpose), proximal_reference=reference,
                   rows=rows, trace=trace, on_epoch=on_epoch, mix_batch=mix, make_private=private)
    for name, defence in defences:
        if defence.update is not None:
            defence.update(settings, model, reference, generator(settings.seed, name, part.party, server_round))
    if mode == "federated" and (kind := listed(settings.fault, part.party, UPDATE_FAULTS)):  # last: what it sends
        model.load_state_dict(falsify_update(kind, model.state_dict(), global_state, settings.fault_scale))
    return LocalResult(model, report, len(part.labels) if rows is None else len(rows))


def party_dp_sgd_noise(settings: Settings, part: Partition) -> float | None:
    """The DP-SGD noise multiplier Opacus picks for this party's whole partition (None without DP-SGD)."""
    if settings.dp_sgd_epsilon <= 0:
        return None
    return dp_sgd_noise_multiplier(train_config(settings, "cpu", federated_client=True), len(part.labels))
