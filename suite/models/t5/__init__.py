"""T5 (Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer", JMLR 2020), built by transformers from a small config with random weights, trained
as a teacher-forced sequence-to-sequence model."""

from __future__ import annotations

import torch
from transformers import T5Config, T5ForConditionalGeneration

from suite.model import BenchmarkModel


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        vocab = int(self.setting("vocab_size", device, 4096))
        src = int(self.setting("source_len", device, 64))
        tgt = int(self.setting("target_len", device, 16))
        config = T5Config(
            vocab_size=vocab,
            d_model=256,
            d_kv=64,
            d_ff=1024,
            num_layers=4,
            num_decoder_layers=4,
            num_heads=4,
            decoder_start_token_id=0,
            pad_token_id=0,
            use_cache=False,
        )
        self.model = T5ForConditionalGeneration(config).to(device)
        self.example_inputs = (torch.randint(1, vocab, (self.batch_size, src), device=device),)
        self.labels = torch.randint(1, vocab, (self.batch_size, tgt), device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        self.model(input_ids=self.example_inputs[0], labels=self.labels).loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(input_ids=self.example_inputs[0], labels=self.labels).logits,)
