"""Glow (Kingma & Dhariwal, "Glow: Generative Flow with Invertible 1x1 Convolutions",
arXiv:1807.03039), from code, at a small scale.

A level squeezes the image (``F.pixel_unshuffle``, 2x2 space to channels), runs K flow steps and,
except for the last level, splits half the channels off onto a Gaussian whose mean and log-scale
come from the other half (a zero-initialised convolution). A flow step is

- actnorm: a per-channel affine map, initialised from the first batch's statistics;
- an invertible 1x1 convolution with a full weight matrix: log-determinant ``H * W *
  slogdet(W)`` (``torch.linalg.slogdet``), inverse by ``torch.linalg.inv`` when sampling;
- an affine coupling layer: half the channels scale and shift the other half, the scale a
  sigmoid as in the reference code, from a conv-ReLU-conv-ReLU-zero-conv network.

Train minimises bits per dimension of uniformly dequantized random 8-bit images with Adamax (the
paper's optimizer); eval samples images by running the flow backwards at temperature 0.7.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

LOG_2PI = math.log(2 * math.pi)


def gaussian_log_p(x: torch.Tensor, mean: torch.Tensor, log_sd: torch.Tensor) -> torch.Tensor:
    """Per-sample log density (B,) of ``x`` (B, C, H, W) under a diagonal Gaussian."""
    logp = -0.5 * (LOG_2PI + 2.0 * log_sd + (x - mean) ** 2 * torch.exp(-2.0 * log_sd))
    return logp.flatten(1).sum(1)


class ActNorm(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.log_scale = nn.Parameter(torch.zeros(1, channels, 1, 1))

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Data-dependent initialisation: zero mean, unit variance per channel on ``x``."""
        std = x.transpose(0, 1).flatten(1).std(1).view(1, -1, 1, 1)
        self.loc.copy_(-x.mean(dim=(0, 2, 3), keepdim=True))
        self.log_scale.copy_(-torch.log(std + 1e-6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logdet = x.shape[2] * x.shape[3] * self.log_scale.sum()
        return (x + self.loc) * torch.exp(self.log_scale), logdet

    def reverse(self, y: torch.Tensor) -> torch.Tensor:
        return y * torch.exp(-self.log_scale) - self.loc


class InvConv1x1(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(channels, channels))  # a random rotation
        self.weight = nn.Parameter(q)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logdet = x.shape[2] * x.shape[3] * torch.linalg.slogdet(self.weight)[1]
        return F.conv2d(x, self.weight[:, :, None, None]), logdet

    def reverse(self, y: torch.Tensor) -> torch.Tensor:
        return F.conv2d(y, torch.linalg.inv(self.weight)[:, :, None, None])


class ZeroConv2d(nn.Conv2d):
    """3x3 convolution started at zero, output scaled by ``exp(3 * logs)`` (the reference code)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(cin, cout, 3, padding=1)
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)
        self.logs = nn.Parameter(torch.zeros(1, cout, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * torch.exp(3.0 * self.logs)


class AffineCoupling(nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels // 2, hidden, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(hidden, hidden, 1),
            nn.ReLU(),
            ZeroConv2d(hidden, channels),
        )

    def _scale_shift(self, xa: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.net(xa)
        shift, raw = h[:, 0::2], h[:, 1::2]
        return torch.sigmoid(raw + 2.0), shift

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xa, xb = x.chunk(2, dim=1)
        scale, shift = self._scale_shift(xa)
        yb = (xb + shift) * scale
        return torch.cat([xa, yb], 1), torch.log(scale).flatten(1).sum(1)

    def reverse(self, y: torch.Tensor) -> torch.Tensor:
        ya, yb = y.chunk(2, dim=1)
        scale, shift = self._scale_shift(ya)
        return torch.cat([ya, yb / scale - shift], 1)


class FlowStep(nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.actnorm = ActNorm(channels)
        self.invconv = InvConv1x1(channels)
        self.coupling = AffineCoupling(channels, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, ld1 = self.actnorm(x)
        x, ld2 = self.invconv(x)
        x, ld3 = self.coupling(x)
        return x, ld1 + ld2 + ld3

    def reverse(self, y: torch.Tensor) -> torch.Tensor:
        return self.actnorm.reverse(self.invconv.reverse(self.coupling.reverse(y)))


class Level(nn.Module):
    def __init__(self, channels: int, steps: int, hidden: int, split: bool) -> None:
        super().__init__()
        squeezed = 4 * channels
        self.steps = nn.ModuleList(FlowStep(squeezed, hidden) for _ in range(steps))
        self.split = split
        # the prior of the split-off half (or of everything, at the last level)
        latent = squeezed // 2 if split else squeezed
        self.prior = ZeroConv2d(latent, 2 * latent)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output, log-determinant (B,), log prior density of what leaves the flow (B,))."""
        x = F.pixel_unshuffle(x, 2)
        logdet = x.new_zeros(x.shape[0])
        for step in self.steps:
            x, ld = step(x)
            logdet = logdet + ld
        if self.split:
            x, z = x.chunk(2, dim=1)
            mean, log_sd = self.prior(x).chunk(2, dim=1)
        else:
            z = x
            mean, log_sd = self.prior(torch.zeros_like(x)).chunk(2, dim=1)
        return x, logdet, gaussian_log_p(z, mean, log_sd)

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> torch.Tensor:
        """Initialise the actnorms from ``x`` (B, C, H, W); returns what the next level reads."""
        x = F.pixel_unshuffle(x, 2)
        for step in self.steps:
            assert isinstance(step, FlowStep)
            step.actnorm.initialize(x)
            x, _ = step(x)
        return x.chunk(2, dim=1)[0] if self.split else x

    def reverse(
        self, x: torch.Tensor | None, eps: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """Draw the level's latent from standard-normal ``eps`` and invert the steps."""
        cond = torch.zeros_like(eps) if x is None else x
        mean, log_sd = self.prior(cond).chunk(2, dim=1)
        z = mean + torch.exp(log_sd) * temperature * eps
        y = torch.cat([x, z], 1) if x is not None else z
        for step in reversed(self.steps):
            y = step.reverse(y)
        return F.pixel_shuffle(y, 2)


class Glow(nn.Module):
    def __init__(self, levels: int, steps: int, hidden: int) -> None:
        super().__init__()
        channels = [3 * 2**i for i in range(levels)]
        self.levels = nn.ModuleList(
            Level(c, steps, hidden, i < levels - 1) for i, c in enumerate(channels)
        )

    def forward(
        self, x: torch.Tensor, reverse: bool = False, temperature: float = 0.7
    ) -> torch.Tensor:
        """Negative log-likelihood per sample (B,) in nats of images ``x`` (B, 3, H, W), before
        the quantisation term; with ``reverse``, images (B, 3, H, W) sampled from the
        standard-normal noise ``x`` of the same shape at ``temperature``."""
        if reverse:
            return self._sample(x, temperature)
        logdet = x.new_zeros(x.shape[0])
        log_p = x.new_zeros(x.shape[0])
        for level in self.levels:
            x, ld, lp = level(x)
            logdet, log_p = logdet + ld, log_p + lp
        return -(log_p + logdet)

    def _sample(self, eps: torch.Tensor, temperature: float) -> torch.Tensor:
        noises = []  # the noise in image layout, squeezed and split as the latents are
        for level in self.levels:
            eps = F.pixel_unshuffle(eps, 2)
            if level.split:
                eps, own = eps.chunk(2, dim=1)
                noises.append(own)
            else:
                noises.append(eps)
        x = None
        for level, noise in zip(reversed(self.levels), reversed(noises), strict=True):
            x = level.reverse(x, noise, temperature)
        assert x is not None
        return x

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Run the actnorm data-dependent initialisation on the batch ``x``."""
        for level in self.levels:
            assert isinstance(level, Level)
            x = level.initialize(x)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        self.size = int(self.setting("image_size", device, 16))
        model = Glow(
            int(self.setting("levels", device, 2)),
            int(self.setting("steps_per_level", device, 4)),
            int(self.setting("hidden_channels", device, 96)),
        ).to(device)
        shape = (self.batch_size, 3, self.size, self.size)
        pixels = torch.randint(0, 256, shape, device=device)
        model.initialize(self.dequantize(pixels))
        self.model = model
        # train: 8-bit images; eval: the standard-normal noise the samples are drawn from
        self.example_inputs = (pixels,) if test == "train" else (torch.randn(shape, device=device),)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adamax(self.model.parameters(), lr=1e-3)
        else:
            self.model.eval()

    @staticmethod
    def dequantize(pixels: torch.Tensor) -> torch.Tensor:
        """8-bit pixels to [-0.5, 0.5) with uniform noise inside each bin."""
        noise = torch.empty(pixels.shape, device=pixels.device).uniform_(0.0, 1.0)
        return (pixels.float() + noise) / 256.0 - 0.5

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        x = self.dequantize(*self.example_inputs)
        dims = x[0].numel()
        nll = self.model(x) + dims * math.log(256.0)
        loss = (nll / (dims * math.log(2.0))).mean()  # bits per dimension
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs, reverse=True, temperature=0.7),)
