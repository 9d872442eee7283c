"""Fault injection for tests and demos, configured by the run setting `fault`.

`fault = "raise:1;timeout:2;nan:3"` makes party 1 raise, party 2 stall past the reply
timeout and party 3 upload NaNs. Corruptions exercise the server's upload validation
through the real message path; they never touch honest parties. `interrupt:E` stops the
server's central training after epoch E, as a crash would (resume with `resume=<run dir>`).

Dishonest parties send well-formed uploads that pass every validation check:
`scale:P` (encoded inputs times `fault-scale`), `garbage:P` (random inputs with the upload's own
per-coordinate mean and spread, labels kept), `label-flip:P` (classes permuted by a derangement),
`replay:P` (another party's upload, fedsmix.party.replayed_upload). In FedAvg/FedProx `scale:P`
scales and `sign-flip:P` negates the model update, and `label-flip:P` trains on permuted classes.

Fault families, each with a strength, for measuring where a fault starts to cost and where a check catches
it (benchmarks/plausibility.py): `scale-report:P` (inputs and every reported norm times `fault-scale`: a
party consistent with itself), `shift:P` (every row moved by `fault-strength` x the upload's spread, in one
random direction), `partial-garbage:P`, `label-noise:P` (that share of the rows random, or with classes
permuted), `label-target:P` (that share of the rows of the party's commonest class relabelled as the next).

A consistent liar (`relabel-target:P`, `relabel-flip:P`) relabels its own data before anything else: its upload, the
class counts of its validation split, its validation votes and its FedAvg/FedProx training all tell the same lie, so
no check that holds a party to its own word can see it (fedsmix.party.load_partition applies `relabel`).
A dishonest voter (`vote-invert:P`) is honest in everything but its selection answers: it reports n - correct of
its true split for every model it scores, so it favours the candidates (and FedAvg/FedProx rounds) that do worst;
`vote-inflate:P` answers its counts times `fault-scale`, as if its split were that much larger (a loud voter).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedsmix.config import FAULT_CORRUPTIONS as CORRUPTIONS
from fedsmix.config import FAULT_RELABELS as RELABELS
from fedsmix.config import parse_faults as parse

UPLOAD_FAULTS = ("scale", "garbage", "label-flip", "replay",  # well-formed, dishonest uploads
                 "scale-report", "shift", "partial-garbage", "label-noise", "label-target")
UPDATE_FAULTS = ("scale", "sign-flip")  # dishonest FedAvg/FedProx model updates


class InjectedFault(RuntimeError):
    pass


def maybe_fail(spec: str, party: int, phase: str, timeout: float) -> None:
    """Raise, or stall past the server's reply timeout, when this party is listed."""
    if not spec:
        return
    faults = parse(spec)
    if party in faults.get("raise", ()):
        raise InjectedFault(f"party {party}: injected fault during {phase}")
    if party in faults.get("timeout", ()):
        # the server stops waiting `timeout` s after the last reply it got: twice that (and a margin) outlasts the
        # wait whenever the other parties answered within `timeout` of the push
        time.sleep(2.0 * timeout + 2.0)
        raise InjectedFault(f"party {party}: injected timeout during {phase}")


def interrupt_after(spec: str):
    """An `on_epoch` hook that crashes central training after the configured epoch, or None."""
    epochs = parse(spec).get("interrupt") if spec else None
    if not epochs:
        return None
    stop = min(epochs)

    def on_epoch(epoch: int, loss: float) -> None:
        if epoch == stop:
            raise InjectedFault(f"server: injected interruption of central training after epoch {epoch}")

    return on_epoch


def listed(spec: str, party: int, kinds: tuple[str, ...]) -> str | None:
    """The first of `kinds` that the fault spec lists this party for, or None."""
    if not spec:
        return None
    for kind, parties in parse(spec).items():
        if kind in kinds and party in parties:
            return kind
    return None


def corruption(spec: str, party: int) -> str | None:
    """What this party does to its mixup-union upload (a malformed or a dishonest kind), or None."""
    return listed(spec, party, CORRUPTIONS + UPLOAD_FAULTS)


def derangement(n: int, generator: torch.Generator) -> np.ndarray:
    """A uniformly random permutation of n classes without a fixed point (every class moves)."""
    while True:
        perm = torch.randperm(n, generator=generator).numpy()
        if not (perm == np.arange(n)).any():
            return perm


def flip_classes(y, generator: torch.Generator):
    """Labels (one-hot or soft, numpy or torch) with their classes permuted: column j holds class perm[j]."""
    perm = derangement(y.shape[1], generator)
    return y[:, torch.from_numpy(perm)] if isinstance(y, torch.Tensor) else y[:, perm]


def relabel(kind: str, labels: np.ndarray, num_classes: int, strength: float, generator: torch.Generator) -> np.ndarray:
    """A consistent liar's labels for every row it holds (training and validation rows alike): `relabel-target`
    moves a `strength` share of its commonest class's rows to the next class, `relabel-flip` permutes the classes
    by a derangement. A copy; the same generator gives the same lie in every call."""
    labels = np.asarray(labels, dtype=np.int64).copy()
    if kind == "relabel-flip":
        return derangement(num_classes, generator)[labels]
    if kind != "relabel-target":
        raise ValueError(f"fault {kind!r} is not a relabelling; allowed: {', '.join(RELABELS)}")
    common = int(np.argmax(np.bincount(labels, minlength=num_classes)))
    holders = np.flatnonzero(labels == common)
    if len(holders):
        labels[holders[_rows(len(holders), strength, generator)]] = (common + 1) % num_classes
    return labels


