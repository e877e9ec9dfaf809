"""BERT (Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers", NAACL 2019),
built by transformers from a small config with random weights, trained on masked-token
prediction (15% of positions carry a label)."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertForMaskedLM

from suite.model import BenchmarkModel


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        seq = int(self.setting("seq_len", device, 64))
        vocab = int(self.setting("vocab_size", device, 4096))
        config = BertConfig(
            vocab_size=vocab,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
            max_position_embeddings=max(512, seq),
        )
        self.model = BertForMaskedLM(config).to(device)
        ids = torch.randint(0, vocab, (self.batch_size, seq), device=device)
        masked = torch.rand(self.batch_size, seq, device=device) < 0.15
        self.labels = torch.where(masked, ids, torch.full_like(ids, -100))
        self.example_inputs = (ids, torch.ones_like(ids))
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        ids, attention = self.example_inputs
        loss = self.model(input_ids=ids, attention_mask=attention, labels=self.labels).loss
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            ids, attention = self.example_inputs
            return (self.model(input_ids=ids, attention_mask=attention).logits,)
