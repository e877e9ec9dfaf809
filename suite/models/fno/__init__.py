"""Fourier Neural Operator (Li et al., "Fourier Neural Operator for Parametric Partial
Differential Equations", arXiv:2010.08895), 2-D, from code.

Each layer adds a spectral convolution (``torch.fft.rfft2`` of the field, the lowest
``modes_kept`` frequencies of both corners multiplied by complex weights with ``einsum`` on
``complex64``, ``torch.fft.irfft2`` back) to a pointwise 1x1 convolution, then GELU: the FFT and
complex kernels the TorchBench paper (arXiv:2304.14226, Table 4) lists among its regressions.
Inputs are a random field plus the grid coordinates; the loss is the relative L2 error used in
the paper, against a fixed random target; AdamW.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel


class SpectralConv2d(nn.Module):
    def __init__(self, channels: int, modes: int) -> None:
        super().__init__()
        self.modes = modes
        scale = 1.0 / (channels * channels)
        self.weights = nn.Parameter(
            scale * torch.randn(2, channels, channels, modes, modes, dtype=torch.cfloat)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        m = self.modes
        x_ft = torch.fft.rfft2(x, norm="ortho")
        out_ft = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.cfloat, device=x.device)
        out_ft[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m, :m], self.weights[0])
        out_ft[:, :, -m:, :m] = torch.einsum(
            "bixy,ioxy->boxy", x_ft[:, :, -m:, :m], self.weights[1]
        )
        return torch.fft.irfft2(out_ft, s=(h, w), norm="ortho")


class FNO2d(nn.Module):
    def __init__(self, modes: int, width: int, layers: int) -> None:
        super().__init__()
        self.lift = nn.Linear(3, width)  # the field and its two grid coordinates
        self.spectral = nn.ModuleList(SpectralConv2d(width, modes) for _ in range(layers))
        self.pointwise = nn.ModuleList(nn.Conv2d(width, width, 1) for _ in range(layers))
        self.project = nn.Sequential(nn.Linear(width, 128), nn.GELU(), nn.Linear(128, 1))

    def forward(self, field: torch.Tensor) -> torch.Tensor:
        b, h, w = field.shape
        gy, gx = torch.meshgrid(
            torch.linspace(0, 1, h, device=field.device),
            torch.linspace(0, 1, w, device=field.device),
            indexing="ij",
        )
        x = torch.stack([field, gy.expand(b, h, w), gx.expand(b, h, w)], dim=-1)
        x = self.lift(x).permute(0, 3, 1, 2)
        for i, (spectral, pointwise) in enumerate(zip(self.spectral, self.pointwise, strict=True)):
            x = spectral(x) + pointwise(x)
            if i < len(self.spectral) - 1:
                x = F.gelu(x)
        return self.project(x.permute(0, 2, 3, 1)).squeeze(-1)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        n = int(self.setting("resolution", device, 64))
        self.model = FNO2d(
            int(self.setting("modes_kept", device, 12)),
            int(self.setting("width", device, 32)),
            int(self.setting("layers", device, 4)),
        ).to(device)
        self.example_inputs = (torch.randn(self.batch_size, n, n, device=device),)
        self.targets = torch.randn(self.batch_size, n, n, device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=1e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        pred = self.model(*self.example_inputs)
        diff = torch.linalg.vector_norm((pred - self.targets).flatten(1), dim=1)
        loss = (diff / torch.linalg.vector_norm(self.targets.flatten(1), dim=1)).mean()
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
