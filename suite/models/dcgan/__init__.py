"""DCGAN (Radford et al., "Unsupervised Representation Learning with Deep Convolutional Generative
Adversarial Networks", ICLR 2016), from code: a transposed-convolution generator and a strided
convolution discriminator for 64x64 images, trained with the non-saturating GAN loss."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel


def init_weights(module: nn.Module) -> None:
    # The paper's initialisation: N(0, 0.02) for convolutions, N(1, 0.02) for batch-norm scales.
    if isinstance(module, nn.Conv2d | nn.ConvTranspose2d):
        nn.init.normal_(module.weight, 0.0, 0.02)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)


class Generator(nn.Module):
    def __init__(self, nz: int, ngf: int) -> None:
        super().__init__()
        chans = [ngf * 8, ngf * 4, ngf * 2, ngf]
        layers: list[nn.Module] = [
            nn.ConvTranspose2d(nz, chans[0], 4, 1, 0, bias=False),
            nn.BatchNorm2d(chans[0]),
            nn.ReLU(True),
        ]
        for cin, cout in zip(chans, chans[1:], strict=False):
            layers += [
                nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(True),
            ]
        layers += [nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, ndf: int) -> None:
        super().__init__()
        chans = [ndf, ndf * 2, ndf * 4, ndf * 8]
        layers: list[nn.Module] = [nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True)]
        for cin, cout in zip(chans, chans[1:], strict=False):
            layers += [
                nn.Conv2d(cin, cout, 4, 2, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.LeakyReLU(0.2, True),
            ]
        layers += [nn.Conv2d(chans[-1], 1, 4, 1, 0, bias=False)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).flatten()


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        self.nz = int(self.setting("latent_size", device, 100))
        width = int(self.setting("feature_maps", device, 32))
        self.model = Generator(self.nz, width).to(device)
        self.discriminator = Discriminator(width).to(device)
        self.model.apply(init_weights)
        self.discriminator.apply(init_weights)
        self.noise = torch.randn(self.batch_size, self.nz, 1, 1, device=device)
        self.real = torch.rand(self.batch_size, 3, 64, 64, device=device) * 2 - 1
        self.example_inputs = (self.noise,)
        if test == "train":
            self.model.train()
            self.discriminator.train()
            betas = (0.5, 0.999)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=2e-4, betas=betas)
            self.optimizer_d = torch.optim.Adam(
                self.discriminator.parameters(), lr=2e-4, betas=betas
            )
        else:
            self.model.eval()

    def set_compiler(self, compiler: str) -> None:
        super().set_compiler(compiler)
        if compiler == "inductor":
            self.discriminator = torch.compile(self.discriminator, backend="inductor")

    def train(self) -> None:
        assert self.optimizer is not None
        ones = torch.ones(self.batch_size, device=self.device)
        zeros = torch.zeros(self.batch_size, device=self.device)
        fake = self.model(self.noise)
        # Discriminator: real images towards 1, generated ones towards 0.
        self.optimizer_d.zero_grad(set_to_none=True)
        loss_d = F.binary_cross_entropy_with_logits(
            self.discriminator(self.real), ones
        ) + F.binary_cross_entropy_with_logits(self.discriminator(fake.detach()), zeros)
        loss_d.backward()
        self.optimizer_d.step()
        # Generator: the non-saturating loss, generated images towards 1.
        self.optimizer.zero_grad(set_to_none=True)
        loss_g = F.binary_cross_entropy_with_logits(self.discriminator(fake), ones)
        loss_g.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(self.noise),)
