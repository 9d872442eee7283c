"""Run settings: one typed schema for presets, Flower run config and overrides.

Precedence, lowest first: schema defaults < YAML preset < explicit overrides
(`flwr run --run-config` or keyword arguments). Every key is spelled with dashes,
as Flower spells run-config keys; Python code reads the underscored attribute.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .registry import ATTACKS, DEFENCES, STRATEGIES, TRAINERS, load_plugins

PROJECT_ROOT = Path(__file__).resolve().parent.parent

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "tiny-imagenet")
ENCODERS = ("singularized", "mixup", "instahide-inside", "instahide-cross", "none", "mixcon")
INSTAHIDE = ("instahide-inside", "instahide-cross")  # the sign-masked encoders
BACKBONES = ("none", "resnet18", "resnet50", "efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2")
# public-pca: the public pool's top principal directions; public-lda: its top discriminant directions of Tiny-ImageNet's
# 200 classes; public-lda-cifar10: of its CIFAR-10-matched classes, grouped by the CIFAR-10 class they match (at most 7)
PROJECTIONS = ("none", "public-pca", "public-lda", "public-lda-cifar10")
PROJECTION_MAX_DIMS = {"public-lda": 199, "public-lda-cifar10": 7}
# fault injection (fedsmix/faults.py): a party raises or stalls, the server's central training is
# interrupted after an epoch, a party sends one kind of malformed upload (the server's validation
# rejects it), or a well-formed but dishonest one (what plausibility checks, robust training
# and robust aggregation are for)
FAULT_FAILURES = ("raise", "timeout", "interrupt")
FAULT_CORRUPTIONS = (
    "nan", "inf", "shape", "dtype", "negative-labels", "label-sum", "class-count", "empty",
    "oversized", "duplicate", "missing-key", "extra-key", "count-mismatch", "class-counts",
)
# scale: encoded inputs (mixup-union) or the model update (FedAvg/FedProx) times fault-scale; garbage:
# random inputs with the upload's per-coordinate mean and spread; label-flip: classes permuted (in the
# upload, or in the party's FedAvg/FedProx training); replay: another party's upload re-sent;
# sign-flip: the model update negated (FedAvg/FedProx). The fault families of the upload (strength
# fault-strength): scale-report (inputs and every reported norm times fault-scale), shift (every row moved
# by fault-strength x the upload's spread, one direction), partial-garbage / label-noise (that share of the
# rows random / with permuted classes), label-target (that share of the rows of the party's commonest class
# relabelled as the next class). A consistent liar relabels its own data before anything else, so that its upload,
# its validation counts and its validation votes (and its FedAvg/FedProx training) tell the same lie:
# relabel-target (that share of its commonest class's rows as the next class), relabel-flip (classes permuted)
FAULT_DISHONEST = ("scale", "garbage", "label-flip", "replay", "sign-flip",
                   "scale-report", "shift", "partial-garbage", "label-noise", "label-target",
                   "relabel-target", "relabel-flip", "vote-invert", "vote-inflate")
FAULT_RELABELS = ("relabel-target", "relabel-flip")  # in the party's data, not in one message
FAULT_SHARES = ("partial-garbage", "label-noise", "label-target", "relabel-target")  # a share of the rows
FEATURE_SHIFTS = ("brightness", "contrast", "blur", "colour", "rotation")  # feature-skew (fedsmix/acquisition.py)
AGGREGATIONS = ("fedavg", "fedmedian", "fedtrimmedavg", "krum", "multikrum", "bulyan")
ROBUST_TRAINING = ("off", "clip", "trim")
SELECTION_SCORES = ("pooled", "trimmed")  # how the voters' counts score a candidate (fedsmix/tuning.py)
CLASS_PRIORS = ("uploads", "uniform")  # the class prior central training learns (fedsmix/trainers/union.py)


class SettingsError(ValueError):
    """A run setting is unknown, mistyped or out of range; the message names the key."""


def _dash(name: str) -> str:
    return name.replace("_", "-")


def _csv(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


def _floats(value: Any) -> tuple[float, ...]:
    """'1e-3,0.1', a list, or one number -> floats."""
    if isinstance(value, str):
        values = _csv(value)
    else:
        values = tuple(value) if isinstance(value, list | tuple) else (value,)
    return tuple(float(v) for v in values)


def parse_faults(spec: str) -> dict[str, set[int]]:
    """'kind:ids;kind:ids' -> {kind: ids}: known kinds, integer ids (party ids; an epoch for interrupt)."""
    allowed = FAULT_FAILURES + FAULT_CORRUPTIONS + FAULT_DISHONEST
    faults: dict[str, set[int]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, _, ids = (s.strip() for s in part.partition(":"))
        if kind not in allowed:
            raise ValueError(f"unknown fault kind {kind!r} in {spec!r}; allowed: {', '.join(allowed)}")
        if not all(i.strip().isdigit() for i in ids.split(",")):
            raise ValueError(f"fault {part!r}: expected {kind}:<id>[,<id>...] with integer ids")
        faults.setdefault(kind, set()).update(int(i) for i in ids.split(","))
    return faults


class Settings(BaseModel):
    """Everything one run needs. Immutable; sent to parties as JSON."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=_dash, populate_by_name=True
    )

    # experiment
    preset: str = ""
    run_name: str = ""
    # extensions: modules imported (server and parties) before any name below is checked (fedsmix/registry.py)
    plugins: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ("mixup-union", "local-only")
    seed: int = 0
    # data
    dataset: str = Field("digits", description="a registered data set, or a path to an .npz or an image folder")
    dataset_mean: tuple[float, ...] = ()  # a path data set's per-channel statistics, when a preset gives them
    dataset_std: tuple[float, ...] = ()  # (empty: inferred from its training split)
    data_dir: str = ""
    download: bool = False
    partitioner: Literal["iid", "dirichlet", "pathological", "dirichlet-equal", "size-skew"] = "dirichlet"
    dirichlet_alpha: float = Field(0.5, gt=0)
    # published-version partitions (size-skew: party `poor-party` holds rho x a rich party's rows)
    poor_party_ratio: float = Field(1.0, gt=0, le=1, description="rho = n_poor / n_rich for partitioner size-skew")
    poor_party: int = Field(0, ge=0, description="which party is data-poor under size-skew")
    classes_per_party: int = Field(2, ge=1)
    # feature skew: each party's images through its own acquisition shift (fedsmix/acquisition.py)
    feature_skew: float = Field(0.0, ge=0, le=1, description="strength of every party's acquisition shift; 0 = off")
    feature_skew_kinds: tuple[str, ...] = Field(FEATURE_SHIFTS, description="the shifts feature-skew draws per party")
    min_partition_size: int = Field(10, ge=1)
    test_subset: int = Field(0, ge=0, description="0 = the whole test split")
    train_subset: int = Field(0, ge=0, description="0 = the whole training split; else a fixed random subset")
    # features
    backbone: Literal[BACKBONES] = "none"  # type: ignore[valid-type]
    weights_path: str = ""
    image_size: int = Field(0, ge=0, description="0 = the backbone's default input size")
    feature_cache_dir: str = ""
    # a fixed linear map of the features, fitted on the public set only, that every party applies before it calibrates
    # and encodes (fedsmix/features.py `projection_basis`): the mixing space becomes its k-dimensional image
    projection: Literal[PROJECTIONS] = Field(  # type: ignore[valid-type]
        "none", description="features: none, or k public directions (principal, or discriminant of public classes)")
    projection_dims: int = Field(0, ge=0, description="k, the projected features' dimension (projection only)")
    # encoder
    encoder: Literal[ENCODERS] = "singularized"  # type: ignore[valid-type]
    tau: float = Field(1e-6, gt=0)
    alpha: float = Field(0.7, gt=0.5, lt=1.0)
    radius_mode: Literal["theorem", "pixel-mapped", "fixed"] = "theorem"
    radius: float = Field(0.0, ge=0)
    permutation: Literal["derangement", "uniform"] = "derangement"
    mix_k: int = Field(4, ge=2, description="images per encoding for mixup/InstaHide")
    coefficient_cap: float = Field(0.65, gt=0, le=1)
    private_mass_min: float = Field(0.3, ge=0, le=1)
    encodings_per_sample: int = Field(1, ge=1)
    upload_dtype: Literal["float32", "float16"] = "float32"
    # MixCon (encoder=mixcon): parties upload the cut-layer representations h(x) of a split
    # LeNet-5 trained by FedAvg with L = L_CE + mixcon-lambda * L_mixcon (docs/mixcon.md)
    mixcon_lambda: float = Field(1.0, ge=0, description="weight of the MixCon term; 0 = the vanilla split model")
    mixcon_beta: float = Field(1e-4, ge=0, description="separability term beta / dist of L_mixcon")
    mixcon_eps: float = Field(1e-6, gt=0, lt=1, description="pair distances clamped to [eps, 1/eps]")
    mixcon_pairs: int = Field(0, ge=0, description="pairs per class pair and batch; 0 = p, the smallest class count")
    mixcon_rounds: int = Field(5, ge=1, description="FedAvg rounds that train the split model before the upload")
    mixcon_clip: float = Field(1.0, ge=0, description="gradient-norm clip of the parties' MixCon training (lambda > 0; "
                                                      "beta/dist spikes diverge without it); 0 = off")
    # central / local training
    model: Literal["auto", "mlp", "cnn", "lenet5"] = "auto"
    cnn_width: int = Field(32, ge=1, description="channels of the cnn's first conv block (the second has twice as "
                                                 "many): its parameter count, so the gradient equations per image")
    epochs: int = Field(30, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    checkpoint_every: int = Field(0, ge=0, description="epochs between checkpoints; 0 = off")
    resume: str = Field("", description="run directory to resume ('latest' = runs-dir/latest)")
    eval_every: int = Field(0, ge=0, description="epochs between test evaluations of the central model; 0 = at the end")
    # the central trainer of mixup-union (fedsmix/trainers/) and its honest selection
    trainer: str = Field("auto", description="a registered trainer family (fedsmix/trainers), or 'auto': every one")
    head_penalties: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # gamma of the closed-form heads
    # one selection protocol for every strategy (fedsmix/tuning.py): each party keeps a validation split of its
    # own clean rows, never encoded, uploaded or trained on; every strategy tries `tuning-budget` settings
    validation_fraction: float = Field(0.1, ge=0, lt=1, description="each party's clean rows kept for selection "
                                                                    "(never encoded, uploaded or trained on)")
    tuning_budget: int = Field(6, ge=1, description="settings each strategy tries, chosen on the parties' validation "
                                                    "scores (the same for every strategy); 1 = the configured one")
    validation_queries: int = Field(0, ge=0, description="models a party scores per run before it refuses; 0 = "
                                                         "what the tuning budget needs")
    selection_score: Literal[SELECTION_SCORES] = Field(  # type: ignore[valid-type]
        "pooled", description="how the voters' validation counts score a candidate: pooled, or trimmed (pooled "
        "without the voter that scores it highest and the one that scores it lowest)")
    return_model: bool = Field(True, description="send the model back; each party recalibrates it on its own data")
    # rounds sized by what they need, not by the federation: a seeded sample of the parties answers them
    vote_parties: int = Field(10, ge=0, description="parties that score the trainer's candidates; 0 = every party")
    return_parties: int = Field(10, ge=0, description="parties the model goes back to (and that report the "
                                                      "recalibrated model's accuracy); 0 = every party")
    return_test_rows: int = Field(2000, ge=0, description="test rows a returned model is scored on (a seeded sample, "
                                                          "the same for every party; a simulation measurement); "
                                                          "0 = the whole test split")
    # federated baselines
    rounds: int = Field(10, ge=1)
    local_epochs: int = Field(1, ge=1)
    proximal_mu: float = Field(0.01, ge=0)
    fraction_train: float = Field(1.0, gt=0, le=1)
    client_lr: float = Field(0.05, gt=0)
    # defences inside federated training (fedsmix/defences.py; docs/defences.md)
    defences: tuple[str, ...] = Field((), description="registered defences without keys of their own, by name (the "
                                                      "built-in ones below are on when their keys say so)")
    prune_ratio: float = Field(
        0.0, ge=0, lt=1, description="fraction of each trainable tensor's round update zeroed (smallest |change|)"
    )
    batch_mix: Literal["none", "mixup", "instahide"] = "none"  # each local batch mixed (Intra-InstaHide: + signs)
    batch_mix_k: int = Field(4, ge=2, description="images mixed into each training input (cap: coefficient-cap)")
    model_norm: Literal["batch", "group"] = "batch"  # group: Opacus' ModuleValidator.fix (BatchNorm -> GroupNorm)
    dp_sgd_epsilon: float = Field(0.0, ge=0, description="per-party DP-SGD (Opacus) target epsilon; 0 = off")
    dp_sgd_max_grad_norm: float = Field(1.0, gt=0, description="DP-SGD per-sample clipping norm")
    dp_fedavg: Literal["off", "server", "client"] = "off"  # Flower's DP wrapper, fixed clipping on that side
    dp_noise_multiplier: float = Field(1.0, gt=0, description="DP-FedAvg: noise std / clipping norm")
    dp_clipping_norm: float = Field(1.0, gt=0, description="DP-FedAvg: bound on each party's update norm")
    dp_delta: float = Field(1e-5, gt=0, lt=1, description="delta of both DP guarantees (DP-FedAvg, DP-SGD)")
    # the server side of FedAvg/FedProx, one of Flower's aggregators (strategies/fedprox.py)
    aggregation: Literal[AGGREGATIONS] = "fedavg"  # type: ignore[valid-type]
    trimmed_beta: float = Field(0.2, ge=0, lt=0.5, description="fedtrimmedavg: fraction cut at each end")
    malicious_parties: int = Field(1, ge=0, description="krum, multikrum, bulyan: the f they tolerate")
    # parties, reliability
    min_parties: int = Field(2, ge=2)
    reply_timeout: float = Field(600.0, gt=0)
    start_timeout: float = Field(
        1800.0, gt=0, description="the wait for every party's first answer (its cold start: imports, data), once a run"
    )
    max_upload_mb: float = Field(512.0, gt=0)
    max_upload_samples: int = Field(1_000_000, ge=1)
    fault: str = Field("", description="fault injection, e.g. 'raise:1' or 'timeout:0,2'")
    fault_scale: float = Field(100.0, description="the factor of faults 'scale' and 'scale-report'")
    fault_strength: float = Field(
        1.0, gt=0,
        description="faults 'shift' (x the upload's spread), 'partial-garbage', 'label-noise', 'label-target', "
        "'relabel-target' (share)",
    )
    # plausibility checks of well-formed uploads (server/plausibility.py) and robust central
    # training (fedsmix/trainers/) for what they cannot decide
    plausibility: bool = Field(True, description="quarantine uploads that fail the plausibility checks")
    robust_training: Literal[ROBUST_TRAINING] = "clip"  # type: ignore[valid-type]
    robust_trim: float = Field(0.1, ge=0, lt=0.5, description="robust-training trim: batch fraction dropped")
    # clip: rows beyond 3x the union's median distance pulled in (none of an honest union's, measured); trim: a
    # trimmed loss; off
    class_prior: Literal[CLASS_PRIORS] = Field(  # type: ignore[valid-type]
        "uploads", description="the class prior mixup-union's trainers learn: the uploads' label shares, or "
        "uniform (every class's label mass rescaled alike: no party moves the prior)")
    # adversary (simulation only)
    adversary: tuple[str, ...] = ()
    attack_victims: int = Field(200, ge=1)
    attack_steps: int = Field(200, ge=1)
    unet_width: int = Field(16, ge=4)
    unet_epochs: int = Field(2, ge=1)
    unet_train_size: int = Field(2000, ge=32)
    unet_select: Literal["holdout", "last"] = Field(
        "holdout", description="the learned attacks' epoch: the best on held-out public images, or the last")
    public_size: int = Field(0, ge=0, description="attacker's public samples: the first N of Tiny-ImageNet's; 0 = all")
    # paper's experiment settings (its tables use fixed weights and ImageNet normalisation,
    # not Algorithm 1), both calibrations of its two versions, the published post-processing screen, and
    # an attacker who recovers the pairing instead of being handed it
    mixing_weights: Literal["algorithm1", "fixed"] = Field(
        "algorithm1", description="singularized: algorithm1 = w uniform, normalised, max <= alpha; fixed = w1 alpha"
    )
    normalisation: Literal["dataset", "imagenet"] = Field(
        "dataset", description="pixels: the data set's mean/std, or ImageNet's (grey images become 3 channels)"
    )
    calibration: Literal["scalar", "directional", "directional-eig"] = Field(
        "scalar", description="r^2 = V k (scalar), d V k (directional), d lambda_max k; k = alpha^2/(tau(1-alpha)^2)-1"
    )
    variance_centring: Literal["per-pixel", "global"] = Field(
        "per-pixel", description="V of Theorem 4.2: centred per coordinate, or on one global mean (the paper's code)"
    )
    screen: Literal["none", "ssim", "snr", "lpips"] = Field(
        "none", description="discard encodings too similar to their source (ssim/snr >= threshold, lpips < threshold)"
    )
    screen_threshold: float = Field(0.0, description="the screen's threshold (SSIM, SNR in dB, or LPIPS distance)")
    public_classes: Literal["all", "cifar10"] = Field(
        "all", description="attacker's public Tiny-ImageNet: all classes, or those matching CIFAR-10's"
    )
    pairing_score: Literal["gaussian", "network", "both"] = Field(
        "gaussian", description="recovered pairing: Gaussian likelihood ratio, a comparison network, or their sum"
    )
    attack_pairing: Literal["oracle", "recovered"] = Field(
        "oracle", description="threat model: pairing and weights from the simulation oracle, or recovered from uploads"
    )
    # outputs and hardware
    runs_dir: str = "runs"
    progress_interval: float = Field(
        10.0, ge=0, description="seconds between epoch lines in the progress log (0 = every epoch)"
    )
    tensorboard: bool = Field(True, description="TensorBoard event files in the run dir, from the progress events")
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @field_validator("plugins", "strategies", "adversary", "defences", "feature_skew_kinds", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> tuple[str, ...]:
        return _csv(value)

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        return value if value in DATASETS else str(dataset_path(value))

    @field_validator("dataset_mean", "dataset_std", mode="before")
    @classmethod
    def _split_statistics(cls, value: Any) -> tuple[float, ...]:
        return _floats(value)

    @field_validator("head_penalties", mode="before")
    @classmethod
    def _split_floats(cls, value: Any) -> tuple[float, ...]:
        values = _floats(value)
        if not values or any(v <= 0 for v in values):
            raise ValueError(f"give one or more penalties > 0, got {value!r}")
        return values

    @field_validator("plugins")
    @classmethod
    def _plugins_load(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        load_plugins(value)  # their entries are registered before the names that follow are checked
        return value

    @field_validator("strategies")
    @classmethod
    def _known_strategies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError(f"give at least one strategy; allowed: {', '.join(STRATEGIES)}")
        return tuple(STRATEGIES.check(name) for name in value)

    @field_validator("feature_skew_kinds")
    @classmethod
    def _known_shifts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if unknown := [k for k in value if k not in FEATURE_SHIFTS]:
            raise ValueError(f"unknown shift {', '.join(map(repr, unknown))}; allowed: {', '.join(FEATURE_SHIFTS)}")
        return value

    @field_validator("trainer")
    @classmethod
    def _known_trainer(cls, value: str) -> str:
        """A registered family, or `auto`: every one (not a family itself, so not registered)."""
        if value == "auto" or value in TRAINERS:
            return value
        raise ValueError(f"{TRAINERS.unknown(value)}, auto (every one)")

    @field_validator("defences")
    @classmethod
    def _known_defences(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if DEFENCES[name].active is not None:
                raise ValueError(f"{name!r} is on by its own keys (docs/defences.md), not by name")
        return value

    @field_validator("fault")
    @classmethod
    def _known_faults(cls, value: str) -> str:
        parse_faults(value)
        return value

    @model_validator(mode="after")
    def _fault_shares_are_shares(self) -> Settings:
        shares = [k for k in parse_faults(self.fault) if k in FAULT_SHARES] if self.fault else []
        if shares and self.fault_strength > 1:
            raise ValueError(f"fault-strength: {self.fault_strength:g} is a share of the rows for fault "
                             f"{shares[0]!r}; give a value in (0, 1]")
        return self

    @field_validator("adversary")
    @classmethod
    def _known_attacks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(ATTACKS.check(name) for name in value)

    @model_validator(mode="after")
    def _statistics_of_a_path_dataset(self) -> Settings:
        if not (self.dataset_mean or self.dataset_std):
            return self
        if self.dataset in DATASETS:
            raise ValueError(
                f"dataset-mean / dataset-std give the statistics of your own data set (a path), not of {self.dataset!r}"
            )
        if len(self.dataset_mean) != len(self.dataset_std):
            raise ValueError("dataset-mean and dataset-std: give both, one value per channel")
        if any(v <= 0 for v in self.dataset_std):
            raise ValueError(f"dataset-std: every value must be > 0, got {self.dataset_std}")
        return self

    @model_validator(mode="after")
    def _projection_of_features(self) -> Settings:
        if self.projection == "none":
            if self.projection_dims:
                raise ValueError("projection-dims: set only with a projection (projection is 'none')")
            return self
        if self.backbone == "none":
            raise ValueError(f"projection: {self.projection!r} maps backbone features; set a backbone (it is 'none')")
        if self.encoder == "mixcon":
            raise ValueError("projection: encoder 'mixcon' learns its own representation; use projection 'none'")
        most = PROJECTION_MAX_DIMS.get(self.projection)
        if not self.projection_dims or (most and self.projection_dims > most):
            limit = f" (at most {most}: its classes less one)" if most else f", got {self.projection_dims}"
            raise ValueError(f"projection-dims: give k >= 1 for projection {self.projection!r}{limit}")
        return self

    @model_validator(mode="after")
    def _poor_party_only_under_size_skew(self) -> Settings:
        if self.partitioner != "size-skew" and (self.poor_party_ratio != 1.0 or self.poor_party != 0):
            raise ValueError(
                f"poor-party-ratio / poor-party shape only partitioner 'size-skew', not {self.partitioner!r}"
            )
        return self

    @model_validator(mode="after")
    def _encoding_is_consistent(self) -> Settings:
        """The encoder's own keys: radius, screen, mixing weights, the space it mixes in."""
        if self.normalisation == "imagenet" and self.backbone != "none":
            raise ValueError("normalisation 'imagenet' applies to pixels; a backbone normalises its own inputs")
        if self.screen != "none" and self.encoder != "singularized":
            raise ValueError(f"screen {self.screen!r}: the post-processing screen applies to singularized mixup")
        if self.radius_mode == "fixed" and self.radius <= 0 and self.encoder == "singularized":
            raise ValueError("radius-mode 'fixed' needs radius > 0")
        if self.radius_mode == "pixel-mapped" and self.backbone == "none":
            raise ValueError("radius-mode 'pixel-mapped' needs a backbone (mixing in feature space)")
        if self.encoder in ("mixup", "instahide-inside", "instahide-cross") and self.coefficient_cap * self.mix_k < 1:
            raise ValueError(
                f"coefficient-cap {self.coefficient_cap} x mix-k {self.mix_k} < 1: the weights cannot sum to 1"
            )
        if self.encoder == "instahide-cross":
            if self.mix_k < 3:
                raise ValueError(
                    f"mix-k: instahide-cross mixes 2 private and mix-k - 2 >= 1 public images; got {self.mix_k}"
                )
            if self.private_mass_min > min(1.0, 2 * self.coefficient_cap) or self.private_mass_min >= 1.0:
                raise ValueError(
                    f"private-mass-min {self.private_mass_min} is unreachable with coefficient-cap "
                    f"{self.coefficient_cap} and at least one public image"
                )
        return self

    @model_validator(mode="after")
    def _attacker_can_do_what_it_is_asked(self) -> Settings:
        if self.attack_pairing == "recovered" and self.encoder not in INSTAHIDE and (
                self.encoder != "singularized" or self.encodings_per_sample != 1
                or self.permutation != "derangement" or self.screen != "none"):
            raise ValueError("attack-pairing 'recovered' recovers singularized mixup's derangement (one encoding per "
                             "sample, unscreened) or InstaHide's membership (server/adversary/pairing.py)")
        return self

    @model_validator(mode="after")
    def _model_and_trainer_fit_the_inputs(self) -> Settings:
        """The classifier and mixup-union's central trainer against what they read (images, features, h(x))."""
        if self.validation_fraction == 0 and self.tuning_budget > 1:
            raise ValueError(
                f"validation-fraction 0 leaves nothing to choose among tuning-budget {self.tuning_budget} settings "
                "with; set validation-fraction > 0, or tuning-budget 1 (each strategy runs its configured setting)"
            )
        if self.model in ("cnn", "lenet5") and self.backbone != "none":
            raise ValueError(f"model {self.model!r} needs images, and backbone {self.backbone!r} turns them into "
                             "feature vectors: use model 'mlp' (or 'auto') with a backbone")
        if self.encoder == "mixcon":
            if self.backbone != "none":
                raise ValueError(f"encoder 'mixcon' trains its own cut layer on pixels; set backbone 'none', "
                                 f"not {self.backbone!r}")
            if self.model not in ("auto", "lenet5"):
                raise ValueError(f"model: encoder 'mixcon' splits LeNet-5 at its cut layer; use 'lenet5' or 'auto', "
                                 f"not {self.model!r}")
            if self.trainer not in ("auto", "mlp"):
                raise ValueError(f"trainer: encoder 'mixcon' trains LeNet-5's head on the representations ('auto' "
                                 f"or 'mlp'), not {self.trainer!r}")
        return self

    @model_validator(mode="after")
    def _defences_can_run(self) -> Settings:
        """Each active defence's own conditions (fedsmix/defences.py), and one defence at most on each batch and
        on the optimiser (the training loop takes one of each)."""
        on = [(name, defence) for name, defence in DEFENCES.items() if defence.on(name, self)]
        for _, defence in on:
            if defence.check is not None:
                defence.check(self)
        for hook, what in (("batch", "each training batch"), ("private", "the optimiser")):
            names = [name for name, defence in on if getattr(defence, hook) is not None]
            if len(names) > 1:
                raise ValueError(f"defences {' and '.join(names)} would each take over {what}; keep one")
        return self

    # ------------------------------------------------------------------ helpers
    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, text: str) -> Settings:
        return cls.model_validate_json(text)

    def to_run_config(self) -> dict[str, Any]:
        """Flat dict in Flower's run-config value types (tuples become CSV strings)."""
        out = {}
        for key, value in self.model_dump(by_alias=True).items():
            out[key] = ",".join(str(v) for v in value) if isinstance(value, tuple | list) else value
        return out

    def replace(self, **changes: Any) -> Settings:
        data = self.model_dump()
        data.update(changes)
        return _validate(data, source="replace()")


KEYS = tuple(_dash(name) for name in Settings.model_fields)


def unknown_keys(keys, source: str) -> SettingsError | None:
    """The error for keys the schema does not have: each with its nearest known keys, or every key when none is
    near (a misspelling gets `did you mean`, not a hundred names)."""
    import difflib

    unknown = [k for k in keys if _dash(k) not in KEYS]
    if not unknown:
        return None
    hints = []
    for key in unknown:
        near = difflib.get_close_matches(_dash(key), KEYS, n=3, cutoff=0.6)
        hints.append(f"{key!r} (did you mean {' or '.join(repr(n) for n in near)}?)" if near else repr(key))
    listing = "" if all("did you mean" in h for h in hints) else f"; allowed keys: {', '.join(KEYS)}"
    return SettingsError(f"{source}: unknown key(s) {', '.join(hints)}{listing}")


def _validate(data: Mapping[str, Any], source: str) -> Settings:
    if (error := unknown_keys(data, source)) is not None:
        raise error
    try:
        return Settings.model_validate({_dash(k): v for k, v in data.items()})
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "settings"
            message = e["msg"].removeprefix("Value error, ")  # pydantic's wording for our own validators' errors
            given = repr(e.get("input"))
            problems.append(f"{key}: {message}" + ("" if given in message else f" (got {given})"))
        raise SettingsError(f"{source}: " + "; ".join(problems)) from None


def dataset_path(value: str) -> Path:
    """A data set given as a path: an .npz archive or an ImageFolder (train/ and test/ sub-folders).

    Relative paths are tried against the working directory, then the project (where presets live); the
    absolute path is kept, so every process of a run reads the same file. Only the layout is checked
    here; the contents are checked when the data set is first loaded (fedsmix/data.py)."""
    given = Path(value).expanduser()
    tried = [given] if given.is_absolute() else list(dict.fromkeys([Path.cwd() / given, PROJECT_ROOT / given]))
    path = next((p for p in tried if p.exists()), None)
    if path is None:
        raise ValueError(
            f"{value!r} is neither a registered data set ({', '.join(DATASETS)}) nor an existing path "
            f"(tried {', '.join(str(p) for p in tried)}); give an .npz file or an image folder with train/ and test/"
        )
    path = path.resolve()
    if path.is_file() and path.suffix.lower() != ".npz":
        raise ValueError(f"{path}: a data set file must be an .npz archive (x_train, y_train, x_test, y_test; or x, y)")
    if path.is_dir():
        missing = [sub for sub in ("train", "test") if not (path / sub).is_dir()]
        if missing:
            raise ValueError(
                f"{path}: an image folder needs sub-folders train/ and test/, each with one folder per class "
                f"(train/<class>/<image>); missing {', '.join(m + '/' for m in missing)}"
            )
    return path


def resolve_preset(preset: str) -> Path:
    path = Path(preset).expanduser()
    if not path.is_absolute():
        path = PROJECT_ROOT / path
    if not path.is_file():
        presets = sorted(p.relative_to(PROJECT_ROOT).as_posix() for p in (PROJECT_ROOT / "configs").glob("*.yaml"))
        raise SettingsError(f"preset: file {preset!r} not found; available presets: {', '.join(presets)}")
    return path


def read_preset(preset: str) -> dict[str, Any]:
    path = resolve_preset(preset)
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SettingsError(f"preset {preset!r}: expected a mapping of settings, got {type(data).__name__}")
    data.pop("grid", None)  # sweep axes belong to the runner, not to one run
    data.pop("frontier", None)  # so do the frontier's rows and attack budget (server/frontier/plan.py)
    data.pop("federation", None)  # simulation resources belong to the launcher (fedsmix/federation.py)
    data.pop("description", None)
    return data


def read_preset_block(preset: str, key: str) -> Any:
    """One block a preset carries for another component (`federation:` for the launcher, `grid:`)."""
    data = yaml.safe_load(resolve_preset(preset).read_text()) or {}
    return data.get(key, {}) if isinstance(data, dict) else {}


def load_settings(overrides: Mapping[str, Any] | None = None, preset: str | None = None) -> Settings:
    """The one function everybody calls: defaults < preset < overrides."""
    overrides = dict(overrides or {})
    preset = preset if preset is not None else overrides.get("preset", "")
    merged: dict[str, Any] = {}
    if preset:
        merged.update({_dash(k): v for k, v in read_preset(str(preset)).items()})
        merged["preset"] = str(preset)
    merged.update({_dash(k): v for k, v in overrides.items()})
    return _validate(merged, source=f"settings (preset {preset!r})" if preset else "settings")


def settings_from_flower(run_config: Mapping[str, Any], overrides: Mapping[str, Any]) -> Settings:
    """Flower hands us pyproject defaults fused with overrides; only overrides beat the preset."""
    if (error := unknown_keys(run_config, "run config")) is not None:
        raise error
    return load_settings(dict(overrides), preset=str(overrides.get("preset", run_config.get("preset", ""))))


def dump_settings(settings: Settings) -> dict[str, Any]:
    return json.loads(settings.to_json())
