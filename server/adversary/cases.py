"""Cases: what the server saw from one party, plus what the threat model grants, with the truth.

An upload becomes an `Observation` (the encodings as received; the pairing, weights and radius a
simulation oracle replays for the strongest attacker); a FedAvg/FedProx round becomes a
`GradientObservation` (the party's weight change, trained by the party's own code). Also the
attacker's own knowledge: public data in the victims' space (pixels or backbone features) and
the box every private sample lies in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from fedsmix import data as datalib
from fedsmix.config import INSTAHIDE, Settings
from fedsmix.encoders import Calibration, Encoded
from fedsmix.models import new_classifier
from fedsmix.party import Partition, party_dp_sgd_noise, train_local
from fedsmix.space import load_public_pool, public_in_space
from fedsmix.training import StepTrace

from .base import GradientObservation, Observation

# The two threat models of the upload attacks (`attack-pairing`); every leakage table names its own.
THREAT_MODELS = {
    "oracle": "oracle pairing: the simulation hands the attacker the pairing pi, the weights and r (the paper's "
              "conservative threat model)",
    "recovered": "recovered pairing: pi and the weights are what the pairing attack recovers from the party's "
                 "upload (soft labels, a comparison score, a matching); r from the party's report",
}


def threat_model(settings: Settings) -> str:
    return THREAT_MODELS[settings.attack_pairing]


@dataclass
class Case:
    """One attacked observation and the ground truth of the rows that are scored.

    `rows` index the attack's reconstruction (all private samples of the observation); `truth`
    holds the originals of those rows. `align(truth, estimate)` may reorder an estimate whose
    order the attack cannot know (a batch reconstructed from a gradient). `weights`, `perm` and
    `radius` feed Theorem 4.1's bound where the pairing is a derangement of two-image mixes.
    """

    party: int
    observation: Observation | GradientObservation
    truth: torch.Tensor
    rows: torch.Tensor
    mixed: torch.Tensor | None = None  # the uploaded rows of the victims (figures)
    weights: torch.Tensor | None = None
    perm: torch.Tensor | None = None
    radius: float | None = None
    align: object | None = None
    info: dict = field(default_factory=dict)


def valid_bounds(settings: Settings, spec: datalib.DatasetSpec) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The box every private sample lies in where the mixing happens: normalised images of 0..1, or
    the backbone's activation range for features (EfficientNet-Lite0: [0, 6]; ResNets: >= 0)."""
    if settings.backbone == "none":
        return datalib.valid_range(spec)
    from fedsmix.features import feature_range

    return feature_range(settings)


def public_samples(settings: Settings, spec: datalib.DatasetSpec | None = None) -> torch.Tensor:
    """The attacker's public data in the victims' space (pixels of `spec`'s shape, e.g. resized victims)."""
    return public_in_space(settings, spec)


def observation(enc: Encoded, radius: float | None, spec: datalib.DatasetSpec | None = None,
                x_tilde: torch.Tensor | None = None, *,
                bounds: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
                public: torch.Tensor | None = None, prior_mean: torch.Tensor | None = None, **extras) -> Observation:
    """The strongest threat model of the paper: W (weights and pairing) and r known.

    x_tilde defaults to the encoder's output; the ServerApp passes the stored upload instead.
    The valid box is `bounds` when given (see `valid_bounds`), else the pixel range of `spec`,
    else none. `public` is the pool InstaHide's cross-dataset encodings drew from; `prior_mean`
    the attacker's data-free guess (the public mean sample).
    """
    x = enc.x if x_tilde is None else x_tilde
    if bounds is None:
        bounds = datalib.valid_range(spec) if spec is not None else (None, None)
    lo, hi = bounds
    if prior_mean is not None:
        extras["prior_mean"] = prior_mean
    return Observation(
        x_tilde=x.float(), n_private=int(enc.sources.max()) + 1, weights=enc.weights, sources=enc.sources,
        radius=None if radius is None else float(radius), public=public, public_sources=enc.public_sources,
        lo=lo, hi=hi, extras={"masked": enc.signs is not None, **extras},
    )


