"""The paper's figure: rows original / mixed / recovered, one column per setting (tau or party)."""

from __future__ import annotations

from pathlib import Path

import torch


def unit_images(x: torch.Tensor, to_unit) -> torch.Tensor:
    """Normalised images -> [0, 1] for display."""
    return to_unit(x.float()).clamp(0, 1)


def stretched(x: torch.Tensor) -> torch.Tensor:
    """Per-image min-max scaling: encodings leave the valid range (by a factor of 10^3 at tau = 1e-6)."""
    flat = x.float().reshape(len(x), -1)
    lo, hi = flat.min(dim=1).values, flat.max(dim=1).values
    scaled = (flat - lo[:, None]) / (hi - lo).clamp_min(1e-12)[:, None]
    return scaled.reshape(x.shape)


def recovery_grid(path: Path, columns: list[str], rows: dict[str, torch.Tensor], title: str = "") -> Path:
    """rows: label -> (len(columns), C, H, W) images in [0, 1]. Saves a PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows, n_cols = len(rows), len(columns)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(1.35 * n_cols + 0.8, 1.35 * n_rows + 0.5), squeeze=False)
    for r, (label, images) in enumerate(rows.items()):
        for c in range(n_cols):
            ax = axes[r][c]
            image = images[c].detach().cpu().float()
            if image.shape[0] == 1:
                ax.imshow(image[0].numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            else:
                ax.imshow(image.permute(1, 2, 0).numpy(), vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(columns[c], fontsize=8)
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
