"""Which attacks apply to which strategy: the registry new attacks plug into.

Uploads are attacked by encoder, federated updates by strategy. The strongest attack of a row
is the applicable one with the highest mean SNR gain over the trivial guess on the victims
(chosen with the ground truth: conservative for the defender). A new attack plugs in as a
factory in MIXING_ATTACKS and its name in APPLICABLE for the encoders it handles.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from fedsmix import data as datalib
from fedsmix.config import Settings
from server.adversary import Attack
from server.adversary.abs_solve import AbsSolve
from server.adversary.averaging import Averaging
from server.adversary.cases import public_samples
from server.adversary.linear import LinearAttack
from server.adversary.mmse import GaussianPrior, MMSEAttack


@lru_cache(maxsize=4)
def _public_prior(settings: Settings) -> GaussianPrior:
    """The MMSE attacker's Gaussian prior, fitted once per run settings on the public pool (the
    same samples, size and mixing space as the trivial guess and the in-run adversary use)."""
    return GaussianPrior.fit(public_samples(settings, datalib.spec(settings.dataset)))


#: attacks on an upload (an `Observation`), built from the run's settings
MIXING_ATTACKS: dict[str, Callable[[Settings], Attack]] = {
    "abs-solve": lambda s: AbsSolve(iters=s.attack_steps),
    "averaging": lambda s: Averaging(),
    "linear": lambda s: LinearAttack(steps=s.attack_steps),
    "mmse": lambda s: MMSEAttack(_public_prior(s)),
}

#: encoder (upload strategies) or strategy (federated, local) -> applicable attacks
APPLICABLE: dict[str, tuple[str, ...]] = {
    "singularized": ("abs-solve", "averaging", "linear", "mmse"),
    "mixup": ("abs-solve", "averaging", "linear"),
    "instahide-inside": ("abs-solve", "averaging"),
    "instahide-cross": ("abs-solve", "averaging"),
    "none": ("abs-solve",),
    "fedavg": ("gradient",),
    "fedprox": ("gradient",),
    "local-only": (),  # nothing a party sends is attacked: the trivial guess stands
}
