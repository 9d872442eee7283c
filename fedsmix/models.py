"""Models: the paper's classifier head, a small CNN for pixels, the attacker's U-Net."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import Settings


class MLPHead(nn.Module):
    """Paper eq. (8): Flatten -> [Linear-BN-GELU-Dropout(0.5)] x 2 -> Linear."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, int] = (1024, 512), dropout: float = 0.5):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden[0]),
            nn.BatchNorm1d(hidden[0]),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden[0], hidden[1]),
            nn.BatchNorm1d(hidden[1]),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden[1], num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Two conv blocks and a linear layer: enough for 28-32 px images on a CPU."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(2 * width * side * side, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_classifier(kind: str, sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """'auto' picks the paper's head for feature vectors and tiny images, a CNN for real images."""
    is_image = len(sample_shape) == 3 and sample_shape[-1] >= 16
    if kind == "auto":
        kind = "cnn" if is_image else "mlp"
    if kind == "mlp":
        return MLPHead(math.prod(sample_shape), num_classes)
    if kind == "cnn":
        if len(sample_shape) != 3:
            raise ValueError(f"model 'cnn' needs image inputs (C, H, W), got shape {sample_shape}")
        return SmallCNN(sample_shape[0], num_classes, sample_shape[-1])
    raise ValueError(f"model: unknown {kind!r}; allowed: auto, mlp, cnn")


def new_classifier(settings: Settings, sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The run's classifier; the same initial weights for every strategy and party (seeded).

    model-norm 'group' swaps every BatchNorm for GroupNorm through Opacus' ModuleValidator.fix
    (min(32, channels) groups; no running statistics), which DP-SGD and DP-FedAvg need; its ReLUs
    stop working in place (Opacus' backward hooks forbid editing their outputs in place)."""
    torch.manual_seed(settings.seed)
    model = build_classifier(settings.model, sample_shape, num_classes)
    if settings.model_norm == "group":
        from opacus.validators import ModuleValidator

        model = ModuleValidator.fix(model)
        for module in model.modules():
            if isinstance(module, nn.ReLU):
                module.inplace = False
    return model


class DoubleConv(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )


class UNet(nn.Module):
    """Appendix F: three poolings, DoubleConv widths C -> B -> 2B -> 4B -> 8B and back, 1x1 out."""

    def __init__(self, channels: int = 3, width: int = 48):
        super().__init__()
        b = width
        self.enc = nn.ModuleList([DoubleConv(channels, b), DoubleConv(b, 2 * b), DoubleConv(2 * b, 4 * b)])
        self.bottleneck = DoubleConv(4 * b, 8 * b)
        self.up = nn.ModuleList(
            [
                nn.ConvTranspose2d(8 * b, 4 * b, 2, 2),
                nn.ConvTranspose2d(4 * b, 2 * b, 2, 2),
                nn.ConvTranspose2d(2 * b, b, 2, 2),
            ]
        )
        self.dec = nn.ModuleList([DoubleConv(8 * b, 4 * b), DoubleConv(4 * b, 2 * b), DoubleConv(2 * b, b)])
        self.out = nn.Conv2d(b, channels, 1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        pad_h, pad_w = (-h) % 8, (-w) % 8  # three poolings need sides divisible by 8 (MNIST is 28)
        if pad_h or pad_w:
            x = nn.functional.pad(x, (0, pad_w, 0, pad_h), mode="replicate")
        skips = []
        for block in self.enc:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for up, block, skip in zip(self.up, self.dec, reversed(skips)):
            x = block(torch.cat([up(x), skip], dim=1))
        return self.out(x)[..., :h, :w]
