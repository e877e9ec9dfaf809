"""A small Conformer (Gulati et al., "Conformer: Convolution-augmented Transformer for Speech
Recognition", Interspeech 2020) trained with CTC (Graves et al., ICML 2006), from code.

Each block is the paper's macaron: half-step feed-forward, multi-head self-attention, a
convolution module (pointwise + GLU, depthwise, batch norm, SiLU, pointwise), half-step
feed-forward, layer norm. Inputs are random 80-bin log-mel frames; targets random character ids.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

MEL_BINS = 80
SUB_CHANNELS = 32  # channels of the 4x convolutional subsampling


class FeedForward(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(d),
            nn.Linear(d, 4 * d),
            nn.SiLU(),
            nn.Dropout(0.1),
            nn.Linear(4 * d, d),
            nn.Dropout(0.1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvModule(nn.Module):
    def __init__(self, d: int, kernel: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pointwise_in = nn.Conv1d(d, 2 * d, 1)
        self.depthwise = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pointwise_out = nn.Conv1d(d, d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x).transpose(1, 2)
        y = F.glu(self.pointwise_in(y), dim=1)
        y = F.silu(self.bn(self.depthwise(y)))
        return F.dropout(self.pointwise_out(y), 0.1, self.training).transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, d: int, heads: int, kernel: int) -> None:
        super().__init__()
        self.ff1 = FeedForward(d)
        self.attn_norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.conv = ConvModule(d, kernel)
        self.ff2 = FeedForward(d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        y = self.attn_norm(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        x = x + self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)


class Conformer(nn.Module):
    def __init__(
        self, vocab: int, d: int = 144, heads: int = 4, layers: int = 4, kernel: int = 15
    ) -> None:
        super().__init__()
        self.subsample = nn.Sequential(
            nn.Conv2d(1, SUB_CHANNELS, 3, 2),
            nn.ReLU(),
            nn.Conv2d(SUB_CHANNELS, SUB_CHANNELS, 3, 2),
            nn.ReLU(),
        )
        freq = ((MEL_BINS - 1) // 2 - 1) // 2
        self.proj = nn.Linear(SUB_CHANNELS * freq, d)
        self.blocks = nn.Sequential(*(ConformerBlock(d, heads, kernel) for _ in range(layers)))
        self.head = nn.Linear(d, vocab)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = self.subsample(feats.unsqueeze(1))  # (B, SUB_CHANNELS, T', F')
        b, c, t, f = x.shape
        x = self.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f))
        return self.head(self.blocks(x)).log_softmax(-1)  # (B, T', vocab)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        frames = int(self.setting("frames", device, 400))
        vocab = int(self.setting("vocab_size", device, 32))
        target_len = int(self.setting("target_len", device, 40))
        self.model = Conformer(vocab).to(device)
        b = self.batch_size
        self.example_inputs = (torch.randn(b, frames, MEL_BINS, device=device),)
        self.targets = torch.randint(1, vocab, (b, target_len), device=device)  # 0 is the blank
        out_frames = ((frames - 1) // 2 - 1) // 2
        self.input_lengths = torch.full((b,), out_frames, dtype=torch.long, device=device)
        self.target_lengths = torch.full((b,), target_len, dtype=torch.long, device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=5e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        log_probs = self.model(*self.example_inputs)
        loss = F.ctc_loss(
            log_probs.transpose(0, 1),
            self.targets,
            self.input_lengths,
            self.target_lengths,
            blank=0,
            zero_infinity=True,
        )
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            best = self.model(*self.example_inputs).argmax(-1)
            # Greedy CTC decoding: keep a frame's label when it is not blank and not a repeat.
            keep = (best != 0) & torch.cat(
                [torch.ones_like(best[:, :1], dtype=torch.bool), best[:, 1:] != best[:, :-1]], dim=1
            )
            return best, keep
