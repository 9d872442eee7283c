"""Model inversion: from uploaded representations z = h(x) back to the private images (MixCon's attacker).

`ModelInversion` is the white-box attack of MixCon's section 4.1 / appendix C: knowing h's weights, find

    x* = argmin_s ||h(s) - z||_2 + zeta * TV(s),   TV(s) = sum_ij ((s_i+1,j - s_ij)^2 + (s_i,j+1 - s_ij)^2)^(1/2)

by SGD with the paper's settings (appendix C.2: weight decay 1e-4, 500 iterations) except the step size
and zeta: the paper's lr 10 oscillates on our normalised pixels (the norm's gradient does not shrink near
the optimum; mean SSIM 0.21 on a vanilla LeNet-5 against 0.36 at lr 1), so the default is lr 1 with a
cosine decay (lr 0.3-3 all score within 0.02; docs/results/mixcon.md). The paper grid-searched zeta (1e-5 for
MNIST in its scale); here the attacker does the same without private data: given several zetas and a few
public probe images, it inverts h(probe) at each and keeps the zeta whose reconstructions of the probe
score best (`choose_tv`), once per h.
Appendix C.1's synthetic variant uses ||h(s) - z||_1 without TV at lr 0.01 (`norm="l1"`). Every victim
is solved on its own (the batch objective is a sum of per-victim terms), from two data-free starts
(zero in the normalised space, i.e. the data's mean value, and the public mean sample; the paper does not
say where it starts), keeping per victim the end point with the lower objective; unless `box=False` it
projects onto the valid pixel range after each step, as the project's other attacks do (the paper's
optimisation is unconstrained).

`DecoderInversion` is the learned variant of MixCon's appendix D.2: a generator G maps codes back to
images, trained on the attacker's public images x_p and their codes h(x_p) with

    L_G = BCE(D(G(z)), 1) + xi ||x - G(z)||_1 + xi ||z - h(G(z))||_1,   L_D = BCE(D(x), 1) + BCE(D(G(z)), 0)

(eq. 7, xi = 10, Adam lr 0.002, batch 128, 50 epochs), then applied to the uploads zero-shot. The
adversarial term can be switched off (`adversarial=0`), and the consistency term too (`xi_code=0`):
it backpropagates through h, which costs most of the training time for a deep backbone.
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn
from torch.nn import functional as F

from fedsmix.seeding import derive_seed, generator

from .base import Attack, Observation
from .linear import _bound


def isotropic_tv(s: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Per sample: sum over pixels and channels of ((s_i+1,j - s_ij)^2 + (s_i,j+1 - s_ij)^2)^(1/2)."""
    dh = s[..., 1:, :-1] - s[..., :-1, :-1]
    dw = s[..., :-1, 1:] - s[..., :-1, :-1]
    return (dh.pow(2) + dw.pow(2) + eps).sqrt().flatten(1).sum(dim=1)


def frozen(encoder: nn.Module, device) -> nn.Module:
    """The attacker's own copy of h: eval mode, no gradients to its weights."""
    h = copy.deepcopy(encoder).float().to(device).eval()
    for p in h.parameters():
        p.requires_grad_(False)
    return h


def check_white_box(obs: Observation, attack: str) -> tuple[int, ...]:
    if obs.encoder is None:
        raise ValueError(f"{attack}: needs the network h that produced the upload (observation.encoder)")
    if obs.input_shape is None:
        raise ValueError(f"{attack}: needs the private samples' shape (observation.input_shape)")
    if len(obs.x_tilde) != obs.n_private:
        raise ValueError(f"{attack}: needs one representation per private sample, got {len(obs.x_tilde)} for "
                         f"{obs.n_private}")
    return tuple(obs.input_shape)


def start_points(obs: Observation, shape: tuple[int, ...], device) -> list[torch.Tensor]:
    """Data-free starting images: zero in the normalised space (the private data's mean value per channel,
    which the normalisation constants of the pipeline give away) and, when the case carries one, the
    public mean sample."""
    starts = [torch.zeros(shape, device=device)]
    prior = obs.extras.get("prior_mean")
    if prior is not None and tuple(prior.shape) == tuple(shape):
        starts.append(prior.to(device, torch.float32))
    return starts


