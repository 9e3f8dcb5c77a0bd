"""Quantization of numeric features into bins: the input transformation of a Hammock network.

Owns: per-feature bin edges (from a tree ensemble's split thresholds or from training-data quantiles),
the map from raw feature values to per-feature and global bin indices, a representative value inside
every bin (so a tree split can be evaluated once per bin instead of once per row), and the dense
one-hot / thermometer encodings used to check the embedding-bag shortcuts.

It must not know about any tree library or about torch: conversion lives in ``convert.py``, the
trainable model in ``estimator.py``.

Bin layout of one feature with sorted edges ``e_1 < ... < e_k``: ``k + 1`` interval bins, then one
bin for NaN (index ``k + 1``), so ``k + 2`` bins in all. ``right_closed=True`` gives the intervals
``(-inf, e_1], (e_1, e_2], ..., (e_k, +inf]`` (LightGBM and scikit-learn send ``x <= t`` left);
``right_closed=False`` gives ``(-inf, e_1), [e_1, e_2), ..., [e_k, +inf]`` (XGBoost sends ``x < t``
left). ``cast_float32`` rounds inputs to float32 before binning, as XGBoost and scikit-learn's
decision trees do before comparing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class BinEdges:
    """Sorted cut points per feature plus the comparison semantics that decide which bin a value is in."""

    edges: tuple[np.ndarray, ...]
    right_closed: bool = True
    cast_float32: bool = False
    offsets: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cleaned = []
        for f, e in enumerate(self.edges):
            arr = np.asarray(e, dtype=np.float64).ravel()
            if np.isnan(arr).any():
                raise ValueError(f"bin edges of feature {f} contain NaN")
            if arr.size > 1 and not np.all(np.diff(arr) > 0):
                raise ValueError(f"bin edges of feature {f} are not strictly increasing")
            cleaned.append(arr)
        object.__setattr__(self, "edges", tuple(cleaned))
        sizes = np.array([e.size + 2 for e in cleaned], dtype=np.int64)
        object.__setattr__(self, "offsets", np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64))

    @property
    def n_features(self) -> int:
        return len(self.edges)

    @property
    def n_bins(self) -> np.ndarray:
        """Bins per feature, the NaN bin included."""
        return np.array([e.size + 2 for e in self.edges], dtype=np.int64)

    @property
    def total_bins(self) -> int:
        return int(self.n_bins.sum())

    def nan_bin(self, feature: int) -> int:
        return int(self.edges[feature].size + 1)

    def prepare(self, X: np.ndarray) -> np.ndarray:
        """The values the trees actually compare: float64, rounded through float32 where the library does."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"expected a 2-D feature matrix, got shape {X.shape}")
        if X.shape[1] != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got {X.shape[1]}")
        if self.cast_float32:
            X = X.astype(np.float32).astype(np.float64)
        return X

    def bin_index(self, X: np.ndarray) -> np.ndarray:
        """Per-feature bin index, shape ``(n_rows, n_features)``, int64; NaN goes to the NaN bin."""
        X = self.prepare(X)
        out = np.empty(X.shape, dtype=np.int64)
        side = "left" if self.right_closed else "right"
        for f, e in enumerate(self.edges):
            col = X[:, f]
            idx = np.searchsorted(e, col, side=side)
            idx[np.isnan(col)] = e.size + 1
            out[:, f] = idx
        return out

    def global_index(self, X: np.ndarray) -> np.ndarray:
        """Bin index into the concatenation of all features' bins: the rows of one embedding table."""
        return self.bin_index(X) + self.offsets[None, :]

    def representatives(self, feature: int) -> np.ndarray:
        """One value inside each bin of ``feature`` (NaN for the NaN bin), for evaluating splits per bin."""
        e = self.edges[feature]
        if e.size == 0:
            return np.array([0.0, np.nan])
        if self.right_closed:  # (e_{i-1}, e_i] contains e_i; the last bin contains the next float up
            inner = np.concatenate([e, [np.nextafter(e[-1], np.inf)]])
        else:  # [e_{i-1}, e_i) contains e_{i-1}; the first bin contains the next float down
            inner = np.concatenate([[np.nextafter(e[0], -np.inf)], e])
        return np.concatenate([inner, [np.nan]])


def thresholds_to_edges(
    thresholds: Sequence[Sequence[float]], n_features: int, *, right_closed: bool, cast_float32: bool = False
) -> BinEdges:
    """Bin edges from the split thresholds an ensemble uses, feature by feature (unique, sorted)."""
    if len(thresholds) != n_features:
        raise ValueError(f"got thresholds for {len(thresholds)} features, expected {n_features}")
    edges = tuple(np.unique(np.asarray(list(t), dtype=np.float64)) for t in thresholds)
    return BinEdges(edges, right_closed=right_closed, cast_float32=cast_float32)


def quantile_edges(X: np.ndarray, max_bins: int) -> BinEdges:
    """Edges at training-data quantiles, at most ``max_bins`` interval bins per feature.

    Cuts sit midway between neighbouring distinct values, so a feature with few distinct values (a
    binary flag, a pixel intensity) gets one bin per value rather than empty bins.
    """
    X = np.asarray(X, dtype=np.float64)
    if max_bins < 2:
        raise ValueError(f"max_bins must be at least 2, got {max_bins}")
    edges = []
    for f in range(X.shape[1]):
        col = X[:, f]
        col = col[np.isfinite(col)]
        values = np.unique(col)
        if values.size <= max_bins:
            cuts = (values[:-1] + values[1:]) / 2.0
        else:
            qs = np.quantile(col, np.linspace(0, 1, max_bins + 1)[1:-1], method="linear")
            # snap each quantile to the midpoint between the distinct values around it
            hi = np.searchsorted(values, qs, side="right").clip(1, values.size - 1)
            cuts = np.unique((values[hi - 1] + values[hi]) / 2.0)
        edges.append(cuts)
    return BinEdges(tuple(edges), right_closed=True)


def one_hot(bin_idx: np.ndarray, binning: BinEdges) -> np.ndarray:
    """Dense one-hot encoding of per-feature bin indices, shape ``(n_rows, total_bins)``."""
    out = np.zeros((bin_idx.shape[0], binning.total_bins))
    rows = np.arange(bin_idx.shape[0])
    for f in range(binning.n_features):
        out[rows, binning.offsets[f] + bin_idx[:, f]] = 1.0
    return out


def thermometer(bin_idx: np.ndarray, binning: BinEdges) -> np.ndarray:
    """Dense thermometer encoding: for each feature a leading 1, then ``x > e_j`` for every cut ``e_j``.

    The NaN bin lights only its own column. Row ``b`` of a feature's block is the sum of one-hot rows
    ``0..b``, which is what lets the model compute it as a cumulative sum over the embedding table.
    """
    out = np.zeros((bin_idx.shape[0], binning.total_bins))
    for f in range(binning.n_features):
        nan_bin = binning.nan_bin(f)
        b = bin_idx[:, f]
        cols = np.arange(nan_bin)
        block = (cols[None, :] <= b[:, None]) & (b[:, None] != nan_bin)
        out[:, binning.offsets[f] : binning.offsets[f] + nan_bin] = block
        out[b == nan_bin, binning.offsets[f] + nan_bin] = 1.0
    return out
