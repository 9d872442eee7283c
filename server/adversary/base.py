"""The shared interface of every attack (breaching-style: case, attack and analysis kept apart)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Observation:
    """What the server received from one party, plus what the threat model grants.

    x_tilde: the uploaded encodings (n, *sample_shape), as received; or representations h(x) (n, *code
      shape) when `encoder` is h and `input_shape` the private samples' shape (MixCon, backbone features).
    weights, sources: the mixing matrix W when known (strongest attacker): encoding i is
      sum_j weights[i, j] * private[sources[i, j]] (+ noise / public images); -1 marks a public slot.
    radius: the noise radius r when known (singularized mixup).
    public: the public pool (InstaHide cross-dataset), public_sources its indices per slot.
    n_private: how many private samples the attack must estimate.
    lo, hi: per-channel bounds of valid normalised values (broadcastable to a sample), or None.
    extras: anything else the case records (party, tau, masked: InstaHide's sign masks, ...).
    What the attacker brings itself (public images, a Gaussian prior fitted on them) belongs to
    the attack, not to the observation: see mmse.GaussianPrior and unet.UNetAttack.
    """

    x_tilde: torch.Tensor
    n_private: int
    weights: torch.Tensor | None = None
    sources: torch.Tensor | None = None
    radius: float | None = None
    public: torch.Tensor | None = None
    public_sources: torch.Tensor | None = None
    lo: torch.Tensor | None = None
    hi: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)
    encoder: nn.Module | None = None  # the network h that produced x_tilde = h(x) (model inversion: white box)
    input_shape: tuple[int, ...] | None = None  # shape of one private sample when x_tilde = h(x) is not one

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one private sample (what an attack reconstructs)."""
        return tuple(self.input_shape) if self.input_shape is not None else tuple(self.x_tilde.shape[1:])

    def to(self, device) -> Observation:
        """The same observation with every tensor on `device` (attacks run where the data is; an attack
        moves its own copy of the encoder)."""
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return Observation(**moved)


@dataclass
class GradientObservation:
    """One party's model update in a FedAvg/FedProx round, seen by the server.

    The weight change of one round is treated as a pseudo-gradient; labels are known (the
    appendix's realistic setting). batch_size and local_steps describe how it was produced.
    What a simulation's oracle may add for stronger threat models (the attack decides what it uses):
    `bn_stats`, the BatchNorm mean and variance of the party's batch at every BatchNorm layer
    (BN_exact), and `dropout_masks`, the masks its dropout layers drew; and, against a batch defence,
    the mixing of each training input (`mix_weights`, `mix_sources` indexing the originals to recover,
    `masked` for InstaHide's unknown signs) with the soft `targets` it trained on (the appendix's
    strongest setting: coefficients and indices known).
    """

    model: nn.Module  # the global model the party started from
    update: list[torch.Tensor]  # w_global - w_local per parameter
    labels: torch.Tensor
    sample_shape: tuple[int, ...]
    batch_size: int
    local_steps: int
    lr: float
    lo: torch.Tensor | None = None
    hi: torch.Tensor | None = None
    weight_decay: float = 0.0  # the party's SGD weight decay (the server sent it in the run settings)
    bn_stats: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    dropout_masks: list[torch.Tensor] | None = None  # the party's dropout keep masks, per layer (oracle)
    targets: torch.Tensor | None = None
    mix_weights: torch.Tensor | None = None
    mix_sources: torch.Tensor | None = None
    masked: bool = False


class Attack(ABC):
    """An attack turns an observation into estimates of the private samples."""

    name: str = "attack"
    #: one line on what the attacker is assumed to know
    threat_model: str = ""

    @abstractmethod
    def reconstruct(self, observation) -> torch.Tensor:
        """Estimates of the private samples, shaped (n_private, *sample_shape)."""
