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

PROJECT_ROOT = Path(__file__).resolve().parent.parent

STRATEGIES = ("mixup-union", "local-only", "fedavg", "fedprox", "centralized")
DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "tiny-imagenet")
ENCODERS = ("singularized", "mixup", "instahide-inside", "instahide-cross", "none", "mixcon")
BACKBONES = ("none", "resnet18", "resnet50", "efficientnet-lite0")
TRAINERS = ("auto", "mlp", "mlp-recal", "ridge", "ridge-eiv", "ridge-public")
ATTACKS = ("linear", "mmse", "unet", "abs-solve", "averaging", "gradient", "inversion", "inversion-decoder")
# fault injection (clients/faults.py): a party raises or stalls, the server's central training is
# interrupted after an epoch, or a party sends one kind of bad upload
FAULT_FAILURES = ("raise", "timeout", "interrupt")
FAULT_CORRUPTIONS = (
    "nan", "inf", "shape", "dtype", "negative-labels", "label-sum", "class-count", "empty",
    "oversized", "duplicate", "missing-key", "extra-key", "count-mismatch",
)


class SettingsError(ValueError):
    """A run setting is unknown, mistyped or out of range; the message names the key."""


def _dash(name: str) -> str:
    return name.replace("_", "-")


def _csv(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


def parse_faults(spec: str) -> dict[str, set[int]]:
    """'kind:ids;kind:ids' -> {kind: ids}: known kinds, integer ids (party ids; an epoch for interrupt)."""
    allowed = FAULT_FAILURES + FAULT_CORRUPTIONS
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
    strategies: tuple[str, ...] = ("mixup-union", "local-only")
    seed: int = 0
    # data
    dataset: Literal[DATASETS] = "digits"  # type: ignore[valid-type]
    data_dir: str = ""
    download: bool = False
    partitioner: Literal["iid", "dirichlet", "pathological"] = "dirichlet"
    dirichlet_alpha: float = Field(0.5, gt=0)
    classes_per_party: int = Field(2, ge=1)
    min_partition_size: int = Field(10, ge=1)
    test_subset: int = Field(0, ge=0, description="0 = the whole test split")
    train_subset: int = Field(0, ge=0, description="0 = the whole training split; else a fixed random subset")
    # features
    backbone: Literal[BACKBONES] = "none"  # type: ignore[valid-type]
    weights_path: str = ""
    image_size: int = Field(0, ge=0, description="0 = the backbone's default input size")
    feature_cache_dir: str = ""
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
    # issue 15: MixCon (encoder=mixcon): parties upload the cut-layer representations h(x) of a split
    # LeNet-5 trained by FedAvg with L = L_CE + mixcon-lambda * L_mixcon (docs/mixcon.md)
    mixcon_lambda: float = Field(1.0, ge=0, description="weight of the MixCon term; 0 = the vanilla split model")
    mixcon_beta: float = Field(1e-4, ge=0, description="separability term beta / dist of L_mixcon")
    mixcon_eps: float = Field(1e-6, gt=0, lt=1, description="pair distances clamped to [eps, 1/eps]")
    mixcon_pairs: int = Field(0, ge=0, description="pairs per class pair and batch; 0 = p, the smallest class count")
    mixcon_rounds: int = Field(5, ge=1, description="FedAvg rounds that train the split model before the upload")
    # central / local training
    model: Literal["auto", "mlp", "cnn", "lenet5"] = "auto"
    epochs: int = Field(30, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    checkpoint_every: int = Field(0, ge=0, description="epochs between checkpoints; 0 = off")
    resume: str = Field("", description="run directory to resume ('latest' = runs-dir/latest)")
    eval_every: int = Field(0, ge=0, description="epochs between test evaluations of the central model; 0 = at the end")
    # issue 14: the central trainer of mixup-union (fedsmix/central.py) and its honest selection
    trainer: Literal[TRAINERS] = "auto"  # type: ignore[valid-type]
    ridge_gammas: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
    validation_fraction: float = Field(0.1, ge=0, lt=1, description="upload rows per party held out for selection")
    return_model: bool = Field(True, description="send the model back; each party recalibrates it on its own data")
    # federated baselines
    rounds: int = Field(10, ge=1)
    local_epochs: int = Field(1, ge=1)
    proximal_mu: float = Field(0.01, ge=0)
    fraction_train: float = Field(1.0, gt=0, le=1)
    client_lr: float = Field(0.05, gt=0)
    # parties, reliability
    min_parties: int = Field(2, ge=2)
    reply_timeout: float = Field(600.0, gt=0)
    max_upload_mb: float = Field(512.0, gt=0)
    max_upload_samples: int = Field(1_000_000, ge=1)
    fault: str = Field("", description="fault injection, e.g. 'raise:1' or 'timeout:0,2'")
    # adversary (simulation only)
    adversary: tuple[str, ...] = ()
    attack_victims: int = Field(200, ge=1)
    attack_steps: int = Field(200, ge=1)
    unet_width: int = Field(16, ge=4)
    unet_epochs: int = Field(2, ge=1)
    unet_train_size: int = Field(2000, ge=32)
    public_size: int = Field(0, ge=0, description="attacker's public samples: the first N of Tiny-ImageNet's; 0 = all")
    # outputs and hardware
    runs_dir: str = "runs"
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @field_validator("strategies", "adversary", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> tuple[str, ...]:
        return _csv(value)

    @field_validator("ridge_gammas", mode="before")
    @classmethod
    def _split_floats(cls, value: Any) -> tuple[float, ...]:
        if isinstance(value, str):
            values = _csv(value)
        else:
            values = tuple(value) if isinstance(value, list | tuple) else (value,)
        if not values or any(float(v) <= 0 for v in values):
            raise ValueError(f"give one or more penalties > 0, got {value!r}")
        return tuple(float(v) for v in values)

    @field_validator("strategies")
    @classmethod
    def _known_strategies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name not in STRATEGIES:
                raise ValueError(f"unknown strategy {name!r}; allowed: {', '.join(STRATEGIES)}")
        if not value:
            raise ValueError(f"give at least one strategy; allowed: {', '.join(STRATEGIES)}")
        return value

    @field_validator("fault")
    @classmethod
    def _known_faults(cls, value: str) -> str:
        parse_faults(value)
        return value

    @field_validator("adversary")
    @classmethod
    def _known_attacks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name not in ATTACKS:
                raise ValueError(f"unknown attack {name!r}; allowed: {', '.join(ATTACKS)}")
        return value

    @model_validator(mode="after")
    def _radius_given_when_fixed(self) -> Settings:
        if self.radius_mode == "fixed" and self.radius <= 0 and self.encoder == "singularized":
            raise ValueError("radius-mode 'fixed' needs radius > 0")
        linear = self.trainer.startswith("ridge")
        if self.validation_fraction == 0 and (self.trainer == "auto" or (linear and len(self.ridge_gammas) > 1)):
            raise ValueError(
                f"validation-fraction 0 leaves nothing to choose trainer {self.trainer!r} (and ridge-gammas) with; "
                "set validation-fraction > 0, or one trainer with one ridge-gammas value"
            )
        if self.radius_mode == "pixel-mapped" and self.backbone == "none":
            raise ValueError("radius-mode 'pixel-mapped' needs a backbone (mixing in feature space)")
        if self.encoder in ("mixup", "instahide-inside", "instahide-cross") and self.coefficient_cap * self.mix_k < 1:
            raise ValueError(
                f"coefficient-cap {self.coefficient_cap} x mix-k {self.mix_k} < 1: the weights cannot sum to 1"
            )
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


def _validate(data: Mapping[str, Any], source: str) -> Settings:
    unknown = [k for k in data if _dash(k) not in KEYS]
    if unknown:
        raise SettingsError(
            f"{source}: unknown key(s) {', '.join(repr(k) for k in unknown)}; allowed keys: {', '.join(KEYS)}"
        )
    try:
        return Settings.model_validate({_dash(k): v for k, v in data.items()})
    except ValidationError as err:
        problems = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "settings"
            problems.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
        raise SettingsError(f"{source}: " + "; ".join(problems)) from None


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
    unknown = [k for k in run_config if k not in KEYS]
    if unknown:
        raise SettingsError(f"run config: unknown key(s) {unknown}; allowed keys: {', '.join(KEYS)}")
    return load_settings(dict(overrides), preset=str(overrides.get("preset", run_config.get("preset", ""))))


def dump_settings(settings: Settings) -> dict[str, Any]:
    return json.loads(settings.to_json())
