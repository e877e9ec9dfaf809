"""A LLaMA-style decoder (Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
2023), built by transformers from a small config with random weights: RMSNorm, rotary position
embeddings, SwiGLU feed-forward and grouped-query attention (4 query heads sharing 2 key/value
heads), trained on next-token prediction."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from suite.model import BenchmarkModel


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        seq = int(self.setting("seq_len", device, 64))
        vocab = int(self.setting("vocab_size", device, 4096))
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max(1024, seq),
            use_cache=False,
        )
        self.model = LlamaForCausalLM(config).to(device)
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
