"""A learned attacker on top of the strongest linear one: the MMSE estimate, refined by a network.

The MMSE attack (mmse.py) is the best estimate of a private sample that depends on the upload linearly under
a Gaussian prior; real images and features are not Gaussian. This attack keeps the MMSE estimate as its
starting point and learns the rest: the attacker encodes its own public samples with the parties' encoder at
the parties' radius (as the U-Net does), computes the MMSE estimate of each from that public upload (the
attacker drew the public pairing and weights itself), and trains a network to map (encoding, MMSE estimate)
to the original, as a residual on the estimate whose last layer starts at zero (an untrained refiner is the
MMSE attack). Images: the U-Net on both stacked as channels; feature vectors: an MLP on both concatenated.
Loss: mean squared error (the score is an SNR). At attack time the estimate comes from the victims' upload with
their W (oracle or recovered pairing), exactly as the MMSE attack computes it. `refined-centred` starts from the
`mmse-centred` estimate instead (the prior's mean read off each upload: the public one for the attacker's own
encodings, the victims' for theirs).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from fedsmix.encoders import EncoderParams
from fedsmix.models import UNet

from .base import Observation
from .mmse import GaussianPrior, MMSEAttack, UploadCentredMMSE, permutation_of
from .unet import UNetAttack


class Residual(nn.Module):
    """estimate + s * body(standardised [encoding, estimate]), the body's last layer zero at the start.

    The inputs are standardised with the training inputs' own mean and spread (per coordinate for vectors, per
    channel for images; fixed buffers) and the correction is scaled by the estimates' spread s, so that the
    network and its fit do not depend on the data's units: pixels in [-2, 2], features in [0, 6] under noise of
    norm r in the thousands. An untrained refiner returns the estimate: it is the MMSE attack."""

    def __init__(self, body: nn.Module, half: int, inputs: torch.Tensor):
        super().__init__()
        self.body, self.half = body, half
        dims = [0] if inputs.dim() == 2 else [0, 2, 3]
        std, mean = torch.std_mean(inputs.float(), dim=dims, keepdim=True)
        self.register_buffer("mean", mean)
        self.register_buffer("std", std.clamp_min(1e-12))
        last = [m for m in body.modules() if isinstance(m, (nn.Linear, nn.Conv2d))][-1]
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z[:, self.half :] + self.body((z - self.mean) / self.std) * self.std[:, self.half :]


def refiner(inputs: torch.Tensor, width: int) -> nn.Module:
    """The residual network for stacked (encoding, estimate) inputs: a U-Net for images (width `width`), an MLP
    of 64 x `width` hidden units for vectors; standardised with `inputs` (the training inputs)."""
    shape = tuple(inputs.shape[1:])
    half = shape[0] // 2
    if len(shape) == 3:
        body = UNet(channels=shape[0], width=width, out_channels=half)
        return Residual(body, half, inputs)
    hidden = 64 * width
    body = nn.Sequential(nn.Linear(shape[0], hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, half))
    return Residual(body, half, inputs)


class RefinedMMSE(UNetAttack):
    name = "refined"
    threat_model = ("knows W and the radius, holds public images: the MMSE estimate, refined by a network trained on "
                    "the attacker's own encodings of public samples")
    images_only = False
    estimator = MMSEAttack  # where the refinement starts

    def __init__(self, public: torch.Tensor, encoder: EncoderParams, prior: GaussianPrior, **options):
        super().__init__(public, encoder, **options)
        self.mmse = self.estimator(prior, clamp=False)  # the network sees the unclamped estimate, as at attack time

    def encoded_pairs(self, originals: torch.Tensor, enc, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
        public_upload = Observation(x_tilde=enc.x, n_private=len(originals), weights=enc.weights,
                                    sources=enc.sources, radius=float(radius))
        return self.stacked(enc.x, self.mmse.reconstruct(public_upload)), originals

    def network(self, inputs: torch.Tensor) -> nn.Module:
        return refiner(inputs, self.width)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, target)

    def model_input(self, observation: Observation) -> torch.Tensor:
        permutation_of(observation, self.name)  # W and the radius, or an error that names this attack
        return self.stacked(observation.x_tilde, self.mmse.reconstruct(observation))

    @staticmethod
    def stacked(x_tilde: torch.Tensor, estimate: torch.Tensor) -> torch.Tensor:
        return torch.cat([x_tilde.float(), estimate.float()], dim=1)


class RefinedCentredMMSE(RefinedMMSE):
    name = "refined-centred"
    threat_model = ("knows W and the radius, holds public images: the mmse-centred estimate (prior mean read off the "
                    "upload), refined by a network trained on the attacker's own encodings of public samples")
    estimator = UploadCentredMMSE
