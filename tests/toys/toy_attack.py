"""A toy attack, as a researcher would add one: one definition plus one registry line.

`toy-mean`: every private sample guessed as the mean of what its party uploaded (a blind guess that reads the
uploads)."""

from __future__ import annotations

from fedsmix.registry import ATTACKS
from server.adversary.base import Attack
from server.adversary.registry import AttackSpec


class MeanGuess(Attack):
    name = "toy-mean"
    threat_model = "sees only the uploads"

    def reconstruct(self, observation):
        mean = observation.x_tilde.float().mean(dim=0)
        return mean.expand(observation.n_private, *mean.shape).clone()


ATTACKS.add("toy-mean", AttackSpec("toy-mean", ("singularized",), lambda settings, **_: MeanGuess()))
