"""Graph convolutional network (Kipf & Welling, "Semi-Supervised Classification with Graph
Convolutional Networks", arXiv:1609.02907), from code.

A random citation-like graph stands in for Cora: ``edges_per_node`` random undirected edges per
node, self-loops, the normalised adjacency ``D^-1/2 (A + I) D^-1/2`` kept as a sparse CSR tensor,
and sparse bag-of-words features (COO, Cora's density of 1.27%). Both products are
``torch.sparse.mm`` (sparse times dense, and its backward to the dense operand), the sparse
kernels the TorchBench paper (arXiv:2304.14226, Table 4) lists among its regressions. Two layers of
64 hidden units, dropout 0.5 (on the sparse features too, by their stored values), Adam with weight decay 5e-4 on the cross-entropy of the labelled
nodes: the paper's settings. The graph is built once; the batch is its number of nodes.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from suite.model import BenchmarkModel


def normalised_adjacency(nodes: int, edges_per_node: int, device: str) -> torch.Tensor:
    """``D^-1/2 (A + I) D^-1/2`` of a random undirected graph, as a sparse CSR tensor."""
    src = torch.arange(nodes).repeat_interleave(edges_per_node)
    dst = torch.randint(0, nodes, (nodes * edges_per_node,))
    loops = torch.arange(nodes)
    rows = torch.cat([src, dst, loops])
    cols = torch.cat([dst, src, loops])
    indices = (
        torch.sparse_coo_tensor(
            torch.stack([rows, cols]),
            torch.ones(rows.numel()),
            (nodes, nodes),
            check_invariants=True,
        )
        .coalesce()
        .indices()
    )
    scale = torch.bincount(indices[0], minlength=nodes).float().pow(-0.5)
    norm = torch.sparse_coo_tensor(
        indices,
        scale[indices[0]] * scale[indices[1]],
        (nodes, nodes),
        is_coalesced=True,
        check_invariants=True,
    )
    with warnings.catch_warnings():  # "CSR support is in beta": known, and what is measured
        warnings.filterwarnings("ignore", message=r".*Sparse CSR tensor support is in beta")
        return norm.to_sparse_csr().to(device)


def sparse_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout of the stored values of a sparse COO tensor (Kipf's ``sparse_dropout``)."""
    if not training:
        return x
    # Same indices as a checked tensor: the per-step invariant check is skipped on purpose.
    return torch.sparse_coo_tensor(
        x.indices(), F.dropout(x.values(), p), x.shape, is_coalesced=True, check_invariants=False
    )


class GraphConvolution(nn.Module):
    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(inputs, outputs))
        self.bias = nn.Parameter(torch.zeros(outputs))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        support = torch.sparse.mm(x, self.weight) if x.is_sparse else x @ self.weight
        return torch.sparse.mm(adj, support) + self.bias


class GCN(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.gc1 = GraphConvolution(features, hidden)
        self.gc2 = GraphConvolution(hidden, classes)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = sparse_dropout(x, 0.5, self.training)
        h = F.dropout(F.relu(self.gc1(x, adj)), 0.5, self.training)
        return F.log_softmax(self.gc2(h, adj), dim=1)


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        nodes = self.batch_size
        features = int(self.setting("num_features", device, 1433))
        density = float(self.setting("feature_density", device, 0.0127))
        classes = int(self.setting("num_classes", device, 7))
        self.model = GCN(features, int(self.setting("hidden_size", device, 64)), classes).to(device)
        words = (torch.rand(nodes, features) < density).float()
        adj = normalised_adjacency(nodes, int(self.setting("edges_per_node", device, 4)), device)
        self.example_inputs = (words.to_sparse_coo().to(device), adj)
        self.labels = torch.randint(0, classes, (nodes,), device=device)
        labelled = max(1, int(nodes * float(self.setting("labelled_fraction", device, 0.1))))
        self.train_nodes = torch.randperm(nodes)[:labelled].to(device)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01, weight_decay=5e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        log_probs = self.model(*self.example_inputs)
        F.nll_loss(log_probs[self.train_nodes], self.labels[self.train_nodes]).backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
