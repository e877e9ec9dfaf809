"""ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016), from code."""

from __future__ import annotations

import torch
from torch import nn

from suite.model import BenchmarkModel


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        layers: list[nn.Module] = []
        inplanes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes)]
            inplanes = planes
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        size = int(self.metadata.get("image_size", {}).get(device, 64))
        self.model = ResNet18().to(device)
        self.example_inputs = (torch.randn(self.batch_size, 3, size, size, device=device),)
        self.targets = torch.randint(0, 10, (self.batch_size,), device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(self.model(*self.example_inputs), self.targets)
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
