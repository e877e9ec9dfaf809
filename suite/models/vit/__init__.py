"""Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021), built by
transformers from a ViT-Tiny-width config with random weights (nothing downloaded)."""

from __future__ import annotations

import torch
from transformers import ViTConfig, ViTForImageClassification

from suite.model import BenchmarkModel


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        size = int(self.setting("image_size", device, 64))
        config = ViTConfig(
            image_size=size,
            patch_size=int(self.setting("patch_size", device, 8)),
            hidden_size=192,
            num_hidden_layers=6,
            num_attention_heads=3,
            intermediate_size=768,
            num_labels=10,
        )
        self.model = ViTForImageClassification(config).to(device)
        self.example_inputs = (torch.randn(self.batch_size, 3, size, size, device=device),)
        self.labels = torch.randint(0, 10, (self.batch_size,), device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        out = self.model(pixel_values=self.example_inputs[0], labels=self.labels)
        out.loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(pixel_values=self.example_inputs[0]).logits,)
