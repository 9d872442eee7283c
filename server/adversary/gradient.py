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

alpha_TV may be a grid: the attacker then chooses it on its own data, never on a victim's. `probe` builds a case
of public images put through the party's round as the victims' batch was (the same global model, batch size,
steps and batch defence, the victims' known labels; `registry.public_probe`), each alpha_TV reconstructs that
batch (one restart), and the one whose reconstructions are closest to the public images (mean SNR) attacks the
victims. The appendix's own values differ by batch size (alpha_TV 1e-2 for one image, its Figure 4; its code runs
0.1 / 0.05 for batches of 16), so a fixed value is weak somewhere.

The appendix's settings (../shared/papers/gradient-inversion-eval-appendix.txt):
- BatchNorm: the dummy batch is normalised by its own statistics, as the party's training normalised its
  batch, and the BN regulariser alpha_BN (||mu - mu*|| + ||var - var*|| per layer) pulls them towards the
  party's exact batch statistics (`bn="exact"`, BN_exact) or towards the global model's running statistics,
  the attacker's only estimate of the data's (`bn="infer"`, BN_infer). (Substituting the exact statistics
  in the forward pass instead recovered less: +6.0 against +12.0 dB on 8 MNIST images.)
- Labels: `labels="known"`, or `"restored"` from the output layer's bias update (iDLG for one image:
  p - y is negative only at the true class; for B > 1 the count estimate n_c = B (p_c - g_c), p the model's
  mean prediction on the attacker's public samples, uniform without).
- Dropout: `dropout="known"` replays the party's own masks (the strongest attacker knows its forward pass);
  `"replay"` switches dropout off, or reads the mask off a one-image one-step update (above).
- Pruned updates: entries the party zeroed are left out of the match (the attacker sees which).
- Batch defences, coefficients and indices known: MixUp's originals are the unknowns, mixed by the
  known weights before the model, with TV on them; InstaHide's inputs carry unknown signs, so the
  inputs themselves are recovered with TV on |x| and then unmixed by abs-solve with the known weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from fedsmix.training import soft_cross_entropy

from .base import Attack, GradientObservation, Observation


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
    model: nn.Module, update: list[torch.Tensor] | None = None, lr: float = 0.0, weight_decay: float = 0.0,
    masks: list[torch.Tensor] | None = None,
) -> nn.Module:
    """The global model as the party ran it: BatchNorm on batch statistics; dropout with the party's own
    `masks` (an oracle's), or off, or, when `update` comes from one SGD step on one image, with the mask
    read off the update."""
    clone = copy.deepcopy(model).float()
    clone.train()
    params = {id(p): i for i, p in enumerate(p for p in clone.parameters() if p.requires_grad)}
    seen = 0
    for parent in list(clone.modules()):
        children = list(parent.named_children())
        for (name, child), (_, after) in zip(children, children[1:] + [(None, None)]):
            if not isinstance(child, nn.Dropout | nn.Dropout1d | nn.Dropout2d):
                continue
            child.eval()
            if masks is not None:
                setattr(parent, name, FixedDropout(masks[seen], child.p))
                seen += 1
            elif update is not None and isinstance(after, nn.Linear) and id(after.weight) in params:
                gone = dropped_inputs(update[params[id(after.weight)]].float(), after.weight.detach(), lr, weight_decay)
                setattr(parent, name, FixedDropout(~gone, child.p))
    return clone


