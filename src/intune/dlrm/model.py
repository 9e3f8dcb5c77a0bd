"""The DLRM model (Naumov et al., 2019) in PyTorch: embeddings, bottom MLP, dot interaction, top MLP.

Owns the network and its loss. One ``EmbeddingBag`` per sparse feature (table sizes already capped by
hashing in preprocessing), a bottom MLP that maps the dense features to the embedding width, the
pairwise dot products of all those vectors (the upper triangle, without the diagonal) concatenated
with the bottom MLP's output, and a top MLP to one logit trained with BCE-with-logits. Embedding
gradients are sparse so that large tables cost only the rows a batch touches. Runs on CPU or CUDA.
It must not know about data files or pipelines.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _mlp(sizes: Sequence[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """``forward(dense (B, num_dense) float, sparse (B, num_tables) int64) -> logits (B,)``."""

    def __init__(
        self,
        table_sizes: Sequence[int],
        num_dense: int = 13,
        embedding_dim: int = 16,
        bottom: Sequence[int] = (64, 32),
        top: Sequence[int] = (64, 32),
    ) -> None:
        super().__init__()
        if not table_sizes or min(table_sizes) < 1:
            raise ValueError(f"DLRM: need at least one table with >= 1 row, got sizes {list(table_sizes)}")
        self.table_sizes = [int(s) for s in table_sizes]
        self.num_dense = num_dense
        self.embedding_dim = embedding_dim
        self.embeddings = nn.ModuleList(
            nn.EmbeddingBag(size, embedding_dim, mode="sum", sparse=True) for size in self.table_sizes
        )
        for table in self.embeddings:  # small uniform init as in the DLRM reference
            bound = (1.0 / table.num_embeddings) ** 0.5
            nn.init.uniform_(table.weight, -bound, bound)
        self.bottom = _mlp([num_dense, *bottom, embedding_dim], last_activation=True)
        vectors = len(self.table_sizes) + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = _mlp([embedding_dim + pairs, *top, 1], last_activation=False)
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("_pair_rows", rows, persistent=False)
        self.register_buffer("_pair_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        if dense.dim() != 2 or dense.shape[1] != self.num_dense:
            raise ValueError(f"DLRM: dense must be (batch, {self.num_dense}), got {tuple(dense.shape)}")
        if sparse.dim() != 2 or sparse.shape[1] != len(self.embeddings):
            raise ValueError(
                f"DLRM: sparse must be (batch, {len(self.embeddings)}), got {tuple(sparse.shape)}"
            )
        x = self.bottom(dense)
        vectors = [x] + [table(sparse[:, f : f + 1]) for f, table in enumerate(self.embeddings)]
        stacked = torch.stack(vectors, dim=1)  # (B, 1 + tables, dim)
        dots = torch.bmm(stacked, stacked.transpose(1, 2))  # (B, V, V)
        pairs = dots[:, self._pair_rows, self._pair_cols]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)

    def loss(self, dense: torch.Tensor, sparse: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(self(dense, sparse), label.float())

    def optimizers(self, lr: float = 1e-3, embedding_lr: float = 1e-2) -> list[torch.optim.Optimizer]:
        """Adam for the MLPs, SparseAdam for the tables (dense Adam state on big tables is slow)."""
        return [
            torch.optim.Adam([*self.bottom.parameters(), *self.top.parameters()], lr=lr),
            torch.optim.SparseAdam(list(self.embeddings.parameters()), lr=embedding_lr),
        ]
