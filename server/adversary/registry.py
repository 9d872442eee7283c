"""The one attack factory: name -> attack, what it applies to, what it needs.

Every consumer (the in-run adversary, the tau sweep, the frontier, `fedsmix mixcon` and `fedsmix invert`)
builds attacks here, so a new attack is one class in its own file plus one `ATTACKS.add` line below (the settings
accept exactly the registered names: fedsmix/registry.py). Uploads are attacked by encoder,
federated updates by strategy (`targets`). Each attack's threat model is its class's
`threat_model` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from fedsmix.config import Settings
from fedsmix.registry import ATTACKS
from fedsmix.seeding import generator

from .base import Attack


class NotApplicable(ValueError):
    """The attack cannot run on this case (shape, missing public data); the message says why."""


@dataclass(frozen=True)
class AttackSpec:
    name: str
    targets: tuple[str, ...]  # encoders (uploads) or strategies (model updates) it attacks
    build: Callable[..., Attack]
    needs_public: bool = False  # public data in the mixing space (a prior, training pairs)
    needs_image: bool = False  # (C, H, W) samples
    options: dict = field(default_factory=dict)


def _linear(settings: Settings, **_) -> Attack:
    from .linear import LinearAttack

    return LinearAttack(steps=settings.attack_steps)


def gaussian_prior(public: torch.Tensor, mmse_rank: int = 256, prior=None, **_):
    """The attacker's Gaussian prior on its public data (`prior` when `build_attacks` already fitted it)."""
    from .mmse import GaussianPrior

    return prior if prior is not None else GaussianPrior.fit(public, rank=mmse_rank)


def _mmse(settings: Settings, public: torch.Tensor, **options) -> Attack:
    from .mmse import MMSEAttack

    return MMSEAttack(gaussian_prior(public, **options))


def _mmse_centred(settings: Settings, public: torch.Tensor, **options) -> Attack:
    from .mmse import UploadCentredMMSE

    return UploadCentredMMSE(gaussian_prior(public, **options))


def _unet(settings: Settings, public: torch.Tensor, device: str = "cpu", **_) -> Attack:
    from fedsmix.party import encoder_params

    from .unet import UNetAttack

    return UNetAttack(
        public, encoder_params(settings, 0.0), width=settings.unet_width, epochs=settings.unet_epochs,
        train_size=settings.unet_train_size, seed=settings.seed, device=device, select=settings.unet_select,
    )


def _refined(settings: Settings, public: torch.Tensor, device: str = "cpu", centred: bool = False,
             **options) -> Attack:
    """The MMSE (or mmse-centred) estimate refined by a network trained on public encodings (the U-Net's budget
    keys)."""
    from fedsmix.party import encoder_params

    from .refined import RefinedCentredMMSE, RefinedMMSE

    return (RefinedCentredMMSE if centred else RefinedMMSE)(
        public, encoder_params(settings, 0.0), gaussian_prior(public, **options), width=settings.unet_width,
        epochs=settings.unet_epochs, train_size=settings.unet_train_size, seed=settings.seed, device=device,
        select=settings.unet_select,
    )


def _abs_solve(settings: Settings, **_) -> Attack:
    from .abs_solve import AbsSolve

    return AbsSolve(iters=settings.attack_steps)


def _averaging(settings: Settings, **_) -> Attack:
    from .averaging import Averaging

    return Averaging()