class ModelInversion(Attack):
    name = "inversion"
    threat_model = "white box: knows the cut-layer network h (its weights) and the uploaded h(x); no training data"

    def __init__(self, steps: int = 500, lr: float = 1.0, weight_decay: float = 1e-4,
                 tv: float | tuple[float, ...] = 1e-5, norm: str = "l2", box: bool = True, cosine: bool = True,
                 batch_size: int = 128, device: str = "cpu", probe: torch.Tensor | None = None,
                 restarts: bool = True):
        if norm not in ("l1", "l2"):
            raise ValueError(f"inversion: norm must be 'l1' or 'l2', got {norm!r}")
        self.tvs = tuple(tv) if isinstance(tv, tuple | list) else (float(tv),)
        if len(self.tvs) > 1 and probe is None:
            raise ValueError("inversion: choosing zeta among several values needs public probe images (probe=...)")
        self.steps, self.lr, self.weight_decay, self.tv = steps, lr, weight_decay, self.tvs[0]
        self.norm, self.box, self.cosine, self.batch_size, self.device = norm, box, cosine, batch_size, device
        self.probe, self.restarts = probe, restarts
        self.last_losses: list[float] = []
        self.start_wins: list[int] = []  # victims whose best end point came from each start
        self.selection: dict = {}  # zeta -> the probe's mean SSIM, for the h it was chosen for
        self.selected_for: nn.Module | None = None

    def objective(self, h: nn.Module, s: torch.Tensor, z: torch.Tensor, tv: float | None = None) -> torch.Tensor:
        """Per victim: ||h(s) - z|| (+ zeta TV(s) for images)."""
        tv = self.tv if tv is None else tv
        residual = (h(s).float() - z).flatten(1)
        value = residual.abs().sum(dim=1) if self.norm == "l1" else residual.pow(2).sum(dim=1).add(1e-12).sqrt()
        if tv > 0 and s.dim() == 4:
            value = value + tv * isotropic_tv(s)
        return value

    def choose_tv(self, obs: Observation, h: nn.Module, shape: tuple[int, ...]) -> float:
        """The attacker's own model selection, without private data: invert h(probe) of its public images at
        every zeta and keep the one whose reconstructions score the best mean SSIM (images mapped to [0, 1]
        through the valid box)."""
        from fedsmix.metrics import ssim

        probe = self.probe.to(self.device, torch.float32)
        with torch.no_grad():
            codes = h(probe).float()
        lo, hi = (_bound(b, probe) for b in (obs.lo, obs.hi))
        unit = ((lambda t: (t - lo) / (hi - lo)) if lo is not None and hi is not None
                else (lambda t: (t - probe.min()) / (probe.max() - probe.min())))
        self.selection = {}
        for tv in self.tvs:
            guess = self.solve(h, codes, obs, shape, tv)
            self.selection[tv] = float(ssim(unit(probe).clamp(0, 1).cpu(), unit(guess).clamp(0, 1).cpu()).mean())
        return max(self.tvs, key=lambda tv: self.selection[tv])

    def solve(self, h: nn.Module, z_all: torch.Tensor, obs: Observation, shape: tuple[int, ...],
              tv: float) -> torch.Tensor:
        """One descent from every start point; per victim the end point with the lowest objective wins
        (the objective is what the attacker observes: no ground truth)."""
        device = self.device
        starts = start_points(obs, shape, device) if self.restarts else start_points(obs, shape, device)[-1:]
        lo, hi = (_bound(b, starts[0].unsqueeze(0)) for b in (obs.lo, obs.hi)) if self.box else (None, None)
        out, self.last_losses, self.start_wins = [], [], [0] * len(starts)
        for first in range(0, len(z_all), self.batch_size):
            z = z_all[first : first + self.batch_size]
            best, best_loss, winner = None, None, None
            for k, start in enumerate(starts):
                s = self.descend(h, z, start.unsqueeze(0).repeat(len(z), *([1] * len(shape))), tv, lo, hi)
                with torch.no_grad():
                    loss = self.objective(h, s, z, tv)
                if best is None:
                    best, best_loss, winner = s, loss, torch.zeros(len(z), dtype=torch.long)
                else:
                    better = loss < best_loss
                    best[better], best_loss[better], winner[better.cpu()] = s[better], loss[better], k
            for k in range(len(starts)):
                self.start_wins[k] += int((winner == k).sum())
            self.last_losses += best_loss.tolist()
            out.append(best)
        return torch.cat(out) if out else torch.empty(0, *shape)

    def descend(self, h: nn.Module, z: torch.Tensor, s: torch.Tensor, tv: float, lo, hi) -> torch.Tensor:
        s = s.clone().requires_grad_(True)
        optimizer = torch.optim.SGD([s], lr=self.lr, weight_decay=self.weight_decay)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.steps) if self.cosine else None
        for _ in range(self.steps):
            optimizer.zero_grad(set_to_none=True)
            self.objective(h, s, z, tv).sum().backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
            if lo is not None or hi is not None:
                with torch.no_grad():
                    s.clamp_(lo, hi)
        return s.detach()

    def reconstruct(self, observation: Observation) -> torch.Tensor:
        obs = observation
        shape = check_white_box(obs, self.name)
        h = frozen(obs.encoder, self.device)
        if len(self.tvs) > 1 and self.selected_for is not obs.encoder:  # zeta chosen once per h
            self.tv, self.selected_for = self.choose_tv(obs, h, shape), obs.encoder
        return self.solve(h, obs.x_tilde.to(self.device, torch.float32), obs, shape, self.tv)

    @property
    def report(self) -> dict:
        return {"zeta": self.tv, "zeta-selection": {f"{k:g}": v for k, v in self.selection.items()},
                "start-wins": dict(zip(("zero", "public-mean"), self.start_wins))}


