"""What a frontier runs: the rows (strategies) and the attack budget, from a preset's `frontier:` section.

Rows are named in one of the forms of ROW_FORMS; each is the base settings plus a few overrides,
so every row shares the partitions, seeds and training budget of the preset. A FedAvg/FedProx row may
carry defences, each a dash-joined suffix, any combination:

    fedavg-prune0.9            gradient pruning of the round's update, p = 0.9
    fedavg-mixup-k4            MixUp of every local batch, k = 4
    fedavg-instahide-k4        Intra-InstaHide of every local batch, k = 4
    fedavg-instahide-k4-prune0.9
    fedavg-dp-eps8             DP-FedAvg, server-side clipping, noise multiplier solved for epsilon 8
    fedavg-dpclient-eps8       DP-FedAvg, client-side clipping (Flower's fixedclipping_mod)
    fedavg-dpsgd-eps8          per-party DP-SGD (Opacus), epsilon 8
    fedavg-groupnorm           the GroupNorm model the DP rows train, without DP (what GroupNorm costs)

Rows of the feature-space pipeline (the paper's Table 4: a public backbone's features, a head on top) sit
on the same partitions: `local-only`, `fedavg`, `fedprox` and `singularized-tau<TAU>` followed by
`-features` run with the preset's `frontier.features` settings (backbone, image size, trainer, ...);
`singularized-pixelmapped-tau<TAU>` is the paper code's radius (`radius-mode: pixel-mapped`), which only
exists there. Their leakage is measured in feature space, a different unit from the pixel rows' (the
report keeps a `space` column and never ranks rows of different spaces against each other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedsmix.config import Settings, SettingsError, resolve_preset
from fedsmix.registry import ATTACKS, STRATEGIES

ROW_FORMS = (
    "local-only, fedavg, fedprox, mixup-k<K>, instahide-inside-k<K>, instahide-cross-k<K>, singularized-tau<TAU>, "
    "mixcon-l<LAMBDA>-b<BETA> (mixcon-l0: the vanilla split model), "
    "fedavg|fedprox followed by any of -prune<P>, -mixup-k<K>, -instahide-k<K>, -dp-eps<E>, -dpclient-eps<E>, "
    "-dpsgd-eps<E>, -groupnorm; in feature space (frontier.features): local-only-features, fedavg-features, "
    "fedprox-features, singularized-tau<TAU>-features, singularized-pixelmapped-tau<TAU>"
)
FEATURES = "-features"
DEFENCE = re.compile(
    r"-(?:prune(?P<prune>[0-9.]+)|(?P<mix>mixup|instahide)-k(?P<k>\d+)|(?P<dp>dp|dpclient|dpsgd)-eps(?P<eps>[0-9.]+)"
    r"|(?P<groupnorm>groupnorm))(?=-|$)"
)
NUMBER = r"(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
DEFAULT_ROWS = (
    "local-only",
    "fedavg",
    "fedprox",
    "mixup-k2",
    "instahide-inside-k4",
    "instahide-cross-k4",
    "singularized-tau1e-2",
    "singularized-tau1e-4",
    "singularized-tau1e-6",
)


@dataclass(frozen=True)
class Row:
    name: str
    strategy: str  # the fedsmix strategy whose run gives accuracy, bytes and wall time
    overrides: dict = field(default_factory=dict)
    dp_fedavg_epsilon: float = 0.0  # a DP-FedAvg row's target: its noise multiplier follows from the run's size
    features: bool = False  # a row of the feature-space pipeline: the plan's `features` settings apply

    @property
    def target(self) -> str:
        """What the attacks registry is keyed by: the encoder for uploads, else the strategy."""
        return self.overrides.get("encoder", "singularized") if STRATEGIES[self.strategy].uploads else self.strategy

    @property
    def defended(self) -> bool:
        return self.strategy in ("fedavg", "fedprox") and bool(self.overrides)

    @property
    def space(self) -> str:
        return "features" if self.features else "pixels"

    def settings(self, base: Settings, runs_dir: Path, parties: int = 0, features: dict | None = None) -> Settings:
        """The preset plus this row's overrides (and, for a feature-space row, the plan's `features` settings)."""
        extra: dict[str, Any] = {}
        if self.features:
            if not features or features.get("backbone", "none") == "none":
                raise SettingsError(f"frontier row {self.name}: a feature-space row needs frontier.features with "
                                    "a backbone (e.g. features: {backbone: efficientnet-lite0, image-size: 64})")
            extra = {k.replace("-", "_"): v for k, v in features.items()}
        settings = base.replace(strategies=(self.strategy,), run_name=self.name, runs_dir=str(runs_dir),
                                **{**extra, **self.overrides})
        if self.dp_fedavg_epsilon > 0:
            from strategies.dp_fedavg import noise_for_epsilon, sampled_per_round

            if parties < 2:
                raise SettingsError(f"frontier row {self.name}: DP-FedAvg needs the number of parties")
            sampled = sampled_per_round(settings, parties)
            noise = noise_for_epsilon(self.dp_fedavg_epsilon, settings.rounds, sampled, parties, settings.dp_delta)
            settings = settings.replace(dp_noise_multiplier=noise)
        return settings


def parse_defences(name: str, base: str) -> Row:
    """`base` (fedavg or fedprox) with the defences its suffixes name, each at most once."""
    overrides: dict[str, Any] = {}
    epsilon, position, rest = 0.0, len(base), name[len(base):]
    seen: set[str] = set()
    while position < len(name):
        match = DEFENCE.match(name, position)
        if match is None:
            raise SettingsError(f"frontier.rows: cannot read {name[position:]!r} in row {name!r}; forms: {ROW_FORMS}")
        kind = next(k for k in ("prune", "mix", "dp", "groupnorm") if match.group(k))
        if kind in seen:
            raise SettingsError(f"frontier.rows: row {name!r} names two {kind} defences")
        seen.add(kind)
        try:
            if kind == "prune":
                overrides["prune_ratio"] = float(match.group("prune"))
            elif kind == "mix":
                overrides.update(batch_mix=match.group("mix"), batch_mix_k=int(match.group("k")))
            elif kind == "groupnorm":
                overrides["model_norm"] = "group"
            else:
                value = float(match.group("eps"))
                if value <= 0:
                    raise ValueError
                overrides["model_norm"] = "group"
                if match.group("dp") == "dpsgd":
                    overrides["dp_sgd_epsilon"] = value
                else:
                    overrides["dp_fedavg"] = "client" if match.group("dp") == "dpclient" else "server"
                    epsilon = value
        except ValueError:
            raise SettingsError(f"frontier.rows: bad number in {match.group(0)!r} of row {name!r}") from None
        position = match.end()
    if not rest:
        return Row(name, base)
    return Row(name, base, overrides, epsilon)


def parse_row(name: str) -> Row:
    if match := re.fullmatch(r"singularized-pixelmapped-tau([0-9.eE+-]+)", name):
        row = parse_row(f"singularized-tau{match.group(1)}{FEATURES}")
        return Row(name, row.strategy, {**row.overrides, "radius_mode": "pixel-mapped"}, features=True)
    if name.endswith(FEATURES):
        row = parse_row(name[: -len(FEATURES)])
        if row.defended or row.features or row.overrides.get("encoder", "singularized") != "singularized":
            raise SettingsError(f"frontier.rows: {name!r}: only local-only, fedavg, fedprox and singularized-tau<TAU> "
                                f"have a feature-space row; forms: {ROW_FORMS}")
        return Row(name, row.strategy, row.overrides, features=True)
    if name in ("local-only", "fedavg", "fedprox"):
        return Row(name, name)
    for base in ("fedavg", "fedprox"):
        if name.startswith(base + "-"):
            row = parse_defences(name, base)
            try:
                Settings().replace(**row.overrides)  # a bad value fails here, naming its key
            except SettingsError as err:
                raise SettingsError(f"frontier.rows: row {name!r}: {err}") from None
            return row
    if match := re.fullmatch(r"(mixup|instahide-inside|instahide-cross)-k(\d+)", name):
        return Row(name, "mixup-union", {"encoder": match.group(1), "mix_k": int(match.group(2))})
    if match := re.fullmatch(r"singularized-tau([0-9.eE+-]+)", name):
        try:
            tau = float(match.group(1))
        except ValueError:
            tau = -1.0
        if tau > 0:
            return Row(name, "mixup-union", {"encoder": "singularized", "tau": tau})
    if match := re.fullmatch(rf"mixcon-l{NUMBER}(?:-b{NUMBER})?", name):
        lam, beta = float(match.group(1)), float(match.group(2)) if match.group(2) else None
        if lam == 0 or beta is not None:  # the vanilla split model needs no beta; MixCon does
            return Row(name, "mixup-union", {"encoder": "mixcon", "model": "lenet5", "mixcon_lambda": lam,
                                             **({"mixcon_beta": beta} if beta is not None else {})})
    raise SettingsError(f"frontier.rows: unknown row {name!r}; forms: {ROW_FORMS}")


class FrontierPlan(BaseModel):
    """The preset's `frontier:` section (dashed keys, like every setting)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=lambda n: n.replace("_", "-"), populate_by_name=True
    )

    parties: int = Field(5, ge=2)
    victim_party: int = Field(0, ge=0)
    rows: tuple[str, ...] = DEFAULT_ROWS
    gradient_batch_size: int = Field(1, ge=1, description="images in the victim's attacked update")
    gradient_local_epochs: int = Field(1, ge=1, description="local epochs over those images: local steps")
    gradient_steps: int = Field(1000, ge=8)
    gradient_restarts: int = Field(2, ge=1)
    gradient_tv: tuple[float, ...] = Field(
        (1e-2, 1e-1), description="alpha_TV, or a grid the attacker chooses on a public probe batch (the appendix: "
                                  "1e-2 for one image, its code 0.1 for batches)")
    gradient_alpha_bn: float = Field(1e-2, ge=0, description="weight of the BatchNorm regulariser (alpha_BN)")
    gradient_labels: Literal["known", "restored"] = "known"
    gradient_round: Literal["first", "last"] = Field(
        "first", description="attack round 1's update (the initial model) or one from the row's trained global model"
    )
    gradient_study: tuple[int, ...] = Field((), description="batch sizes of the per-defence gradient study (1,16,32)")
    gradient_study_victims: int = Field(
        0, ge=0, description="victims per study batch size: the first max(B, this) (0 = all attack-victims)"
    )
    inversion_steps: int = Field(500, ge=1, description="model inversion (mixcon rows): SGD steps per victim")
    inversion_lr: float = Field(1.0, gt=0)
    inversion_tv: tuple[float, ...] = (1e-5, 1e-3, 1e-2, 3e-2, 1e-1)  # zeta grid, chosen on public probes
    decoder_epochs: int = Field(50, ge=1, description="the inversion decoder's epochs on the public images")
    reencoding: tuple[int, ...] = (1, 4, 16)
    features: dict[str, Any] = Field(
        default_factory=dict, description="settings of the feature-space rows (`-features`, `-pixelmapped-`)"
    )
    #: attacks tried on every row they apply to (server/adversary/registry.py); the U-Net trains per
    #: radius on public data, so it joins only when named
    attacks: tuple[str, ...] = ("abs-solve", "averaging", "linear", "mmse", "mmse-centred", "gradient",
                                "gradient-realistic", "inversion", "inversion-decoder")

    @field_validator("rows", "reencoding", "attacks", "gradient_study", "inversion_tv", "gradient_tv", mode="before")
    @classmethod
    def _csv(cls, value: Any):
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, int | float):
            return (value,)
        return tuple(value)

    @field_validator("gradient_tv")
    @classmethod
    def _tv_grid(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or min(value) < 0:
            raise ValueError("give one or more alpha_TV values >= 0")
        return value

    @field_validator("attacks")
    @classmethod
    def _known_attacks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(ATTACKS.check(name) for name in value)

    @field_validator("rows")
    @classmethod
    def _known_rows(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            parse_row(name)
        if not value:
            raise ValueError(f"give at least one row; forms: {ROW_FORMS}")
        return value


def load_plan(preset: str | None, overrides: dict[str, Any] | None = None) -> FrontierPlan:
    """The preset's `frontier:` section, then explicit overrides (`features.<key>` sets one feature-space
    setting); errors name the key."""
    data: dict[str, Any] = {}
    if preset:
        raw = yaml.safe_load(resolve_preset(preset).read_text()) or {}
        data.update(raw.get("frontier") or {})
    for key, value in (overrides or {}).items():
        if key.startswith("features."):  # one feature-space setting: merged into the preset's section
            data["features"] = {**(data.get("features") or {}), key.split(".", 1)[1]: value}
        else:
            data[key] = value
    try:
        plan = FrontierPlan.model_validate({k.replace("_", "-"): v for k, v in data.items()})
    except ValidationError as err:
        problems = [
            f"frontier.{'.'.join(str(p) for p in e['loc'])}: {e['msg']} (got {e.get('input')!r})" for e in err.errors()
        ]
        raise SettingsError("; ".join(problems)) from None
    if plan.victim_party >= plan.parties:
        raise SettingsError(f"frontier.victim-party: {plan.victim_party} is outside 0..{plan.parties - 1}")
    return plan
