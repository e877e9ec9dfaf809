"""Conv-TasNet (Luo & Mesgarani, "Conv-TasNet: Surpassing Ideal Time-Frequency Magnitude Masking
for Speech Separation", IEEE/ACM TASLP 2019), from code.

Encoder: 1-D convolution (N filters, length L, 50% overlap) with ReLU. Separator: a bottleneck,
then R repeats of X dilated depthwise-separable convolution blocks (dilations 1..2^(X-1)) with
PReLU and global layer norm, producing one sigmoid mask per speaker. Decoder: transposed
convolution. Loss: negative scale-invariant SNR under the best speaker permutation (utterance-level
permutation-invariant training).
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from suite.model import BenchmarkModel


class GlobalLayerNorm(nn.Module):
    """gLN: normalise over channels and time, per utterance (section III-B of the paper)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(1, channels, 1))
        self.beta = nn.Parameter(torch.zeros(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean((1, 2), keepdim=True)
        var = (x - mean).pow(2).mean((1, 2), keepdim=True)
        return self.gamma * (x - mean) / torch.sqrt(var + 1e-8) + self.beta


class TCNBlock(nn.Module):
    def __init__(self, b: int, h: int, p: int, dilation: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(b, h, 1),
            nn.PReLU(),
            GlobalLayerNorm(h),
            nn.Conv1d(h, h, p, padding=dilation * (p - 1) // 2, dilation=dilation, groups=h),
            nn.PReLU(),
            GlobalLayerNorm(h),
            nn.Conv1d(h, b, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class ConvTasNet(nn.Module):
    def __init__(
        self,
        speakers: int = 2,
        n: int = 128,
        length: int = 16,
        b: int = 64,
        h: int = 128,
        p: int = 3,
        x: int = 6,
        r: int = 2,
    ) -> None:
        super().__init__()
        self.speakers, self.n = speakers, n
        self.encoder = nn.Conv1d(1, n, length, stride=length // 2, bias=False)
        self.separator = nn.Sequential(
            GlobalLayerNorm(n),
            nn.Conv1d(n, b, 1),
            *(TCNBlock(b, h, p, 2**i) for _ in range(r) for i in range(x)),
            nn.PReLU(),
            nn.Conv1d(b, speakers * n, 1),
        )
        self.decoder = nn.ConvTranspose1d(n, 1, length, stride=length // 2, bias=False)

    def forward(self, mixture: torch.Tensor) -> torch.Tensor:
        w = torch.relu(self.encoder(mixture.unsqueeze(1)))  # (B, N, K)
        masks = torch.sigmoid(self.separator(w)).view(w.shape[0], self.speakers, self.n, -1)
        sources = self.decoder((masks * w.unsqueeze(1)).flatten(0, 1))  # (B*C, 1, T)
        return sources.view(w.shape[0], self.speakers, -1)[..., : mixture.shape[-1]]


def si_snr(estimate: torch.Tensor, target: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Scale-invariant SNR in dB over the last dimension."""
    estimate = estimate - estimate.mean(-1, keepdim=True)
    target = target - target.mean(-1, keepdim=True)
    scale = (estimate * target).sum(-1, keepdim=True) / (target.pow(2).sum(-1, keepdim=True) + eps)
    projection = scale * target
    noise = estimate - projection
    return 10 * torch.log10(projection.pow(2).sum(-1) / (noise.pow(2).sum(-1) + eps) + eps)


def pit_si_snr_loss(estimates: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """Negative SI-SNR under the best permutation of speakers, per utterance, averaged."""
    c = sources.shape[1]
    per_perm = torch.stack(
        [
            si_snr(estimates[:, list(perm)], sources).mean(1)
            for perm in itertools.permutations(range(c))
        ],
        dim=1,
    )
    return -per_perm.max(1).values.mean()


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        length = int(self.setting("samples", device, 4000))
        speakers = int(self.setting("speakers", device, 2))
        self.model = ConvTasNet(speakers).to(device)
        self.sources = torch.randn(self.batch_size, speakers, length, device=device) * 0.1
        self.example_inputs = (self.sources.sum(1),)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = pit_si_snr_loss(self.model(*self.example_inputs), self.sources)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
