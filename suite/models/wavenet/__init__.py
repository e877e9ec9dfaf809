"""WaveNet (van den Oord et al., "WaveNet: A Generative Model for Raw Audio", arXiv:1609.03499)
as a mel-conditioned vocoder, from code.

Samples are mu-law companded to 256 classes; each layer is a dilated causal convolution with a
gated activation ``tanh(W_f x + V_f c) * sigmoid(W_g x + V_g c)`` conditioned on mel frames
upsampled (hop 256) by a transposed convolution to 16 conditioning channels, with residual and
skip outputs. Training and evaluation are teacher-forced (one parallel pass), as in vocoder
training.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

CLASSES = 256
HOP = 256
MEL_BINS = 80
COND_CHANNELS = 16  # the upsampling network's output: the conditioning every layer sees


def mu_law_encode(audio: torch.Tensor, classes: int = CLASSES) -> torch.Tensor:
    mu = classes - 1
    y = torch.sign(audio) * torch.log1p(mu * audio.abs()) / torch.log1p(torch.tensor(float(mu)))
    return ((y + 1) / 2 * mu + 0.5).long().clamp(0, mu)


class GatedLayer(nn.Module):
    def __init__(self, channels: int, skip: int, dilation: int) -> None:
        super().__init__()
        self.dilation = dilation
        self.conv = nn.Conv1d(channels, 2 * channels, 2, dilation=dilation)
        self.cond = nn.Conv1d(COND_CHANNELS, 2 * channels, 1)
        self.res = nn.Conv1d(channels, channels, 1)
        self.skip = nn.Conv1d(channels, skip, 1)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.conv(F.pad(x, (self.dilation, 0))) + self.cond(c)  # causal: pad on the left
        filt, gate = h.chunk(2, dim=1)
        z = torch.tanh(filt) * torch.sigmoid(gate)
        return x + self.res(z), self.skip(z)


class WaveNet(nn.Module):
    def __init__(self, channels: int, stacks: int = 2, layers: int = 8) -> None:
        super().__init__()
        skip = 2 * channels
        self.embed = nn.Embedding(CLASSES, channels)
        self.upsample = nn.ConvTranspose1d(MEL_BINS, COND_CHANNELS, HOP, stride=HOP)
        self.layers = nn.ModuleList(
            GatedLayer(channels, skip, 2**i) for _ in range(stacks) for i in range(layers)
        )
        self.out = nn.Sequential(
            nn.ReLU(), nn.Conv1d(skip, skip, 1), nn.ReLU(), nn.Conv1d(skip, CLASSES, 1)
        )

    def forward(self, classes: torch.Tensor, mel: torch.Tensor) -> torch.Tensor:
        x = self.embed(classes).transpose(1, 2)  # (B, C, T)
        c = self.upsample(mel)[..., : classes.shape[1]]
        skips = 0
        for layer in self.layers:
            x, s = layer(x, c)
            skips = skips + s
        return self.out(skips)  # (B, 256, T) logits of the next sample


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        length = int(self.setting("samples", device, 2048))
        self.model = WaveNet(int(self.setting("residual_channels", device, 32))).to(device)
        b = self.batch_size
        t = torch.arange(length + 1, device=device, dtype=torch.float32)
        freqs = torch.rand(b, 1, device=device) * 0.05 + 0.01
        audio = 0.5 * torch.sin(t * freqs) + 0.05 * torch.randn(b, length + 1, device=device)
        classes = mu_law_encode(audio)
        mel = torch.randn(b, MEL_BINS, -(-length // HOP), device=device)
        self.example_inputs = (classes[:, :-1], mel)
        self.next_samples = classes[:, 1:]
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(*self.example_inputs), self.next_samples).backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs).argmax(1),)
