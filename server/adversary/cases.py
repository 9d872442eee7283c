"""Cases: what the server saw, plus what the threat model grants, as an `Observation`.

Also the attacker's own knowledge: public images in the victims' space (for the U-Net, the
Gaussian prior and the trivial guess) and the attacks themselves, built from the run settings.
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
                **extras) -> Observation:
    """The strongest threat model of the paper: W (weights and pairing) and r known.

    x_tilde defaults to the encoder's output; the ServerApp passes the stored upload instead.
    spec gives the valid pixel range; None for feature vectors (no box to clamp to).
    """
    x = enc.x if x_tilde is None else x_tilde
    lo, hi = datalib.valid_range(spec) if spec is not None else (None, None)
    return Observation(
        x_tilde=x.float(), n_private=int(enc.sources.max()) + 1, weights=enc.weights, sources=enc.sources,
        radius=float(radius), public_sources=enc.public_sources, lo=lo, hi=hi,
        extras={"sign_masked": enc.signs is not None, **extras},
    )


def public_samples(settings: Settings, spec: datalib.DatasetSpec) -> torch.Tensor | None:
    """Tiny-ImageNet in the victims' shape and normalisation; None where mixing is in feature space."""
    if settings.backbone != "none":
        return None
    return load_public_pool(settings, spec)


def build_attacks(names, settings: Settings, public: torch.Tensor | None, device: str, mmse_rank: int = 256,
                  sample_shape: tuple[int, ...] = ()) -> tuple[dict[str, Attack], dict[str, str]]:
    """The configured attacks, and for each one that cannot run here, why (never silently)."""
    from .linear import LinearAttack, is_image
    from .mmse import GaussianPrior, MMSEAttack
    from .unet import UNetAttack

    attacks, skipped = {}, {}
    for name in names:
        if name in NEEDS_PUBLIC and public is None:
            skipped[name] = "needs public data in the mixing space (pixels); none for backbone features yet"
        elif name == "linear":
            attacks[name] = LinearAttack(steps=settings.attack_steps)
        elif name == "mmse":
            attacks[name] = MMSEAttack(GaussianPrior.fit(public, rank=mmse_rank))
        elif name == "unet":
            if not is_image(sample_shape or tuple(public.shape[1:])):
                skipped[name] = f"needs image-shaped samples, got {sample_shape}"
                continue
            attacks[name] = UNetAttack(
                public, encoder_params(settings, 0.0), width=settings.unet_width, epochs=settings.unet_epochs,
                train_size=settings.unet_train_size, seed=settings.seed, device=device,
            )
        else:
            skipped[name] = "not implemented by this adversary (see server/adversary/)"
    return attacks, skipped
