"""A word-level LSTM language model (Zaremba, Sutskever & Vinyals, "Recurrent Neural Network
Regularization", arXiv:1409.2329; the shape of PyTorch's ``word_language_model`` example), from
code: embedding, 2-layer LSTM with dropout, decoder tied to the embedding (Press & Wolf, 2017).
Training is truncated back-propagation through time: the hidden state is carried from batch to
batch and detached, gradients are clipped at 0.25, plain SGD."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

HIDDEN = 256
LAYERS = 2


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, HIDDEN)
        self.lstm = nn.LSTM(HIDDEN, HIDDEN, LAYERS, dropout=0.2, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.decoder = nn.Linear(HIDDEN, vocab)
        self.decoder.weight = self.embed.weight  # tied embeddings

    def forward(
        self, tokens: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, state = self.lstm(self.drop(self.embed(tokens)), state)
        return self.decoder(self.drop(out)), state


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        vocab = int(self.setting("vocab_size", device, 10000))
        bptt = int(self.setting("bptt", device, 35))
        self.model = LSTMLanguageModel(vocab).to(device)
        stream = torch.randint(0, vocab, (self.batch_size, bptt + 1), device=device)
        self.example_inputs = (stream[:, :-1],)
        self.targets = stream[:, 1:]
        zeros = torch.zeros(LAYERS, self.batch_size, HIDDEN, device=device)
        self.state = (zeros, zeros.clone())
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=20.0)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        state = (self.state[0].detach(), self.state[1].detach())
        logits, self.state = self.model(self.example_inputs[0], state)
        F.cross_entropy(logits.flatten(0, 1), self.targets.flatten()).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 0.25)
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            logits, self.state = self.model(self.example_inputs[0], self.state)
            return (logits,)
