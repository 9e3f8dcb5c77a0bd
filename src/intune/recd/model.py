"""The dedup-aware DLRM for session data: user-side work on unique rows, expanded only where needed.

The user tower (bottom MLP over user counts, user id / country / device embeddings, and an attention
pooling layer over the user-history list) runs on the unique user rows of a batch. Its outputs are
expanded with the inverse indices only where they meet per-sample item features (the user x item dot
products and the top MLP); user x user dot products are also computed once per unique row. A batch
without an inverse (``inverse=None``) is the plain model: the same parameters and code, every row
treated as its own user row. The two give the same outputs and gradients (tests check this to float
tolerance); the deduplicated one does less work. This module owns the model and the batch tensors it
reads; it must not preprocess raw features (the pipeline's UDFs do) or train (see the benchmark).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from intune.recd.ikjt import IKJT, INVERSE

USER_DENSE_INPUTS = ("user_clicks", "user_views", "user_days", "user_purchases")
USER_ID_INPUTS = ("user_id", "user_country", "user_device")
HISTORY = "user_history"
ITEM_INPUTS = ("item_id", "item_category", "position")


@dataclass(frozen=True)
class SessionDLRMConfig:
    """Table sizes (ids must already be hashed into them) and layer widths."""

    dim: int = 32
    user_table: int = 100_000
    country_table: int = 64
    device_table: int = 8
    item_table: int = 200_003  # shared by candidate items and the user-history list
    category_table: int = 256
    position_table: int = 64
    bottom: tuple[int, ...] = (64,)
    top: tuple[int, ...] = (256, 128)


@dataclass
class SessionBatch:
    """Model inputs. User tensors have one row per unique user row; ``inverse`` maps batch rows to
    them (``None``: the user rows are the batch rows, the plain model)."""

    user_dense: torch.Tensor  # [U, 4] float
    user_ids: torch.Tensor  # [U, 3] int64: user id, country, device
    history: torch.Tensor  # [U, L] int64, padded
    history_mask: torch.Tensor  # [U, L] bool
    items: torch.Tensor  # [B, 3] int64: item id, category, position
    label: torch.Tensor  # [B] float
    inverse: torch.Tensor | None = None  # [B] int64

    @property
    def batch_size(self) -> int:
        return int(self.items.shape[0])

    @property
    def num_user_rows(self) -> int:
        return int(self.user_ids.shape[0])


def pad_jagged(values: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(padded [rows, max_len] with 0s, mask) from jagged values / lengths."""
    rows = lengths.shape[0]
    width = int(lengths.max()) if rows else 0
    padded = np.zeros((rows, max(width, 1)), dtype=np.int64)
    mask = np.arange(max(width, 1))[None, :] < lengths[:, None]
    padded[mask] = values
    return padded, mask


def batch_from_chunk(chunk: Mapping[str, np.ndarray], group: str = "user") -> SessionBatch:
    """Model inputs from a preprocessed chunk, deduplicated (``<group>.inverse`` present) or plain."""
    if f"{group}.{INVERSE}" in chunk:
        ikjt = IKJT.from_chunk(chunk, group)
        user = ikjt.unique_chunk()
        inverse: np.ndarray | None = ikjt.inverse
        if ikjt.num_unique == ikjt.batch_size and np.array_equal(inverse, np.arange(ikjt.batch_size)):
            inverse = None  # nothing repeats: skip the expansion
    else:
        user, inverse = dict(chunk), None
    need = [*USER_DENSE_INPUTS, *USER_ID_INPUTS, HISTORY + ".values", HISTORY + ".lengths"]
    missing = [c for c in need if c not in user] + [c for c in (*ITEM_INPUTS, "label") if c not in chunk]
    if missing:
        raise ValueError(f"batch lacks model inputs {missing}")
    history, mask = pad_jagged(user[HISTORY + ".values"], user[HISTORY + ".lengths"])
    return SessionBatch(
        user_dense=torch.from_numpy(np.stack([user[c] for c in USER_DENSE_INPUTS], 1).astype(np.float32)),
        user_ids=torch.from_numpy(np.stack([user[c] for c in USER_ID_INPUTS], 1).astype(np.int64)),
        history=torch.from_numpy(history),
        history_mask=torch.from_numpy(mask),
        items=torch.from_numpy(np.stack([chunk[c] for c in ITEM_INPUTS], 1).astype(np.int64)),
        label=torch.from_numpy(chunk["label"].astype(np.float32)),
        inverse=None if inverse is None else torch.from_numpy(inverse.astype(np.int64)),
    )


