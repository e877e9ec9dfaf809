"""BART (Lewis et al., "BART: Denoising Sequence-to-Sequence Pre-training for Natural Language
Generation, Translation, and Comprehension", ACL 2020), built by transformers from a small config
with random weights, trained teacher-forced on a source/summary pair."""

from __future__ import annotations

import torch
from transformers import BartConfig, BartForConditionalGeneration

from suite.model import BenchmarkModel


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        vocab = int(self.setting("vocab_size", device, 4096))
        src = int(self.setting("source_len", device, 64))
        tgt = int(self.setting("target_len", device, 16))
        config = BartConfig(
            vocab_size=vocab,
            d_model=256,
            encoder_layers=3,
            decoder_layers=3,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=1024,
            decoder_ffn_dim=1024,
            max_position_embeddings=max(512, src),
            use_cache=False,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
        )
        self.model = BartForConditionalGeneration(config).to(device)
        self.example_inputs = (torch.randint(3, vocab, (self.batch_size, src), device=device),)
        self.labels = torch.randint(3, vocab, (self.batch_size, tgt), device=device)
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
