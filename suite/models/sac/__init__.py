"""Soft Actor-Critic (Haarnoja et al., "Soft Actor-Critic Algorithms and Applications",
arXiv:1812.05905) for continuous control, from code.

The policy is a squashed Gaussian written with ``torch.distributions``: ``Normal(mean, std)``
through a ``TanhTransform``, reparameterised samples (``rsample``) and their log-probabilities
(``log_prob``, with the transform's log-determinant), the path whose slowdowns the TorchBench paper
(arXiv:2304.14226, Table 4) traced to ``torch.distributions``. The replay minibatch is fixed and
random, so every iteration does the same work: one update of the twin critics against the target
networks' soft value, of the actor and of the temperature (target entropy ``-action_size``), then a
Polyak average of the targets (tau 0.005). The three losses share one Adam with a group each;
the critics are frozen while the actor's loss is built, as in Spinning Up's implementation.
Adam runs its multi-tensor (``foreach``) kernels on every device, the path PyTorch picks by default
on CUDA, so that CPU and CUDA measure the same optimizer code.
"""

from __future__ import annotations

import copy

import torch
from torch import distributions as D
from torch import nn

from suite.model import BenchmarkModel

GAMMA = 0.99
TAU = 0.005
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, outputs),
    )


class SquashedGaussianActor(nn.Module):
    def __init__(self, obs: int, act: int, hidden: int) -> None:
        super().__init__()
        self.net = mlp(obs, hidden, 2 * act)

    def forward(self, obs: torch.Tensor) -> D.Distribution:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
        squashed = D.TransformedDistribution(D.Normal(mean, std), [D.TanhTransform(cache_size=1)])
        return D.Independent(squashed, 1)


class TwinCritic(nn.Module):
    def __init__(self, obs: int, act: int, hidden: int) -> None:
        super().__init__()
        self.q1 = mlp(obs + act, hidden, 1)
        self.q2 = mlp(obs + act, hidden, 1)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, act], dim=-1)
        return torch.minimum(self.q1(x), self.q2(x)).squeeze(-1)

    def both(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, act], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class SAC(nn.Module):
    def __init__(self, obs: int, act: int, hidden: int) -> None:
        super().__init__()
        self.actor = SquashedGaussianActor(obs, act, hidden)
        self.critic = TwinCritic(obs, act, hidden)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.zeros(()))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        policy = self.actor(obs)
        action = policy.rsample()
        return action, policy.log_prob(action)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        obs = int(self.setting("observation_size", device, 17))
        act = int(self.setting("action_size", device, 6))
        self.model = SAC(obs, act, int(self.setting("hidden_size", device, 256))).to(device)
        self.target_entropy = -float(act)
        b = self.batch_size
        self.example_inputs = (torch.randn(b, obs, device=device),)
        self.actions = torch.rand(b, act, device=device) * 2 - 1
        self.rewards = torch.randn(b, device=device)
        self.next_obs = torch.randn(b, obs, device=device)
        self.not_done = (torch.rand(b, device=device) > 0.05).float()
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(
                [
                    {"params": self.model.critic.parameters()},
                    {"params": self.model.actor.parameters()},
                    {"params": [self.model.log_alpha]},
                ],
                lr=3e-4,
                foreach=True,
            )
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        sac = self.model
        assert isinstance(sac, SAC)
        obs = self.example_inputs[0]
        self.optimizer.zero_grad(set_to_none=True)
        alpha = sac.log_alpha.exp()
        with torch.no_grad():
            next_action, next_log_prob = sac(self.next_obs)
            soft_value = sac.target(self.next_obs, next_action) - alpha * next_log_prob
            target_q = self.rewards + GAMMA * self.not_done * soft_value
        q1, q2 = sac.critic.both(obs, self.actions)
        critic_loss = 0.5 * ((q1 - target_q).pow(2).mean() + (q2 - target_q).pow(2).mean())
        action, log_prob = sac(obs)
        sac.critic.requires_grad_(False)
        actor_loss = (alpha.detach() * log_prob - sac.critic(obs, action)).mean()
        sac.critic.requires_grad_(True)
        alpha_loss = -(sac.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        (critic_loss + actor_loss + alpha_loss).backward()
        self.optimizer.step()
        with torch.no_grad():
            targets, online = list(sac.target.parameters()), list(sac.critic.parameters())
            torch._foreach_lerp_(targets, online, TAU)

    def eval(self) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.model(*self.example_inputs)
