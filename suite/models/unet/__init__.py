"""U-Net (Ronneberger et al., "U-Net: Convolutional Networks for Biomedical Image Segmentation",
MICCAI 2015), from code: a contracting and an expanding path joined by skip connections, trained
with per-pixel cross-entropy plus soft Dice."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel


def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 5, base: int = 16) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(5)]
        self.down = nn.ModuleList([double_conv(in_channels, widths[0])])
        self.down.extend(double_conv(widths[i], widths[i + 1]) for i in range(4))
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(4))
        )
        self.merge = nn.ModuleList(
            double_conv(2 * widths[i], widths[i]) for i in reversed(range(4))
        )
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        x = skips.pop()
        for up, merge in zip(self.up, self.merge, strict=True):
            x = merge(torch.cat([up(x), skips.pop()], dim=1))
        return self.head(x)


def dice_loss(logits: torch.Tensor, target: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    probs = logits.softmax(1)
    onehot = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).to(probs.dtype)
    inter = (probs * onehot).sum((0, 2, 3))
    union = probs.sum((0, 2, 3)) + onehot.sum((0, 2, 3))
    return 1 - ((2 * inter + eps) / (union + eps)).mean()


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        size = int(self.setting("image_size", device, 96))
        classes = int(self.setting("num_classes", device, 5))
        self.model = UNet(3, classes, int(self.setting("base_channels", device, 16))).to(device)
        self.example_inputs = (torch.randn(self.batch_size, 3, size, size, device=device),)
        self.masks = torch.randint(0, classes, (self.batch_size, size, size), device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(*self.example_inputs)
        loss = F.cross_entropy(logits, self.masks) + dice_loss(logits, self.masks)
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs).argmax(1),)
