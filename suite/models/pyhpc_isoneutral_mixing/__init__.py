"""A pyhpc-style scientific kernel (after pyhpc-benchmarks' isoneutral mixing, from the Veros
ocean model, which TorchBench runs as ``pyhpc_isoneutral_mixing``), written anew in torch.

The isoneutral diffusion tensor (Redi, 1982; small-slope form) is assembled from triads (Griffies
et al., "Isoneutral diffusion in a z-coordinate ocean model", JPO 1998): each tracer cell combines
the four triads formed by its two horizontal faces and its two vertical faces; each triad's
isoneutral slope ``-(drho/dx) / (drho/dz)`` comes from temperature and salinity gradients weighted
by the thermal expansion and haline contraction of a simplified nonlinear equation of state
(Vallis, 2006, section 1.6), and is tapered with ``0.5 * (1 + tanh((S_max - |s|) / S_d))``
(Danabasoglu & McWilliams, 1995). The output stacks the tensor components K11, K22, K13, K23, K33
at every cell: many shifted slices and element-wise operations, as in the original kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from suite.model import BenchmarkModel

RHO0 = 1027.0  # kg m^-3
BETA_T = 1.67e-4  # 1/K, thermal expansion at the surface
BETA_T_STAR = 1.1e-5  # 1/K^2, cabbeling
GAMMA = 1.1e-8 * 1e4  # 1/bar, thermobaric coefficient per bar (1.1e-8 per Pa)
BETA_S = 7.8e-4  # 1/psu
T0 = 10.0
DIFFUSIVITY = 1000.0  # m^2 s^-1, isoneutral diffusivity A_i
SLOPE_MAX = 1e-3
SLOPE_WIDTH = 1e-3
# Floor of -drho/dz (kg m^-4): keeps slopes finite in unstratified cells, where the taper is 0.
STABILITY_FLOOR = 1e-8
# Keeps the slope norm differentiable where both slopes vanish (d sqrt(x)/dx is infinite at 0).
NORM_EPS = 1e-24


class IsoneutralTensor(nn.Module):
    """Inputs (nx, ny, nz): temperature (deg C), salinity (psu), pressure (bar), land mask; and
    grid spacings dx, dy (m, scalars) and dz (nz,). Output (5, nx-2, ny-2, nz-2): K11, K22, K13,
    K23, K33 (m^2 s^-1) at interior cells."""

    def __init__(self, dx: float, dy: float) -> None:
        super().__init__()
        self.dx, self.dy = dx, dy

    def forward(
        self,
        temp: torch.Tensor,
        salt: torch.Tensor,
        pressure: torch.Tensor,
        mask: torch.Tensor,
        dz: torch.Tensor,
    ) -> torch.Tensor:
        # Equation-of-state derivatives at cell centres.
        drdt = -RHO0 * (BETA_T * (1 + GAMMA * pressure) + BETA_T_STAR * (temp - T0))
        drds = torch.full_like(salt, RHO0 * BETA_S)
        # Tracer gradients on faces, masked where either side is land.
        mx = mask[1:] * mask[:-1]
        my = mask[:, 1:] * mask[:, :-1]
        mz = mask[..., 1:] * mask[..., :-1]
        dtx, dsx = mx * (temp[1:] - temp[:-1]) / self.dx, mx * (salt[1:] - salt[:-1]) / self.dx
        dty = my * (temp[:, 1:] - temp[:, :-1]) / self.dy
        dsy = my * (salt[:, 1:] - salt[:, :-1]) / self.dy
        dzf = 0.5 * (dz[1:] + dz[:-1])
        dtz = mz * (temp[..., 1:] - temp[..., :-1]) / dzf
        dsz = mz * (salt[..., 1:] - salt[..., :-1]) / dzf
        # Interior cells i in 1..n-2; their west/east faces are x-faces i-1 and i, their
        # lower/upper faces are z-faces k-1 and k (z grows downwards: upper = smaller k).
        c = (slice(1, -1), slice(1, -1), slice(1, -1))
        a_t, a_s = drdt[c], drds[c]
        k11 = k22 = k13 = k23 = k33 = torch.zeros_like(a_t)
        for hx in (0, 1):
            for vz in (0, 1):
                zs = slice(vz, dtz.shape[2] - 1 + vz)
                drz = a_t * dtz[1:-1, 1:-1, zs] + a_s * dsz[1:-1, 1:-1, zs]
                drz = torch.minimum(drz, torch.full_like(drz, -STABILITY_FLOOR))
                xs = slice(hx, dtx.shape[0] - 1 + hx)
                drx = a_t * dtx[xs, 1:-1, 1:-1] + a_s * dsx[xs, 1:-1, 1:-1]
                ys = slice(hx, dty.shape[1] - 1 + hx)
                dry = a_t * dty[1:-1, ys, 1:-1] + a_s * dsy[1:-1, ys, 1:-1]
                sx, sy = -drx / drz, -dry / drz
                taper = 0.5 * (
                    1
                    + torch.tanh(
                        (SLOPE_MAX - torch.sqrt(sx * sx + sy * sy + NORM_EPS)) / SLOPE_WIDTH
                    )
                )
                w = 0.25 * DIFFUSIVITY * taper * mask[c]
                k11 = k11 + w
                k22 = k22 + w
                k13 = k13 + w * sx
                k23 = k23 + w * sy
                k33 = k33 + w * (sx * sx + sy * sy)
        return torch.stack([k11, k22, k13, k23, k33])


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        nx, ny = self.batch_size + 2, int(self.setting("ny", device, 32)) + 2
        nz = int(self.setting("levels", device, 24)) + 2
        if nx < 3:
            raise NotImplementedError("pyhpc_isoneutral_mixing needs batch_size >= 1")
        dz = torch.linspace(10, 250, nz, device=device)
        depth = torch.cumsum(dz, 0)
        pressure = (depth / 10).expand(nx, ny, nz).contiguous()
        temp = (2 + 18 * torch.exp(-depth / 700)) + 0.5 * torch.randn(nx, ny, nz, device=device)
        salt = 34.0 + 0.002 * depth.clamp(max=1000) + 0.05 * torch.randn(nx, ny, nz, device=device)
        mask = (torch.rand(nx, ny, 1, device=device) > 0.05).float().expand(nx, ny, nz).contiguous()
        self.model = IsoneutralTensor(dx=50e3, dy=50e3)
        if test == "train":
            with torch.no_grad():
                self.observed = self.model(
                    temp + 0.1 * torch.randn_like(temp), salt, pressure, mask, dz
                )
            temp.requires_grad_(True)
            salt.requires_grad_(True)
            self.optimizer = torch.optim.SGD([temp, salt], lr=10.0)
        self.example_inputs = (temp, salt, pressure, mask, dz)

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss = ((self.model(*self.example_inputs) - self.observed) / DIFFUSIVITY).pow(2).mean()
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
