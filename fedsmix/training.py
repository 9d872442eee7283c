"""One training loop for every role: central (soft labels), local, proximal (FedProx), MixCon (split models).

Inputs may be tensors or numpy arrays (memory-mapped uploads); batches are copied to the
device one at a time. Checkpoints capture model, optimiser, schedule and every RNG, so a
resumed run ends bit-identical to an uninterrupted one on the CPU.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .config import Settings


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 1e-4
    optimizer: str = "adamw"  # adamw (paper, appendix E) | sgd (FedProx clients)
    cosine: bool = True
    proximal_mu: float = 0.0
    device: str = "cpu"
    momentum: float = 0.9  # SGD only
    # MixCon (issue 15): lambda * L_mixcon on the cut-layer output of a SplitModel; 0 = off
    mixcon_lambda: float = 0.0
    mixcon_beta: float = 0.0
    mixcon_eps: float = 1e-6
    mixcon_pairs: int = 0
    mixcon_normalize: bool = True  # dist on L2-normalised h (footnote 3); False: raw h (the synthetic figure)
    clip_grad_norm: float = 0.0  # > 0: clip the gradient's global norm (beta/dist can spike; docs/mixcon.md)


def mixcon_config(settings: Settings) -> dict:
    """The MixCon terms of a run (encoder=mixcon), as TrainConfig fields."""
    return {"mixcon_lambda": settings.mixcon_lambda, "mixcon_beta": settings.mixcon_beta,
            "mixcon_eps": settings.mixcon_eps, "mixcon_pairs": settings.mixcon_pairs}


def train_config(
    settings: Settings, device: str, *, federated_client: bool = False, proximal_mu: float = 0.0, split: bool = False
) -> TrainConfig:
    """Central and local-only training follow appendix E (AdamW, cosine); FedAvg/FedProx
    clients run `local-epochs` of SGD with momentum per round, as in the FedProx paper.

    `split`: the model trained is encoder=mixcon's split model, so the MixCon term joins the loss.
    """
    mixcon = mixcon_config(settings) if split and settings.encoder == "mixcon" else {}
    if federated_client:
        return TrainConfig(
            epochs=settings.local_epochs,
            batch_size=settings.batch_size,
            lr=settings.client_lr,
            weight_decay=settings.weight_decay,
            optimizer="sgd",
            cosine=False,
            proximal_mu=proximal_mu,
            device=device,
            **mixcon,
        )
    return TrainConfig(settings.epochs, settings.batch_size, settings.lr, settings.weight_decay, device=device,
                       **mixcon)


@dataclass
class TrainReport:
    epochs_run: int = 0
    resumed_from: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Paper eq. (7): -(y * log_softmax(o)).sum(1).mean(); equals CE for one-hot targets."""
    return -(targets * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()


def proximal_term(model: nn.Module, reference: list[torch.Tensor]) -> torch.Tensor:
    """sum ||w - w_global||^2 over trainable parameters (squared, as in the FedProx paper)."""
    return sum(((p - r) ** 2).sum() for p, r in zip((p for p in model.parameters() if p.requires_grad), reference))


def mixcon_loss(z: torch.Tensor, labels: torch.Tensor, beta: float, eps: float = 1e-6, pairs: int = 0,
                normalize: bool = True) -> torch.Tensor:
    """MixCon's consistency loss (eq. 1) on one batch of cut-layer representations z.

    L = 1/p 1/(|C|(|C|-1)) sum_i sum_{c1 != c2} (dist + beta / dist), dist = ||h(x_i,c1) - h(x_i,c2)||^2
    on L2-normalised representations (footnote 3; `normalize=False`: on h itself), clamped to [eps, 1/eps];
    x_i,c is the i-th sample of class c in the batch and p the smallest class count among the classes
    present (class-balanced pairing: the i-th sample of every class meets the i-th of every other;
    `pairs` > 0 caps p). Fewer than two classes in the batch: no pair, the term is 0.
    """
    z = z.flatten(1).float()
    if normalize:
        z = nn.functional.normalize(z, dim=1)
    classes, counts = labels.unique(return_counts=True)
    if len(classes) < 2:
        return z.sum() * 0.0
    p = int(counts.min()) if not pairs else min(int(counts.min()), pairs)
    # rank of every sample within its class, in batch order: the class-balanced pairing
    order = torch.argsort(labels * len(labels) + torch.arange(len(labels), device=labels.device), stable=True)
    starts = torch.cumsum(counts, 0) - counts
    index = starts.unsqueeze(0) + torch.arange(p, device=labels.device).unsqueeze(1)  # (p, |C|)
    grouped = z[order[index]]  # (p, |C|, m)
    dist = (grouped.unsqueeze(2) - grouped.unsqueeze(1)).pow(2).sum(-1)  # (p, |C|, |C|)
    off = ~torch.eye(len(classes), dtype=torch.bool, device=z.device)
    dist = dist[:, off].clamp(eps, 1.0 / eps)
    return (dist + beta / dist).mean()


def batch_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor, cfg: TrainConfig,
               reference: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The objective of one batch: soft cross-entropy, + lambda * L_mixcon (split models), + the proximal term.

    lambda = 0 adds nothing (not even a zero): the loss is then the vanilla one, bit for bit.
    """
    use_amp = str(cfg.device).startswith("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
        if cfg.mixcon_lambda > 0:
            if not hasattr(model, "encoder") or not hasattr(model, "head"):
                raise ValueError("mixcon-lambda > 0 needs a split model (encoder + head), e.g. model 'lenet5'")
            z = model.encoder(xb)
            logits = model.head(z)
        else:
            logits = model(xb)
    loss = soft_cross_entropy(logits.float(), yb)
    if cfg.mixcon_lambda > 0:
        loss = loss + cfg.mixcon_lambda * mixcon_loss(z, yb.argmax(dim=1), cfg.mixcon_beta, cfg.mixcon_eps,
                                                      cfg.mixcon_pairs, cfg.mixcon_normalize)
    if reference is not None:
        loss = loss + 0.5 * cfg.proximal_mu * proximal_term(model, reference)
    return loss


def _rows(data, index: torch.Tensor, device: str) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        batch = data[index]
    else:  # numpy array or memory-mapped upload
        batch = torch.from_numpy(np.ascontiguousarray(data[index.numpy()]))
    return batch.to(device, dtype=torch.float32, non_blocking=True)


class CheckpointMismatch(ValueError):
    """The checkpoint was written for other training data (its key differs)."""


def state_digest(model: nn.Module) -> str:
    """sha256 over the state dict's names and tensor bytes: equal digests, equal weights."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _atomic_save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(
    model: nn.Module,
    x,
    y,
    cfg: TrainConfig,
    generator: torch.Generator,
    proximal_reference: list[torch.Tensor] | None = None,
    checkpoint_path: Path | None = None,
    checkpoint_every: int = 0,
    on_epoch: Callable[[int, float], None] | None = None,
    checkpoint_key: str = "",
) -> TrainReport:
    """Minimise soft cross-entropy (+ mu/2 * proximal term, + lambda * L_mixcon) with AdamW/SGD and a
    cosine schedule (`batch_loss`).

    `checkpoint_key` names the training data; a checkpoint with another key is refused.
    """
    device = cfg.device
    model.to(device)
    n = len(y)
    if n == 0:
        raise ValueError("cannot train on 0 samples")
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "sgd":
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    else:
        raise ValueError(f"optimizer: unknown {cfg.optimizer!r}")
    steps_per_epoch = (n + cfg.batch_size - 1) // cfg.batch_size
    scheduler = (
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs * steps_per_epoch)
        if cfg.cosine
        else None
    )
    reference = None
    if cfg.proximal_mu > 0:
        if proximal_reference is None:
            raise ValueError("proximal_mu > 0 needs the global weights as proximal_reference")
        reference = [r.detach().to(device) for r in proximal_reference]
    report = TrainReport()
    start_epoch = 0
    if checkpoint_path is not None and checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False, map_location="cpu")  # a GPU checkpoint resumes anywhere
        if state.get("key", "") != checkpoint_key:
            raise CheckpointMismatch(
                f"{checkpoint_path}: written for data {state.get('key', '')!r}, not {checkpoint_key!r}"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        start_epoch = report.resumed_from = state["epoch"]
        report.losses = state["losses"]
    y_dev = y if isinstance(y, torch.Tensor) else torch.from_numpy(np.asarray(y))
    t0 = time.perf_counter()
    for epoch in range(start_epoch, cfg.epochs):
        model.train()
        order = torch.randperm(n, generator=generator)
        total = 0.0
        for start in range(0, n, cfg.batch_size):
            index = order[start : start + cfg.batch_size]
            if len(index) < 2 and any(isinstance(m, nn.BatchNorm1d) for m in model.modules()):
                continue  # BatchNorm1d cannot train on a single sample (BatchNorm2d still has H x W values)
            xb = _rows(x, index, device)
            yb = y_dev[index].to(device, dtype=torch.float32)
            loss = batch_loss(model, xb, yb, cfg, reference)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            total += loss.item() * len(index)
        report.losses.append(total / n)
        report.epochs_run += 1
        if checkpoint_path is not None and checkpoint_every and (epoch + 1) % checkpoint_every == 0:
            _atomic_save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "generator": generator.get_state(),
                    "torch_rng": torch.get_rng_state(),
                    "epoch": epoch + 1,
                    "losses": report.losses,
                    "key": checkpoint_key,
                },
                checkpoint_path,
            )
        if on_epoch is not None:
            on_epoch(epoch + 1, total / n)
    report.seconds = time.perf_counter() - t0
    return report


@torch.no_grad()
def predict(model: nn.Module, x, device: str = "cpu", batch_size: int = 1024) -> torch.Tensor:
    model.to(device).eval()
    out = []
    for start in range(0, len(x), batch_size):
        xb = _rows(x, torch.arange(start, min(start + batch_size, len(x))), device)
        out.append(model(xb).float().cpu())
    return torch.cat(out)


def evaluate(model: nn.Module, x, labels: torch.Tensor, device: str = "cpu") -> dict[str, float]:
    logits = predict(model, x, device)
    labels = labels.long().cpu()
    loss = nn.functional.cross_entropy(logits, labels).item()
    accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
    return {"accuracy": accuracy, "loss": loss}
