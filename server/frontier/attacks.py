"""Which attacks apply to which strategy: the registry new attacks plug into.

Uploads are attacked by encoder, federated updates by strategy. The strongest attack of a row
is the applicable one with the highest mean SNR gain over the trivial guess on the victims
(chosen with the ground truth: conservative for the defender). To add the linear or MMSE
attacker: put a factory into MIXING_ATTACKS and its name into APPLICABLE for the encoders it
handles, e.g. MIXING_ATTACKS["mmse"] = lambda s: MMSE(...); APPLICABLE["singularized"] += ("mmse",).
"""

from __future__ import annotations

from collections.abc import Callable

from fedsmix.config import Settings
from server.adversary import Attack
from server.adversary.abs_solve import AbsSolve
from server.adversary.averaging import Averaging

#: attacks on an upload (an `Observation`), built from the run's settings
MIXING_ATTACKS: dict[str, Callable[[Settings], Attack]] = {
    "abs-solve": lambda s: AbsSolve(iters=s.attack_steps),
    "averaging": lambda s: Averaging(),
}

#: encoder (upload strategies) or strategy (federated, local) -> applicable attacks
APPLICABLE: dict[str, tuple[str, ...]] = {
    "singularized": ("abs-solve", "averaging"),
    "mixup": ("abs-solve", "averaging"),
    "instahide-inside": ("abs-solve", "averaging"),
    "instahide-cross": ("abs-solve", "averaging"),
    "none": ("abs-solve",),
    "fedavg": ("gradient",),
    "fedprox": ("gradient",),
    "local-only": (),  # nothing a party sends is attacked: the trivial guess stands
}