# ---------------------------------------------------------------------------------- learned decoder
class Decoder(nn.Module):
    """Code -> image: a linear map to a quarter-size feature map, then two x2 transposed convolutions."""

    def __init__(self, code_dim: int, shape: tuple[int, int, int], width: int = 64):
        super().__init__()
        c, h, w = shape
        self.shape, self.h0, self.w0, self.width = shape, math.ceil(h / 4), math.ceil(w / 4), width
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(code_dim, 2 * width * self.h0 * self.w0),
                                nn.BatchNorm1d(2 * width * self.h0 * self.w0), nn.ReLU())
        self.up = nn.Sequential(
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.ConvTranspose2d(width, c, 4, 2, 1),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.fc(z).view(len(z), 2 * self.width, self.h0, self.w0)
        return self.up(x)[..., : self.shape[1], : self.shape[2]]


class Discriminator(nn.Module):
    """DCGAN-style: two strided convolutions, one logit per image."""

    def __init__(self, shape: tuple[int, int, int], width: int = 64):
        super().__init__()
        c, h, w = shape
        self.net = nn.Sequential(
            nn.Conv2d(c, width, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(width, 2 * width, 4, 2, 1), nn.BatchNorm2d(2 * width), nn.LeakyReLU(0.2), nn.Flatten(),
        )
        with torch.no_grad():
            features = self.net(torch.zeros(2, c, h, w)).shape[1]
        self.out = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.net(x)).squeeze(1)


@torch.no_grad()
def codes_of(h: nn.Module, x: torch.Tensor, device, batch_size: int = 256) -> torch.Tensor:
    return torch.cat([h(x[s : s + batch_size].to(device)).float().flatten(1) for s in range(0, len(x), batch_size)])


class DecoderInversion(Attack):
    name = "inversion-decoder"
    threat_model = ("knows h (white box) and holds public images: trains a decoder G(h(x)) ~ x on them "
                    "(GAN + L1 + code consistency, MixCon's appendix D.2); no private data")

    def __init__(self, public: torch.Tensor, epochs: int = 50, batch_size: int = 128, lr: float = 2e-3,
                 xi: float = 10.0, xi_code: float = 10.0, adversarial: float = 1.0, width: int = 64,
                 train_size: int = 0, seed: int = 0, device: str = "cpu", public_codes: torch.Tensor | None = None):
        if public.dim() != 4:
            raise ValueError(f"inversion-decoder: needs public images (N, C, H, W), got {tuple(public.shape)}")
        self.public, self.public_codes = public, public_codes
        self.epochs, self.batch_size, self.lr = epochs, batch_size, lr
        self.xi, self.xi_code, self.adversarial, self.width = xi, xi_code, adversarial, width
        self.train_size = min(train_size or len(public), len(public))
        self.seed, self.device = seed, device
        self.decoder: Decoder | None = None
        self.fitted_for: nn.Module | None = None
        self.report: dict = {}

    def fit(self, encoder: nn.Module, lo=None, hi=None) -> DecoderInversion:
        t0, device = time.perf_counter(), self.device
        h = frozen(encoder, device)
        order = torch.randperm(len(self.public), generator=generator(self.seed, "decoder", "subset"))[: self.train_size]
        images = self.public[order].float().to(device)
        codes = (self.public_codes[order].float().flatten(1).to(device) if self.public_codes is not None
                 else codes_of(h, images, device))
        shape = tuple(images.shape[1:])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "decoder", "init"))
            G = Decoder(codes.shape[1], shape, self.width).to(device)
            D = Discriminator(shape, self.width).to(device) if self.adversarial > 0 else None
        opt_g = torch.optim.Adam(G.parameters(), lr=self.lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(D.parameters(), lr=self.lr, betas=(0.5, 0.999)) if D is not None else None
        shuffle = generator(self.seed, "decoder", "shuffle")
        lo, hi = (_bound(b, images) for b in (lo, hi))
        losses = []
        for _ in range(self.epochs):
            G.train()
            total, batches = 0.0, 0
            perm = torch.randperm(len(images), generator=shuffle).to(device)
            for first in range(0, len(perm), self.batch_size):
                batch = perm[first : first + self.batch_size]
                if len(batch) < 2:  # BatchNorm
                    continue
                x, z = images[batch], codes[batch]
                fake = G(z)
                if D is not None:
                    real_logit, fake_logit = D(x), D(fake.detach())
                    loss_d = (F.binary_cross_entropy_with_logits(real_logit, torch.ones_like(real_logit))
                              + F.binary_cross_entropy_with_logits(fake_logit, torch.zeros_like(fake_logit)))
                    opt_d.zero_grad(set_to_none=True)
                    loss_d.backward()
                    opt_d.step()
                loss_g = self.xi * (fake - x).abs().mean()
                if self.xi_code > 0:
                    clamped = fake if lo is None and hi is None else fake.clamp(lo, hi)
                    loss_g = loss_g + self.xi_code * (h(clamped).float().flatten(1) - z).abs().mean()
                if D is not None:
                    logit = D(fake)
                    fooled = F.binary_cross_entropy_with_logits(logit, torch.ones_like(logit))
                    loss_g = loss_g + self.adversarial * fooled
                opt_g.zero_grad(set_to_none=True)
                loss_g.backward()
                opt_g.step()
                total, batches = total + loss_g.detach(), batches + 1
            losses.append(float(total) / max(batches, 1))
        G.eval()
        self.decoder, self.fitted_for = G, encoder
        self.report = {"epochs": self.epochs, "train-size": len(images), "batch-size": self.batch_size, "lr": self.lr,
                       "xi": self.xi, "xi-code": self.xi_code, "adversarial": self.adversarial, "train-loss": losses,
                       "fit-seconds": time.perf_counter() - t0, "device": device}
        return self

    def reconstruct(self, observation: Observation) -> torch.Tensor:
        obs = observation
        shape = check_white_box(obs, self.name)
        if tuple(self.public.shape[1:]) != shape:
            raise ValueError(f"inversion-decoder: public images {tuple(self.public.shape[1:])} differ from the "
                             f"private samples {shape}")
        if self.decoder is None or self.fitted_for is not obs.encoder:  # one decoder per encoder h
            self.fit(obs.encoder, obs.lo, obs.hi)
        return self.predict(obs.x_tilde, obs.lo, obs.hi)

    @torch.no_grad()
    def predict(self, codes: torch.Tensor, lo=None, hi=None) -> torch.Tensor:
        out = torch.cat([self.decoder(codes[s : s + 256].float().flatten(1).to(self.device)).cpu()
                         for s in range(0, len(codes), 256)])
        lo, hi = _bound(lo, out), _bound(hi, out)
        return out.clamp(lo, hi) if lo is not None or hi is not None else out
