"""The defences inside federated training, in one home: what each does, at which point of a round, and when.

A `Defence` is a registry entry (`fedsmix.registry.DEFENCES`: one `DEFENCES.add` line each, at the end of this
file or in a plugin module named under `plugins`) whose hooks are the points of a FedAvg/FedProx round it acts
on, each optional. The code at each point runs the hooks of the run's active defences, in registration order,
and reads no defence's setting itself:

  model    the classifier as built, for every role               fedsmix/models.py: new_classifier
  batch    each local batch: its rows -> what the model sees     fedsmix/training.py: train (one defence at most)
  private  the local training made differentially private        fedsmix/training.py: train (one defence at most)
  update   the round's update, after local training              fedsmix/party.py: train_local
  metrics  what the party reports beside its update              clients/app.py: the train handler
  results  the defence's block in results.json, under its name  strategies/fedprox.py: federate
  server   a part on the server, around Flower's strategy        strategies/fedprox.py: SERVER_SIDES[name]

A server part wraps Flower's strategy, and this library never imports Flower, so it is registered under the
defence's name in strategies/ (`server=True` here says there is one). The settings refuse what an active defence
cannot run under (its `check`) and two defences on one batch or one optimiser. Batch, private, update and metrics
hooks act in a party's federated round only: local-only training and the mixup-union upload are untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .config import Settings
from .encoders import Encoded, instahide, mixup
from .registry import DEFENCES
from .training import TrainConfig, TrainReport, dp_sgd_epsilon


@dataclass(frozen=True)
class Defence:
    """Where a defence acts (its hooks, each optional) and when (`active`)."""

    active: Callable[[Settings], bool] | None = None  # on by its own keys; None: on when named in `defences`
    check: Callable[[Settings], None] | None = None  # raises ValueError, naming the key, on settings it cannot run
    model: Callable[[Settings, nn.Module], nn.Module] | None = None  # the classifier built -> the one used
    # (cfg, x, y, index, generator) -> the encoded batch the model trains on (the step trace records it)
    batch: Callable[[TrainConfig, torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], Encoded] | None = None
    # (model, optimiser, cfg, rows, generator) -> Opacus' private module, its DPOptimizer and Poisson batches of rows
    private: Callable[..., tuple] | None = None
    # (settings, model, the global weights, a generator of its own for this party and round): edits the model
    update: Callable[[Settings, nn.Module, list[torch.Tensor], torch.Generator], None] | None = None
    metrics: Callable[[Settings, TrainReport, int], dict] | None = None  # (settings, report, round) -> party metrics
    results: Callable[[Settings, dict], dict | None] | None = None  # (settings, last round's party metrics) -> block
    server: bool = False  # it has a part on the server, registered under its name in strategies/

    def on(self, name: str, settings: Settings) -> bool:
        """Whether this run turns on the defence registered as `name`."""
        return self.active(settings) if self.active is not None else name in settings.defences


def active(settings: Settings) -> list[tuple[str, Defence]]:
    """The registered defences this run turns on, in registration order (the order their hooks run in)."""
    return [(name, defence) for name, defence in DEFENCES.items() if defence.on(name, settings)]


# ------------------------------------------------------------------------------ model-norm group
def group_norm(settings: Settings, model: nn.Module) -> nn.Module:
    """Opacus' ModuleValidator.fix: every BatchNorm becomes GroupNorm (min(32, channels) groups; no running
    statistics), which DP-SGD and DP-FedAvg need; its ReLUs stop working in place (Opacus' backward hooks forbid
    editing their outputs in place)."""
    from opacus.validators import ModuleValidator

    model = ModuleValidator.fix(model)
    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.inplace = False
    return model


# ------------------------------------------------------------------------------ batch-mix
def mix_batch(cfg: TrainConfig, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor,
              generator: torch.Generator) -> Encoded:
    """Rows `index` of x, each mixed with batch-mix-k - 1 partners from all of x (coefficients uniform, normalised,
    capped at coefficient-cap), by the encoders' own MixUp or inside-dataset InstaHide (which also flips every
    pixel's sign with a fresh mask). Soft labels mix alike."""
    if not isinstance(x, torch.Tensor):
        raise ValueError("batch-mix needs the party's samples in memory (a tensor)")
    if cfg.batch_mix == "mixup":
        return mixup(x, y, cfg.batch_mix_k, cfg.mix_cap, generator, rows=index)
    if cfg.batch_mix == "instahide":
        return instahide(x, y, cfg.batch_mix_k, cfg.mix_cap, generator, rows=index)
    raise ValueError(f"batch-mix: unknown {cfg.batch_mix!r}; allowed: none, mixup, instahide")


def batch_mix_can_run(settings: Settings) -> None:
    if settings.coefficient_cap * settings.batch_mix_k < 1:
        raise ValueError(f"coefficient-cap {settings.coefficient_cap} x batch-mix-k {settings.batch_mix_k} < 1: "
                         "the weights cannot sum to 1")


