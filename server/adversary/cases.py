"""Cases: what the server saw, plus what the threat model grants, as an `Observation`.

Also the attacker's own knowledge: public data in the victims' space, pixels or backbone
features (for the U-Net, the Gaussian prior and the trivial guess), the valid box, and the
attacks themselves, built from the run settings.
"""

from __future__ import annotations

import torch

from fedsmix import data as datalib
from fedsmix.config import Settings
from fedsmix.encoders import Encoded
from fedsmix.pipeline import encoder_params, load_public_pool

from .base import Attack, Observation

NEEDS_PUBLIC = ("mmse", "unet")


def observation(enc: Encoded, radius: float, spec: datalib.DatasetSpec | None, x_tilde: torch.Tensor | None = None,
                *, bounds: tuple[torch.Tensor | None, torch.Tensor | None] | None = None, **extras) -> Observation:
    """The strongest threat model of the paper: W (weights and pairing) and r known.

    x_tilde defaults to the encoder's output; the ServerApp passes the stored upload instead.
    The valid box is `bounds` when given (see `valid_bounds`), else the pixel range of `spec`,
    else none.
    """
    x = enc.x if x_tilde is None else x_tilde
    if bounds is None:
        bounds = datalib.valid_range(spec) if spec is not None else (None, None)
    lo, hi = bounds
    return Observation(
        x_tilde=x.float(), n_private=int(enc.sources.max()) + 1, weights=enc.weights, sources=enc.sources,
        radius=float(radius), public_sources=enc.public_sources, lo=lo, hi=hi,
        extras={"masked": enc.signs is not None, **extras},
    )


def valid_bounds(settings: Settings, spec: datalib.DatasetSpec) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The box every private sample lies in where the mixing happens: normalised images of 0..1, or
    the backbone's activation range for features (EfficientNet-Lite0: [0, 6]; ResNets: >= 0)."""
    if settings.backbone == "none":
        return datalib.valid_range(spec)
    from fedsmix.features import feature_range

    return feature_range(settings)


def public_samples(settings: Settings, spec: datalib.DatasetSpec) -> torch.Tensor:
    """The attacker's public data (Tiny-ImageNet) in the victims' space: pixels in their shape and
    normalisation, or features of the same backbone, input size and weights. `public-size` > 0
    keeps that many samples."""
    if settings.backbone != "none":
        from fedsmix.features import public_features

        return public_features(settings, settings.public_size)
    pool = load_public_pool(settings, spec)
    return pool[: settings.public_size] if settings.public_size else pool


def build_attacks(names, settings: Settings, public: torch.Tensor | None, device: str, mmse_rank: int = 256,
                  sample_shape: tuple[int, ...] = ()) -> tuple[dict[str, Attack], dict[str, str]]:
    """The configured attacks, and for each one that cannot run here, why (never silently)."""
    from .linear import LinearAttack, is_image
    from .mmse import GaussianPrior, MMSEAttack
    from .unet import UNetAttack

    attacks, skipped = {}, {}
    for name in names:
        if name in NEEDS_PUBLIC and public is None:
            skipped[name] = "needs public data in the mixing space"
        elif name == "linear":
            attacks[name] = LinearAttack(steps=settings.attack_steps)
        elif name == "mmse":
            attacks[name] = MMSEAttack(GaussianPrior.fit(public, rank=mmse_rank))
        elif name == "unet":
            if not is_image(sample_shape or tuple(public.shape[1:])):
                skipped[name] = f"needs image-shaped samples (C, H, W), got {sample_shape}"
                continue
            attacks[name] = UNetAttack(
                public, encoder_params(settings, 0.0), width=settings.unet_width, epochs=settings.unet_epochs,
                train_size=settings.unet_train_size, seed=settings.seed, device=device,
            )
        else:
            skipped[name] = "not implemented by this adversary (see server/adversary/)"
    return attacks, skipped
