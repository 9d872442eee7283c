"""Never trust an upload: check keys, dtypes, shapes, values, labels and sizes before use."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fedsmix import messages as wire

ALLOWED_DTYPES = (np.float32, np.float16)
REQUIRED_METRICS = ("party", "num-examples")


class UploadRejected(ValueError):
    """An upload failed a check; names the party and the field."""

    def __init__(self, party: str, field: str, reason: str):
        super().__init__(f"party {party}: field {field!r}: {reason}")
        self.party, self.field, self.reason = party, field, reason


@dataclass(frozen=True)
class Expectation:
    sample_shape: tuple[int, ...]
    num_classes: int
    max_samples: int
    max_bytes: int
    label_tolerance: float = 1e-3


@dataclass
class ValidUpload:
    party: int
    x: np.ndarray
    y: np.ndarray
    metrics: dict
    nbytes: int


def validate_upload(content: RecordDict, who: str, expect: Expectation, seen_parties: set[int]) -> ValidUpload:
    """Return the upload's arrays when every check passes; raise UploadRejected otherwise.

    `who` names the sender (node id) until the upload proves its party id.
    """
    upload = content.get(wire.UPLOAD)
    if not isinstance(upload, ArrayRecord):
        raise UploadRejected(who, wire.UPLOAD, f"missing ArrayRecord {wire.UPLOAD!r}")
    metrics = content.get(wire.METRICS)
    if not isinstance(metrics, MetricRecord):
        raise UploadRejected(who, wire.METRICS, f"missing MetricRecord {wire.METRICS!r}")
    for key in REQUIRED_METRICS:
        if key not in metrics:
            raise UploadRejected(who, f"metrics.{key}", "missing")
    party = int(metrics["party"])
    who = str(party)
    if party in seen_parties:
        raise UploadRejected(who, "party", "duplicate upload: one upload per party per run")
    extra = set(upload.keys()) - {"x", "y"}
    if extra:
        raise UploadRejected(who, "upload", f"unexpected arrays {sorted(extra)}: only 'x' and 'y' may be uploaded")
    for key in ("x", "y"):
        if key not in upload:
            raise UploadRejected(who, f"upload.{key}", "missing")
    nbytes = sum(len(upload[k].data) for k in ("x", "y"))
    if nbytes > expect.max_bytes:
        raise UploadRejected(who, "upload", f"payload of {nbytes:,} bytes exceeds the limit of {expect.max_bytes:,}")
    for key in ("x", "y"):
        dtype = np.dtype(upload[key].dtype)
        if dtype not in [np.dtype(d) for d in ALLOWED_DTYPES]:
            raise UploadRejected(who, f"upload.{key}", f"dtype {dtype} not allowed; expected float32 or float16")
    try:
        x, y = upload["x"].numpy(), upload["y"].numpy()
    except Exception as err:  # corrupt bytes
        raise UploadRejected(who, "upload", f"cannot decode arrays: {err}") from None
    n = len(x) if x.ndim else 0
    if n == 0:
        raise UploadRejected(who, "upload.x", "empty upload")
    if n > expect.max_samples:
        raise UploadRejected(who, "upload.x", f"{n} samples exceed the limit of {expect.max_samples}")
    if tuple(x.shape[1:]) != tuple(expect.sample_shape):
        raise UploadRejected(
            who, "upload.x", f"sample shape {tuple(x.shape[1:])}, expected {tuple(expect.sample_shape)}"
        )
    if y.ndim != 2 or y.shape[1] != expect.num_classes:
        raise UploadRejected(who, "upload.y", f"shape {tuple(y.shape)}, expected (n, {expect.num_classes}) soft labels")
    if len(y) != n:
        raise UploadRejected(who, "upload.y", f"{len(y)} label rows for {n} samples")
    if int(metrics["num-examples"]) != n:
        raise UploadRejected(who, "metrics.num-examples", f"says {int(metrics['num-examples'])}, upload has {n}")
    counts = metrics.get("validation-counts")
    if counts is not None and not (isinstance(counts, list) and len(counts) == expect.num_classes
                                   and all(isinstance(c, int) and c >= 0 for c in counts)):
        raise UploadRejected(who, "metrics.validation-counts",
                             f"expected {expect.num_classes} non-negative class counts, got {counts!r}")
    if not np.isfinite(x).all():
        raise UploadRejected(who, "upload.x", f"{int((~np.isfinite(x)).sum())} non-finite values (NaN/Inf)")
    if not np.isfinite(y).all():
        raise UploadRejected(who, "upload.y", "non-finite label values (NaN/Inf)")
    if (y < 0).any():
        raise UploadRejected(who, "upload.y", f"{int((y < 0).sum())} negative label entries")
    sums = y.astype(np.float64).sum(axis=1)
    worst = float(np.abs(sums - 1).max())
    if worst > expect.label_tolerance:
        raise UploadRejected(
            who, "upload.y", f"label rows must sum to 1 (worst row sums to {sums[np.abs(sums - 1).argmax()]:.4f})"
        )
    return ValidUpload(party, x, y, {k: metrics[k] for k in metrics}, nbytes)


def vote_problem(votes: dict[str, tuple], sizes: set[int] | None) -> tuple[str, str] | None:
    """Why a party's validation answers cannot be counted, as (field, reason), or None. `votes`: scored model ->
    (correct, n). Each answer is there, both counts whole numbers with 0 <= correct <= n, and n one of the `sizes`
    the party's validation split can have (from what it reported of itself; None: unknown), for a party that
    claimed a larger split would outvote the others."""
    for name, (correct, n) in votes.items():
        if correct is None or n is None:
            return name, "no answer"
        if not float(correct).is_integer() or not float(n).is_integer():
            return f"{name}.{'n' if float(correct).is_integer() else 'correct'}", "not a whole number"
        if not 0 <= correct <= n:
            return f"{name}.correct", f"{correct:g} correct of {n:g}"
        if sizes is not None and n not in sizes:
            return f"{name}.n", f"scored on {n:g} rows; its validation split has {' or '.join(map(str, sorted(sizes)))}"
    return None