def _mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class HistoryAttentionPool(nn.Module):
    """Attention pooling with a learned query over a padded history: one vector per user row."""

    def __init__(self, dim: int):
        super().__init__()
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.query = nn.Parameter(torch.randn(dim) / dim**0.5)
        self.out = nn.Linear(dim, dim)

    def forward(self, embedded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = (self.key(embedded) @ self.query) / embedded.shape[-1] ** 0.5  # [U, L]
        weights = torch.softmax(scores.masked_fill(~mask, -1e9), dim=1) * mask  # empty history -> 0
        pooled = (weights.unsqueeze(-1) * self.value(embedded)).sum(1)
        return torch.relu(self.out(pooled))


def _pairwise(vectors: torch.Tensor) -> torch.Tensor:
    """Dot products of every pair (i < j) of the feature vectors [N, F, D] -> [N, F(F-1)/2]."""
    f = vectors.shape[1]
    gram = vectors @ vectors.transpose(1, 2)
    i, j = torch.triu_indices(f, f, offset=1)
    return gram[:, i, j]


class SessionDLRM(nn.Module):
    """DLRM with a user tower on unique rows and an item tower on batch rows (module docstring)."""

    def __init__(self, config: SessionDLRMConfig | None = None):
        super().__init__()
        c = self.config = config or SessionDLRMConfig()
        self.bottom = _mlp([len(USER_DENSE_INPUTS), *c.bottom, c.dim], last_relu=True)
        self.user_tables = nn.ModuleList(
            nn.Embedding(n, c.dim, sparse=True) for n in (c.user_table, c.country_table, c.device_table)
        )
        self.item_table = nn.Embedding(c.item_table, c.dim, sparse=True)
        self.category_table = nn.Embedding(c.category_table, c.dim, sparse=True)
        self.position_table = nn.Embedding(c.position_table, c.dim, sparse=True)
        self.history_pool = HistoryAttentionPool(c.dim)
        n_user, n_item = 5, 3
        pairs = (n_user + n_item) * (n_user + n_item - 1) // 2
        self.top = _mlp([c.dim + pairs, *c.top, 1], last_relu=False)
        for table in (*self.user_tables, self.item_table, self.category_table, self.position_table):
            nn.init.normal_(table.weight, std=c.dim**-0.5)  # unit-scale vectors: dot products start near 0..1

    def user_tower(self, batch: SessionBatch) -> torch.Tensor:
        """[U, 5, D]: dense projection, three id embeddings, pooled history, per unique user row."""
        vecs = [self.bottom(batch.user_dense)]
        vecs += [table(batch.user_ids[:, k]) for k, table in enumerate(self.user_tables)]
        vecs.append(self.history_pool(self.item_table(batch.history), batch.history_mask))
        return torch.stack(vecs, 1)

    def item_tower(self, batch: SessionBatch) -> torch.Tensor:
        """[B, 3, D]: candidate item, its category, its position, per batch row."""
        items = batch.items
        return torch.stack(
            [self.item_table(items[:, 0]), self.category_table(items[:, 1]), self.position_table(items[:, 2])], 1
        )

    def forward(self, batch: SessionBatch) -> torch.Tensor:
        """Logits [B]."""
        user = self.user_tower(batch)  # [U, 5, D]
        item = self.item_tower(batch)  # [B, 3, D]
        user_pairs = _pairwise(user)  # user x user: once per unique row
        dense = user[:, 0]
        if batch.inverse is not None:  # expand only where user meets item
            inv = batch.inverse
            user, user_pairs, dense = user.index_select(0, inv), user_pairs.index_select(0, inv), dense.index_select(0, inv)
        cross = (user @ item.transpose(1, 2)).flatten(1)  # [B, 15]
        item_pairs = _pairwise(item)
        return self.top(torch.cat([dense, user_pairs, cross, item_pairs], 1)).squeeze(1)

    def loss(self, batch: SessionBatch) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(self.forward(batch), batch.label)
