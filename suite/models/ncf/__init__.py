"""Neural Collaborative Filtering (He et al., "Neural Collaborative Filtering", WWW 2017), the
NeuMF model from code: GMF (element-wise product of user and item embeddings) and an MLP over
their concatenation, fused by a final linear layer; binary cross-entropy on implicit feedback with
negative sampling (4 negatives per positive, as in the paper)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

NEGATIVES = 4


class NeuMF(nn.Module):
    def __init__(self, users: int, items: int, factors: int) -> None:
        super().__init__()
        self.user_gmf = nn.Embedding(users, factors)
        self.item_gmf = nn.Embedding(items, factors)
        self.user_mlp = nn.Embedding(users, factors * 2)
        self.item_mlp = nn.Embedding(items, factors * 2)
        self.mlp = nn.Sequential(
            nn.Linear(factors * 4, factors * 2),
            nn.ReLU(),
            nn.Linear(factors * 2, factors),
            nn.ReLU(),
            nn.Linear(factors, factors // 2),
            nn.ReLU(),
        )
        self.out = nn.Linear(factors + factors // 2, 1)
        for emb in (self.user_gmf, self.item_gmf, self.user_mlp, self.item_mlp):
            nn.init.normal_(emb.weight, std=0.01)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        gmf = self.user_gmf(users) * self.item_gmf(items)
        mlp = self.mlp(torch.cat([self.user_mlp(users), self.item_mlp(items)], dim=-1))
        return self.out(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        users = int(self.setting("num_users", device, 20000))
        items = int(self.setting("num_items", device, 10000))
        self.model = NeuMF(users, items, int(self.setting("factors", device, 64))).to(device)
        b = self.batch_size
        user_ids = torch.randint(0, users, (b,), device=device)
        item_ids = torch.randint(0, items, (b,), device=device)
        labels = torch.zeros(b, device=device)
        labels[:: NEGATIVES + 1] = 1.0  # one observed interaction per NEGATIVES sampled ones
        self.example_inputs = (user_ids, item_ids)
        self.labels = labels
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(self.model(*self.example_inputs), self.labels)
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs).sigmoid(),)
