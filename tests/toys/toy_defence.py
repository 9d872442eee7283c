"""A toy defence, as a researcher would add one: one definition plus one registry line.

`toy-noise`: Gaussian noise of a fixed std on every weight of each party's round update, from the generator the
round hands the defence (seeded by run seed, defence, party and round); each party reports the std, and the run's
results record it."""

from __future__ import annotations

import torch

from fedsmix.defences import Defence
from fedsmix.registry import DEFENCES

STD = 0.01


@torch.no_grad()
def add_noise(settings, model, reference, generator) -> None:
    for p in model.parameters():
        if p.requires_grad:
            p.add_(STD * torch.randn(p.shape, generator=generator).to(p.device))


DEFENCES.add("toy-noise", Defence(update=add_noise, metrics=lambda settings, report, round_: {"toy-noise-std": STD},
                                  results=lambda settings, last: {"std": last.get("toy-noise-std")}))
