"""The one place that picks a device: CUDA when present and allowed, CPU otherwise."""

from __future__ import annotations

import torch


def select_device(preference: str = "auto") -> str:
    if preference == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if preference == "cuda":
        raise RuntimeError("device: 'cuda' was requested but torch sees no CUDA device; use 'auto' or 'cpu'")
    return "cpu"
