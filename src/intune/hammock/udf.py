"""Hammock in the input pipeline: a Bucketize UDF for Criteo-format chunks and ``HammockNet`` for the trainer.

Owns: the chunk -> chunk UDF that quantizes the dense counts ``I1..I13`` into bins and hashes the
categorical IDs ``C1..C26`` into buckets (so the model's input is only integer indices: the cheap
training step that makes ingestion the bottleneck), and the torch module that ``intune.dlrm.train``
trains instead of DLRM (``train(batches, model="hammock", table_sizes=udf.sparse_sizes)``, which finds
``intune.hammock.hammock_module``). It must not read files, build pipelines or run a training loop.

The UDF's output (the same keys as the DLRM UDFs, so the same loop and evaluation work):

* ``dense``: float32 ``(rows, 13)``, ``log1p(max(x, 0))`` with missing as 0 (kept for inspection and
  for models that want values; ``HammockNet`` ignores it);
* ``sparse``: int64 ``(rows, 13 + 26)``: columns ``0..12`` are the bin index of each dense feature
  (ordered: bins by increasing value, the last bin is "missing"), columns ``13..38`` the bucket of
  each categorical feature (0 is "missing", IDs hash into ``1..size-1``);
* ``label``: float32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from intune.hammock.network import ACTIVATIONS, RelaxedHammock
from intune.hammock.quantize import BinEdges

DENSE_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
SPARSE_COLUMNS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
# Criteo counts are heavy-tailed integers (I2 has a few negatives): one bin for negatives, one per
# small count, then bins growing by about sqrt(2) up to ~1e6.
DEFAULT_DENSE_BORDERS: tuple[float, ...] = tuple(
    [-0.5, 0.5, 1.5, 2.5, 3.5] + sorted({round(2 ** (k / 2)) + 0.5 for k in range(5, 41)})
)


def _categorical_sizes(table_size: int) -> tuple[int, ...]:
    from intune.dlrm.data import KAGGLE_CARDINALITIES

    return tuple(min(int(c), table_size - 1) + 1 for c in KAGGLE_CARDINALITIES)


@dataclass(frozen=True)
class Bucketize:
    """Criteo chunk -> bin and bucket indices (see the module docstring for the output columns)."""

    dense_borders: tuple[tuple[float, ...], ...] = field(default_factory=lambda: (DEFAULT_DENSE_BORDERS,) * 13)
    table_size: int = 10_000  # buckets per categorical feature at most (bucket 0 = missing)

    def __post_init__(self) -> None:
        if len(self.dense_borders) != len(DENSE_COLUMNS):
            raise ValueError(f"Bucketize: need borders for {len(DENSE_COLUMNS)} dense features, got {len(self.dense_borders)}")
        if self.table_size < 2:
            raise ValueError(f"Bucketize: table_size must be >= 2, got {self.table_size}")
        object.__setattr__(self, "_binning", BinEdges(tuple(np.asarray(b) for b in self.dense_borders)))

    @property
    def sparse_sizes(self) -> list[int]:
        """Rows of each feature's block: dense bins (incl. missing), then categorical buckets."""
        return [int(n) for n in self._binning.n_bins] + list(_categorical_sizes(self.table_size))

    @classmethod
    def fit(cls, chunk: Mapping[str, np.ndarray], max_bins: int = 32, table_size: int = 10_000) -> Bucketize:
        """Borders at the quantiles of a training sample (only the training data, never held-out rows)."""
        from intune.hammock.quantize import quantile_edges

        dense = np.column_stack([np.asarray(chunk[c], dtype=np.float64) for c in DENSE_COLUMNS])
        edges = quantile_edges(dense, max_bins)
        return cls(tuple(tuple(float(v) for v in e) for e in edges.edges), table_size)

    def __call__(self, chunk: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from intune.dlrm.ops import hex_to_int
        from intune.hashing import splitmix64

        missing = [c for c in ("label", *DENSE_COLUMNS, *SPARSE_COLUMNS) if c not in chunk]
        if missing:
            raise KeyError(f"hammock Bucketize: chunk lacks the Criteo columns {missing}; it has {sorted(chunk)}")
        raw = np.column_stack([np.asarray(chunk[c], dtype=np.float64) for c in DENSE_COLUMNS])
        rows = raw.shape[0]
        sparse = np.empty((rows, len(DENSE_COLUMNS) + len(SPARSE_COLUMNS)), dtype=np.int64)
        sparse[:, : len(DENSE_COLUMNS)] = self._binning.bin_index(raw)
        for f, (name, size) in enumerate(zip(SPARSE_COLUMNS, _categorical_sizes(self.table_size), strict=True)):
            ids, absent = hex_to_int(np.asarray(chunk[name]), name)
            bucket = 1 + (splitmix64(ids, salt=f) % np.uint64(size - 1)).astype(np.int64)
            sparse[:, len(DENSE_COLUMNS) + f] = np.where(absent, 0, bucket)
        dense = np.log1p(np.maximum(np.nan_to_num(raw, nan=0.0), 0.0)).astype(np.float32)
        return {"dense": dense, "sparse": sparse, "label": np.asarray(chunk["label"], dtype=np.float32)}


class HammockNet(nn.Module):
    """Hammock for the DLRM training loop.

    ``forward(dense, sparse) -> logits`` with ``dense`` float ``(batch, num_dense)`` (ignored: the
    bins already carry it) and ``sparse`` int64 ``(batch, len(table_sizes))`` of *per-feature* indices,
    the first ``num_dense`` columns ordered bins (thermometer-encoded), the rest categorical buckets
    (one-hot); returns logits ``(batch,)`` for BCE-with-logits, like ``intune.dlrm.model.DLRM``.
    The categorical table is a sparse-gradient ``EmbeddingBag``; ``optimizers()`` pairs Adam for the
    small dense part with SparseAdam for it, as DLRM does.
    """

    def __init__(
        self, table_sizes: Sequence[int], num_dense: int = 13, hidden: int = 64, encoding: str = "thermometer",
        activation: str = "relu", seed: int = 0,
    ):
        super().__init__()
        sizes = [int(s) for s in table_sizes]
        if len(sizes) <= num_dense or num_dense < 1 or min(sizes) < 1:
            raise ValueError(
                f"HammockNet: need num_dense >= 1 ordered features and at least one categorical, got "
                f"{len(sizes)} table sizes with num_dense={num_dense}"
            )
        self.table_sizes, self.num_dense, self.activation = sizes, num_dense, activation
        self.ordered = RelaxedHammock(sizes[:num_dense], hidden, 1, encoding=encoding, activation=activation, seed=seed)
        cat = np.asarray(sizes[num_dense:], dtype=np.int64)
        self.register_buffer("cat_offsets", torch.from_numpy(np.concatenate([[0], np.cumsum(cat)[:-1]])))
        self.register_buffer("limits", torch.tensor(sizes, dtype=torch.int64))
        self.categorical = nn.EmbeddingBag(int(cat.sum()), hidden, mode="sum", sparse=True)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(seed + 1)
            self.categorical.weight.normal_(0.0, 1.0 / np.sqrt(len(sizes)), generator=gen)

    def forward(self, dense: torch.Tensor | None, sparse: torch.Tensor) -> torch.Tensor:
        if sparse.dim() != 2 or sparse.shape[1] != len(self.table_sizes):
            raise ValueError(f"HammockNet: sparse must be (batch, {len(self.table_sizes)}), got {tuple(sparse.shape)}")
        bad = (sparse < 0) | (sparse >= self.limits)
        if bool(bad.any()):
            row, col = (int(v) for v in bad.nonzero()[0])
            raise ValueError(
                f"HammockNet: sparse[{row}, {col}] = {int(sparse[row, col])} is outside [0, {self.table_sizes[col]})"
            )
        sparse = sparse.long()
        nd = self.num_dense
        pre = self.ordered.pre_activation(sparse[:, :nd] + self.ordered.offsets)
        pre = pre + self.categorical(sparse[:, nd:] + self.cat_offsets)
        return self.ordered.out(ACTIVATIONS[self.activation](pre)).squeeze(1)

    def optimizers(self, lr: float = 1e-3, embedding_lr: float = 1e-2) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.ordered.parameters(), lr=lr),
            torch.optim.SparseAdam(list(self.categorical.parameters()), lr=embedding_lr),
        ]


def hammock_module(table_sizes: Sequence[int] | None, num_dense: int = 13, **kwargs) -> HammockNet:
    """The factory ``intune.dlrm.train`` looks up (``model="hammock"``)."""
    if table_sizes is None:
        raise ValueError("train: model='hammock' needs table_sizes (the Bucketize UDF's .sparse_sizes)")
    return HammockNet(table_sizes, num_dense=num_dense, **kwargs)
