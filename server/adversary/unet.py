"""The paper's nonlinear attack (Table 2): a U-Net trained to undo the encoder on public data.

The attacker encodes its public images with the parties' own encoder at the parties' radius
(the radius travels in every upload's metrics), trains `fedsmix.models.UNet` to map each
encoding back to the image that leads it (L1 + 1e-4 anisotropic TV, Adam 1e-3, batch 32), then
applies it zero-shot to the private encodings. Partner selection, weights and noise directions
on the public set come from one fixed seed, so the same public pairs align across tau values.

The attacker keeps its last epoch (`unet-select = last`, the paper's protocol) or, by default (`holdout`), the epoch
whose model scores best on public images it held out of training, encoded the same way: its own data only, never
a victim. The network as initialised counts as epoch 0 (for `refined` that is the MMSE attack itself). A fit at
the paper's budget takes hours on a CPU: `fit(..., checkpoint=PATH)` saves the model, the optimiser and the shuffle
state after every epoch and continues from the last finished epoch when called again with the
same file (bit-identical to an uninterrupted fit on the same machine); a checkpoint of other settings is
refused, naming the setting. `on_epoch(epoch, attack)` runs after each epoch (a learning curve: the sweep
scores the victims there, for analysis only: nothing is chosen on it).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch.nn import functional as F

from fedsmix.encoders import EncoderParams, encode
from fedsmix.metrics import snr_db
from fedsmix.models import UNet
from fedsmix.runs import atomic_write_bytes
from fedsmix.seeding import derive_seed, generator

from .base import Attack, Observation
from .linear import _bound, is_image

HOLDOUT = 500  # public images the attacker keeps aside to choose its epoch on


def anisotropic_tv(x: torch.Tensor) -> torch.Tensor:
    return x.diff(dim=-2).abs().mean() + x.diff(dim=-1).abs().mean()


class UNetAttack(Attack):
    name = "unet"
    threat_model = "knows the encoder and radius, holds public images; learns the inverse (no W needed)"
    images_only = True

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
        select: str = "holdout",
    ):
        if select not in ("holdout", "last"):
            raise ValueError(f"{self.name}: unet-select must be 'holdout' or 'last', got {select!r}")
        if self.images_only and not is_image(tuple(public.shape[1:])):
            raise ValueError(f"{self.name}: needs image-shaped samples (C, H, W); got {tuple(public.shape[1:])}")
        self.public, self.encoder = public, encoder
        self.width, self.epochs, self.train_size = width, epochs, min(train_size, len(public))
        self.batch_size, self.lr, self.lambda_tv, self.seed, self.device = batch_size, lr, lambda_tv, seed, device
        self.select = select
        self.model: torch.nn.Module | None = None
        self.radius: float | None = None
        self.report: dict = {}

    def public_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(training subset, held-out subset) of the attacker's public images: the first `train_size` of a fixed
        shuffle, and up to HOLDOUT of the images after them; where the pool has fewer than 64 to spare, the last
        tenth of the subset is held out instead (and not trained on)."""
        order = torch.randperm(len(self.public), generator=generator(self.seed, "unet", "subset"))
        spare = len(self.public) - self.train_size
        if spare >= 64:
            held = order[self.train_size :][:HOLDOUT]
            return self.public[order[: self.train_size]].float(), self.public[held].float()
        cut = self.train_size - max(self.train_size // 10, 2)
        return self.public[order[:cut]].float(), self.public[order[cut : self.train_size]].float()

    def pairs(self, originals: torch.Tensor, radius: float, purpose: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(network inputs, targets) of `originals` encoded at `radius` (one encoding per image, led by it)."""
        params = replace(self.encoder, radius=radius, encodings_per_sample=1)
        dummy = torch.zeros(len(originals), 1)
        return self.encoded_pairs(originals, encode(originals, dummy, params, generator(self.seed, "unet", purpose)),
                                  radius)

    def encoded_pairs(self, originals: torch.Tensor, enc, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
        return enc.x, originals[enc.sources[:, 0]]

    def training_pairs(self, radius: float) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
        """(inputs, targets) of the public training subset and of the held-out subset, encoded at `radius`."""
        train, held = self.public_split()
        return self.pairs(train, radius, "encode"), self.pairs(held, radius, "holdout")

    @torch.no_grad()
    def holdout_snr(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Mean SNR (dB) of the model so far on the attacker's held-out public encodings."""
        return float(snr_db(targets, self.predict(inputs)).mean())

    def network(self, inputs: torch.Tensor) -> torch.nn.Module:
        return UNet(channels=inputs.shape[1], width=self.width)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.l1_loss(out, target) + self.lambda_tv * anisotropic_tv(out)

    def model_input(self, observation: Observation) -> torch.Tensor:
        """What the network reads of an observation: the uploaded encodings."""
        return observation.x_tilde

    def checkpoint_key(self, radius: float, inputs: torch.Tensor) -> dict:
        """What a checkpoint must match to be continued: everything that shapes the fit but its length."""
        return {"attack": self.name, "radius": float(radius), "width": self.width, "train-size": self.train_size,
                "select": self.select,
                "input-shape": list(inputs.shape[1:]), "batch-size": self.batch_size, "lr": self.lr,
                "lambda-tv": self.lambda_tv, "seed": self.seed}

    def fit(self, radius: float, checkpoint: str | Path | None = None,
            on_epoch: Callable[[int, UNetAttack], dict] | None = None,
            log: Callable[[str], None] | None = None) -> UNetAttack:
        t0 = time.perf_counter()
        (inputs, targets), held = self.training_pairs(radius)  # 100 MB at 8000 CIFAR images
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "unet", "init"))
            model = self.network(inputs).to(self.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.lr)
        shuffle = generator(self.seed, "unet", "shuffle")
        key = self.checkpoint_key(radius, inputs)
        losses, curve, held_snr, best, initial, resumed = [], [], [], None, None, 0
        if checkpoint is not None and Path(checkpoint).exists():
            state = torch.load(checkpoint, map_location=self.device, weights_only=False)
            for name, value in key.items():
                if state["key"].get(name) != value:
                    raise ValueError(f"{self.name}: checkpoint {checkpoint} was written with {name} = "
                                     f"{state['key'].get(name)!r}, this fit has {value!r}; remove it or use another")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            shuffle.set_state(state["shuffle"])
            losses, curve, resumed = list(state["losses"]), list(state["curve"]), len(state["losses"])
            held_snr, best, initial = list(state["holdout-snr"]), state["best"], state.get("initial-holdout-snr")
            if resumed > self.epochs:
                raise ValueError(f"{self.name}: checkpoint {checkpoint} has {resumed} epochs, this fit asks for "
                                 f"{self.epochs}; raise unet-epochs to continue it, or use another")
            if log:
                log(f"{self.name}: resumed at epoch {resumed}/{self.epochs} from {checkpoint}")
        self.model, self.radius = model, float(radius)
        if self.select == "holdout" and best is None:  # the network as initialised is a candidate too (epoch 0):
            model.eval()  # an untrained refiner is the MMSE attack, which training must beat to be kept
            initial = self.holdout_snr(*held)
            best = {"epoch": 0, "holdout-snr": initial,
                    "model": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        for epoch in range(resumed + 1, self.epochs + 1):
            model.train()
            order, total = torch.randperm(len(inputs), generator=shuffle).to(self.device), 0.0
            started = time.perf_counter()
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                if len(batch) < 2:  # BatchNorm needs two samples
                    continue
                out = model(inputs[batch])
                target = targets[batch]
                loss = self.loss(out, target)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.detach() * len(batch)  # no per-step sync with the GPU
            losses.append(float(total) / len(inputs))
            model.eval()
            held_snr.append(self.holdout_snr(*held))
            if self.select == "holdout" and (best is None or held_snr[-1] > best["holdout-snr"]):
                best = {"epoch": epoch, "holdout-snr": held_snr[-1],
                        "model": {k: v.detach().clone() for k, v in model.state_dict().items()}}
            if on_epoch is not None:
                curve.append({"epoch": epoch, **on_epoch(epoch, self)})
            if checkpoint is not None:
                buffer = io.BytesIO()
                torch.save({"key": key, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "shuffle": shuffle.get_state(), "losses": losses, "curve": curve,
                            "holdout-snr": held_snr, "initial-holdout-snr": initial, "best": best}, buffer)
                atomic_write_bytes(Path(checkpoint), buffer.getvalue())  # a fit killed mid-save keeps the last epoch
            if log:
                extra = "".join(f", {k} {v:.3g}" for k, v in curve[-1].items() if k != "epoch") if on_epoch else ""
                log(f"{self.name}: epoch {epoch}/{self.epochs} loss {losses[-1]:.4f}, held-out public SNR "
                    f"{held_snr[-1]:.2f} dB{extra} ({time.perf_counter() - started:.0f} s)")
        chosen = self.epochs
        if best is not None:  # the epoch the attacker's own held-out public images score best
            model.load_state_dict(best["model"])
            chosen = best["epoch"]
        model.eval()
        self.report = {
            "radius": float(radius),
            "width": self.width,
            "epochs": self.epochs,
            "train-size": len(inputs),
            "batch-size": self.batch_size,
            "train-loss": losses,
            "holdout-snr": held_snr,
            "holdout-size": len(held[0]),
            "select": self.select,
            "chosen-epoch": chosen,
            "initial-holdout-snr": initial,
            "fit-seconds": time.perf_counter() - t0,
            "device": self.device,
        }
        if resumed:
            self.report["resumed-at-epoch"] = resumed
        if curve:
            self.report["curve"] = curve
        return self

    def reconstruct(self, observation: Observation) -> torch.Tensor:
        obs = observation
        if obs.radius is None and self.model is None:
            raise ValueError(f"{self.name}: needs the radius (observation.radius) to encode its public training set")
        if obs.sources is not None and (
            obs.sources.shape[0] != obs.n_private
            or not torch.equal(obs.sources[:, 0].cpu(), torch.arange(obs.n_private))
        ):
            raise ValueError(f"{self.name}: needs one encoding per private sample, led by that sample "
                             "(sources[:, 0] = 0..n-1)")
        if self.model is None:  # callers attacking several parties fit once, at the radius they choose
            self.fit(obs.radius)
        return self.predict(self.model_input(obs), obs.lo, obs.hi)

    @torch.no_grad()
    def predict(self, inputs: torch.Tensor, lo=None, hi=None) -> torch.Tensor:
        """The network's estimates for its inputs (`model_input` of an observation), clamped to the box."""
        outputs = []
        for start in range(0, len(inputs), 256):
            out = self.model(inputs[start : start + 256].float().to(self.device)).cpu()
            outputs.append(out)
        out = torch.cat(outputs)
        lo, hi = _bound(lo, out), _bound(hi, out)
        return out.clamp(lo, hi) if lo is not None or hi is not None else out