def upload_case(settings: Settings, part: Partition, enc: Encoded, calibration: Calibration | None,
                rows: torch.Tensor, *, uploaded: np.ndarray | torch.Tensor | None = None,
                bounds: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
                prior_mean: torch.Tensor | None = None, pairing=None, encoder: torch.nn.Module | None = None,
                **extras) -> Case:
    """A party's upload (as stored, when given; else as the encoder produced it, in the upload dtype)
    with the secrets the oracle replayed, scored on `rows` of the party's samples.

    `attack-pairing = "recovered"`: the observation's pairing and weights are what `pairing` (a
    `pairing.PairingAttack`) recovers from the upload and its soft labels; the oracle's pi only scores
    that recovery (extras["pairing-accuracy"]). Theorem 4.1's bound stays that of the true W.
    encoder=mixcon: the upload is h(x) and the white-box attacker holds h (`encoder`, required).
    """
    if uploaded is None:
        dtype = torch.float16 if settings.upload_dtype == "float16" else torch.float32
        x_tilde = enc.x.to(dtype).float()  # float16 uploads keep their precision for the attacks
    else:
        x_tilde = torch.as_tensor(np.asarray(uploaded, dtype=np.float32))
    if settings.encoder == "mixcon":
        if encoder is None:
            raise ValueError("upload_case: an encoder=mixcon upload is attacked with its network h (encoder=...)")
        return representation_case(part, x_tilde, encoder, rows, bounds=bounds or valid_bounds(settings, part.spec),
                                   prior_mean=prior_mean, encoder_name="mixcon", **extras)
    cross = settings.encoder == "instahide-cross"
    obs = observation(
        enc, calibration.radius if settings.encoder == "singularized" else None, x_tilde=x_tilde,
        bounds=bounds if bounds is not None else valid_bounds(settings, part.spec),
        public=load_public_pool(settings, part.spec) if cross else None, prior_mean=prior_mean,
        party=part.party, tau=settings.tau, encoder=settings.encoder, **extras,
    )
    two_image = settings.encoder == "singularized" and enc.weights.shape[1] == 2 and settings.encodings_per_sample == 1
    if settings.attack_pairing == "recovered":
        if pairing is None:
            raise ValueError("attack-pairing 'recovered' needs a pairing attack (server/adversary/pairing.py)")
        instahide = settings.encoder in INSTAHIDE  # a membership of every source, not one partner
        obs = pairing.observation(obs, enc.y, truth=enc.sources if instahide else enc.sources[:, 1])
    return Case(
        party=part.party, observation=obs, truth=part.x[rows], rows=rows, mixed=x_tilde[rows],
        weights=enc.weights if two_image else None, perm=enc.sources[:, 1] if two_image else None,
        radius=calibration.radius if two_image else None,
    )


def representation_case(part: Partition, z: torch.Tensor, encoder: torch.nn.Module, rows: torch.Tensor, *,
                        bounds: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
                        prior_mean: torch.Tensor | None = None, truth: torch.Tensor | None = None,
                        encoder_name: str = "mixcon", **extras) -> Case:
    """Uploaded representations z = h(x) of a party's samples, attacked by model inversion with h known.

    Each representation is inverted on its own, so the observation holds only the victims' rows `rows`.
    `truth` (default: the partition's samples) is what reconstructions are scored against, in the
    space h reads (normalised pixels for MixCon; for a backbone, the images it saw)."""
    lo, hi = bounds
    if prior_mean is not None:
        extras["prior_mean"] = prior_mean
    truth = (part.x if truth is None else truth)[rows]
    obs = Observation(x_tilde=z[rows].float(), n_private=len(rows), lo=lo, hi=hi, encoder=encoder,
                      input_shape=tuple(truth.shape[1:]),
                      extras={"party": part.party, "encoder": encoder_name, "masked": False, **extras})
    return Case(party=part.party, observation=obs, truth=truth, rows=torch.arange(len(rows)))


