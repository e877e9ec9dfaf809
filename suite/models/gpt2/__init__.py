"""GPT-2 (Radford et al., "Language Models are Unsupervised Multitask Learners", 2019), built by
transformers from a small config with random weights, trained on next-token prediction."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from suite.model import BenchmarkModel


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        seq = int(self.setting("seq_len", device, 64))
        vocab = int(self.setting("vocab_size", device, 4096))
        config = GPT2Config(
            vocab_size=vocab,
            n_positions=max(1024, seq),
            n_embd=256,
            n_layer=4,
            n_head=4,
            use_cache=False,
            bos_token_id=vocab - 1,
            eos_token_id=vocab - 1,
        )
        self.model = GPT2LMHeadModel(config).to(device)
        self.example_inputs = (torch.randint(0, vocab, (self.batch_size, seq), device=device),)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        ids = self.example_inputs[0]
        self.model(input_ids=ids, labels=ids).loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(input_ids=self.example_inputs[0]).logits,)
