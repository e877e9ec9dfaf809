"""DeepAR (Salinas, Flunkert, Gasthaus & Januschowski, "DeepAR: Probabilistic Forecasting with
Autoregressive Recurrent Networks", arXiv:1704.04110) for count series, from code.

The network reads, at each step, the previous target divided by the series' scale
``v = 1 + mean(context)``, the step's covariates and an embedding of the item, through a 2-layer
GRU (GluonTS's ``cell_type="gru"``, 40 cells: its defaults), and emits the mean ``mu`` and the
shape ``alpha`` of a negative binomial, rescaled as in the paper (``mu v``, ``alpha / sqrt(v)``)
and expressed as a ``torch.distributions.NegativeBinomial``. Train maximises the likelihood of the
context and the horizon, teacher-forced (Adam, lr 1e-3); eval draws ``num_samples`` paths by
ancestral sampling over the horizon (``sample``: a gamma-Poisson mixture), feeding each draw back,
and returns them with their 10/50/90% quantiles (GluonTS's sample forecast).
The series are random counts; nothing is downloaded.
"""

from __future__ import annotations

import torch
from torch import distributions as D
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

LAYERS = 2
ITEM_DIM = 8
QUANTILES = torch.tensor([0.1, 0.5, 0.9])  # the forecast's quantiles, from the sample paths


class DeepAR(nn.Module):
    def __init__(self, covariates: int, items: int, hidden: int) -> None:
        super().__init__()
        self.item = nn.Embedding(items, ITEM_DIM)
        self.rnn = nn.GRU(1 + covariates + ITEM_DIM, hidden, LAYERS, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def step(
        self,
        lagged: torch.Tensor,
        covariates: torch.Tensor,
        item: torch.Tensor,
        scale: torch.Tensor,
        state: torch.Tensor | None,
    ) -> tuple[D.NegativeBinomial, torch.Tensor]:
        """One or more steps: ``lagged`` (B, T), ``covariates`` (B, T, C), ``item`` (B,)."""
        embedded = self.item(item).unsqueeze(1).expand(-1, lagged.shape[1], -1)
        x = torch.cat([(lagged / scale).unsqueeze(-1), covariates, embedded], dim=-1)
        out, state = self.rnn(x, state)
        mu_raw, alpha_raw = self.head(out).unbind(-1)
        mu = F.softplus(mu_raw) * scale
        alpha = F.softplus(alpha_raw) / scale.sqrt() + 1e-6
        # NB(mean mu, shape alpha): r = 1/alpha, p = alpha mu / (1 + alpha mu), i.e. logits log(alpha mu)
        return D.NegativeBinomial(total_count=1 / alpha, logits=torch.log(alpha * mu)), state

    def forward(
        self, target: torch.Tensor, covariates: torch.Tensor, item: torch.Tensor, context: int
    ) -> D.NegativeBinomial:
        scale = 1 + target[:, :context].mean(dim=1, keepdim=True)
        lagged = F.pad(target[:, :-1], (1, 0))
        distribution, _ = self.step(lagged, covariates, item, scale, None)
        return distribution


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        covariates = int(self.setting("num_covariates", device, 4))
        items = int(self.setting("num_items", device, 1000))
        self.context = int(self.setting("context_length", device, 48))
        self.horizon = int(self.setting("prediction_length", device, 24))
        self.samples = int(self.setting("num_samples", device, 20))
        self.model = DeepAR(covariates, items, int(self.setting("hidden_size", device, 40)))
        self.model.to(device)
        b, length = self.batch_size, self.context + self.horizon
        rates = torch.rand(b, 1, device=device) * 20
        target = torch.poisson(rates.expand(b, length).contiguous())
        self.example_inputs = (
            target,
            torch.randn(b, length, covariates, device=device),
            torch.randint(0, items, (b,), device=device),
        )
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        target = self.example_inputs[0]
        distribution = self.model(*self.example_inputs, self.context)
        (-distribution.log_prob(target).mean()).backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        assert isinstance(model, DeepAR)
        target, covariates, item = self.example_inputs
        n, c = self.samples, self.context
        with torch.no_grad():
            scale = (1 + target[:, :c].mean(dim=1, keepdim=True)).repeat_interleave(n, 0)
            lagged = F.pad(target[:, : c - 1], (1, 0)).repeat_interleave(n, 0)
            paths_cov = covariates.repeat_interleave(n, 0)
            paths_item = item.repeat_interleave(n, 0)
            _, state = model.step(lagged, paths_cov[:, :c], paths_item, scale, None)
            last = target[:, c - 1 : c].repeat_interleave(n, 0)
            draws = []
            for t in range(c, c + self.horizon):
                distribution, state = model.step(
                    last, paths_cov[:, t : t + 1], paths_item, scale, state
                )
                last = distribution.sample()
                draws.append(last)
            paths = torch.cat(draws, dim=1).view(target.shape[0], n, self.horizon)
            return paths, torch.quantile(paths, QUANTILES.to(paths.device), dim=1)
