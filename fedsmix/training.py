"""One training loop for every role: central (soft labels), local, proximal (FedProx), MixCon (split models).

Inputs may be tensors or numpy arrays (memory-mapped uploads); batches are copied to the
device one at a time. Checkpoints capture model, optimiser, schedule and every RNG, so a
resumed run ends bit-identical to an uninterrupted one on the CPU.

A federated party's defences (fedsmix/defences.py) reach the loop as two hooks: one turns each
batch's rows into what the model trains on (`batch-mix`), one makes the training private (DP-SGD
through Opacus). The DP-SGD accountant's arithmetic stays here, beside the report that records the
sigma and sampling rate Opacus used.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .config import Settings
from .encoders import Encoded


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
    # a federated party's defences, as their hooks read them (fedsmix/defences.py)
    batch_mix: str = "none"  # none | mixup | instahide: every local batch mixed with partners from the whole set
    batch_mix_k: int = 4
    mix_cap: float = 0.65
    dp_sgd_epsilon: float = 0.0  # > 0: Opacus make_private_with_epsilon for this target
    dp_delta: float = 1e-5
    dp_max_grad_norm: float = 1.0
    dp_epochs: int = 1  # epochs the DP-SGD budget covers (rounds x local epochs: every round spends its share)
    dp_noise_multiplier: float | None = None  # a replay of one step: the party's own sigma instead of solving
    trim: float = 0.0  # robust loss: drop this fraction of each batch's largest per-sample losses
    # MixCon: lambda * L_mixcon on the cut-layer output of a SplitModel; 0 = off
    mixcon_lambda: float = 0.0
    mixcon_beta: float = 0.0
    mixcon_eps: float = 1e-6
    mixcon_pairs: int = 0
    mixcon_normalize: bool = True  # dist on L2-normalised h (footnote 3); False: raw h (the synthetic figure)
    clip_grad_norm: float = 0.0  # > 0: clip the gradient's global norm (beta/dist can spike; docs/mixcon.md)


def mixcon_config(settings: Settings) -> dict:
    """The MixCon terms of a run (encoder=mixcon), as TrainConfig fields; the gradient clip only with the term
    (lambda = 0 stays the vanilla split model's training)."""
    return {"mixcon_lambda": settings.mixcon_lambda, "mixcon_beta": settings.mixcon_beta,
            "mixcon_eps": settings.mixcon_eps, "mixcon_pairs": settings.mixcon_pairs,
            "clip_grad_norm": settings.mixcon_clip if settings.mixcon_lambda > 0 else 0.0}


def train_config(
    settings: Settings,
    device: str,
    *,
    federated_client: bool = False,
    proximal_mu: float = 0.0,
    dp_noise_multiplier: float | None = None,
    split: bool = False,
) -> TrainConfig:
    """Central and local-only training follow appendix E (AdamW, cosine); FedAvg/FedProx
    clients run `local-epochs` of SGD with momentum per round, as in the FedProx paper, with the
    run's defences.

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
            batch_mix=settings.batch_mix,
            batch_mix_k=settings.batch_mix_k,
            mix_cap=settings.coefficient_cap,
            dp_sgd_epsilon=settings.dp_sgd_epsilon,
            dp_delta=settings.dp_delta,
            dp_max_grad_norm=settings.dp_sgd_max_grad_norm,
            dp_epochs=settings.rounds * settings.local_epochs,
            dp_noise_multiplier=dp_noise_multiplier,
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
    steps: int = 0
    dp_noise_multiplier: float | None = None  # DP-SGD: the sigma Opacus used
    dp_sample_rate: float | None = None  # DP-SGD: Poisson sampling rate (batch-size / rows)


@dataclass
class StepTrace:
    """The oracle's record of a party's local steps (simulation only, never sent): the rows of each
    batch, the batch defence's mixing (weights, sources, sign masks), what went into the model and the
    BatchNorm statistics of that input at every BatchNorm layer (what BN_exact hands the attacker)."""

    rows: list[torch.Tensor] = field(default_factory=list)
    mixes: list[Encoded | None] = field(default_factory=list)
    inputs: list[torch.Tensor] = field(default_factory=list)
    targets: list[torch.Tensor] = field(default_factory=list)
    bn_stats: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    dropout_masks: list[list[torch.Tensor]] = field(default_factory=list)

    def watch(self, model: nn.Module) -> list:
        """Forward hooks recording, per step, each BatchNorm input's batch mean and (biased) variance and each
        dropout layer's keep mask (an input that was 0 counts as kept: it contributes nothing either way)."""

        def norm_hook(module, inputs, _output):
            x = inputs[0].detach().float()
            dims = [0] + list(range(2, x.dim()))
            self.bn_stats[-1].append((x.mean(dim=dims).cpu(), x.var(dim=dims, unbiased=False).cpu()))

        def dropout_hook(module, inputs, output):
            self.dropout_masks[-1].append(((output != 0) | (inputs[0] == 0)).detach().cpu())

        hooks = []
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                hooks.append(m.register_forward_hook(norm_hook))
            elif isinstance(m, nn.Dropout | nn.Dropout1d | nn.Dropout2d):
                hooks.append(m.register_forward_hook(dropout_hook))
        return hooks

    def step(self, rows: torch.Tensor, mix: Encoded | None, xb: torch.Tensor, yb: torch.Tensor) -> None:
        self.rows.append(rows.clone())
        self.mixes.append(mix)
        self.inputs.append(xb.detach().cpu())
        self.targets.append(yb.detach().cpu())
        self.bn_stats.append([])
        self.dropout_masks.append([])


def dp_sgd_sample_rate(rows: int, batch_size: int) -> float:
    """Opacus' Poisson rate: 1 / len(data loader)."""
    return 1.0 / math.ceil(rows / batch_size)


def dp_sgd_noise_multiplier(cfg: TrainConfig, rows: int) -> float:
    """The sigma make_private_with_epsilon picks for a party of `rows` samples (RDP accountant)."""
    from opacus.accountants.utils import get_noise_multiplier

    return get_noise_multiplier(target_epsilon=cfg.dp_sgd_epsilon, target_delta=cfg.dp_delta,
                                sample_rate=dp_sgd_sample_rate(rows, cfg.batch_size), epochs=cfg.dp_epochs,
                                accountant="rdp")


def dp_sgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """Epsilon spent after `steps` DP-SGD steps (Opacus' RDP accountant)."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta))


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
               reference: list[torch.Tensor] | None = None, forward: nn.Module | None = None) -> torch.Tensor:
    """The objective of one batch: soft cross-entropy (less its `trim` largest per-sample losses),
    + lambda * L_mixcon (split models), + the proximal term.

    `forward` is what the batch passes through (Opacus' private wrapper of `model` under DP-SGD; its
    per-sample hooks run in float32, so no autocast then). lambda = 0 adds nothing (not even a zero):
    the loss is then the vanilla one, bit for bit.
    """
    forward = model if forward is None else forward
    use_amp = str(cfg.device).startswith("cuda") and forward is model
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
        if cfg.mixcon_lambda > 0:
            if not hasattr(model, "encoder") or not hasattr(model, "head"):
                raise ValueError("mixcon-lambda > 0 needs a split model (encoder + head), e.g. model 'lenet5'")
            z = model.encoder(xb)
            logits = model.head(z)
        else:
            logits = forward(xb)
    loss = soft_cross_entropy(logits.float(), yb, cfg.trim)
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


def tensors_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names and tensor bytes, in order: equal digests, equal tensors."""
    h = hashlib.sha256()
    for name, tensor in named:
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def state_digest(model: nn.Module) -> str:
    """`tensors_digest` of the state dict: equal digests, equal weights."""
    return tensors_digest(model.state_dict().items())


SKETCH_SIZE = 16
SKETCH_BLOCK = 1 << 16  # values projected at a time (SKETCH_SIZE x 64k float64 = 8 MiB of directions)


def sketch(arrays) -> list[float]:
    """A fingerprint of arrays that survives other CPUs' rounding: their values projected on SKETCH_SIZE fixed
    Gaussian directions (numpy's generator, seed 0, scaled by 1/sqrt(SKETCH_SIZE)), in float64. By
    Johnson-Lindenstrauss, the distance between two sketches is about the distance between the arrays (within
    some 40 % at this size), so two runs agree to a tolerance where their digests cannot: PyTorch's kernels
    round differently on AVX2, AVX-512 and scalar CPUs, and training carries those bits forward."""
    rng = np.random.default_rng(0)
    out = np.zeros(SKETCH_SIZE)
    for array in arrays:
        flat = np.asarray(array).reshape(-1)
        for start in range(0, flat.size, SKETCH_BLOCK):  # bounded memory: the directions drawn a block at a time
            block = flat[start:start + SKETCH_BLOCK].astype(np.float64)
            out += block @ rng.standard_normal((block.size, SKETCH_SIZE))
    return (out / np.sqrt(SKETCH_SIZE)).tolist()


def state_sketch(model: nn.Module) -> list[float]:
    """`sketch` of the state dict's tensors, in order: the weights' fingerprint beside `state_digest`."""
    return sketch(t.detach().cpu().numpy() for t in model.state_dict().values())


def _atomic_save(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def warm_up() -> None:
    """Pay the lazy imports of a process's first training step now (a party's hello, its cold start).

    Building the first torch optimizer imports torch._dynamo (about 860 modules: 2.3 s idle here, over a
    minute in each of three Ray actors on a loaded 2-core machine, measured), which would otherwise eat
    the first local-only or FedAvg round's reply-timeout.
    """
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


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
    rows: torch.Tensor | None = None,
    trace: StepTrace | None = None,
    mix_batch: Callable[..., Encoded] | None = None,
    make_private: Callable[..., tuple] | None = None,
) -> TrainReport:
    """Minimise soft cross-entropy (+ mu/2 * proximal term, + lambda * L_mixcon) with AdamW/SGD and a
    cosine schedule (`batch_loss`).

    `checkpoint_key` names the training data; a checkpoint with another key is refused. `rows` restricts
    the epochs to those samples (a replayed batch); batch-mix partners still come from all of x. `trace`
    records every step for the simulation's oracle.

    The hooks of a party's defences (fedsmix/defences.py): `mix_batch(cfg, x, y, index, generator)` turns each
    batch's rows into the encoded batch the model trains on; `make_private(model, optimizer, cfg, rows,
    generator)` returns Opacus' private module, its DPOptimizer and a loader of Poisson batches of rows (DP-SGD).
    """
    device = cfg.device
    model.to(device)
    rows = torch.arange(len(y)) if rows is None else torch.as_tensor(rows)
    n = len(rows)
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
    private = loader = None
    if make_private is not None:
        private, optimizer, loader = make_private(model, optimizer, cfg, rows, generator)
        report.dp_noise_multiplier = float(optimizer.noise_multiplier)
        report.dp_sample_rate = dp_sgd_sample_rate(n, cfg.batch_size)
    forward = private if private is not None else model
    hooks = trace.watch(model) if trace is not None else []
    for epoch in range(start_epoch, cfg.epochs):
        model.train()
        if loader is not None:  # Poisson batches of row indices (some may be empty: no step then)
            batches = (batch[0] for batch in loader)
        else:
            order = rows[torch.randperm(n, generator=generator)]
            batches = (order[start : start + cfg.batch_size] for start in range(0, n, cfg.batch_size))
        total = 0.0
        for index in batches:
            if len(index) == 0 or (
                len(index) < 2 and any(isinstance(m, nn.BatchNorm1d) for m in model.modules())
            ):
                continue  # BatchNorm1d cannot train on a single sample (BatchNorm2d still has H x W values)
            mix = mix_batch(cfg, x, y_dev, index, generator) if mix_batch is not None else None
            if mix is None:
                xb = _rows(x, index, device)
                yb = y_dev[index].to(device, dtype=torch.float32)
            else:
                xb, yb = mix.x.to(device), mix.y.to(device, dtype=torch.float32)
            if trace is not None:
                trace.step(index, mix, xb, yb)
            loss = batch_loss(model, xb, yb, cfg, reference, forward)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            report.steps += 1
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
    for hook in hooks:
        hook.remove()
    if private is not None:
        private._close()  # the model keeps its trained weights, without Opacus' hooks and per-sample grads
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
