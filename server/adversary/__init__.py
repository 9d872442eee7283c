"""The honest-but-curious server's attacks: one file per attack, one `reconstruct()` entry each.

Cases (what the server saw and what the threat model grants) are `Observation`s; attacks turn
an observation into estimates of the private samples; analysis scores estimates against the
ground truth that only a simulation oracle knows.
"""

from .base import Attack, GradientObservation, Observation

__all__ = ["Attack", "GradientObservation", "Observation"]
