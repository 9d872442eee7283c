"""Models: the paper's classifier head, a small CNN for pixels, split models (LeNet-5 cut after its
second conv block, MixCon's synthetic network), the attacker's U-Net."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import INSTAHIDE, Settings
from .defences import active


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


class SplitModel(nn.Module):
    """f = g o h: `encoder` h (the party's side, up to the cut layer) and `head` g (the server's side).

    forward is head(encoder(x)), exactly the unsplit network: a split model trained without the MixCon
    term is the vanilla model (the training loop calls encoder and head separately only for MixCon).
    """

    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class LeNet5Encoder(nn.Sequential):
    """LeNet-5 up to MixCon's cut (the output of the second conv block), flattened: 16 x 5 x 5 = 400
    values for 28 px inputs (conv 5x5 pad 2 -> ReLU -> max-pool 2 -> conv 5x5 -> ReLU -> max-pool 2)."""

    def __init__(self, in_channels: int):
        super().__init__(
            nn.Conv2d(in_channels, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )


class LeNet5Head(nn.Sequential):
    """LeNet-5 after the cut: 120 -> 84 -> classes, ReLU between."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__(
            nn.Flatten(), nn.Linear(in_features, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )


def lenet5_cut_features(sample_shape: tuple[int, ...]) -> int:
    """Values at LeNet-5's cut for (C, H, W) images: 16 x ((H/2 - 4)/2) x ((W/2 - 4)/2)."""
    if len(sample_shape) != 3 or min(sample_shape[1:]) < 12:
        raise ValueError(f"model 'lenet5' needs images (C, H, W) of at least 12 px, got shape {tuple(sample_shape)}")
    h, w = ((side // 2 - 4) // 2 for side in sample_shape[1:])
    return 16 * h * w


def lenet5(sample_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    return SplitModel(LeNet5Encoder(sample_shape[0]), LeNet5Head(lenet5_cut_features(sample_shape), num_classes))


class SyntheticSplitNet(SplitModel):
    """MixCon's synthetic network (section 4.2): h(x) = W2 relu(W1 x + b1) + b2 (10 -> 500 -> 2) and
    g(z) = W4 relu(W3 relu(z) + b3) + b4 (2 -> 100 -> 2); `deeper` adds two 100-unit layers to g,
    `width` sets g's hidden width (2048: the paper's "wider"). Every weight and bias entry starts
    from N(u_k, 1) with u_k ~ N(0, init_alpha) per layer k, as the paper initialises it."""

    def __init__(self, d: int = 10, hidden: int = 500, cut: int = 2, width: int = 100, classes: int = 2,
                 deeper: bool = False, init_alpha: float | None = None, generator: torch.Generator | None = None):
        head: list[nn.Module] = [nn.ReLU(), nn.Linear(cut, width), nn.ReLU()]
        if deeper:
            head += [nn.Linear(width, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU()]
            width = 100
        super().__init__(nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, cut)),
                         nn.Sequential(*head, nn.Linear(width, classes)))
        if init_alpha is not None:
            for layer in (m for m in self.modules() if isinstance(m, nn.Linear)):
                u = torch.randn((), generator=generator) * math.sqrt(init_alpha)
                with torch.no_grad():
                    for p in (layer.weight, layer.bias):
                        p.copy_(torch.randn(p.shape, generator=generator) + u)


def build_classifier(kind: str, sample_shape: tuple[int, ...], num_classes: int, cnn_width: int = 32) -> nn.Module:
    """'auto' picks the paper's head for feature vectors and tiny images, a CNN for real images.

    'lenet5' is the split LeNet-5 for images and its head alone for cut-layer representations (what
    the server trains on the uploads of encoder=mixcon).
    """
    is_image = len(sample_shape) == 3 and sample_shape[-1] >= 16
    if kind == "auto":
        kind = "cnn" if is_image else "mlp"
    if kind == "lenet5":
        if len(sample_shape) == 1:
            return LeNet5Head(sample_shape[0], num_classes)
        return lenet5(sample_shape, num_classes)
    if kind == "mlp":
        return MLPHead(math.prod(sample_shape), num_classes)
    if kind == "cnn":
        if len(sample_shape) != 3:
            raise ValueError(f"model 'cnn' needs image inputs (C, H, W), got shape {sample_shape}")
        return SmallCNN(sample_shape[0], num_classes, sample_shape[-1], width=cnn_width)
    raise ValueError(f"model: unknown {kind!r}; allowed: auto, mlp, cnn, lenet5")


def model_kind(settings: Settings) -> str:
    """The configured model; encoder=mixcon means the split LeNet-5 (and its head on representations)."""
    return "lenet5" if settings.encoder == "mixcon" and settings.model == "auto" else settings.model


def new_classifier(settings: Settings, sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The run's classifier; the same initial weights for every strategy and party (seeded), as the run's
    defences shape it (model-norm 'group' swaps BatchNorm for GroupNorm: fedsmix/defences.py)."""
    torch.manual_seed(settings.seed)
    model = build_classifier(model_kind(settings), sample_shape, num_classes, settings.cnn_width)
    for _, defence in active(settings):
        if defence.model is not None:
            model = defence.model(settings, model)
    return model


class Absolute(nn.Module):
    """|x| as a fixed first layer. InstaHide's sign mask is uniform and independent of the image, so |x~| keeps
    everything a masked input says about its image: a model behind this layer need not learn sign invariance
    (measured: docs/results/defences.md, InstaHide at its own protocol). Clean inputs go through it alike."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs()


def union_classifier(settings: Settings, sample_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model mixup-union's trainer fits on the union: the run's classifier, behind the |x| layer when the
    uploads are sign-masked (the InstaHide encoders). The parties rebuild the same to score and recalibrate it."""
    model = new_classifier(settings, sample_shape, num_classes)
    return nn.Sequential(Absolute(), model) if settings.encoder in INSTAHIDE else model


SPLIT_MODEL_FILE = "mixcon-split.pt"  # encoder=mixcon: <run dir>/models/<this>, the FedAvg-trained split model


def load_split_model(settings: Settings, run_dir, sample_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """The split model an encoder=mixcon run trained (h is its `.encoder`): what the server shipped."""
    from pathlib import Path

    path = Path(run_dir) / "models" / SPLIT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no split model; was this an encoder=mixcon mixup-union run?")
    model = new_classifier(settings, sample_shape, num_classes)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval()


def cut_shape(settings: Settings, sample_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of one cut-layer representation h(x) that a mixcon party uploads."""
    return (lenet5_cut_features(sample_shape),)


@torch.no_grad()
def represent(encoder: nn.Module, x, device: str = "cpu", batch_size: int = 1024) -> torch.Tensor:
    """h(x) for a whole partition, in batches, on `device`; returned on the CPU (float32)."""
    encoder = encoder.to(device).eval()
    out = [encoder(x[s : s + batch_size].to(device, torch.float32)).float().cpu() for s in range(0, len(x), batch_size)]
    return torch.cat(out) if out else torch.empty(0)


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
    """Appendix F: three poolings, DoubleConv widths C -> B -> 2B -> 4B -> 8B and back, 1x1 out (to `out_channels`,
    default C)."""

    def __init__(self, channels: int = 3, width: int = 48, out_channels: int | None = None):
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
        self.out = nn.Conv2d(b, out_channels or channels, 1)
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
