"""The server's learning steps: central trainers on the uploaded union, their honest selection, and
test evaluation.

Singularized mixup uploads carry noise of norm r in every row while the test inputs carry none, so
the trainer that fits the uploads best is not the one that classifies clean inputs best. The
`trainer` key picks a family; each family yields candidates, all trained on the uploaded union only:

- `mlp`: the paper's head (eq. 8). `mlp` keeps the BatchNorm statistics of the noisy union;
  `mlp-recal` the same weights with BatchNorm statistics recalibrated on clean public data in the
  mixing space (the server's Tiny-ImageNet pool, which it legitimately holds).
- `ridge`: a closed-form linear head on the uploads, one candidate per relative penalty gamma.
- `ridge-eiv`: errors in variables: the known noise covariance (sigma^2 I, from every party's
  reported r and the weight distribution) is removed from the uploads' covariance first.
- `lda`: a Gaussian discriminant: class means recovered from the soft labels (the mixing shrinks
  them towards the overall mean by a known factor), the within-class covariance from the uploads'
  covariance less the noise (as `ridge-eiv`), regularised by gamma; large gamma is the nearest
  class mean.
- `lda-public`: the same with the within-class covariance's shape taken from the public pool (the
  server's Tiny-ImageNet data in the mixing space), scaled to the uploads' within-class variance.
- `auto`: every registered family (plugins' included).

Each family is a `Trainer` (base.py) registered below in `fedsmix.registry.TRAINERS`, one line each: its
candidates' names, how it fits them, and the empty module a party loads a candidate into (mlp.py, linear.py).

With more than one candidate every one (at most `tuning-budget`, a seeded draw) is fit on the whole
union and each voting party scores them on its own validation split, clean rows it never encoded or
uploaded (fedsmix/tuning.py): only counts come back, and the best candidate is the central model
(selection.py). Nothing here reads the test split.

Robust training (`robust-training`), for what the plausibility checks (server/plausibility.py)
cannot decide (measured in docs/results/robustness.md):
- `clip` (the default): every row farther than CLIP_FACTOR x the union's median distance from its
  coordinate-wise median is pulled back onto that radius (direction kept), for every candidate: one party's
  inflated rows weigh no more than a few ordinary ones. Rows within the bound pass bit for bit, and no honest
  row was beyond it in 33 settings (benchmarks/plausibility.py), so a clean run is unchanged.
- `trim` (off unless chosen): the MLP minimises a trimmed loss, each batch without its `robust-trim` fraction of largest
  per-sample losses (rows no model fits: permuted labels, garbage).

`class-prior = uniform` (off unless chosen): each class weighs as if its label mass were rescaled to the same total
(union.balanced: the MLP's loss, the closed-form heads' scores), so the model's class prior is uniform and no
party's labels move it. At small tau the prior
term decides most predictions, and it is the channel through which one party's consistent label lie costs most.
"""

from __future__ import annotations

from ..registry import TRAINERS
from ..training import TrainReport
from . import linear, mlp
from .base import Job, Trainer
from .linear import LinearHead, empty_head, linear_heads, public_covariance
from .mlp import recalibrate_batchnorm, train_classifier
from .selection import (
    Fitted,
    Selection,
    build_model,
    candidate_names,
    ensure_run_features,
    families,
    fit,
    needs_public,
    party_summary,
    sample_parties,
    score_models,
    server_public,
    test_accuracy,
    train_union,
)
from .union import (
    CLIP_FACTOR,
    Clipped,
    Moments,
    Rows,
    Union,
    balanced,
    clipped,
    union_statistics,
    weight_moments,
    weight_spread,
)

TRAINERS.add("mlp", mlp.MLP)
TRAINERS.add("mlp-recal", mlp.MLP_RECAL)
TRAINERS.add("ridge", linear.RIDGE)
TRAINERS.add("ridge-eiv", linear.RIDGE_EIV)
TRAINERS.add("lda", linear.LDA)
TRAINERS.add("lda-public", linear.LDA_PUBLIC)

PUBLIC = tuple(name for name, family in TRAINERS.items() if family.needs_public)  # built-in families on the pool

__all__ = [
    "CLIP_FACTOR", "PUBLIC", "Clipped", "Fitted", "Job", "LinearHead", "Moments", "Rows", "Selection", "TrainReport",
    "Trainer", "Union", "balanced", "build_model", "candidate_names", "clipped", "empty_head", "ensure_run_features",
    "families", "fit", "linear_heads", "needs_public", "party_summary", "public_covariance", "recalibrate_batchnorm",
    "score_models", "server_public", "test_accuracy", "train_classifier", "train_union", "union_statistics",
    "sample_parties", "weight_moments", "weight_spread",
]
