"""Faster R-CNN with an FPN (Ren et al., "Faster R-CNN", arXiv:1506.01497; Lin et al., "Feature
Pyramid Networks for Object Detection", arXiv:1612.03144), from code, at a small scale.

- Backbone: MobileNetV3-style inverted residuals (Howard et al., arXiv:1905.02244) with hardswish
  and squeeze-and-excitation (adaptive average pooling, hardsigmoid); features at strides 8, 16.
- Neck: FPN lateral 1x1 convolutions, nearest top-down upsampling, 3x3 outputs with GroupNorm.
- RPN: three anchors per location and level; anchors are matched to the ground truth by IoU
  (positive >= 0.7 or best for a box, negative < 0.3), 256 per image drawn at most half
  positive (``torch.randperm``), binary cross-entropy on objectness and smooth L1 on the encoded
  deltas; proposals are decoded, clipped and thinned with Fast NMS (Bolya et al., "YOLACT",
  arXiv:1904.02689: the IoU matrix's upper triangle, no sequential loop), which keeps the
  proposals' shapes static, so that every step does the same work up to the random draws.
- RoIAlign (He et al., "Mask R-CNN", arXiv:1703.06870): a 14x14 bilinear sampling grid per region
  from ``F.affine_grid``, ``F.grid_sample`` on the region's FPN level, 2x2 average pooling to 7x7.
- Box head: two fully connected layers, softmax classification and class-specific box deltas,
  trained on regions drawn at most a quarter positive (IoU >= 0.5 with a box); eval decodes the
  boxes per class, runs class-offset Fast NMS and keeps the top detections.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

STRIDES = (8, 16)
ANCHOR_SIZES = (32.0, 64.0)
ASPECTS = (0.5, 1.0, 2.0)
FPN_CHANNELS = 64
POOL = 7
BBOX_CLIP = math.log(1000.0 / 16)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of ``a`` (..., N, 4) and ``b`` (..., M, 4) boxes ``(x1, y1, x2, y2)``: (..., N, M)."""
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    lt = torch.maximum(a[..., :, None, :2], b[..., None, :, :2])
    rb = torch.minimum(a[..., :, None, 2:], b[..., None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    return inter / (area_a[..., :, None] + area_b[..., None, :] - inter)


def encode(boxes: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Deltas ``(dx, dy, dw, dh)`` of ``boxes`` relative to ``anchors`` (same shape, ..., 4)."""
    wa, ha = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
    wb, hb = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    dx = (boxes[..., 0] + 0.5 * wb - anchors[..., 0] - 0.5 * wa) / wa
    dy = (boxes[..., 1] + 0.5 * hb - anchors[..., 1] - 0.5 * ha) / ha
    return torch.stack([dx, dy, torch.log(wb / wa), torch.log(hb / ha)], dim=-1)


def decode(deltas: torch.Tensor, anchors: torch.Tensor, size: int) -> torch.Tensor:
    """Boxes from ``deltas`` on ``anchors`` (..., 4), clipped to a ``size`` x ``size`` image."""
    wa, ha = anchors[..., 2] - anchors[..., 0], anchors[..., 3] - anchors[..., 1]
    cx = anchors[..., 0] + 0.5 * wa + deltas[..., 0] * wa
    cy = anchors[..., 1] + 0.5 * ha + deltas[..., 1] * ha
    w = wa * torch.exp(deltas[..., 2].clamp(max=BBOX_CLIP))
    h = ha * torch.exp(deltas[..., 3].clamp(max=BBOX_CLIP))
    boxes = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)
    return boxes.clamp(0, size)


def fast_nms(
    boxes: torch.Tensor, scores: torch.Tensor, keep: int, threshold: float = 0.7
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast NMS on (B, N, 4) boxes and (B, N) scores; the ``keep`` best survivors per image.

    A box is dropped when a higher-scoring box overlaps it by more than ``threshold`` IoU.
    Returns the kept boxes (B, keep, 4) and scores (B, keep), suppressed ones scored ``-inf``.
    """
    order = scores.argsort(dim=1, descending=True)
    boxes = boxes.gather(1, order.unsqueeze(-1).expand_as(boxes))
    scores = scores.gather(1, order)
    iou = box_iou(boxes, boxes).triu(diagonal=1)
    suppressed = iou.amax(dim=1) > threshold
    scores = scores.masked_fill(suppressed, float("-inf"))
    top, idx = scores.topk(keep, dim=1)
    return boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4)), top


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, expand: int, cout: int, stride: int, hswish: bool) -> None:
        super().__init__()
        act = nn.Hardswish if hswish else nn.ReLU
        squeeze = max(8, expand // 4)
        self.block = nn.Sequential(
            nn.Conv2d(cin, expand, 1, bias=False),
            nn.BatchNorm2d(expand),
            act(),
            nn.Conv2d(expand, expand, 3, stride, 1, groups=expand, bias=False),
            nn.BatchNorm2d(expand),
            act(),
        )
        self.se = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(expand, squeeze, 1),
            nn.ReLU(),
            nn.Conv2d(squeeze, expand, 1),
            nn.Hardsigmoid(),
        )
        self.project = nn.Sequential(nn.Conv2d(expand, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        y = self.project(y * self.se(y))
        return x + y if self.residual else y


class Backbone(nn.Module):
    """MobileNetV3-small-like trunk; returns the stride-8 and stride-16 feature maps."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish()
        )
        self.c3 = nn.Sequential(
            InvertedResidual(16, 64, 24, 2, False),
            InvertedResidual(24, 72, 24, 2, False),
            InvertedResidual(24, 96, 40, 1, True),
        )
        self.c4 = nn.Sequential(
            InvertedResidual(40, 160, 48, 2, True), InvertedResidual(48, 144, 48, 1, True)
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        c3 = self.c3(self.stem(x))
        return [c3, self.c4(c3)]


class FPN(nn.Module):
    def __init__(self, channels: tuple[int, ...]) -> None:
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, FPN_CHANNELS, 1) for c in channels)
        self.output = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(FPN_CHANNELS, FPN_CHANNELS, 3, padding=1, bias=False),
                nn.GroupNorm(8, FPN_CHANNELS),
                nn.ReLU(),
            )
            for _ in channels
        )

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        inner = self.lateral[-1](feats[-1])
        outs = [self.output[-1](inner)]
        for i in range(len(feats) - 2, -1, -1):
            inner = self.lateral[i](feats[i]) + F.interpolate(inner, size=feats[i].shape[-2:])
            outs.insert(0, self.output[i](inner))
        return outs


class RPNHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(FPN_CHANNELS, FPN_CHANNELS, 3, padding=1)
        self.objectness = nn.Conv2d(FPN_CHANNELS, len(ASPECTS), 1)
        self.deltas = nn.Conv2d(FPN_CHANNELS, 4 * len(ASPECTS), 1)

    def forward(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Objectness (B, A) and deltas (B, A, 4) over all levels' anchors A."""
        logits, deltas = [], []
        for f in feats:
            h = F.relu(self.conv(f))
            logits.append(self.objectness(h).permute(0, 2, 3, 1).flatten(1))
            d = self.deltas(h).permute(0, 2, 3, 1)
            deltas.append(d.reshape(d.shape[0], -1, 4))
        return torch.cat(logits, 1), torch.cat(deltas, 1)


def make_anchors(size: int, device: torch.device | str) -> torch.Tensor:
    """All anchors (A, 4) in the RPN head's order: level, row, column, aspect ratio."""
    out = []
    for stride, base in zip(STRIDES, ANCHOR_SIZES, strict=True):
        n = size // stride
        ratios = torch.tensor(ASPECTS, device=device)
        ws, hs = base / torch.sqrt(ratios), base * torch.sqrt(ratios)
        cell = torch.stack([-ws, -hs, ws, hs], dim=1) / 2  # (3, 4) around the origin
        shifts = (torch.arange(n, device=device, dtype=torch.float32) + 0.5) * stride
        sy, sx = torch.meshgrid(shifts, shifts, indexing="ij")
        centres = torch.stack([sx, sy, sx, sy], dim=-1).reshape(-1, 1, 4)
        out.append((centres + cell).reshape(-1, 4))
    return torch.cat(out)


def roi_align(feats: list[torch.Tensor], rois: torch.Tensor, size: int) -> torch.Tensor:
    """RoIAlign of (B, R, 4) image-space boxes: (B * R, C, 7, 7) pooled features.

    Each region is sampled on a 14x14 bilinear grid of its FPN level (small regions on stride 8,
    the others on stride 16, the FPN paper's level rule), then 2x2 average pooled. The regions'
    grids are stacked so that one ``grid_sample`` per level reads each image's own map.
    """
    b, r, _ = rois.shape
    flat = rois.reshape(-1, 4)
    cx, cy = (flat[:, 0] + flat[:, 2]) / size - 1, (flat[:, 1] + flat[:, 3]) / size - 1
    w, h = (flat[:, 2] - flat[:, 0]) / size, (flat[:, 3] - flat[:, 1]) / size
    theta = torch.zeros(b * r, 2, 3, device=rois.device)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w, cx, h, cy
    n = 2 * POOL
    grid = F.affine_grid(theta, [b * r, FPN_CHANNELS, n, n], align_corners=False)
    grid = grid.view(b, r * n, n, 2)  # each image's regions stacked along the grid's height
    small = (torch.sqrt(w * h) * size < 2 * ANCHOR_SIZES[0]).view(-1, 1, 1, 1)
    pooled = []
    for f in feats:
        sampled = F.grid_sample(f, grid, align_corners=False)  # (B, C, R * n, n)
        sampled = sampled.view(b, f.shape[1], r, n, n).transpose(1, 2).reshape(b * r, -1, n, n)
        pooled.append(F.avg_pool2d(sampled, 2))
    return torch.where(small, pooled[0], pooled[1])


class FasterRCNN(nn.Module):
    def __init__(self, num_classes: int, size: int, proposals: int) -> None:
        super().__init__()
        self.size, self.proposals, self.num_classes = size, proposals, num_classes
        self.backbone = Backbone()
        self.fpn = FPN((40, 48))
        self.rpn = RPNHead()
        self.box_head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(FPN_CHANNELS * POOL * POOL, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
        )
        self.cls_score = nn.Linear(256, num_classes + 1)
        self.bbox_pred = nn.Linear(256, 4 * num_classes)
        self.register_buffer("anchors", make_anchors(size, "cpu"), persistent=False)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """RPN outputs, proposals (B, P, 4), class logits (B*P, K+1), box deltas (B*P, K, 4)."""
        feats = self.fpn(self.backbone(images))
        logits, deltas = self.rpn(feats)
        with torch.no_grad():
            boxes = decode(deltas.detach(), self.anchors, self.size)
            pre = min(4 * self.proposals, boxes.shape[1])
            top, idx = logits.detach().topk(pre, dim=1)
            boxes = boxes.gather(1, idx.unsqueeze(-1).expand(-1, -1, 4))
            proposals, _ = fast_nms(boxes, top, self.proposals)
        h = self.box_head(roi_align(feats, proposals, self.size))
        return (
            logits,
            deltas,
            proposals,
            self.cls_score(h),
            self.bbox_pred(h).view(-1, self.num_classes, 4),
        )


def sample_balanced(labels: torch.Tensor, per_image: int, positive_fraction: float) -> torch.Tensor:
    """The paper's minibatch of anchors or regions: a (B, N) mask of at most ``per_image``
    entries per image drawn at random (``torch.randperm``), positives (label > 0) up to
    ``positive_fraction`` of them, negatives (label 0) filling the rest; -1 is never drawn.
    As torchvision's ``BalancedPositiveNegativeSampler``."""
    mask = torch.zeros_like(labels, dtype=torch.bool)
    for i in range(labels.shape[0]):
        pos = (labels[i] > 0).nonzero().squeeze(1)
        neg = (labels[i] == 0).nonzero().squeeze(1)
        n_pos = min(pos.numel(), int(per_image * positive_fraction))
        n_neg = min(neg.numel(), per_image - n_pos)
        pos = pos[torch.randperm(pos.numel(), device=labels.device)[:n_pos]]
        neg = neg[torch.randperm(neg.numel(), device=labels.device)[:n_neg]]
        mask[i, torch.cat([pos, neg])] = True
    return mask


def rpn_loss(
    logits: torch.Tensor, deltas: torch.Tensor, anchors: torch.Tensor, gt_boxes: torch.Tensor
) -> torch.Tensor:
    """Objectness BCE over 256 sampled anchors per image (half positive at most) plus smooth L1
    on the sampled positives' deltas."""
    iou = box_iou(anchors.expand(gt_boxes.shape[0], -1, -1), gt_boxes)  # (B, A, G)
    best, matched = iou.max(dim=2)
    labels = torch.full_like(best, -1.0)
    labels[best < 0.3] = 0.0
    labels[best >= 0.7] = 1.0
    labels.scatter_(1, iou.argmax(dim=1), 1.0)  # each box's best anchor is positive
    sampled = sample_balanced(labels, 256, 0.5)
    cls = F.binary_cross_entropy_with_logits(logits[sampled], labels[sampled])
    targets = encode(
        gt_boxes.gather(1, matched.unsqueeze(-1).expand(-1, -1, 4)), anchors.expand_as(deltas)
    )
    pos = sampled & (labels > 0)
    reg = F.smooth_l1_loss(deltas[pos], targets[pos], beta=1 / 9, reduction="sum")
    return cls + reg / sampled.sum().clamp(min=1)


def box_loss(
    proposals: torch.Tensor,
    class_logits: torch.Tensor,
    box_deltas: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
) -> torch.Tensor:
    """Cross-entropy over K+1 classes and smooth L1 on the matched class's deltas, over regions
    sampled a quarter positive at most (the paper's box-head minibatch)."""
    iou = box_iou(proposals, gt_boxes)  # (B, P, G)
    best, matched = iou.max(dim=2)
    labels = gt_labels.gather(1, matched) + 1
    labels = torch.where(best >= 0.5, labels, torch.zeros_like(labels))
    sampled = sample_balanced(labels, proposals.shape[1], 0.25).flatten()
    labels = labels.flatten()
    cls = F.cross_entropy(class_logits[sampled], labels[sampled])
    targets = encode(gt_boxes.gather(1, matched.unsqueeze(-1).expand(-1, -1, 4)), proposals)
    pos = (sampled & (labels > 0)).nonzero().squeeze(1)
    picked = box_deltas[pos, labels[pos] - 1]
    reg = F.smooth_l1_loss(picked, targets.reshape(-1, 4)[pos], beta=1.0, reduction="sum")
    return cls + reg / sampled.sum().clamp(min=1)


def random_boxes(batch: int, count: int, size: int, device: str) -> torch.Tensor:
    """(batch, count, 4) ground-truth boxes of 16 to size/2 pixels inside the image."""
    wh = torch.empty(batch, count, 2, device=device).uniform_(16, size / 2)
    xy = torch.rand(batch, count, 2, device=device) * (size - wh)
    return torch.cat([xy, xy + wh], dim=-1)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        size = int(self.setting("image_size", device, 128))
        classes = int(self.setting("num_classes", device, 8))
        boxes = int(self.setting("boxes_per_image", device, 4))
        self.detections = int(self.setting("detections", device, 16))
        self.model = FasterRCNN(classes, size, int(self.setting("proposals", device, 64)))
        self.model = self.model.to(device)
        # kept here too: set_compiler may wrap self.model, whose buffers are then not its own
        self.anchors, self.size = self.model.get_buffer("anchors"), size
        self.example_inputs = (torch.randn(self.batch_size, 3, size, size, device=device),)
        self.gt_boxes = random_boxes(self.batch_size, boxes, size, device)
        self.gt_labels = torch.randint(0, classes, (self.batch_size, boxes), device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.SGD(
                self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4
            )
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        logits, deltas, proposals, class_logits, box_deltas = self.model(*self.example_inputs)
        loss = rpn_loss(logits, deltas, self.anchors, self.gt_boxes) + box_loss(
            proposals, class_logits, box_deltas, self.gt_boxes, self.gt_labels
        )
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            _, _, proposals, class_logits, box_deltas = self.model(*self.example_inputs)
            b, p, _ = proposals.shape
            scores = F.softmax(class_logits, dim=-1)[:, 1:].reshape(b, -1)  # (B, P*K)
            k = box_deltas.shape[1]
            boxes = decode(
                box_deltas.view(b, p, k, 4) / 10,
                proposals.unsqueeze(2).expand(-1, -1, k, -1),
                self.size,
            )
            classes = torch.arange(k, device=boxes.device).repeat(p)
            # class-offset trick: boxes of different classes never overlap in the NMS
            offset = (classes * (self.size + 1)).to(boxes.dtype).view(1, -1, 1)
            kept, top = fast_nms(boxes.reshape(b, -1, 4) + offset, scores, self.detections, 0.5)
            labels = (kept[..., 0] // (self.size + 1)).long()
            return kept - (labels * (self.size + 1)).unsqueeze(-1), top, labels
