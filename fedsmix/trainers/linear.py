"""Closed-form heads on the union's second moments: `ridge`, `ridge-eiv`, `lda` and `lda-public`, one candidate
per `head-penalties` value, every one from a single pass over the union."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import Settings
from .base import Job, Trainer
from .union import Moments


class LinearHead(nn.Module):
    """logits = flatten(x) W + b: a closed-form head as a module (evaluated, sent and scored like the MLP)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.linear = nn.Linear(weight.shape[0], weight.shape[1])
        with torch.no_grad():
            self.linear.weight.copy_(weight.T.float())
            self.linear.bias.copy_(bias.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def linear_heads(kind: str, m: Moments, gammas: tuple[float, ...], noise_var: float = 0.0, mix_scale: float = 1.0,
                 prior: torch.Tensor | None = None) -> dict[str, LinearHead]:
    """One closed-form head per relative penalty gamma (the penalty is gamma times the mean eigenvalue).

    ridge:       W = (S + penalty I)^-1 C_xy, b = mean_y - mean_x W, with S the uploads' covariance;
    ridge-eiv:   S less the known noise sigma^2 I, eigenvalues floored at 0 (errors in variables);
    lda:         logits_c = x S_w^-1 mu_c - mu_c S_w^-1 mu_c / 2 + log pi_c, with the clean class means
                 mu_c - mean = C_xy[:, c] / (pi_c * mix_scale) (soft labels pull every mixed class mean
                 towards the overall mean by mix_scale) and the within-class covariance S_w = the clean
                 total covariance (S - sigma^2 I) / mix_scale less the between-class one, floored at 0;
                 S_w is shrunk as (S_w + gamma s I) / (1 + gamma), s its mean eigenvalue, so that large
                 gamma is the nearest class mean (with the class priors) rather than the priors alone.
                 The quadratic term is debiased for the noise in the estimated means (at small tau the
                 noise in mu_c's estimate, not mu_c, would dominate mu_c S_w^-1 mu_c);
    lda-public:  S_w's shape from the public pool's covariance (`prior`), scaled to S_w's trace.
    C_xy always comes from the uploads: the noise is independent of the labels, so it is unbiased there.
    """
    d = m.xx.shape[0]
    if kind in ("ridge", "ridge-eiv"):
        cov = m.xx if kind == "ridge" else _floored(m.xx - noise_var * torch.eye(d, dtype=m.xx.dtype))
        values, vectors = torch.linalg.eigh(cov)
        values = values.clamp_min(0)
        scale, rotated = max(float(values.mean()), 1e-12), vectors.T @ m.xy
        heads = {}
        for gamma in gammas:
            weight = vectors @ (rotated / (values + gamma * scale).unsqueeze(1))
            heads[f"{kind}@{gamma:g}"] = LinearHead(weight, m.mean_y - m.mean_x @ weight)
        return heads
    if kind not in ("lda", "lda-public"):
        raise ValueError(f"trainer: unknown linear head {kind!r}")
    prior_c = m.mean_y.clamp_min(1e-12)
    means = m.xy / (prior_c * mix_scale)  # (d, C): mu_c - overall mean
    total = _floored((m.xx - noise_var * torch.eye(d, dtype=m.xx.dtype)) / mix_scale)
    within = _floored(total - (means * prior_c) @ means.T)
    if kind == "lda-public":
        if prior is None:
            raise ValueError("lda-public needs a clean covariance from public data")
        within = prior.double() * (float(torch.trace(within)) / max(float(torch.trace(prior)), 1e-12))
    values, vectors = torch.linalg.eigh(within)
    values = values.clamp_min(0)
    scale, rotated = max(float(values.mean()), 1e-12), vectors.T @ means
    # per coordinate, the variance of an estimated mean: the uploads' variance, weighted by the soft labels
    mean_var = (float(torch.trace(m.xx)) / d) * m.yy / (m.n * prior_c**2) / mix_scale**2
    heads = {}
    for gamma in gammas:
        shrunk = (values + gamma * scale) / (1 + gamma)  # shrinkage towards scale * I, keeping the total variance
        weight = vectors @ (rotated / shrunk.unsqueeze(1))  # S_w^-1 (mu_c - mean)
        quadratic = (means * weight).sum(0) - mean_var * float((1.0 / shrunk).sum())
        bias = -0.5 * quadratic + prior_c.log() - m.mean_x @ weight
        heads[f"{kind}@{gamma:g}"] = LinearHead(weight, bias)
    return heads


def reweighted(head: LinearHead, kind: str, class_weights) -> LinearHead:
    """The head as if fitted to labels whose class c entries were multiplied by class_weights[c] (fedsmix.trainers.
    union.balanced): a ridge head's scores (linear in the labels) times the weight; a discriminant's log-prior term
    plus its log (its class means and within-class covariance are the data's, not the labels' weighting)."""
    f = torch.as_tensor(class_weights, dtype=torch.float64)
    weight, bias = head.linear.weight.detach().double().T, head.linear.bias.detach().double()
    if kind in ("lda", "lda-public"):
        return LinearHead(weight, bias + f.clamp_min(1e-300).log())
    return LinearHead(weight * f, bias * f)


def _floored(cov: torch.Tensor) -> torch.Tensor:
    """The nearest positive semi-definite matrix in the eigenbasis (negative eigenvalues set to 0)."""
    values, vectors = torch.linalg.eigh((cov + cov.T) / 2)
    return (vectors * values.clamp_min(0.0)) @ vectors.T


def public_covariance(public: torch.Tensor) -> torch.Tensor:
    flat = public.reshape(len(public), -1).double()
    centred = flat - flat.mean(0)
    return centred.T @ centred / max(len(flat) - 1, 1)


def empty_head(settings: Settings, sample_shape: tuple[int, ...], num_classes: int) -> LinearHead:
    """A linear head of the right shape, for a party to load a candidate's state dict into."""
    return LinearHead(torch.zeros(math.prod(sample_shape), num_classes), torch.zeros(num_classes))


def _family(kind: str, needs_public: bool = False) -> Trainer:
    """The `kind` heads of `linear_heads`, one per `head-penalties` value (`kind@gamma`); the union's moments are
    shared with the other closed-form families of the same fit."""

    def fit(job: Job, names: list[str]) -> dict[str, tuple[nn.Module, dict]]:
        m = job.once("moments", lambda: Moments.of(job.union.x, job.union.y))
        gammas = tuple(float(name.split("@")[1]) for name in names)
        prior = public_covariance(job.public) if needs_public and job.public is not None else None
        heads = linear_heads(kind, m, gammas, job.union.noise_var, job.union.mix_scale, prior)
        if job.union.class_weights is not None:
            heads = {name: reweighted(head, kind, job.union.class_weights) for name, head in heads.items()}
        info = {"noise-var": job.union.noise_var, "mix-scale": job.union.mix_scale}
        return {name: (head, dict(info)) for name, head in heads.items()}

    return Trainer(candidates=lambda settings: [f"{kind}@{gamma:g}" for gamma in settings.head_penalties], fit=fit,
                   build=empty_head, needs_public=needs_public)


RIDGE = _family("ridge")
RIDGE_EIV = _family("ridge-eiv")
LDA = _family("lda")
LDA_PUBLIC = _family("lda-public", needs_public=True)
