"""What a frontier runs: the rows (strategies) and the attack budget, from a preset's `frontier:` section.

Rows are named in one of the forms of ROW_FORMS; each is the base settings plus a few overrides,
so every row shares the partitions, seeds and training budget of the preset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedsmix.config import ATTACKS, Settings, SettingsError, resolve_preset

ROW_FORMS = (
    "local-only, fedavg, fedprox, mixup-k<K>, instahide-inside-k<K>, instahide-cross-k<K>, singularized-tau<TAU>, "
    "mixcon-l<LAMBDA>-b<BETA> (mixcon-l0: the vanilla split model)"
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

    @property
    def target(self) -> str:
        """What the attacks registry is keyed by: the encoder for uploads, else the strategy."""
        return self.overrides.get("encoder", "singularized") if self.strategy == "mixup-union" else self.strategy

    def settings(self, base: Settings, runs_dir: Path) -> Settings:
        return base.replace(strategies=(self.strategy,), run_name=self.name, runs_dir=str(runs_dir), **self.overrides)


def parse_row(name: str) -> Row:
    if name in ("local-only", "fedavg", "fedprox"):
        return Row(name, name)
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
    gradient_tv: float = Field(1e-2, ge=0)
    inversion_steps: int = Field(500, ge=1, description="model inversion (mixcon rows): SGD steps per victim")
    inversion_lr: float = Field(1.0, gt=0)
    inversion_tv: tuple[float, ...] = (1e-5, 1e-3, 1e-2, 3e-2, 1e-1)  # zeta grid, chosen on public probes
    decoder_epochs: int = Field(50, ge=1, description="the inversion decoder's epochs on the public images")
    reencoding: tuple[int, ...] = (1, 4, 16)
    #: attacks tried on every row they apply to (server/adversary/registry.py); the U-Net trains per
    #: radius on public data, so it joins only when named
    attacks: tuple[str, ...] = ("abs-solve", "averaging", "linear", "mmse", "gradient", "inversion",
                                "inversion-decoder")

    @field_validator("rows", "reencoding", "attacks", "inversion_tv", mode="before")
    @classmethod
    def _csv(cls, value: Any):
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, int | float):
            return (value,)
        return tuple(value)

    @field_validator("attacks")
    @classmethod
    def _known_attacks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in ATTACKS]
        if unknown:
            raise ValueError(f"unknown attack(s) {unknown}; allowed: {', '.join(ATTACKS)}")
        return value

    @field_validator("rows")
    @classmethod
    def _known_rows(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            parse_row(name)
        if not value:
            raise ValueError(f"give at least one row; forms: {ROW_FORMS}")
        return value


def load_plan(preset: str | None, overrides: dict[str, Any] | None = None) -> FrontierPlan:
    """The preset's `frontier:` section, then explicit overrides; errors name the key."""
    data: dict[str, Any] = {}
    if preset:
        raw = yaml.safe_load(resolve_preset(preset).read_text()) or {}
        data.update(raw.get("frontier") or {})
    data.update(overrides or {})
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
