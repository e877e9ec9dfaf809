"""PPO (Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347) actor-critic
for continuous control, from code.

The minibatch (observations, actions, their log-probabilities under the policy that collected
them, advantages and returns) is a fixed random rollout, so that every iteration does the same
work: one update of the clipped surrogate objective (clip 0.2), the value loss and an entropy bonus,
with gradient-norm clipping at 0.5 (the paper's MuJoCo settings).
"""

from __future__ import annotations

import torch
from torch import nn

from suite.model import BenchmarkModel

CLIP = 0.2
VALUE_COEF = 0.5
ENTROPY_COEF = 0.01
MAX_GRAD_NORM = 0.5


class ActorCritic(nn.Module):
    def __init__(self, obs: int, act: int, hidden: int) -> None:
        super().__init__()
        self.actor = nn.Sequential(
            nn.Linear(obs, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, act),
        )
        self.critic = nn.Sequential(
            nn.Linear(obs, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, 1),
        )
        self.log_std = nn.Parameter(torch.full((act,), -0.5))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.actor(obs), self.log_std.expand(obs.shape[0], -1), self.critic(obs).squeeze(-1)


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    var = torch.exp(2 * log_std)
    return (-((x - mean) ** 2) / (2 * var) - log_std - 0.9189385332046727).sum(-1)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        obs = int(self.setting("observation_size", device, 17))
        act = int(self.setting("action_size", device, 6))
        self.model = ActorCritic(obs, act, int(self.setting("hidden_size", device, 256))).to(device)
        b = self.batch_size
        self.example_inputs = (torch.randn(b, obs, device=device),)
        self.actions = torch.randn(b, act, device=device)
        with torch.no_grad():
            mean, log_std, _ = self.model(self.example_inputs[0])
            # The collecting policy was slightly different: ratios start near, not at, 1.
            jitter = 0.05 * torch.randn(b, device=device)
            self.old_log_probs = gaussian_log_prob(mean, log_std, self.actions) + jitter
        advantages = torch.randn(b, device=device)
        self.advantages = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)
        self.returns = torch.randn(b, device=device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=3e-4, eps=1e-5)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        mean, log_std, value = self.model(*self.example_inputs)
        log_prob = gaussian_log_prob(mean, log_std, self.actions)
        ratio = torch.exp(log_prob - self.old_log_probs)
        surrogate = torch.min(
            ratio * self.advantages, ratio.clamp(1 - CLIP, 1 + CLIP) * self.advantages
        )
        entropy = (log_std + 1.4189385332046727).sum(-1)
        loss = (
            -surrogate.mean()
            + VALUE_COEF * (value - self.returns).pow(2).mean()
            - ENTROPY_COEF * entropy.mean()
        )
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            mean, log_std, value = self.model(*self.example_inputs)
            return mean + log_std.exp() * torch.randn_like(mean), value
