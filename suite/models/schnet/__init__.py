"""SchNet (Schuett, Kindermans, Sauceda, Chmiela, Tkatchenko & Mueller, "SchNet: A
continuous-filter convolutional neural network for modeling quantum interactions",
arXiv:1706.08566), from code.

Atoms are embedded by type; each interaction block computes, for every pair of atoms of a
molecule closer than the cutoff, a filter from the pair's distance (50 Gaussians on [0, cutoff],
a two-layer network, times the cosine cutoff ``0.5 (cos(pi d / c) + 1)``), multiplies the
neighbour's features by it and sums over neighbours (``index_select`` then ``index_add``); an
atom-wise network with shifted softplus ``ln(0.5 e^x + 0.5)`` updates the features residually.
The energy is the sum of per-atom outputs over the molecule.

Training fits energies and forces as on MD17 (the paper's force-matching loss with weight 0.01
on energies): the forces are ``-dE/dR``, taken by ``torch.autograd.grad(create_graph=True)``, so
the backward differentiates a backward. Eval predicts energies (QM9-style screening).

Data: molecules of 18 atoms of 5 types at Gaussian random positions (standard deviation 1.6
Angstrom), labelled by a Morse pair potential whose well depth depends on the two atom types.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel

ENERGY_WEIGHT = 0.01
LOG2 = math.log(2.0)


def shifted_softplus(x: torch.Tensor) -> torch.Tensor:
    """``ln(0.5 e^x + 0.5)``: softplus shifted to pass through the origin."""
    return F.softplus(x) - LOG2


class ShiftedSoftplus(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shifted_softplus(x)


class Interaction(nn.Module):
    def __init__(self, hidden: int, gaussians: int, cutoff: float) -> None:
        super().__init__()
        self.cutoff = cutoff
        self.filter = nn.Sequential(
            nn.Linear(gaussians, hidden), ShiftedSoftplus(), nn.Linear(hidden, hidden)
        )
        self.in2f = nn.Linear(hidden, hidden, bias=False)
        self.f2out = nn.Sequential(
            nn.Linear(hidden, hidden), ShiftedSoftplus(), nn.Linear(hidden, hidden)
        )

    def forward(
        self,
        h: torch.Tensor,
        rbf: torch.Tensor,
        dist: torch.Tensor,
        src: torch.Tensor,
        dst: torch.Tensor,
    ) -> torch.Tensor:
        """Updated atom features (N, hidden) from pairs ``src -> dst`` (E,) with distances (E,)."""
        cut = 0.5 * (torch.cos(dist * math.pi / self.cutoff) + 1.0)
        w = self.filter(rbf) * cut.unsqueeze(1)
        messages = self.in2f(h).index_select(0, src) * w
        return h + self.f2out(torch.zeros_like(h).index_add(0, dst, messages))


class SchNet(nn.Module):
    def __init__(
        self, types: int, hidden: int, gaussians: int, interactions: int, cutoff: float
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(types, hidden)
        self.register_buffer("centres", torch.linspace(0.0, cutoff, gaussians), persistent=False)
        self.gamma = 0.5 / (cutoff / (gaussians - 1)) ** 2
        self.interactions = nn.ModuleList(
            Interaction(hidden, gaussians, cutoff) for _ in range(interactions)
        )
        self.output = nn.Sequential(
            nn.Linear(hidden, hidden // 2), ShiftedSoftplus(), nn.Linear(hidden // 2, 1)
        )

    def forward(
        self,
        types: torch.Tensor,
        positions: torch.Tensor,
        src: torch.Tensor,
        dst: torch.Tensor,
        molecule: torch.Tensor,
        molecules: int,
    ) -> torch.Tensor:
        """Energies (molecules,) of atoms ``types`` (N,) at ``positions`` (N, 3) in Angstrom;
        ``molecule`` (N,) numbers each atom's molecule, ``src``/``dst`` (E,) the pairs."""
        dist = (positions.index_select(0, src) - positions.index_select(0, dst)).norm(dim=1)
        rbf = torch.exp(-self.gamma * (dist.unsqueeze(1) - self.get_buffer("centres")) ** 2)
        h = self.embedding(types)
        for block in self.interactions:
            h = block(h, rbf, dist, src, dst)
        per_atom = self.output(h).squeeze(1)
        return per_atom.new_zeros(molecules).index_add(0, molecule, per_atom)


def random_molecules(
    count: int, atoms: int, types: int, cutoff: float, device: str
) -> tuple[torch.Tensor, ...]:
    """``count`` molecules: atom types (N,), positions (N, 3), the directed pairs closer than
    ``cutoff`` (src, dst: (E,)) and each atom's molecule (N,), N = count * atoms."""
    z = torch.randint(0, types, (count * atoms,), device=device)
    pos = torch.randn(count, atoms, 3, device=device) * 1.6
    i, j = torch.triu_indices(atoms, atoms, offset=1, device=device)
    close = (pos[:, i] - pos[:, j]).norm(dim=-1) < cutoff  # (count, pairs)
    mol, pair = close.nonzero(as_tuple=True)
    a, b = mol * atoms + i[pair], mol * atoms + j[pair]
    molecule = torch.arange(count, device=device).repeat_interleave(atoms)
    return z, pos.reshape(-1, 3), torch.cat([a, b]), torch.cat([b, a]), molecule


def morse_labels(
    z: torch.Tensor,
    pos: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    molecule: torch.Tensor,
    count: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Energies (count,) and forces (N, 3) of a Morse pair potential, depth by atom types."""
    pos = pos.detach().requires_grad_(True)
    depth = 0.5 + 0.1 * (z.index_select(0, src) + z.index_select(0, dst)).float()
    r = (pos.index_select(0, src) - pos.index_select(0, dst)).norm(dim=1)
    pair = depth * (1 - torch.exp(-1.5 * (r - 1.2))) ** 2 - depth
    energy = pos.new_zeros(count).index_add(0, molecule.index_select(0, src), 0.5 * pair)
    (grad,) = torch.autograd.grad(energy.sum(), pos)
    return energy.detach(), -grad


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        types = int(self.setting("atom_types", device, 5))
        cutoff = float(self.setting("cutoff", device, 5.0))
        self.model = SchNet(
            types,
            int(self.setting("hidden_size", device, 64)),
            int(self.setting("gaussians", device, 50)),
            int(self.setting("interactions", device, 3)),
            cutoff,
        ).to(device)
        z, pos, src, dst, molecule = random_molecules(
            self.batch_size,
            int(self.setting("atoms_per_molecule", device, 18)),
            types,
            cutoff,
            device,
        )
        self.example_inputs = (z, pos, src, dst, molecule, self.batch_size)
        if test == "train":
            self.energies, self.forces = morse_labels(z, pos, src, dst, molecule, self.batch_size)
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=5e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        z, pos, src, dst, molecule, count = self.example_inputs
        pos = pos.detach().requires_grad_(True)
        energy = self.model(z, pos, src, dst, molecule, count)
        (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=True)
        loss = ENERGY_WEIGHT * F.mse_loss(energy, self.energies) + F.mse_loss(-grad, self.forces)
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
