"""DQN (Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015), from
code: the Nature Q-network over 4 stacked 84x84 frames, trained with the Double-DQN target (van
Hasselt et al., AAAI 2016): the online network picks the next action, a target network values it;
Huber loss, gradient-norm clipping at 10, Adam."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

GAMMA = 0.99


class QNetwork(nn.Module):
    def __init__(self, actions: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(4, 32, 8, 4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, actions))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        # Frames are stored as uint8, as in a replay buffer; scaling happens on the fly.
        return self.head(self.features(frames.float() / 255.0))


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        actions = int(self.setting("num_actions", device, 18))
        self.model = QNetwork(actions).to(device)
        self.target = copy.deepcopy(self.model).requires_grad_(False)
        b = self.batch_size
        self.example_inputs = (
            torch.randint(0, 256, (b, 4, 84, 84), dtype=torch.uint8, device=device),
        )
        self.next_frames = torch.randint(0, 256, (b, 4, 84, 84), dtype=torch.uint8, device=device)
        self.actions = torch.randint(0, actions, (b,), device=device)
        self.rewards = torch.randn(b, device=device).clamp(-1, 1)
        self.done = (torch.rand(b, device=device) < 0.05).float()
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=6.25e-5, eps=1.5e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        with torch.no_grad():
            next_action = self.model(self.next_frames).argmax(1, keepdim=True)
            next_q = self.target(self.next_frames).gather(1, next_action).squeeze(1)
            target = self.rewards + GAMMA * (1 - self.done) * next_q
        self.optimizer.zero_grad(set_to_none=True)
        q = self.model(*self.example_inputs).gather(1, self.actions.unsqueeze(1)).squeeze(1)
        F.smooth_l1_loss(q, target).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs).argmax(1),)
