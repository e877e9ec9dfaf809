"""Int8 inference of an LSTM text classifier on CPU, from code.

A 2-layer bidirectional LSTM over word embeddings, max-pooled over time, beside a sum-pooled
``EmbeddingBag`` of the same tokens (fastText's bag of words, Joulin et al., arXiv:1607.01759),
then an MLP head. After building with random weights, ``torch.ao.quantization.quantize_dynamic``
turns the LSTM and the Linear layers into their dynamically quantized versions (int8 weights,
activations quantized per batch: ``aten::quantized_lstm``, ``quantized::linear_dynamic``) and the
embeddings become weight-only 8-bit tables (``float_qparams_weight_only_qconfig``:
``quantized::embedding_byte``, ``quantized::embedding_bag_byte``): the quantized CPU
inference path of the TorchBench paper's regressions (arXiv:2304.14226, Table 4). Eval only: the
metadata lists no train mode, and CUDA has no such kernels.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.ao import quantization as tq

from suite.model import BenchmarkModel


class LSTMClassifier(nn.Module):
    def __init__(self, vocab: int, dim: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.bag = nn.EmbeddingBag(vocab, dim, mode="sum")
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(2 * hidden + dim, hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(self.embed(tokens))
        offsets = torch.arange(0, tokens.numel(), tokens.shape[1], device=tokens.device)
        bag = self.bag(tokens.flatten(), offsets)
        return self.head(torch.cat([states.amax(dim=1), bag], dim=-1)).log_softmax(-1)


def quantize(model: LSTMClassifier) -> nn.Module:
    """Dynamic int8 quantization of LSTM and Linear, weight-only 8-bit embeddings (in place)."""
    model.eval()
    with warnings.catch_warnings():
        # torch.ao.quantization and quantized tensors are deprecated in favour of torchao, which
        # the suite does not install: this path is what the model measures, for as long as torch
        # ships it.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*quantiz.*deprecated", category=UserWarning)
        for table in (model.embed, model.bag):
            table.qconfig = tq.float_qparams_weight_only_qconfig
        tq.prepare(model, inplace=True)
        tq.convert(model, inplace=True)
        return tq.quantize_dynamic(model, {nn.LSTM, nn.Linear}, dtype=torch.qint8)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        vocab = int(self.setting("vocab_size", device, 20000))
        model = LSTMClassifier(
            vocab,
            int(self.setting("embedding_dim", device, 128)),
            int(self.setting("hidden_size", device, 256)),
            int(self.setting("num_classes", device, 4)),
        )
        self.model = quantize(model)
        length = int(self.setting("sequence_length", device, 64))
        self.example_inputs = (torch.randint(0, vocab, (self.batch_size, length)),)

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
