"""What every encoder returns: the upload, plus the secrets that never leave the party."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Encoded:
    """x and y are uploaded; everything else stays with the party (or a simulation oracle).

    sources[i, j] indexes the party's private rows mixed into encoding i with weight
    weights[i, j]; -1 marks a public image (InstaHide cross-dataset).
    """

    x: torch.Tensor
    y: torch.Tensor
    weights: torch.Tensor
    sources: torch.Tensor
    noise: torch.Tensor | None = None  # e_i before weighting (singularized mixup)
    signs: torch.Tensor | None = None  # InstaHide masks, shaped like x
    public_sources: torch.Tensor | None = None  # rows of the public pool, -1 where private

    def __len__(self) -> int:
        return len(self.x)

    def select(self, rows: torch.Tensor) -> Encoded:
        """The encodings `rows` only (the post-processing screen discards the others)."""
        pick = (lambda t: None if t is None else t[rows])
        return Encoded(**{name: pick(getattr(self, name)) for name in Encoded.__dataclass_fields__})


def concat(parts: list[Encoded], rows: int) -> Encoded:
    """Join T encodings of the same private rows (encodings-per-sample)."""
    if len(parts) == 1:
        return parts[0]

    def cat(name: str) -> torch.Tensor | None:
        values = [getattr(p, name) for p in parts]
        return None if values[0] is None else torch.cat(values)

    return Encoded(**{name: cat(name) for name in Encoded.__dataclass_fields__})