class ReplayedBatchNorm(nn.Module):
    """A BatchNorm layer on the dummy batch, as the party's training ran it (normalised by the batch's own
    statistics), recording those statistics for the BN regulariser and the prior they are pulled towards: the
    party's exact batch statistics (BN_exact) or the global model's running statistics (BN_infer). Keeps the
    layer's affine parameters (the same objects, in the same order)."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm, exact: tuple[torch.Tensor, torch.Tensor] | None):
        super().__init__()
        self.weight, self.bias, self.eps = bn.weight, bn.bias, bn.eps
        self.prior = exact if exact is not None else (bn.running_mean.detach().clone(), bn.running_var.detach().clone())
        self.stats: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = [0] + list(range(2, x.dim()))
        mean, var = x.mean(dim=dims), x.var(dim=dims, unbiased=False)
        self.stats = (mean, var)
        shape = [1, -1] + [1] * (x.dim() - 2)
        out = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.weight is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out

    def penalty(self) -> torch.Tensor:
        """||mean - prior mean||_2 + ||var - prior var||_2 (the appendix's BN regulariser, one layer)."""
        return (self.stats[0] - self.prior[0]).norm() + (self.stats[1] - self.prior[1]).norm()


def replay_batchnorm(
    model: nn.Module, exact: list[tuple[torch.Tensor, torch.Tensor]] | None
) -> list[ReplayedBatchNorm]:
    """Swap every BatchNorm of `model` (in module order) for a ReplayedBatchNorm."""
    layers = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm):
                stats = None
                if exact is not None:
                    if len(layers) >= len(exact):
                        raise ValueError(f"BN_exact: the observation holds {len(exact)} BatchNorm layers' statistics")
                    stats = tuple(t.float() for t in exact[len(layers)])
                layer = ReplayedBatchNorm(child, stats)
                setattr(parent, name, layer)
                layers.append(layer)
    return layers


