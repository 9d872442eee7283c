"""Feature skew: every party's images pass through its own acquisition (camera, scanner, lighting).

Real federations differ in how their images were taken, not only in which classes they hold: one
hospital's scanner is darker, another's blurrier, a third's camera rotated or tinted. `feature-skew`
(a strength in [0, 1], 0 = off) gives every party one fixed acquisition, drawn from (seed, party):

| shift | at strength s, drawn uniformly per party |
|---|---|
| `brightness` | pixels x b, b in [1 - 0.7 s, 1 + 0.7 s] (s = 1: as dark as x 0.3) |
| `contrast` | distance to the image's mean grey x k, k in [1 - 0.6 s, 1 + 0.6 s] |
| `blur` | Gaussian blur, sigma in [0, s x width / 20] pixels (1.6 px at 32 px) |
| `colour` | per-channel gains (white balance) in [1 - 0.25 s, 1 + 0.25 s]; colour images only |
| `rotation` | rotation by [-30 s, 30 s] degrees, corners filled black |

applied in that order to the images in [0, 1] and clipped to [0, 1], before normalisation or the
backbone: a shifted party's images stay images of its kind, so its upload stays inside the data's
valid range (what the server's `domain` check holds it to). `feature-skew-kinds` picks the shifts.
Strength 1 is the strongest the benchmarks test: the darkest party's images are faint but readable
(docs/results/robustness.md shows them); beyond it a party's data would be a different task. The server's
test split is not shifted: accuracy is on the population's clean images.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from . import data as datalib
from .config import FEATURE_SHIFTS as KINDS
from .config import Settings
from .seeding import generator

BRIGHTNESS, CONTRAST, COLOUR, ROTATION = 0.7, 0.6, 0.25, 30.0  # the range of each shift at strength 1
BLUR = 1 / 20  # the largest blur at strength 1: sigma = width / 20 pixels


@dataclass(frozen=True)
class Acquisition:
    """One party's acquisition: the identity unless a shift is set."""

    brightness: float = 1.0
    contrast: float = 1.0
    blur: float = 0.0  # sigma in pixels
    colour: tuple[float, ...] = ()  # per-channel gains (empty: none)
    rotation: float = 0.0  # degrees

    def describe(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else [round(g, 4) for g in v]) for k, v in asdict(self).items()}

    def __call__(self, unit: torch.Tensor) -> torch.Tensor:
        """Images (N, C, H, W) in [0, 1] as this party's acquisition records them, in [0, 1]."""
        from torchvision.transforms.v2 import functional as F

        out = unit.float()
        if self.brightness != 1.0:
            out = (out * self.brightness).clamp(0, 1)
        if self.contrast != 1.0:
            grey = out.mean(dim=1, keepdim=True).mean(dim=(2, 3), keepdim=True)
            out = (grey + self.contrast * (out - grey)).clamp(0, 1)
        if self.blur > 0:
            size = 2 * math.ceil(3 * self.blur) + 1
            out = F.gaussian_blur(out, [size, size], [self.blur, self.blur])
        if self.colour and out.shape[1] == len(self.colour):
            out = (out * torch.tensor(self.colour, dtype=out.dtype).view(1, -1, 1, 1)).clamp(0, 1)
        if self.rotation != 0.0:
            out = F.rotate(out, self.rotation, interpolation=F.InterpolationMode.BILINEAR, fill=0.0)
        return out.clamp(0, 1)


def party_acquisition(strength: float, kinds: tuple[str, ...], seed: int, party: int, shape: tuple[int, ...]
                      ) -> Acquisition | None:
    """The acquisition of `party` at `strength` (None at 0: the images as stored), drawn from (seed, party);
    `shape` is one image's (C, H, W). Every shift draws its value whether or not it is used, so turning one
    shift off leaves the others' values unchanged."""
    if strength <= 0:
        return None
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"feature-skew-kinds: unknown {', '.join(unknown)}; allowed: {', '.join(KINDS)}")
    draw = torch.rand(4 + 3, generator=generator(seed, party, "acquisition"), dtype=torch.float64).tolist()
    u = [2 * d - 1 for d in draw]  # uniform in [-1, 1]
    channels, width = shape[0], shape[-1]
    return Acquisition(
        brightness=1 + BRIGHTNESS * strength * u[0] if "brightness" in kinds else 1.0,
        contrast=1 + CONTRAST * strength * u[1] if "contrast" in kinds else 1.0,
        blur=BLUR * width * strength * draw[2] if "blur" in kinds else 0.0,
        rotation=ROTATION * strength * u[3] if "rotation" in kinds else 0.0,
        colour=tuple(1 + COLOUR * strength * g for g in u[4:4 + channels]) if "colour" in kinds and channels == 3
        else (),
    )


def acquisition(settings: Settings, spec: datalib.DatasetSpec, party: int | None) -> Acquisition | None:
    """How `party` records its images under `feature-skew` (None: as stored; also for the server's splits)."""
    if party is None:
        return None
    return party_acquisition(settings.feature_skew, settings.feature_skew_kinds, settings.seed, party,
                             spec.sample_shape)


def party_unit(settings: Settings, raw: datalib.RawSplit, rows: np.ndarray | None, party: int | None) -> torch.Tensor:
    """Images in [0, 1] as `party` holds them: its acquisition applied (none for the server's splits)."""
    unit = datalib.to_unit(raw.images if rows is None else raw.images[rows], raw.spec)
    shift = acquisition(settings, raw.spec, party)
    return unit if shift is None else shift(unit)
