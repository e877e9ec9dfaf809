"""A pyhpc-style scientific kernel (after pyhpc-benchmarks, which TorchBench runs as
``pyhpc_equation_of_state``): the UNESCO EOS-80 equation of state of seawater in torch.

Density follows Fofonoff & Millard, "Algorithms for computation of fundamental properties of
seawater", UNESCO Tech. Pap. Mar. Sci. 44 (1983): the one-atmosphere density polynomial in
salinity S (psu) and temperature T (deg C), divided by ``1 - p / K(S, T, p)`` with the secant bulk
modulus K (pressure p in bar). It is a long chain of element-wise operations, memory-bound like
the pyhpc kernels.

Train is one step of state estimation: temperature and salinity are the unknowns, fitted to
observed densities by gradient descent through the kernel (forward, MSE, backward, SGD step).
"""

from __future__ import annotations

import torch
from torch import nn

from suite.model import BenchmarkModel


def _poly(x: torch.Tensor, coefficients: tuple[float, ...]) -> torch.Tensor:
    """Horner's rule: c0 + c1 x + c2 x^2 + ..."""
    out = torch.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        out = out * x + c
    return out


class EquationOfState(nn.Module):
    """EOS-80 density (kg m^-3) of seawater; inputs (..., levels) tensors of S, T and p."""

    def forward(self, s: torch.Tensor, t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        s15 = s * torch.sqrt(s.clamp(min=0))
        rho_w = _poly(
            t, (999.842594, 6.793952e-2, -9.095290e-3, 1.001685e-4, -1.120083e-6, 6.536332e-9)
        )
        rho0 = (
            rho_w
            + s * _poly(t, (8.24493e-1, -4.0899e-3, 7.6438e-5, -8.2467e-7, 5.3875e-9))
            + s15 * _poly(t, (-5.72466e-3, 1.0227e-4, -1.6546e-6))
            + 4.8314e-4 * s * s
        )
        k_w = _poly(t, (19652.21, 148.4206, -2.327105, 1.360477e-2, -5.155288e-5))
        k0 = (
            k_w
            + s * _poly(t, (54.6746, -0.603459, 1.09987e-2, -6.1670e-5))
            + s15 * _poly(t, (7.944e-2, 1.6483e-2, -5.3009e-4))
        )
        a = (
            _poly(t, (3.239908, 1.43713e-3, 1.16092e-4, -5.77905e-7))
            + s * _poly(t, (2.2838e-3, -1.0981e-5, -1.6078e-6))
            + 1.91075e-4 * s15
        )
        b = _poly(t, (8.50935e-5, -6.12293e-6, 5.2787e-8)) + s * _poly(
            t, (-9.9348e-7, 2.0816e-8, 9.1697e-10)
        )
        k = k0 + a * p + b * p * p
        return rho0 / (1 - p / k)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        levels = int(self.setting("levels", device, 64))
        shape = (self.batch_size, levels)
        depth = torch.linspace(0, 5000, levels, device=device)  # m; ~1 dbar per m
        pressure = (depth / 10).expand(shape).contiguous()  # bar
        temperature = 2 + 20 * torch.exp(-depth / 800) + torch.randn(shape, device=device)
        salinity = 34.5 + 0.5 * torch.rand(shape, device=device)
        self.model = EquationOfState()
        if test == "train":
            self.observed = self.model(
                salinity + 0.1 * torch.randn_like(salinity),
                temperature + 0.5 * torch.randn_like(temperature),
                pressure,
            ).detach()
            salinity.requires_grad_(True)
            temperature.requires_grad_(True)
            self.optimizer = torch.optim.SGD([salinity, temperature], lr=1e-3)
        self.example_inputs = (salinity, temperature, pressure)

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = (self.model(*self.example_inputs) - self.observed).pow(2).mean()
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
