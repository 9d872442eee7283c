"""The paper's nonlinear attack (Table 2): a U-Net trained to undo the encoder on public data.

The attacker encodes its public images with the parties' own encoder at the parties' radius
(the radius travels in every upload's metrics), trains `fedsmix.models.UNet` to map each
encoding back to the image that leads it (L1 + 1e-4 anisotropic TV, Adam 1e-3, batch 32), then
applies it zero-shot to the private encodings. Partner selection, weights and noise directions
on the public set come from one fixed seed, so the same public pairs align across tau values.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from torch.nn import functional as F

from fedsmix.encoders import EncoderParams, encode
from fedsmix.models import UNet
from fedsmix.seeding import derive_seed, generator

from .base import Attack, Observation
from .linear import _bound, is_image


def anisotropic_tv(x: torch.Tensor) -> torch.Tensor:
    return x.diff(dim=-2).abs().mean() + x.diff(dim=-1).abs().mean()


class UNetAttack(Attack):
    name = "unet"
    threat_model = "knows the encoder and radius, holds public images; learns the inverse (no W needed)"

    def __init__(
        self,
        public: torch.Tensor,
        encoder: EncoderParams,
        width: int = 48,
        epochs: int = 30,
        train_size: int = 8000,
        batch_size: int = 32,
        lr: float = 1e-3,
        lambda_tv: float = 1e-4,
        seed: int = 0,
        device: str = "cpu",
    ):
        if not is_image(tuple(public.shape[1:])):
            raise ValueError(f"unet: needs image-shaped samples (C, H, W); got {tuple(public.shape[1:])}")
        self.public, self.encoder = public, encoder
        self.width, self.epochs, self.train_size = width, epochs, min(train_size, len(public))
        self.batch_size, self.lr, self.lambda_tv, self.seed, self.device = batch_size, lr, lambda_tv, seed, device
        self.model: UNet | None = None
        self.radius: float | None = None
        self.report: dict = {}

    def training_pairs(self, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(encodings, originals) of a fixed public subset, encoded at `radius`."""
        order = torch.randperm(len(self.public), generator=generator(self.seed, "unet", "subset"))
        originals = self.public[order[: self.train_size]].float()
        params = replace(self.encoder, radius=radius, encodings_per_sample=1)
        dummy = torch.zeros(len(originals), 1)
        enc = encode(originals, dummy, params, generator(self.seed, "unet", "encode"))
        return enc.x, originals[enc.sources[:, 0]]

    def fit(self, radius: float) -> UNetAttack:
        t0 = time.perf_counter()
        inputs, targets = (t.to(self.device) for t in self.training_pairs(radius))  # 100 MB at 8000 CIFAR images
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "unet", "init"))
            model = UNet(channels=inputs.shape[1], width=self.width).to(self.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.lr)
        shuffle = generator(self.seed, "unet", "shuffle")
        losses = []
        model.train()
        for _ in range(self.epochs):
            order, total = torch.randperm(len(inputs), generator=shuffle).to(self.device), 0.0
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                if len(batch) < 2:  # BatchNorm needs two samples
                    continue
                out = model(inputs[batch])
                target = targets[batch]
                loss = F.l1_loss(out, target) + self.lambda_tv * anisotropic_tv(out)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.detach() * len(batch)  # no per-step sync with the GPU
            losses.append(float(total) / len(inputs))
        model.eval()
        self.model, self.radius = model, float(radius)
        self.report = {
            "radius": float(radius),
            "width": self.width,
            "epochs": self.epochs,
            "train-size": len(inputs),
            "batch-size": self.batch_size,
            "train-loss": losses,
            "fit-seconds": time.perf_counter() - t0,
            "device": self.device,
        }
        return self

    def reconstruct(self, observation: Observation) -> torch.Tensor:
        obs = observation
        if obs.radius is None and self.model is None:
            raise ValueError("unet: needs the radius (observation.radius) to encode its public training set")
        if self.model is None:  # callers attacking several parties fit once, at the radius they choose
            self.fit(obs.radius)
        if obs.sources is not None and (
            obs.sources.shape[0] != obs.n_private
            or not torch.equal(obs.sources[:, 0].cpu(), torch.arange(obs.n_private))
        ):
            raise ValueError("unet: needs one encoding per private sample, led by that sample (sources[:, 0] = 0..n-1)")
        return self.predict(obs.x_tilde, obs.lo, obs.hi)

    @torch.no_grad()
    def predict(self, x_tilde: torch.Tensor, lo=None, hi=None) -> torch.Tensor:
        outputs = []
        for start in range(0, len(x_tilde), 256):
            out = self.model(x_tilde[start : start + 256].float().to(self.device)).cpu()
            outputs.append(out)
        out = torch.cat(outputs)
        lo, hi = _bound(lo, out), _bound(hi, out)
        return out.clamp(lo, hi) if lo is not None or hi is not None else out
