"""Inverting gradients (Geiping et al. 2020) against one party's FedAvg/FedProx update.

The server knows the global model it sent, the party's returned weights, the labels (the
realistic setting of the appendix) and how many images went into the update. It treats the
weight change w_global - w_local as a pseudo-gradient (exact, up to the step size and weight
decay, after one local SGD step; an average over the trajectory after several) and looks for
images whose gradient points the same way: minimise 1 - cos(grad L(x_hat, y), update) + tv TV(x_hat)
with Adam (lr 0.1, decayed x0.1 at 3/8, 5/8 and 7/8 of the steps, signed gradients), projecting
onto the valid pixel range, from several random starts; the restart with the best objective wins.
BatchNorm uses the dummy batch's statistics as the party's training did. Dropout masks are
unknown in general and dropout is switched off; after one SGD step on one image, though, the
mask in front of a linear layer can be read off that layer's update (dropped inputs moved by
weight decay alone), and the attacker replays it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedsmix.training import soft_cross_entropy

from .base import Attack, GradientObservation


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic TV: mean absolute difference between neighbouring pixels."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def cosine_distance(grads: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """1 - <g, t> / (|g| |t|), all parameters taken as one vector."""
    dot = sum((g * t).sum() for g, t in zip(grads, target))
    g_norm = sum(g.pow(2).sum() for g in grads).sqrt()
    t_norm = sum(t.pow(2).sum() for t in target).sqrt()
    return 1 - dot / (g_norm * t_norm).clamp_min(1e-30)


class FixedDropout(nn.Module):
    """Dropout with a known mask (inverted scaling, as nn.Dropout trains)."""

    def __init__(self, keep: torch.Tensor, p: float):
        super().__init__()
        self.register_buffer("keep", keep.float())
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.keep / (1 - self.p)


def dropped_inputs(update: torch.Tensor, weight: torch.Tensor, lr: float, weight_decay: float) -> torch.Tensor:
    """Inputs of a linear layer that dropout zeroed during a single one-image SGD step.

    Their weight columns moved by weight decay alone (update = lr * wd * W[:, j]); a kept input
    with a non-zero activation also carries the loss gradient. An input that was zero anyway is
    reported as dropped, which is harmless: it contributes nothing either way.
    """
    residual = (update - lr * weight_decay * weight).norm(dim=0)
    return residual <= 1e-4 * residual.max()


def attacker_copy(
    model: nn.Module, update: list[torch.Tensor] | None = None, lr: float = 0.0, weight_decay: float = 0.0
) -> nn.Module:
    """The global model as the party ran it: BatchNorm on batch statistics; dropout off, or, when
    `update` comes from one SGD step on one image, with the mask read off the update."""
    clone = copy.deepcopy(model).float()
    clone.train()
    params = {id(p): i for i, p in enumerate(p for p in clone.parameters() if p.requires_grad)}
    for parent in list(clone.modules()):
        children = list(parent.named_children())
        for (name, child), (_, after) in zip(children, children[1:] + [(None, None)]):
            if not isinstance(child, nn.Dropout | nn.Dropout1d | nn.Dropout2d):
                continue
            child.eval()
            if update is not None and isinstance(after, nn.Linear) and id(after.weight) in params:
                gone = dropped_inputs(update[params[id(after.weight)]].float(), after.weight.detach(), lr, weight_decay)
                setattr(parent, name, FixedDropout(~gone, child.p))
    return clone


class InvertingGradients(Attack):
    name = "gradient"
    threat_model = "sees one party's weight change for a round, the global model, the labels and the batch size"

    def __init__(
        self,
        steps: int = 1000,
        restarts: int = 2,
        lr: float = 0.1,
        tv: float = 1e-2,
        seed: int = 0,
        signed: bool = True,
    ):
        if steps < 8:
            raise ValueError(f"gradient inversion needs at least 8 steps for its schedule, got {steps}")
        self.steps, self.restarts, self.lr, self.tv, self.seed, self.signed = steps, restarts, lr, tv, seed, signed
        self.last_losses: list[float] = []

    def reconstruct(self, observation: GradientObservation) -> torch.Tensor:
        obs = observation
        one_step = obs.batch_size == 1 and obs.local_steps == 1
        model = attacker_copy(obs.model, obs.update if one_step else None, obs.lr, obs.weight_decay)
        params = [p for p in model.parameters() if p.requires_grad]
        if len(params) != len(obs.update):
            raise ValueError(f"update has {len(obs.update)} tensors, the model {len(params)} trainable parameters")
        target = [u.detach().float() for u in obs.update]
        labels = obs.labels
        if labels.dim() == 1:  # class indices: the last trainable tensor is the output layer's bias
            labels = nn.functional.one_hot(labels.long(), params[-1].shape[0]).float()
        generator = torch.Generator().manual_seed(self.seed)
        best, best_loss, self.last_losses = None, float("inf"), []
        for _ in range(self.restarts):
            x_hat, loss = self._trial(model, params, target, labels.float(), obs, generator)
            self.last_losses.append(loss)
            if loss < best_loss:
                best, best_loss = x_hat, loss
        return best

    def _trial(self, model, params, target, labels, obs, generator) -> tuple[torch.Tensor, float]:
        shape = (len(labels), *obs.sample_shape)
        x_hat = torch.randn(shape, generator=generator).requires_grad_(True)
        lo = obs.lo.float() if obs.lo is not None else None
        hi = obs.hi.float() if obs.hi is not None else None
        optimizer = torch.optim.Adam([x_hat], lr=self.lr)
        milestones = [int(self.steps * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)
        for _ in range(self.steps):
            optimizer.zero_grad()
            loss = self._objective(model, params, target, labels, x_hat)
            loss.backward()
            if self.signed:
                x_hat.grad.sign_()
            optimizer.step()
            schedule.step()
            if lo is not None:
                with torch.no_grad():
                    x_hat.data = torch.maximum(torch.minimum(x_hat.data, hi), lo)
        final = float(self._objective(model, params, target, labels, x_hat).detach())
        return x_hat.detach(), final

    def _objective(self, model, params, target, labels, x_hat) -> torch.Tensor:
        loss = soft_cross_entropy(model(x_hat), labels)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        objective = cosine_distance(list(grads), target)
        if self.tv > 0 and x_hat.dim() == 4:
            objective = objective + self.tv * total_variation(x_hat)
        return objective
