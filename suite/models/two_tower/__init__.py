"""Two-tower retrieval (Yi, Yang, Hong, Cheng, Heldt, Kumthekar, Zhao, Wei & Chi,
"Sampling-Bias-Corrected Neural Modeling for Large Corpus Item Recommendations", RecSys 2019;
towers after Covington, Adams & Sargin, "Deep Neural Networks for YouTube Recommendations", 2016),
from code.

- User tower: the watch history pooled by a mean ``EmbeddingBag``, the search query's tokens
  pooled by a sum ``EmbeddingBag`` weighted by their idf (``per_sample_weights``), the age
  bucketized (``torch.bucketize``) into an embedding; an MLP; L2 normalisation.
- Item tower: the item id's embedding and its categories max-pooled by an ``EmbeddingBag``; an
  MLP; L2 normalisation.
- Loss: softmax over the batch's items, logits ``u.v / tau - log p(item)`` (the logQ
  correction), ``p`` from the paper's streaming frequency estimate (Algorithm 2: per hashed id,
  the last step it was seen and a moving average of the gap between sightings).
- Optimizer: Adagrad; the item and watch-history tables take sparse gradients.

Eval scores a batch of users against every item of the corpus and returns the top 100.
Data: power-law item and token ids, as in interaction logs; variable history lengths.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

AGE_BOUNDARIES = (18.0, 25.0, 35.0, 45.0, 55.0, 65.0)
CATEGORIES_PER_ITEM = 3
TEMPERATURE = 0.05
HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash
FREQUENCY_RATE = 0.01  # the paper's alpha
TOP_K = 100


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class TwoTower(nn.Module):
    def __init__(self, items: int, vocab: int, categories: int, dim: int) -> None:
        super().__init__()
        self.history = nn.EmbeddingBag(items, dim, mode="mean", sparse=True)
        # dense gradients: the token table is small (and torch.compile cannot yet trace the
        # sparse backward of a bag with per_sample_weights)
        self.query = nn.EmbeddingBag(vocab, dim, mode="sum")
        self.age = nn.Embedding(len(AGE_BOUNDARIES) + 1, 16)
        self.register_buffer("age_boundaries", torch.tensor(AGE_BOUNDARIES), persistent=False)
        self.user_mlp = mlp([2 * dim + 16, 256, 128, dim])
        self.item = nn.Embedding(items, dim, sparse=True)
        self.category = nn.EmbeddingBag(categories, dim, mode="max")
        self.item_mlp = mlp([2 * dim, 256, 128, dim])

    def users(
        self,
        history: torch.Tensor,
        history_offsets: torch.Tensor,
        tokens: torch.Tensor,
        token_offsets: torch.Tensor,
        token_weights: torch.Tensor,
        age: torch.Tensor,
    ) -> torch.Tensor:
        """L2-normalised user vectors (B, dim) from bags of ids (flat, with offsets) and ages."""
        feats = torch.cat(
            [
                self.history(history, history_offsets),
                self.query(tokens, token_offsets, per_sample_weights=token_weights),
                self.age(torch.bucketize(age, self.get_buffer("age_boundaries"))),
            ],
            dim=1,
        )
        return F.normalize(self.user_mlp(feats), dim=1)

    def items(self, ids: torch.Tensor, categories: torch.Tensor) -> torch.Tensor:
        """L2-normalised item vectors (N, dim) of ``ids`` (N,) with ``categories`` (N, C)."""
        feats = torch.cat([self.item(ids), self.category(categories)], dim=1)
        return F.normalize(self.item_mlp(feats), dim=1)

    def forward(
        self,
        history: torch.Tensor,
        history_offsets: torch.Tensor,
        tokens: torch.Tensor,
        token_offsets: torch.Tensor,
        token_weights: torch.Tensor,
        age: torch.Tensor,
        item_ids: torch.Tensor,
        item_categories: torch.Tensor,
    ) -> torch.Tensor:
        """Scores (B, N): user rows against the items' columns, divided by the temperature."""
        users = self.users(history, history_offsets, tokens, token_offsets, token_weights, age)
        return users @ self.items(item_ids, item_categories).t() / TEMPERATURE


class FrequencyEstimator:
    """Streaming item-frequency estimate of Yi et al. (Algorithm 2) over ``buckets`` hashes."""

    def __init__(self, buckets: int, device: str) -> None:
        self.buckets = buckets
        self.last_seen = torch.zeros(buckets, device=device)
        self.gap = torch.ones(buckets, device=device)
        self.step = 0

    def update(self, ids: torch.Tensor) -> torch.Tensor:
        """Record a batch of item ids (B,); return their estimated sampling probabilities (B,)."""
        self.step += 1
        h = (ids * HASH_MULTIPLIER) % self.buckets
        gap = (1 - FREQUENCY_RATE) * self.gap[h] + FREQUENCY_RATE * (self.step - self.last_seen[h])
        self.gap.index_put_((h,), gap)
        self.last_seen.index_fill_(0, h, float(self.step))
        return 1.0 / self.gap[h]


def bags(count: int, max_length: int, high: int, device: str) -> tuple[torch.Tensor, ...]:
    """``count`` bags of 1 to ``max_length`` power-law ids below ``high``: (ids, offsets)."""
    lengths = torch.randint(1, max_length + 1, (count,), device=device)
    offsets = torch.cumsum(lengths, 0) - lengths
    ids = (torch.rand(int(lengths.sum()), device=device) ** 3 * high).long()
    return ids, offsets


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        items = int(self.setting("num_items", device, 10000))
        vocab = int(self.setting("vocab_size", device, 10000))
        categories = int(self.setting("num_categories", device, 200))
        self.model = TwoTower(
            items, vocab, categories, int(self.setting("embedding_dim", device, 64))
        ).to(device)
        b = self.batch_size
        history = bags(b, int(self.setting("history_length", device, 20)), items, device)
        tokens, token_offsets = bags(b, int(self.setting("query_length", device, 6)), vocab, device)
        idf = torch.log(vocab / (1.0 + torch.rand(vocab, device=device) ** 3 * vocab))
        age = torch.empty(b, device=device).uniform_(13, 80)
        catalogue = torch.randint(0, categories, (items, CATEGORIES_PER_ITEM), device=device)
        user = (*history, tokens, token_offsets, idf[tokens] + 0.1, age)
        if test == "train":
            ids = (torch.rand(b, device=device) ** 3 * items).long()  # the watched items
            self.example_inputs = (*user, ids, catalogue[ids])
            self.frequencies = FrequencyEstimator(items // 2, device)
            self.model.train()
            self.optimizer = torch.optim.Adagrad(self.model.parameters(), lr=0.05)
        else:
            corpus = torch.arange(items, device=device)
            self.example_inputs = (*user, corpus, catalogue)
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        ids = self.example_inputs[6]
        log_q = torch.log(self.frequencies.update(ids))
        logits = self.model(*self.example_inputs) - log_q.unsqueeze(0)
        loss = F.cross_entropy(logits, torch.arange(logits.shape[0], device=logits.device))
        loss.backward()
        # Adagrad builds sparse tensors from the sparse gradients; the invariant checks were off
        # by default and stay off (the same work), said explicitly so torch does not warn.
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            scores, ids = self.model(*self.example_inputs).topk(TOP_K, dim=1)
            return scores, ids
