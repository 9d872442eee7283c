"""Seeds derived from (run seed, party, purpose): every random choice is replayable."""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *parts: object) -> int:
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, *parts: object, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh torch.Generator for one purpose; same inputs give the same stream."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *parts))
    return gen
