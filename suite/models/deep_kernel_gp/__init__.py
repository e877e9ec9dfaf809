"""Deep kernel learning (Wilson, Hu, Salakhutdinov & Xing, "Deep Kernel Learning",
arXiv:1511.02222): exact Gaussian-process regression with an RBF kernel on MLP features, from code.

The kernel is ``k(x, x') = s^2 exp(-|g(x) - g(x')|^2 / (2 l^2))`` with ``g`` a tanh MLP; the
length scale ``l``, output scale ``s`` and noise ``sigma`` are positive through softplus. The
negative log marginal likelihood (Rasmussen & Williams, "Gaussian Processes for Machine Learning",
2006, Algorithm 2.1) is ``0.5 y^T (K + sigma^2 I)^-1 y + sum(log diag L) + n/2 log(2 pi)`` with
``L`` the Cholesky factor (``torch.linalg.cholesky``, ``torch.cholesky_solve``); squared distances
come from ``torch.cdist``. Eval computes the predictive mean ``K_*^T alpha`` and variance
``k_** - |L^-1 K_*|^2`` (``torch.linalg.solve_triangular``) at test points.

Data: inputs uniform in [-1, 1]^8, targets a smooth nonlinear function of them plus noise.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

JITTER = 1e-4


def target_function(x: torch.Tensor) -> torch.Tensor:
    """A smooth test function of (N, D) inputs: (N,)."""
    return torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1]) + 0.5 * x[:, 2:].pow(2).sum(1).sqrt()


class DeepKernelGP(nn.Module):
    def __init__(self, inputs: int, hidden: int, features: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Linear(inputs, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, features),
        )
        self.raw_lengthscale = nn.Parameter(torch.zeros(()))
        self.raw_outputscale = nn.Parameter(torch.zeros(()))
        self.raw_noise = nn.Parameter(torch.tensor(-2.0))

    def kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """RBF kernel (N, M) between feature rows ``a`` (N, F) and ``b`` (M, F)."""
        lengthscale = F.softplus(self.raw_lengthscale)
        # exact pairwise distances: the matrix-product shortcut loses precision near zero
        dist = torch.cdist(
            a / lengthscale, b / lengthscale, compute_mode="donot_use_mm_for_euclid_dist"
        )
        return F.softplus(self.raw_outputscale) * torch.exp(-0.5 * dist.pow(2))

    def factor(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features (N, F) of ``x`` and the Cholesky factor (N, N) of ``K + sigma^2 I``."""
        z = self.features(x)
        noise = F.softplus(self.raw_noise) + JITTER
        k = self.kernel(z, z) + noise * torch.eye(z.shape[0], device=z.device, dtype=z.dtype)
        return z, torch.linalg.cholesky(k)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Train: (negative log marginal likelihood per point, ``alpha``) for ``x`` (N, D) and
        ``y`` (N,). With ``x_test`` (M, D): the predictive mean (M,) and variance (M,)."""
        z, chol = self.factor(x)
        alpha = torch.cholesky_solve(y.unsqueeze(1), chol)  # (K + sigma^2 I)^-1 y
        if x_test is None:
            n = x.shape[0]
            nll = (
                0.5 * (y.unsqueeze(1) * alpha).sum()
                + torch.log(torch.diagonal(chol)).sum()
                + 0.5 * n * math.log(2 * math.pi)
            )
            return nll / n, alpha
        zt = self.features(x_test)
        cross = self.kernel(z, zt)  # (N, M)
        mean = (cross * alpha).sum(0)
        v = torch.linalg.solve_triangular(chol, cross, upper=False)
        prior_var = F.softplus(self.raw_outputscale) + F.softplus(self.raw_noise)
        return mean, (prior_var - v.pow(2).sum(0)).clamp(min=JITTER)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        dim = int(self.setting("input_size", device, 8))
        self.model = DeepKernelGP(
            dim,
            int(self.setting("hidden_size", device, 128)),
            int(self.setting("feature_size", device, 4)),
        ).to(device)
        n_train = (
            self.batch_size
            if test == "train"
            else int(self.setting("train_points_eval", device, 512))
        )
        x = torch.rand(n_train, dim, device=device) * 2 - 1
        y = target_function(x) + 0.05 * torch.randn(n_train, device=device)
        if test == "train":
            self.example_inputs = (x, y)
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        else:
            x_test = torch.rand(self.batch_size, dim, device=device) * 2 - 1
            self.example_inputs = (x, y, x_test)
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        nll, _ = self.model(*self.example_inputs)
        nll.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.model(*self.example_inputs)
