"""One training loop for every role: central (soft labels), local, and proximal (FedProx).

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
    trim: float = 0.0  # robust loss: drop this fraction of each batch's largest per-sample losses


def train_config(
    settings: Settings, device: str, *, federated_client: bool = False, proximal_mu: float = 0.0
) -> TrainConfig:
    """Central and local-only training follow appendix E (AdamW, cosine); FedAvg/FedProx
    clients run `local-epochs` of SGD with momentum per round, as in the FedProx paper."""
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
        )
    return TrainConfig(settings.epochs, settings.batch_size, settings.lr, settings.weight_decay, device=device)


@dataclass
class TrainReport:
    epochs_run: int = 0
    resumed_from: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, trim: float = 0.0) -> torch.Tensor:
    """Paper eq. (7): -(y * log_softmax(o)).sum(1).mean(); equals CE for one-hot targets.

    `trim` > 0: the mean over the batch's samples without its `trim` fraction of largest losses (trimmed
    loss minimisation, Shen & Sanghavi 2019: samples the model cannot fit, such as mislabelled or
    corrupted rows, stop pulling on it)."""
    losses = -(targets * torch.log_softmax(logits, dim=1)).sum(dim=1)
    if trim > 0:
        keep = max(1, len(losses) - int(trim * len(losses)))
        losses = torch.topk(losses, keep, largest=False, sorted=False).values
    return losses.mean()


def proximal_term(model: nn.Module, reference: list[torch.Tensor]) -> torch.Tensor:
    """sum ||w - w_global||^2 over trainable parameters (squared, as in the FedProx paper)."""
    return sum(((p - r) ** 2).sum() for p, r in zip((p for p in model.parameters() if p.requires_grad), reference))


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
    """Minimise soft cross-entropy (+ mu/2 * proximal term) with AdamW/SGD and a cosine schedule.

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
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
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
    use_amp = str(device).startswith("cuda")
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
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
                logits = model(xb)
            loss = soft_cross_entropy(logits.float(), yb, cfg.trim)
            if reference is not None:
                loss = loss + 0.5 * cfg.proximal_mu * proximal_term(model, reference)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
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
