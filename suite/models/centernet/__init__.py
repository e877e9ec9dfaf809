"""A CenterNet-style detector (Zhou et al., "Objects as Points", arXiv:1904.07850), from code.

Objects are points: a heatmap per class peaks at box centres, with box size and sub-pixel offset
regressed at the centre. Training uses the paper's penalty-reduced focal loss on the heatmap and
L1 losses at the object centres; evaluation decodes boxes with a 3x3 max-pool as non-maximum
suppression and a top-k over all classes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

STRIDE = 4


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


class CenterNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        # Backbone down to stride 16, neck back up to stride 4 (the paper's output stride).
        self.backbone = nn.Sequential(
            conv_bn(3, 32, 2),
            conv_bn(32, 32),
            conv_bn(32, 64, 2),
            conv_bn(64, 64),
            conv_bn(64, 128, 2),
            conv_bn(128, 128),
            conv_bn(128, 256, 2),
            conv_bn(256, 256),
        )
        self.neck = nn.Sequential(
            nn.ConvTranspose2d(256, 128, 4, 2, 1, bias=False),
            nn.BatchNorm2d(128),
            nn.ReLU(True),
            nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(True),
        )

        def head(out: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(True), nn.Conv2d(64, out, 1)
            )

        self.heatmap = head(num_classes)
        self.size = head(2)
        self.offset = head(2)
        # The paper's prior: initial heatmap confidence of ~0.1 keeps the focal loss stable.
        nn.init.constant_(self.heatmap[-1].bias, -2.19)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f = self.neck(self.backbone(x))
        return self.heatmap(f), self.size(f), self.offset(f)


def focal_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Penalty-reduced pixel-wise focal loss (alpha=2, beta=4), normalised by object count."""
    pred = logits.sigmoid().clamp(1e-4, 1 - 1e-4)
    pos = target.eq(1).float()
    neg_weight = (1 - target).pow(4)
    pos_loss = torch.log(pred) * (1 - pred).pow(2) * pos
    neg_loss = torch.log(1 - pred) * pred.pow(2) * neg_weight * (1 - pos)
    return -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)


def gather_at(feature: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``feature`` (B, C, H, W) read at flat positions ``index`` (B, K) -> (B, K, C)."""
    b, c = feature.shape[:2]
    flat = feature.view(b, c, -1)
    return flat.gather(2, index.unsqueeze(1).expand(b, c, index.shape[1])).permute(0, 2, 1)


def make_targets(
    batch: int, classes: int, out: int, objects: int, device: str, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Random boxes rendered as the paper's targets: Gaussian peaks, sizes and offsets."""
    centers = torch.rand(batch, objects, 2, generator=generator) * (out - 1)
    sizes = torch.rand(batch, objects, 2, generator=generator) * out / 3 + 2
    labels = torch.randint(0, classes, (batch, objects), generator=generator)
    ys, xs = torch.meshgrid(torch.arange(out), torch.arange(out), indexing="ij")
    heat = torch.zeros(batch, classes, out, out)
    ints = centers.floor()
    sigma = sizes.mean(-1) / 6
    for b in range(batch):
        for k in range(objects):
            cx, cy = ints[b, k]
            g = torch.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * sigma[b, k] ** 2))
            heat[b, labels[b, k]] = torch.maximum(heat[b, labels[b, k]], g)
    index = (ints[..., 1] * out + ints[..., 0]).long()
    return {
        "heatmap": heat.to(device),
        "index": index.to(device),
        "size": sizes.to(device),
        "offset": (centers - ints).to(device),
    }


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        size = int(self.setting("image_size", device, 128))
        classes = int(self.setting("num_classes", device, 8))
        self.top_k = int(self.setting("max_objects", device, 16))
        self.model = CenterNet(classes).to(device)
        self.example_inputs = (torch.randn(self.batch_size, 3, size, size, device=device),)
        gen = torch.Generator().manual_seed(0)
        self.targets = make_targets(
            self.batch_size, classes, size // STRIDE, self.top_k, device, gen
        )
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1.25e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        heat, size, offset = self.model(*self.example_inputs)
        t = self.targets
        loss = (
            focal_loss(heat, t["heatmap"])
            + 0.1 * F.l1_loss(gather_at(size, t["index"]), t["size"])
            + F.l1_loss(gather_at(offset, t["index"]), t["offset"])
        )
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            heat, size, offset = self.model(*self.example_inputs)
            heat = heat.sigmoid()
            peaks = heat * (F.max_pool2d(heat, 3, 1, 1) == heat)
            b, c, h, w = peaks.shape
            scores, flat = peaks.view(b, -1).topk(self.top_k)
            labels = torch.div(flat, h * w, rounding_mode="floor")
            index = flat % (h * w)
            ys = torch.div(index, w, rounding_mode="floor").float()
            xs = (index % w).float()
            wh = gather_at(size, index)
            off = gather_at(offset, index)
            cx, cy = xs + off[..., 0], ys + off[..., 1]
            boxes = (
                torch.stack(
                    [
                        cx - wh[..., 0] / 2,
                        cy - wh[..., 1] / 2,
                        cx + wh[..., 0] / 2,
                        cy + wh[..., 1] / 2,
                    ],
                    -1,
                )
                * STRIDE
            )
            return boxes, scores, labels