def update_case(settings: Settings, part: Partition, rows: torch.Tensor, *, proximal_mu: float, batch_size: int,
                local_epochs: int, device: str = "cpu", server_round: int = 1,
                global_state: dict[str, torch.Tensor] | None = None) -> Case:
    """The party's FedAvg/FedProx update in round `server_round` on `rows` (a batch of its samples), trained by
    the party's own `train_local` from `global_state` (default: the initial model, round 1's) with the run's
    defences, and what the oracle grants the strongest attacker: the labels, the batch's BatchNorm statistics
    (BN_exact), the dropout masks and, against a batch defence, the first step's mixing coefficients, sources
    and soft targets.

    With a batch defence the originals to recover are every private sample mixed into the first step's inputs;
    the case scores the victims `rows` among them. DP-FedAvg adds its noise to the aggregate, after the server
    has seen each update: the server sees the raw update (server-side clipping) or the clipped one (client-side)."""
    client = settings.replace(batch_size=batch_size, local_epochs=local_epochs)
    model = new_classifier(client, part.sample_shape, part.num_classes)
    if global_state is not None:
        model.load_state_dict(global_state)
    global_model = copy.deepcopy(model)
    trace = StepTrace()
    result = train_local(client, part, model.state_dict(), mode="federated", server_round=server_round,
                         proximal_mu=proximal_mu, device=device, rows=rows, trace=trace,
                         dp_noise_multiplier=party_dp_sgd_noise(settings, part))
    update = [
        g.detach() - w.detach().cpu()
        for g, w in zip(global_model.parameters(), result.model.parameters())
        if g.requires_grad
    ]
    if settings.dp_fedavg == "client":  # Flower's fixedclipping_mod scales the whole update to norm <= C before sending
        norm = float(torch.sqrt(sum(u.double().pow(2).sum() for u in update)))
        update = [u * min(1.0, settings.dp_clipping_norm / max(norm, 1e-30)) for u in update]
    if not trace.rows:
        raise ValueError(f"no local step on a batch of {len(rows)}: BatchNorm1d cannot train on a single sample")
    lo, hi = valid_bounds(settings, part.spec)
    first = trace.rows[0]  # the first step's rows in the order the party drew them (its dropout masks' order)
    labels = part.labels[first] if len(first) == len(rows) else part.labels[rows]
    obs = GradientObservation(
        model=global_model, update=update, labels=labels, sample_shape=part.sample_shape,
        batch_size=batch_size, local_steps=len(trace.rows), lr=client.client_lr, lo=lo, hi=hi,
        weight_decay=client.weight_decay, bn_stats=(trace.bn_stats[0] or None) if trace.bn_stats else None,
        dropout_masks=(trace.dropout_masks[0] or None) if trace.dropout_masks else None,
    )
    info = {"batch_size": batch_size, "local_steps": obs.local_steps, "round": server_round,
            "step_rows": first.tolist()}
    mix = trace.mixes[0] if trace.mixes else None
    if mix is None:
        return Case(party=part.party, observation=obs, truth=part.x[rows], rows=torch.arange(len(rows)),
                    align=match_rows, info=info)
    originals = mix.sources.unique()  # sorted rows of the partition that went into the first step's inputs
    obs.mix_weights, obs.mix_sources = mix.weights, torch.searchsorted(originals, mix.sources)
    obs.masked, obs.targets = mix.signs is not None, mix.y
    return Case(party=part.party, observation=obs, truth=part.x[rows], rows=torch.searchsorted(originals, rows),
                info={**info, "originals": len(originals)})


def match_rows(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """Order a batch's reconstructions like the truth: a gradient does not say which image is which, so each
    victim is paired with a distinct reconstruction by least total squared error (Hungarian)."""
    from scipy.optimize import linear_sum_assignment

    cost = torch.cdist(x.flatten(1).double(), x_hat.flatten(1).double()).pow(2).numpy()
    _, cols = linear_sum_assignment(cost)
    return x_hat[torch.from_numpy(cols)]
