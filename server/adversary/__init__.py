"""The honest-but-curious server's attacks: one file per attack, one `reconstruct()` entry each.

Cases (what the server saw and what the threat model grants) are `Observation`s; attacks turn
an observation into estimates of the private samples; analysis scores estimates against the
ground truth that only a simulation oracle knows, next to the trivial guess.
"""

from .base import Attack, GradientObservation, Observation
from .linear import LinearAttack
from .mmse import GaussianPrior, MMSEAttack
from .unet import UNetAttack

__all__ = ["Attack", "GaussianPrior", "GradientObservation", "LinearAttack", "MMSEAttack", "Observation", "UNetAttack"]