# ------------------------------------------------------------------------------ dp-sgd
def dp_sgd_private(model: nn.Module, optimizer, cfg: TrainConfig, rows: torch.Tensor, generator: torch.Generator):
    """Opacus' PrivacyEngine around the model and optimiser; its data loader yields Poisson batches of row
    indices (so the batch defence and the trace see rows, as without DP)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    if cfg.proximal_mu > 0:
        raise ValueError("dp-sgd-epsilon > 0 with proximal-mu > 0: Opacus would drop the proximal gradient")
    loader = DataLoader(TensorDataset(rows), batch_size=cfg.batch_size, generator=generator)
    noise = torch.Generator(device=cfg.device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
    engine = PrivacyEngine(accountant="rdp")
    common = dict(module=model, optimizer=optimizer, data_loader=loader, max_grad_norm=cfg.dp_max_grad_norm,
                  noise_generator=noise, poisson_sampling=True)
    if cfg.dp_noise_multiplier is None:
        private, optimizer, loader = engine.make_private_with_epsilon(
            target_epsilon=cfg.dp_sgd_epsilon, target_delta=cfg.dp_delta, epochs=cfg.dp_epochs, **common
        )
    else:
        private, optimizer, loader = engine.make_private(noise_multiplier=cfg.dp_noise_multiplier, **common)
    return private, optimizer, loader


def dp_sgd_spent(settings: Settings, report: TrainReport, server_round: int) -> float:
    """DP-SGD epsilon a party has spent after `server_round` rounds (it trained in each; an upper bound where
    fraction-train < 1), from the sigma and sampling rate Opacus used and the steps per round."""
    steps = round(settings.local_epochs / report.dp_sample_rate) * max(server_round, 1)
    return dp_sgd_epsilon(report.dp_noise_multiplier, report.dp_sample_rate, steps, settings.dp_delta)


def dp_sgd_metrics(settings: Settings, report: TrainReport, server_round: int) -> dict:
    return {"dp-sgd-epsilon": dp_sgd_spent(settings, report, server_round),
            "dp-sgd-noise-multiplier": report.dp_noise_multiplier}


def dp_sgd_results(settings: Settings, last: dict) -> dict | None:
    """The target and what the parties spent (Flower's mean over the parties of the last round)."""
    if not last:
        return None
    return {
        "target-epsilon": settings.dp_sgd_epsilon, "delta": settings.dp_delta,
        "max-grad-norm": settings.dp_sgd_max_grad_norm, "epsilon": last.get("dp-sgd-epsilon"),
        "noise-multiplier": last.get("dp-sgd-noise-multiplier"),
        "accountant": "Opacus RDP, per party (mean over parties of the last round), Poisson sampling",
    }


def dp_sgd_can_run(settings: Settings) -> None:
    if settings.model_norm != "group":
        raise ValueError("dp-sgd-epsilon > 0 needs model-norm 'group': Opacus refuses BatchNorm (per-sample "
                         "gradients do not exist when a batch's statistics mix its samples)")
    if settings.proximal_mu > 0 and "fedprox" in settings.strategies:
        raise ValueError("dp-sgd-epsilon > 0 with fedprox: Opacus clips per-sample gradients of the loss and "
                         "would drop the proximal term's gradient; use fedavg (proximal-mu 0)")


# ------------------------------------------------------------------------------ prune
@torch.no_grad()
def prune_update(model: nn.Module, reference: list[torch.Tensor], ratio: float) -> None:
    """Gradient pruning of the round's update: in every trainable tensor, the floor(ratio * size) entries whose
    change w - w_global is smallest in magnitude are reset to the global value, so the update the server sees
    has exactly that fraction of zeros per tensor (ties broken by position)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p, ref in zip(params, reference):
        flat, ref = p.view(-1), ref.to(p.device).reshape(-1)
        drop = int(ratio * flat.numel())
        if drop:
            smallest = torch.topk((flat - ref).abs(), drop, largest=False, sorted=False).indices
            flat[smallest] = ref[smallest]


# ------------------------------------------------------------------------------ dp-fedavg
def dp_fedavg_can_run(settings: Settings) -> None:
    if settings.aggregation != "fedavg":
        raise ValueError(f"aggregation {settings.aggregation!r} with dp-fedavg {settings.dp_fedavg!r}: DP-FedAvg's "
                         "noise and accountant assume the clipped updates are averaged; use aggregation 'fedavg'")
    if settings.model_norm != "group":
        raise ValueError("dp-fedavg needs model-norm 'group': BatchNorm's running statistics (and its integer "
                         "batch counter) would be clipped and noised as if they were weights")


DEFENCES.add("group-norm", Defence(active=lambda s: s.model_norm == "group", model=group_norm))
DEFENCES.add("batch-mix", Defence(active=lambda s: s.batch_mix != "none", check=batch_mix_can_run, batch=mix_batch))
DEFENCES.add("dp-sgd", Defence(active=lambda s: s.dp_sgd_epsilon > 0, check=dp_sgd_can_run, private=dp_sgd_private,
                               metrics=dp_sgd_metrics, results=dp_sgd_results))
DEFENCES.add("prune", Defence(active=lambda s: s.prune_ratio > 0,
                              update=lambda s, model, reference, _: prune_update(model, reference, s.prune_ratio)))
DEFENCES.add("dp-fedavg", Defence(active=lambda s: s.dp_fedavg != "off", check=dp_fedavg_can_run, server=True))
