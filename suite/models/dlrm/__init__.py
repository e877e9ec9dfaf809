"""DLRM (Naumov et al., "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", arXiv:1906.00091), from code.

Dense features go through a bottom MLP; each sparse feature is a bag of ids pooled (sum) by an
``EmbeddingBag``; the dense vector and the pooled embeddings interact by pairwise dot products
(the strict lower triangle of their Gram matrix); a top MLP maps dense vector and interactions to
a click logit. As in the reference implementation, the embedding tables get sparse gradients
and plain SGD updates only the rows a batch touched.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

DENSE_FEATURES = 13  # as in the Criteo data sets DLRM was built for


def mlp(sizes: list[int], last_activation: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        layers.append(nn.Linear(a, b))
        if last_activation or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, num_embeddings: int, dim: int, num_sparse: int) -> None:
        super().__init__()
        self.bottom = mlp([DENSE_FEATURES, 512, 256, dim])
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(num_embeddings, dim, mode="sum", sparse=True) for _ in range(num_sparse)
        )
        n = num_sparse + 1
        self.register_buffer("tril", torch.tril_indices(n, n, offset=-1), persistent=False)
        self.top = mlp([dim + n * (n - 1) // 2, 512, 256, 1], last_activation=False)

    def forward(
        self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [emb(ids[i], offsets) for i, emb in enumerate(self.embeddings)]
        feats = torch.stack([x, *pooled], dim=1)  # (B, n, dim)
        gram = torch.bmm(feats, feats.transpose(1, 2))
        inter = gram[:, self.tril[0], self.tril[1]]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        rows = int(self.setting("num_embeddings", device, 20000))
        dim = int(self.setting("embedding_dim", device, 64))
        sparse = int(self.setting("num_sparse_features", device, 8))
        lookups = int(self.setting("lookups_per_feature", device, 4))
        self.model = DLRM(rows, dim, sparse).to(device)
        b = self.batch_size
        dense = torch.rand(b, DENSE_FEATURES, device=device)
        # Power-law ids, as in click logs: a few rows are hot, most are cold.
        ids = (torch.rand(sparse, b * lookups, device=device) ** 3 * rows).long()
        offsets = torch.arange(0, b * lookups, lookups, device=device)
        self.example_inputs = (dense, ids, offsets)
        self.clicks = (torch.rand(b, device=device) < 0.25).float()
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(self.model(*self.example_inputs), self.clicks)
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs).sigmoid(),)
