"""A BiLSTM-CRF tagger (Huang, Xu & Yu, "Bidirectional LSTM-CRF Models for Sequence Tagging",
arXiv:1508.01991; Lample et al., NAACL 2016), from code.

Structured prediction: a linear-chain CRF over the BiLSTM's per-tag emissions. Training computes
the log partition function with the forward algorithm (a log-sum-exp recursion over time) minus
the gold path's score; decoding is Viterbi with back-pointers. Both recursions are batched over
sentences and loop over time, as CRF layers do.
"""

from __future__ import annotations

import torch
from torch import nn

from suite.model import BenchmarkModel


class BiLSTMCRF(nn.Module):
    def __init__(self, vocab: int, tags: int, embed: int = 100, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True, bidirectional=True)
        self.emit = nn.Linear(2 * hidden, tags)
        self.transitions = nn.Parameter(torch.randn(tags, tags) * 0.1)  # [from, to]
        self.start = nn.Parameter(torch.randn(tags) * 0.1)
        self.end = nn.Parameter(torch.randn(tags) * 0.1)

    def emissions(self, words: torch.Tensor) -> torch.Tensor:
        return self.emit(self.lstm(self.embed(words))[0])  # (B, T, tags)

    def forward(self, words: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood of the gold ``tags`` (B, T)."""
        em = self.emissions(words)
        b, t, _ = em.shape
        # Score of the gold path.
        batch = torch.arange(b, device=em.device)
        gold = self.start[tags[:, 0]] + em[batch, 0, tags[:, 0]]
        for i in range(1, t):
            gold = gold + self.transitions[tags[:, i - 1], tags[:, i]] + em[batch, i, tags[:, i]]
        gold = gold + self.end[tags[:, -1]]
        # Log partition function: the forward algorithm.
        alpha = self.start + em[:, 0]
        for i in range(1, t):
            alpha = torch.logsumexp(alpha.unsqueeze(2) + self.transitions, dim=1) + em[:, i]
        log_z = torch.logsumexp(alpha + self.end, dim=1)
        return (log_z - gold).mean()

    @torch.no_grad()
    def decode(self, words: torch.Tensor) -> torch.Tensor:
        """Viterbi: the highest-scoring tag sequence (B, T)."""
        em = self.emissions(words)
        b, t, _ = em.shape
        score = self.start + em[:, 0]
        pointers = []
        for i in range(1, t):
            best, idx = (score.unsqueeze(2) + self.transitions).max(dim=1)
            pointers.append(idx)
            score = best + em[:, i]
        last = (score + self.end).argmax(1)
        path = [last]
        for idx in reversed(pointers):
            last = idx.gather(1, last.unsqueeze(1)).squeeze(1)
            path.append(last)
        return torch.stack(path[::-1], dim=1)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        vocab = int(self.setting("vocab_size", device, 10000))
        tags = int(self.setting("num_tags", device, 17))
        seq = int(self.setting("seq_len", device, 40))
        self.model = BiLSTMCRF(vocab, tags).to(device)
        self.example_inputs = (torch.randint(0, vocab, (self.batch_size, seq), device=device),)
        self.tags = torch.randint(0, tags, (self.batch_size, seq), device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        self.model(self.example_inputs[0], self.tags).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        return (self.model.decode(*self.example_inputs),)
