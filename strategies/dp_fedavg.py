"""DP-FedAvg: Flower's own central-DP wrappers around the run's FedAvg/FedProx, and its accountant.

`dp-fedavg = server`: DifferentialPrivacyServerSideFixedClipping (the server clips each party's update to
`dp-clipping-norm`, averages, adds Gaussian noise of std z C / m); `client`:
DifferentialPrivacyClientSideFixedClipping (each party clips its own update through Flower's
`fixedclipping_mod`, see clients/app.py; the server averages and adds the same noise). z is
`dp-noise-multiplier`, m the parties sampled per round.

The wrappers' conditions, met here: the aggregate is the unweighted mean (every party reports
`equal-weight` = 1 and the strategy weights by it, so one party moves the mean by at most C / m);
every sampled party must reply (a short round would release a mean over fewer parties with noise sized
for m: the run aborts instead); the model has no BatchNorm buffers (model-norm group), so every array sent
is a clipped and noised weight. Sampling: a fixed-size sample of m of the N parties each round; the
accountant takes no credit for it (`no-amplification`, the only mode Flower's fixed-clipping accounting
accepts), so epsilon holds for any choice of the m parties.

Epsilon comes from Flower's RdpAccountant (Renyi DP over Google's dp-accounting): one Gaussian release
of noise multiplier z per aggregated round, party-level add-or-remove-one adjacency. The wrapper's
built-in accounting refuses strategies that override `aggregate_train` (ours records dropped parties and
sums in party order, then calls FedAvg's), so the same accountant is composed here, once per release.
"""

from __future__ import annotations

import numpy as np
from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from fedsmix.config import Settings
from fedsmix.seeding import derive_seed

SAMPLING = (
    "fixed-size sample of the parties each round, no amplification credited (Flower 'no-amplification'); "
    "party-level adjacency (add or remove one party)"
)


def sampled_per_round(settings: Settings, parties: int) -> int:
    """How many parties Flower's FedAvg samples each round (its own formula)."""
    return min(parties, max(int(parties * settings.fraction_train), settings.min_parties))


def wrap(strategy: Strategy, settings: Settings, sampled: int) -> Strategy:
    """The run's strategy inside Flower's fixed-clipping DP wrapper (server- or client-side clipping). Flower draws
    the noise from numpy's global generator: seeded here, a run is replayable."""
    wrapper = {"server": DifferentialPrivacyServerSideFixedClipping,
               "client": DifferentialPrivacyClientSideFixedClipping}.get(settings.dp_fedavg)
    if wrapper is None:
        raise ValueError(f"dp-fedavg: {settings.dp_fedavg!r} is not a DP mode; allowed: server, client")
    np.random.seed(derive_seed(settings.seed, "dp-fedavg-noise") % 2**32)
    return wrapper(strategy, settings.dp_noise_multiplier, settings.dp_clipping_norm, sampled)


def epsilon(noise_multiplier: float, releases: int, sampled: int, parties: int, delta: float) -> float:
    """Epsilon at `delta` after `releases` noisy aggregates, from Flower's RdpAccountant."""
    if releases == 0:
        return 0.0
    from flwr.serverapp import RdpAccountant

    accountant = RdpAccountant(PrivacyConfig(
        target_delta=delta, population_size=parties, neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
    ))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier, sampled, parties), count=releases)
    return accountant.get_privacy_spent().epsilon


def noise_for_epsilon(target: float, releases: int, sampled: int, parties: int, delta: float) -> float:
    """The smallest noise multiplier (to 0.1 %) whose `releases` aggregates spend at most `target`."""
    if target <= 0:
        raise ValueError(f"DP-FedAvg target epsilon must be > 0, got {target}")
    lo, hi = 1e-3, 1.0
    while epsilon(hi, releases, sampled, parties, delta) > target:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if epsilon(mid, releases, sampled, parties, delta) > target else (lo, mid)
    return hi


def report(settings: Settings, sampled: int, parties: int, released: list[int]) -> dict:
    """What results.json records about the guarantee."""
    return {
        "mode": f"{settings.dp_fedavg}-side fixed clipping",
        "wrapper": ("DifferentialPrivacyServerSideFixedClipping" if settings.dp_fedavg == "server"
                    else "DifferentialPrivacyClientSideFixedClipping + fixedclipping_mod"),
        "noise-multiplier": settings.dp_noise_multiplier,
        "clipping-norm": settings.dp_clipping_norm,
        "noise-std": settings.dp_noise_multiplier * settings.dp_clipping_norm / sampled,
        "delta": settings.dp_delta,
        "sampled-per-round": sampled,
        "parties": parties,
        "releases": len(released),
        "sampling": SAMPLING,
        "accountant": "Flower RdpAccountant (dp-accounting RDP)",
        "epsilon": epsilon(settings.dp_noise_multiplier, len(released), sampled, parties, settings.dp_delta),
    }
