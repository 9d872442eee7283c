"""Simulation-only ground truth: replay a party's seeded encoding, never read it off the upload.

Every random choice of a party derives from (seed, party, purpose), so the server's oracle can
rerun `load_partition -> encode_partition` and learn what the threat model grants (originals,
pairing, weights, radius). The replay must reproduce the stored upload (bit for bit, or within
one float16 rounding when parties upload float16); otherwise the oracle refuses, because any
score computed against a wrong replay would be fiction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedsmix.config import Settings
from fedsmix.encoders import Calibration, Encoded
from fedsmix.party import Partition, encode_partition, load_partition
from server.store import UploadStore


class ReplayMismatch(RuntimeError):
    """The replayed encoding is not what the party uploaded; the message names the party."""


@dataclass
class Replay:
    party: int
    partition: Partition  # the originals, in mixing space
    encoded: Encoded  # pairing, weights, noise: the party's secrets
    calibration: Calibration | None  # radius and Theorem 4.2's statistics (None: encoder=mixcon)

    @property
    def perm(self) -> torch.Tensor:
        return self.encoded.sources[:, 1]


def stored_upload(store: UploadStore, party: int) -> np.ndarray:
    """The encodings exactly as the server stored them (what the attack observes)."""
    entry = store.manifest.get(str(party))
    if entry is None:
        raise KeyError(f"party {party}: no stored upload (stored: {store.parties()})")
    return np.load(store.root / entry["x"]["file"])


def check_replay(party: int, replayed: np.ndarray, uploaded: np.ndarray) -> None:
    """Equal bit for bit (float32), or within one rounding to the uploaded dtype (float16)."""
    if replayed.shape != uploaded.shape:
        raise ReplayMismatch(f"party {party}: replay has shape {replayed.shape}, the upload {uploaded.shape}")
    if uploaded.dtype == replayed.dtype:
        same = np.array_equal(replayed, uploaded)
        worst = 0.0 if same else float(np.abs(replayed.astype(np.float64) - uploaded).max())
    else:
        rounded = replayed.astype(uploaded.dtype)
        half_ulp = np.spacing(np.abs(rounded)).astype(np.float64) / 2  # correct rounding is never further off
        diff = np.abs(replayed.astype(np.float64) - uploaded.astype(np.float64))
        same = bool((diff <= half_ulp).all())
        worst = float(diff.max())
    if not same:
        raise ReplayMismatch(
            f"party {party}: the replayed encoding differs from the stored upload (max |diff| {worst:.3g}, "
            f"dtype {uploaded.dtype}); refusing to score attacks against it"
        )


def replay_party(settings: Settings, party: int, num_parties: int, uploaded: np.ndarray,
                 encoder_state: dict[str, torch.Tensor] | None = None) -> Replay:
    """`encoder_state`: the cut-layer weights the server shipped (encoder=mixcon)."""
    part = load_partition(settings, party, num_parties)
    enc, calibration = encode_partition(settings, part, encoder_state=encoder_state)
    check_replay(party, enc.x.numpy(), uploaded)
    return Replay(party, part, enc, calibration)
