"""Fault injection for tests and demos, configured by the run setting `fault`.

`fault = "raise:1;timeout:2;nan:3"` makes party 1 raise, party 2 stall past the reply
timeout and party 3 upload NaNs. Corruptions exercise the server's upload validation
through the real message path; they never touch honest parties. `interrupt:E` stops the
server's central training after epoch E, as a crash would (resume with `resume=<run dir>`).
"""

from __future__ import annotations

import time

import numpy as np

from fedsmix.config import FAULT_CORRUPTIONS as CORRUPTIONS
from fedsmix.config import parse_faults as parse


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
        time.sleep(timeout + 2.0)  # the server stopped waiting `timeout` s after it sent the message
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


def corruption(spec: str, party: int) -> str | None:
    if not spec:
        return None
    for kind, parties in parse(spec).items():
        if kind in CORRUPTIONS and party in parties:
            return kind
    return None


def corrupt(kind: str, arrays: dict[str, np.ndarray], metrics: dict) -> tuple[dict[str, np.ndarray], dict]:
    """Return a dishonest version of an upload (a copy: the honest one is untouched)."""
    x, y, metrics = arrays["x"].copy(), arrays["y"].copy(), dict(metrics)
    extra: dict[str, np.ndarray] = {}
    if kind == "nan":
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
    return {"x": x, "y": y, **extra}, metrics