def vote(spec: str, party: int, counts: dict[str, int], scale: float = 1.0) -> dict[str, int]:
    """What this party answers for one scored model: its counts ({"correct", "n"}) as they are; as a
    `vote-invert` party, the wrong answers counted as right; as a `vote-inflate` party, both times `scale`."""
    kind = listed(spec, party, ("vote-invert", "vote-inflate"))
    if kind == "vote-invert":
        return {**counts, "correct": int(counts["n"]) - int(counts["correct"])}
    if kind == "vote-inflate":
        return {**counts, "correct": round(scale * int(counts["correct"])), "n": round(scale * int(counts["n"]))}
    return counts


def falsify_update(
    kind: str, state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """A dishonest FedAvg/FedProx reply: the update (trained minus received weights) scaled or negated,
    in every floating-point entry of the state (integer counters are sent as trained)."""
    factor = -1.0 if kind == "sign-flip" else scale
    out = {}
    for key, value in state.items():
        if value.is_floating_point():
            base = reference[key].to(value.dtype)
            out[key] = base + factor * (value - base)
        else:
            out[key] = value
    return out


def _rows(n: int, share: float, generator: torch.Generator) -> np.ndarray:
    """A random `share` of n rows (at least one), sorted."""
    return np.sort(torch.randperm(n, generator=generator)[: max(1, round(share * n))].numpy())


def corrupt(
    kind: str,
    arrays: dict[str, np.ndarray],
    metrics: dict,
    scale: float = 100.0,
    generator: torch.Generator | None = None,
    strength: float = 1.0,
) -> tuple[dict[str, np.ndarray], dict]:
    """Return a dishonest version of an upload (a copy: the honest one is untouched). `scale`, `strength` and
    `generator` (the party's own "fault" stream) serve the kinds that need them."""
    x, y, metrics = arrays["x"].copy(), arrays["y"].copy(), dict(metrics)
    extra: dict[str, np.ndarray] = {}
    if kind in ("garbage", "label-flip", "shift", "partial-garbage", "label-noise", "label-target") \
            and generator is None:
        raise ValueError(f"fault {kind!r} needs the party's generator")
    if kind in ("scale", "scale-report"):
        x = (x.astype(np.float64) * scale).astype(x.dtype)
        if kind == "scale-report":  # every reported norm with it: c, m_f and the SNR bound are scale-free
            for key, power in (("V", 2), ("D", 1), ("radius", 1), ("calibration-variance", 2), ("lambda-max", 2)):
                if key in metrics:
                    metrics[key] = float(metrics[key]) * scale**power
    elif kind in ("garbage", "partial-garbage"):  # the upload's own per-coordinate mean and spread: a plausible scale
        flat = x.reshape(len(x), -1).astype(np.float64)
        rows = np.arange(len(flat)) if kind == "garbage" else _rows(len(flat), strength, generator)
        noise = torch.randn((len(rows), flat.shape[1]), generator=generator, dtype=torch.float64).numpy()
        flat[rows] = flat.mean(0) + flat.std(0) * noise
        x = flat.astype(x.dtype).reshape(x.shape)
    elif kind == "shift":  # one direction for every row, `strength` x the rows' spread (centred norm) long
        flat = x.reshape(len(x), -1).astype(np.float64)
        spread = float(np.sqrt(((flat - flat.mean(0)) ** 2).sum(axis=1).mean()))
        direction = torch.randn(flat.shape[1], generator=generator, dtype=torch.float64).numpy()
        x = (flat + strength * spread * direction / np.linalg.norm(direction)).astype(x.dtype).reshape(x.shape)
    elif kind == "label-flip":
        y = np.ascontiguousarray(flip_classes(y, generator))
    elif kind == "label-noise":
        rows = _rows(len(y), strength, generator)
        y[rows] = np.ascontiguousarray(flip_classes(y[rows], generator))
    elif kind == "label-target":  # rows holding the commonest class: that class's mass moved to the next class
        common = int(np.argmax((y > 0).sum(axis=0)))
        holders = np.flatnonzero(y[:, common] > 0)
        rows = holders[_rows(len(holders), strength, generator)] if len(holders) else holders
        target = (common + 1) % y.shape[1]
        y[rows, target] += y[rows, common]
        y[rows, common] = 0.0
    elif kind == "nan":
        x.reshape(-1)[0] = np.nan
    elif kind == "inf":
        x.reshape(-1)[-1] = np.inf
    elif kind == "shape":
        x = x.reshape(len(x), -1)[:, :-1].copy()
    elif kind == "dtype":
        x = x.astype(np.float64)
    elif kind == "negative-labels":
        y[0, 0], y[0, 1] = -0.5, y[0, 1] + 0.5 + y[0, 0]
    elif kind == "label-sum":
        y = y * 2.0
    elif kind == "class-count":
        y = np.concatenate([y, np.zeros((len(y), 1), y.dtype)], axis=1)
    elif kind == "empty":
        x, y = x[:0], y[:0]
        metrics["num-examples"] = 0
    elif kind == "oversized":
        x, y = np.concatenate([x] * 64), np.concatenate([y] * 64)
        metrics["num-examples"] = len(x)
    elif kind == "duplicate":
        metrics["party"] = 0  # claims to be party 0
    elif kind == "missing-key":
        return {"x": x}, metrics
    elif kind == "extra-key":
        extra["rows"] = np.arange(len(x), dtype=np.float32)  # would leak row indices
    elif kind == "count-mismatch":
        metrics["num-examples"] = len(x) + 1
    elif kind == "class-counts":  # its validation split's class counts one class short
        metrics["validation-counts"] = list(metrics.get("validation-counts", [0, 0]))[:-1]
    return {"x": x, "y": y, **extra}, metrics