def public_probe(settings: Settings, public: torch.Tensor) -> Callable:
    """For a gradient observation, the same round on public images: a partition of public images carrying the
    victims' known labels (cycled), whose first `batch_size` rows the party's own `train_local` trains on from the
    observed global model with the row's defences, as the victims' batch was (`update_case`). The attacker's data
    only; what it chooses on it (alpha_TV) then attacks the victims."""

    def make(obs):
        import numpy as np

        from fedsmix.party import Partition
        from fedsmix.space import pixel_spec

        from .cases import update_case

        count = int(obs.batch_size)
        n = min(len(public), max(4 * count, 64))
        if n < count:
            raise NotApplicable(f"a public probe batch of {count} needs {count} public images, got {len(public)}")
        labels = obs.labels.long().repeat(-(-n // len(obs.labels)))[:n]
        part = Partition(0, public[:n].float(), labels, int(obs.update[-1].shape[0]), pixel_spec(settings),
                         np.arange(n))
        return update_case(settings, part, torch.arange(count), proximal_mu=0.0, batch_size=count,
                           local_epochs=max(1, int(obs.local_steps)), global_state=obs.model.state_dict())

    return make


def _gradient(settings: Settings, public: torch.Tensor | None = None, gradient_steps: int = 1000,
              gradient_restarts: int = 2, gradient_tv: float | tuple[float, ...] = 1e-2,
              gradient_alpha_bn: float = 1e-2, gradient_labels: str = "known", realistic: bool = False,
              **_) -> Attack:
    """The appendix's strongest attacker (BN_exact: the batch's BatchNorm statistics and dropout masks known) or,
    `realistic`, BN_infer (the global model's running statistics as the prior, weight alpha_BN; dropout off).
    A grid of alpha_TV is chosen on a public probe batch (`public_probe`), or its first value without public
    images."""
    from .gradient import InvertingGradients

    probe = public_probe(settings, public) if public is not None and public.dim() == 4 else None
    return InvertingGradients(
        gradient_steps, gradient_restarts, tv=gradient_tv, seed=settings.seed, bn="infer" if realistic else "exact",
        alpha_bn=gradient_alpha_bn, labels=gradient_labels, label_inputs=public,
        dropout="replay" if realistic else "known", probe=probe,
    )


def _gradient_realistic(settings: Settings, **options) -> Attack:
    return _gradient(settings, **{**options, "realistic": True})


INVERSION_TVS = (1e-5, 1e-3, 1e-2, 3e-2, 1e-1)  # zeta grid the white-box attacker picks from on public probes


def _inversion(settings: Settings, public: torch.Tensor | None = None, device: str = "cpu",
               inversion_steps: int = 500, inversion_lr: float = 1.0, inversion_tv=INVERSION_TVS,
               inversion_probe: int = 16, **_) -> Attack:
    """White-box inversion; with public images (in h's input space) zeta is chosen on `inversion_probe` of
    them among `inversion_tv`, else the grid's first value (the paper's 1e-5) is used."""
    from .inversion import ModelInversion

    tvs = tuple(inversion_tv) if isinstance(inversion_tv, tuple | list) else (float(inversion_tv),)
    probe = None
    if len(tvs) > 1 and public is not None and public.dim() == 4:
        pick = torch.randperm(len(public), generator=generator(settings.seed, "inversion", "probe"))[:inversion_probe]
        probe = public[pick]
    return ModelInversion(steps=inversion_steps, lr=inversion_lr, tv=tvs if probe is not None else tvs[0],
                          device=device, probe=probe)


def _inversion_decoder(settings: Settings, public: torch.Tensor, device: str = "cpu", decoder_epochs: int = 50,
                       decoder_adversarial: float = 1.0, decoder_code_weight: float = 10.0, public_codes=None,
                       **_) -> Attack:
    from .inversion import DecoderInversion

    return DecoderInversion(public, epochs=decoder_epochs, adversarial=decoder_adversarial,
                            xi_code=decoder_code_weight, seed=settings.seed, device=device, public_codes=public_codes)


UPLOADS = ("singularized", "mixup", "instahide-inside", "instahide-cross", "none")
# model inversion's targets: MixCon's cut-layer uploads, and uploads of a pretrained backbone's features
# (commands/invert.py maps them back to pixels, after the linear/MMSE attacks estimated mixed ones)
REPRESENTATIONS = ("mixcon", "backbone-features")
ATTACKS.add("linear", AttackSpec("linear", ("singularized", "mixup"), _linear))
ATTACKS.add("mmse", AttackSpec("mmse", ("singularized",), _mmse, needs_public=True))
ATTACKS.add("mmse-centred", AttackSpec("mmse-centred", ("singularized",), _mmse_centred, needs_public=True))
ATTACKS.add("unet", AttackSpec("unet", ("singularized",), _unet, needs_public=True, needs_image=True))
ATTACKS.add("refined", AttackSpec("refined", ("singularized",), _refined, needs_public=True))
ATTACKS.add("refined-centred", AttackSpec("refined-centred", ("singularized",), partial(_refined, centred=True),
                                          needs_public=True))
ATTACKS.add("abs-solve", AttackSpec("abs-solve", UPLOADS, _abs_solve))
ATTACKS.add("averaging", AttackSpec("averaging", UPLOADS[:-1], _averaging))
ATTACKS.add("gradient", AttackSpec("gradient", ("fedavg", "fedprox"), _gradient))
ATTACKS.add("gradient-realistic", AttackSpec("gradient-realistic", ("fedavg", "fedprox"), _gradient_realistic))
ATTACKS.add("inversion", AttackSpec("inversion", REPRESENTATIONS, _inversion, needs_image=True))
ATTACKS.add("inversion-decoder", AttackSpec("inversion-decoder", REPRESENTATIONS, _inversion_decoder,
                                            needs_public=True, needs_image=True))


def applicable(target: str) -> tuple[str, ...]:
    """The attacks that apply to an encoder's uploads or a strategy's updates (local-only: none)."""
    return tuple(name for name, spec in ATTACKS.items() if target in spec.targets)


def build_attack(name: str, settings: Settings, *, public: torch.Tensor | None = None,
                 sample_shape: tuple[int, ...] = (), **options) -> Attack:
    """One attack from the run settings; `options` reach its builder (device, mmse_rank, gradient_*)."""
    from .linear import is_image

    if name not in ATTACKS:
        raise NotApplicable(str(ATTACKS.unknown(name)))
    spec = ATTACKS[name]
    if spec.needs_public and public is None:
        raise NotApplicable("needs public data in the mixing space")
    shape = tuple(sample_shape) or (tuple(public.shape[1:]) if public is not None else ())
    if spec.needs_image and not is_image(shape):
        raise NotApplicable(f"needs image-shaped samples (C, H, W), got {shape}")
    return spec.build(settings, public=public, **options)


def build_attacks(names, settings: Settings, public: torch.Tensor | None, sample_shape: tuple[int, ...] = (),
                  **options) -> tuple[dict[str, Attack], dict[str, str]]:
    """The named attacks, and for each one that cannot be built here, why (never silently)."""
    attacks, skipped = {}, {}
    readers = {"mmse", "mmse-centred", "refined", "refined-centred"}
    if public is not None and "prior" not in options and len(readers & set(names)) > 1:
        options["prior"] = gaussian_prior(public, **options)  # one fit for every attack that reads it
    for name in names:
        try:
            attacks[name] = build_attack(name, settings, public=public, sample_shape=sample_shape, **options)
        except NotApplicable as err:
            skipped[name] = str(err)
    return attacks, skipped
