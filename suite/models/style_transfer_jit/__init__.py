"""Fast neural style transfer (Johnson, Alahi & Fei-Fei, "Perceptual Losses for Real-Time Style
Transfer and Super-Resolution", arXiv:1603.08155; the shape of PyTorch's ``fast_neural_style``
example), from code, run as TorchScript.

The image transformation network (reflection padding, strided convolutions, instance norm, five
residual blocks, nearest-neighbour upsampling) and the loss network are compiled with
``torch.jit.script``: every step runs in the TorchScript interpreter, the path of the TorchBench
paper's TorchScript regressions (arXiv:2304.14226, Table 4). The loss network is a frozen, random,
VGG-like stack of 3x3 convolutions (no pretrained weights are downloaded); the loss is the
paper's: content (MSE of features), style (MSE of Gram matrices against a fixed random style
image) and total variation; Adam (lr 1e-3) in its fused single-kernel form on every device. Eval
runs the network as TorchBench's TorchScript backend does for inference: scripted, frozen
(``torch.jit.freeze``) and passed through ``torch.jit.optimize_for_inference`` (oneDNN layouts on
CPU).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

CONTENT_WEIGHT = 1e5
STYLE_WEIGHT = 1e10
TV_WEIGHT = 1e-6


class ConvLayer(nn.Module):
    def __init__(
        self, cin: int, cout: int, kernel: int, stride: int = 1, upsample: int = 1
    ) -> None:
        super().__init__()
        self.upsample = upsample
        self.pad = nn.ReflectionPad2d(kernel // 2)
        self.conv = nn.Conv2d(cin, cout, kernel, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample > 1:
            x = F.interpolate(x, scale_factor=float(self.upsample), mode="nearest")
        return self.conv(self.pad(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = ConvLayer(channels, channels, 3)
        self.in1 = nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, 3)
        self.in2 = nn.InstanceNorm2d(channels, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.in2(self.conv2(F.relu(self.in1(self.conv1(x)))))


class TransformerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Sequential(
            ConvLayer(3, 32, 9),
            nn.InstanceNorm2d(32, affine=True),
            nn.ReLU(),
            ConvLayer(32, 64, 3, 2),
            nn.InstanceNorm2d(64, affine=True),
            nn.ReLU(),
            ConvLayer(64, 128, 3, 2),
            nn.InstanceNorm2d(128, affine=True),
            nn.ReLU(),
        )
        self.res = nn.Sequential(*(ResidualBlock(128) for _ in range(5)))
        self.up = nn.Sequential(
            ConvLayer(128, 64, 3, upsample=2),
            nn.InstanceNorm2d(64, affine=True),
            nn.ReLU(),
            ConvLayer(64, 32, 3, upsample=2),
            nn.InstanceNorm2d(32, affine=True),
            nn.ReLU(),
            ConvLayer(32, 3, 9),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.res(self.down(x)))


class LossNetwork(nn.Module):
    """Three VGG-like stages; returns the features after each."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            [
                nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU()),
                nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU()),
                nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU()),
            ]
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        features: list[torch.Tensor] = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features


def gram(features: torch.Tensor) -> torch.Tensor:
    b, c, h, w = features.shape
    flat = features.reshape(b, c, h * w)
    return torch.bmm(flat, flat.transpose(1, 2)) / (c * h * w)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        size = int(self.setting("image_size", device, 128))
        net = TransformerNet().to(device)
        self.example_inputs = (torch.rand(self.batch_size, 3, size, size, device=device),)
        if test == "train":
            self.loss_net = torch.jit.script(LossNetwork().to(device).eval().requires_grad_(False))
            style = torch.rand(1, 3, size, size, device=device)
            with torch.no_grad():
                self.style_grams = [gram(f) for f in self.loss_net(style)]
                self.content = self.loss_net(self.example_inputs[0])[1]
            self.model = torch.jit.script(net.train())
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3, fused=True)
        else:
            # TorchBench's TorchScript inference: script, freeze, optimize for inference.
            self.model = torch.jit.optimize_for_inference(
                torch.jit.freeze(torch.jit.script(net.eval()))
            )

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        out = self.model(*self.example_inputs)
        features = self.loss_net(out)
        content = CONTENT_WEIGHT * F.mse_loss(features[1], self.content)
        style = STYLE_WEIGHT * sum(
            F.mse_loss(gram(f), g.expand(f.shape[0], -1, -1))
            for f, g in zip(features, self.style_grams, strict=True)
        )
        tv = TV_WEIGHT * (
            (out[:, :, :, 1:] - out[:, :, :, :-1]).abs().sum()
            + (out[:, :, 1:, :] - out[:, :, :-1, :]).abs().sum()
        )
        (content + style + tv).backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
