"""Cases: what the server sees from the victim party, replayed from the run's settings and seeds.

A party's encoding and its FedAvg/FedProx update are pure functions of (settings, party, number
of parties), so the simulation replays them with the very code the ClientApp runs, and keeps
the secrets (weights, sources, masks) and the ground truth the attacks are scored against.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from fedsmix import data as datalib
from fedsmix.config import Settings
from fedsmix.encoders import Encoded
from fedsmix.pipeline import Partition, encode_partition, load_partition, load_public_pool, new_classifier, train_config
from fedsmix.seeding import generator
from fedsmix.training import train
from server.adversary import GradientObservation, Observation
from server.adversary.cases import public_samples


@dataclass
class Victims:
    """The private samples every attack is scored on: the first rows of the victim party."""

    part: Partition
    index: torch.Tensor  # rows of part.x

    @property
    def x(self) -> torch.Tensor:
        return self.part.x[self.index]

    @property
    def labels(self) -> torch.Tensor:
        return self.part.labels[self.index]


def victims(settings: Settings, party: int, num_parties: int, count: int) -> Victims:
    part = load_partition(settings, party, num_parties)
    return Victims(part, torch.arange(min(count, len(part.x))))


def bounds(settings: Settings, part: Partition) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Valid normalised pixel range (pixels only; backbone features are unbounded)."""
    if settings.backbone != "none":
        return None, None
    lo, hi = datalib.valid_range(part.spec)
    return lo[0], hi[0]


def public_mean(settings: Settings, part: Partition) -> torch.Tensor:
    """The trivial guess: the public pool's mean sample, in the party's mixing space."""
    return public_samples(settings, part.spec).mean(dim=0)


def upload_observation(settings: Settings, part: Partition, prior: torch.Tensor) -> tuple[Observation, Encoded]:
    """The party's upload as the server received it, with the strongest attacker's knowledge."""
    enc, cal = encode_partition(settings, part)
    dtype = torch.float16 if settings.upload_dtype == "float16" else torch.float32
    cross = settings.encoder == "instahide-cross"
    lo, hi = bounds(settings, part)
    obs = Observation(
        x_tilde=enc.x.to(dtype),  # as uploaded: float16 uploads keep their precision for the attacks
        n_private=len(part.x),
        weights=enc.weights,
        sources=enc.sources,
        radius=cal.radius if settings.encoder == "singularized" else None,
        public=load_public_pool(settings, part.spec) if cross else None,
        public_sources=enc.public_sources if cross else None,
        lo=lo,
        hi=hi,
        extras={"masked": enc.signs is not None, "prior_mean": prior, "encoder": settings.encoder},
    )
    return obs, enc


def check_against_store(obs: Observation, upload_path) -> None:
    """The replayed upload must be the one the run stored (same partitions, same seeds)."""
    stored = torch.from_numpy(np.load(upload_path))
    if stored.shape != obs.x_tilde.shape or not torch.equal(stored, obs.x_tilde):
        raise RuntimeError(f"replayed upload differs from the stored one at {upload_path}: settings or seeds drifted")


def first_round_update(
    settings: Settings,
    part: Partition,
    rows: torch.Tensor,
    mu: float,
    batch_size: int,
    local_epochs: int,
    device: str = "cpu",
) -> GradientObservation:
    """The victim's first-round FedAvg/FedProx update on `rows`, trained exactly as the ClientApp trains."""
    client = settings.replace(batch_size=batch_size, local_epochs=local_epochs)
    model = new_classifier(client, part.sample_shape, part.num_classes)  # round 1's global model
    global_model = copy.deepcopy(model)
    reference = [p.detach().clone() for p in model.parameters()]
    cfg = train_config(client, device, federated_client=True, proximal_mu=mu)
    torch.manual_seed(settings.seed + part.party)
    x, labels = part.x[rows], part.labels[rows]
    train(
        model,
        x,
        datalib.one_hot(labels, part.num_classes),
        cfg,
        generator(settings.seed, "federated", part.party, 1),
        proximal_reference=reference,
    )
    update = [
        g.detach() - w.detach().cpu() for g, w in zip(global_model.parameters(), model.parameters()) if g.requires_grad
    ]
    lo, hi = bounds(settings, part)
    return GradientObservation(
        model=global_model,
        update=update,
        labels=labels,
        sample_shape=part.sample_shape,
        batch_size=batch_size,
        local_steps=local_epochs * math.ceil(len(rows) / batch_size),
        lr=cfg.lr,
        lo=lo,
        hi=hi,
        weight_decay=cfg.weight_decay,
    )


def match_within_labels(x: torch.Tensor, x_hat: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Order a batch's reconstructions like the truth: labels are known, so only images that share
    a label can be confused; those are matched by least squared error (Hungarian)."""
    from scipy.optimize import linear_sum_assignment

    out = x_hat.clone()
    for label in labels.unique():
        rows = (labels == label).nonzero().squeeze(1)
        if len(rows) < 2:
            continue
        cost = torch.cdist(x[rows].flatten(1).double(), x_hat[rows].flatten(1).double()).numpy()
        _, cols = linear_sum_assignment(cost)
        out[rows] = x_hat[rows[torch.from_numpy(cols)]]
    return out
