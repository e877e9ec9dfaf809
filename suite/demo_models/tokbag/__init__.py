"""A bag-of-tokens text classifier over the ``minitok`` tokenizer (``nightbench demo``'s model).

Each iteration tokenizes the batch's texts with ``minitok`` (pure Python, the hot path a
regression in that package would slow down), packs the ids in EmbeddingBag's layout, pools the
mean token embedding of each text with ``minitok.tensors.pool`` over the model's embedding
table (the package's tensor code in the model's forward, where an extra aten operator of the
package shows) and classifies with a linear layer. The texts and weights come from fixed
seeds; nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel


class BagOfTokens(nn.Module):
    def __init__(self, vocab_size: int, dim: int, classes: int, pool: Callable[..., Any]) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, dim, mode="mean")
        self.out = nn.Linear(dim, classes)
        self.pool = pool

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.out(self.pool(self.embed.weight, ids, offsets))


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        try:
            import minitok
            from minitok.tensors import pool
        except ImportError as exc:
            raise NotImplementedError(
                "tokbag needs the minitok package installed (with minitok.tensors)"
            ) from exc
        self.tokenizer = minitok.Tokenizer(minitok.build_vocab())
        words = int(self.setting("words_per_text", device, 150))
        self.texts = [minitok.sample_text(words=words, seed=i) for i in range(self.batch_size)]
        vocab_size = len(self.tokenizer.vocab)
        self.model = BagOfTokens(
            vocab_size,
            int(self.setting("embedding_dim", device, 32)),
            int(self.setting("classes", device, 4)),
            pool,
        ).to(device)
        self.labels = torch.arange(self.batch_size, device=device) % self.model.out.out_features
        self.example_inputs = self._inputs()
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        else:
            self.model.eval()

    def _inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenize the batch: flat ids and the offset of each text (EmbeddingBag's layout)."""
        ids: list[int] = []
        offsets: list[int] = []
        for text in self.texts:
            offsets.append(len(ids))
            ids.extend(self.tokenizer.encode(text))
        return (torch.tensor(ids, device=self.device), torch.tensor(offsets, device=self.device))

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(*self._inputs()), self.labels)
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self._inputs()),)