def restore_labels(obs: GradientObservation, params: list[torch.Tensor], prior: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """Labels from the output layer's bias update g ~ mean(p_i - y_i) (one SGD step, weight decay removed).

    B = 1: iDLG, the one negative entry. B > 1: n_c = B (p_c - g_c) clipped at 0, p the model's mean softmax on
    the attacker's own inputs (`prior`; uniform without), rounded to B images by largest remainder."""
    bias = params[-1]
    if bias.dim() != 1:
        raise ValueError("label restoration reads the output layer's bias; the model's last parameter is not one")
    g = obs.update[-1].float() / (obs.lr * obs.local_steps) - obs.weight_decay * bias.detach().float()
    count = len(obs.labels)
    if count == 1:
        return g.argmin().reshape(1)
    p = prior if prior is not None else torch.full_like(g, 1.0 / len(g))
    share = (p - g).clamp_min(0)
    share = count * share / share.sum().clamp_min(1e-12)
    counts = share.floor().long()
    remainder = share - counts
    for c in remainder.argsort(descending=True)[: count - int(counts.sum())]:
        counts[c] += 1
    return torch.repeat_interleave(torch.arange(len(g)), counts)


class InvertingGradients(Attack):
    name = "gradient"
    threat_model = "sees one party's weight change for a round, the global model, the labels and the batch size"

    def __init__(
        self,
        steps: int = 1000,
        restarts: int = 2,
        lr: float = 0.1,
        tv: float | tuple[float, ...] = 1e-2,
        seed: int = 0,
        signed: bool = True,
        bn: str = "infer",
        alpha_bn: float = 0.0,
        labels: str = "known",
        label_inputs: torch.Tensor | None = None,
        dropout: str = "replay",
        snapshots: tuple[int, ...] = (),
        probe: Callable[[GradientObservation], object] | None = None,
    ):
        if steps < 8:
            raise ValueError(f"gradient inversion needs at least 8 steps for its schedule, got {steps}")
        if bn not in ("exact", "infer"):
            raise ValueError(f"gradient attack: bn {bn!r}; allowed: exact (BN_exact), infer (BN_infer)")
        if labels not in ("known", "restored"):
            raise ValueError(f"gradient attack: labels {labels!r}; allowed: known, restored")
        if dropout not in ("known", "replay"):
            raise ValueError(f"gradient attack: dropout {dropout!r}; allowed: known (the party's masks), replay")
        self.tvs = tuple(float(t) for t in tv) if isinstance(tv, tuple | list) else (float(tv),)
        if not self.tvs or min(self.tvs) < 0:
            raise ValueError(f"gradient attack: tv {tv!r}; one or more values >= 0")
        self.steps, self.restarts, self.lr, self.seed, self.signed = steps, restarts, lr, seed, signed
        self.tv, self.probe = self.tvs[0], probe
        self.probe_scores: dict[float, float] = {}  # alpha_TV -> mean SNR (dB) on the public probe, when chosen
        self.chosen: list[float] = []  # the alpha_TV chosen for each observation attacked, in order
        self.bn, self.alpha_bn, self.labels, self.label_inputs = bn, alpha_bn, labels, label_inputs
        self.dropout = dropout
        self.snapshots = tuple(sorted(int(k) for k in snapshots if 0 < int(k) <= steps))
        norm = "the batch's statistics known (BN_exact)" if bn == "exact" else "statistics inferred (BN_infer)"
        masks = "known" if dropout == "known" else "not known"
        tvs = f"alpha_TV {self.tvs[0]:g}" if len(self.tvs) == 1 else (
            f"alpha_TV among {', '.join(f'{t:g}' for t in self.tvs)} chosen on a public probe batch")
        self.threat_model = (
            f"{self.threat_model}; BatchNorm {norm}, alpha_BN {alpha_bn:g}, {tvs}, labels {labels}, dropout masks "
            f"{masks}"
        )
        self.last_losses: list[float] = []
        self.restored: torch.Tensor | None = None  # the labels restoration produced, when it ran
        # the winning restart's unknowns after each of `snapshots` steps (of this schedule: a learning curve of
        # one long run, not of shorter runs, whose step size decays sooner); before any unmixing
        self.taken: dict[int, torch.Tensor] = {}

    def reconstruct(self, observation: GradientObservation) -> torch.Tensor:
        if len(self.tvs) > 1 and self.probe is not None:
            self.tv = self.choose_tv(observation)
            self.chosen.append(self.tv)
        return self._reconstruct(observation)

    def choose_tv(self, observation: GradientObservation) -> float:
        """The alpha_TV of the grid that best reconstructs the public probe batch (mean SNR, one restart each)."""
        from fedsmix.metrics import snr_db

        case = self.probe(observation)
        truth = case.truth.float()
        scores = {}
        for tv in self.tvs:
            self.tv = tv
            x_hat = self._reconstruct(case.observation, restarts=1)[case.rows]
            if case.align is not None:
                x_hat = case.align(truth, x_hat)
            scores[tv] = float(snr_db(truth, x_hat).mean())
        self.probe_scores = scores
        return max(scores, key=scores.get)

    def _reconstruct(self, observation: GradientObservation, restarts: int | None = None) -> torch.Tensor:
        obs = observation
        one_step = obs.batch_size == 1 and obs.local_steps == 1 and obs.mix_weights is None
        masks = obs.dropout_masks if self.dropout == "known" else None
        model = attacker_copy(obs.model, obs.update if one_step else None, obs.lr, obs.weight_decay, masks)
        norms = []
        if self.alpha_bn > 0:
            if self.bn == "exact" and obs.bn_stats is None and any(
                isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
            ):
                raise ValueError("BN_exact needs the batch's BatchNorm statistics in the observation")
            norms = replay_batchnorm(model, obs.bn_stats if self.bn == "exact" else None)
        params = [p for p in model.parameters() if p.requires_grad]
        if len(params) != len(obs.update):
            raise ValueError(f"update has {len(obs.update)} tensors, the model {len(params)} trainable parameters")
        target = [u.detach().float() for u in obs.update]
        masks = [u != 0 for u in target]  # a pruned update shows which entries the party zeroed
        labels = self._targets(obs, model, params)
        generator = torch.Generator().manual_seed(self.seed)
        best, best_loss, self.last_losses = None, float("inf"), []
        for _ in range(restarts or self.restarts):
            x_hat, loss, taken = self._trial(model, params, target, masks, labels, obs, norms, generator)
            self.last_losses.append(loss)
            if loss < best_loss:
                best, best_loss, self.taken = x_hat, loss, taken
        if obs.masked:  # InstaHide: the recovered inputs are sign-masked mixtures; unmix |x| with the known weights
            from .abs_solve import AbsSolve

            mixed = Observation(x_tilde=best, n_private=int(obs.mix_sources.max()) + 1, weights=obs.mix_weights,
                                sources=obs.mix_sources, lo=obs.lo, hi=obs.hi, extras={"masked": True})
            best = AbsSolve().reconstruct(mixed)
        return best

    def _targets(self, obs: GradientObservation, model: nn.Module, params: list[torch.Tensor]) -> torch.Tensor:
        """The training targets: given (batch defences: mixed soft labels), known, or restored."""
        if obs.targets is not None:
            return obs.targets.float()
        labels = obs.labels
        if self.labels == "restored":
            prior = None
            if self.label_inputs is not None:
                with torch.no_grad():
                    model.eval()
                    prior = torch.softmax(model(self.label_inputs[:256].float()), dim=1).mean(dim=0)
                    model.train()
            labels = self.restored = restore_labels(obs, params, prior)
        if labels.dim() == 1:  # class indices: the last trainable tensor is the output layer's bias
            labels = nn.functional.one_hot(labels.long(), params[-1].shape[0]).float()
        return labels.float()

    def _unknowns(self, obs: GradientObservation, count: int, generator) -> tuple[torch.Tensor, tuple]:
        """The variables optimised and their box: images, MixUp's originals, or InstaHide's masked inputs."""
        lo = obs.lo.float() if obs.lo is not None else None
        hi = obs.hi.float() if obs.hi is not None else None
        rows = count if obs.mix_sources is None or obs.masked else int(obs.mix_sources.max()) + 1
        if obs.masked and lo is not None:  # a sign-flipped mixture lies within +- the range's larger side
            hi = torch.maximum(lo.abs(), hi.abs())
            lo = -hi
        return torch.randn((rows, *obs.sample_shape), generator=generator).requires_grad_(True), (lo, hi)

    def _inputs(self, obs: GradientObservation, unknown: torch.Tensor) -> torch.Tensor:
        """What goes into the model: the unknowns, or MixUp's mixtures of them by the known weights."""
        if obs.mix_sources is None or obs.masked:
            return unknown
        view = (len(obs.mix_sources),) + (1,) * (unknown.dim() - 1)
        weights = obs.mix_weights.float()
        return sum(weights[:, j].view(view) * unknown[obs.mix_sources[:, j]] for j in range(obs.mix_sources.shape[1]))

    def _trial(self, model, params, target, masks, labels, obs, norms, generator
               ) -> tuple[torch.Tensor, float, dict[int, torch.Tensor]]:
        x_hat, (lo, hi) = self._unknowns(obs, len(labels), generator)
        optimizer = torch.optim.Adam([x_hat], lr=self.lr)
        milestones = [int(self.steps * f) for f in (3 / 8, 5 / 8, 7 / 8)]
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.1)
        taken = {}
        for step in range(1, self.steps + 1):
            optimizer.zero_grad()
            loss = self._objective(model, params, target, masks, labels, x_hat, obs, norms)
            loss.backward()
            if self.signed:
                x_hat.grad.sign_()
            optimizer.step()
            schedule.step()
            if lo is not None:
                with torch.no_grad():
                    x_hat.data = torch.maximum(torch.minimum(x_hat.data, hi), lo)
            if step in self.snapshots:
                taken[step] = x_hat.detach().clone()
        final = float(self._objective(model, params, target, masks, labels, x_hat, obs, norms).detach())
        return x_hat.detach(), final, taken

    def _objective(self, model, params, target, masks, labels, x_hat, obs, norms) -> torch.Tensor:
        loss = soft_cross_entropy(model(self._inputs(obs, x_hat)), labels)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        objective = cosine_distance([g * m for g, m in zip(grads, masks)], target)
        if self.tv > 0 and x_hat.dim() == 4:
            objective = objective + self.tv * total_variation(x_hat.abs() if obs.masked else x_hat)
        if self.alpha_bn > 0 and norms:
            objective = objective + self.alpha_bn * sum(layer.penalty() for layer in norms)
        return objective
