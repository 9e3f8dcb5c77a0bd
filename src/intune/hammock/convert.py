"""Exact conversion of a fitted tree ensemble into a Hammock network: ``from_trees(model)``.

Owns: the construction of the two-layer network that computes a tree ensemble exactly, and its
numpy-in / numpy-out prediction API. It must not parse library models (``trees.py`` does) nor train
anything (``estimator.py`` does).

The network, for an ensemble with leaves ``l`` and outputs ``k``:

* input: per feature, the index of the bin the value falls in; the bins are cut at every threshold
  the ensemble uses on that feature (plus a bin for NaN), so every split is constant within a bin;
* hidden layer: one unit per leaf. ``W[bin, l] = 1`` when a value in ``bin`` satisfies every split
  that the path to ``l`` makes on that bin's feature. A one-hot input times ``W`` is a sum of
  embedding rows, so the pre-activation is ``torch.nn.EmbeddingBag(mode="sum")`` over the per-feature
  bin indices: the number of the leaf's constrained features whose conditions hold;
* step activation: the unit fires when that count equals the number of features its path constrains;
* output layer: ``raw[k] = base[k] + sum_l fired[l] * value[l, k]`` (leaf values, shrinkage and
  averaging folded in), then the library's link (sigmoid, softmax, exp) for probabilities.

Everything is float64, so ``predict_raw`` matches the library's margin to rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from intune.hammock.quantize import BinEdges, thresholds_to_edges
from intune.hammock.trees import ConversionError, Ensemble, describe

# refuse first-layer tables larger than this many float64 entries (2 GiB)
MAX_TABLE_ENTRIES = 1 << 28


class HammockTrees(nn.Module):
    """A tree ensemble as a one-hidden-layer network over quantized, one-hot (embedding-bag) inputs.

    ``forward(bin_idx)`` takes global bin indices, a LongTensor ``(n_rows, n_features)`` from
    ``binning.global_index(X)``, and returns the raw scores ``(n_rows, n_outputs)`` in float64.
    """

    def __init__(self, ensemble: Ensemble, binning: BinEdges, table: np.ndarray, need: np.ndarray, values: np.ndarray):
        super().__init__()
        self.ensemble_source = ensemble.source
        self.binning = binning
        self.link = ensemble.link
        self.link_scale = ensemble.link_scale
        self.accepts_nan = ensemble.accepts_nan
        self.missing_value = ensemble.missing_value
        self.zero_snap = ensemble.zero_snap
        self.classes_ = ensemble.classes
        self.n_features_in_ = ensemble.n_features
        self.n_outputs = ensemble.n_outputs
        self.n_trees = ensemble.n_trees
        n_leaves = table.shape[1]
        self.bag = nn.EmbeddingBag(binning.total_bins, n_leaves, mode="sum", dtype=torch.float64)
        self.out = nn.Linear(n_leaves, ensemble.n_outputs, dtype=torch.float64)
        with torch.no_grad():
            self.bag.weight.copy_(torch.from_numpy(table))
            self.out.weight.copy_(torch.from_numpy(values.T.copy()))
            self.out.bias.copy_(torch.from_numpy(ensemble.base.astype(np.float64)))
        # a unit fires when its count of satisfied features reaches its count of constrained features
        self.register_buffer("need", torch.from_numpy(need - 0.5))
        # per-tree outputs, for libraries that sum trees in float32 (XGBoost): leaf -> (tree, output)
        self.accumulate_float32 = ensemble.accumulate_float32
        self._leaf_tree = np.array([leaf.tree for leaf in ensemble.leaves], dtype=np.int64)
        self._tree_output = np.asarray(ensemble.extra.get("tree_output", []), dtype=np.int64)

    @property
    def n_leaves(self) -> int:
        return int(self.bag.embedding_dim)

    def hidden(self, bin_idx: torch.Tensor) -> torch.Tensor:
        """Step activations: 1.0 for every leaf whose path conditions all hold."""
        return (self.bag(bin_idx) > self.need).to(torch.float64)

    def forward(self, bin_idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.hidden(bin_idx))

    # ---------------------------------------------------------------- numpy API
    def _check_input(self, X: Any) -> np.ndarray:
        X = np.array(X, dtype=np.float64, copy=True)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"converted {self.ensemble_source} model expects shape (n, {self.n_features_in_}), got {X.shape}"
            )
        if not np.isnan(self.missing_value):
            X[X == self.missing_value] = np.nan
        if self.zero_snap > 0:
            X[np.abs(X) <= self.zero_snap] = 0.0
        if not self.accepts_nan and np.isnan(X).any():
            row, col = np.argwhere(np.isnan(X))[0]
            raise ValueError(
                f"X has NaN (first at row {row}, feature {col}); the original {self.ensemble_source} model "
                "does not accept missing values, so neither does its conversion"
            )
        return X

    def predict_raw(self, X: Any, batch_rows: int = 2048) -> np.ndarray:
        """The ensemble's raw score (margin): shape ``(n,)`` for one output, ``(n, k)`` for several."""
        X = self._check_input(X)
        idx = torch.from_numpy(self.binning.global_index(X))
        parts = []
        with torch.no_grad():
            for start in range(0, idx.shape[0], batch_rows):
                batch = idx[start : start + batch_rows]
                if self.accumulate_float32:
                    parts.append(self._raw_float32(self.hidden(batch).numpy()))
                else:
                    parts.append(self.forward(batch).numpy())
        raw = np.concatenate(parts) if parts else np.zeros((0, self.n_outputs))
        return raw[:, 0] if self.n_outputs == 1 else raw

    def _raw_float32(self, fired: np.ndarray) -> np.ndarray:
        """Sum the fired leaves tree by tree in float32, in tree order, as XGBoost's predictor does.

        The float64 ``forward`` is the more accurate sum; this reproduces the library's own rounding
        so that converted and original agree to float32 accumulation order, not just to ~1e-6.
        """
        values = self.out.weight.detach().numpy().T  # (n_leaves, n_outputs)
        n_trees = self._tree_output.size
        # each boosted tree feeds one output; its fired leaf's value, as a (rows, trees) matrix
        per_leaf = values[np.arange(values.shape[0]), self._tree_output[self._leaf_tree]]
        contrib = np.zeros((values.shape[0], n_trees))
        contrib[np.arange(values.shape[0]), self._leaf_tree] = per_leaf
        per_tree = (fired @ contrib).astype(np.float32)
        acc = np.empty((fired.shape[0], self.n_outputs), dtype=np.float32)
        acc[:] = self.out.bias.detach().numpy().astype(np.float32)
        for t in range(n_trees):
            acc[:, self._tree_output[t]] += per_tree[:, t]
        return acc.astype(np.float64)

    def _transform(self, raw: np.ndarray) -> np.ndarray:
        """The library's link: raw score to what its booster predicts (value, probability, class probabilities)."""
        if self.link in ("identity", "proba"):
            return raw
        if self.link == "exp":
            return np.exp(raw)
        if self.link == "sigmoid":
            return 1.0 / (1.0 + np.exp(-self.link_scale * raw))
        if self.link == "softmax":
            z = np.exp(raw - raw.max(axis=1, keepdims=True))
            return z / z.sum(axis=1, keepdims=True)
        raise ValueError(f"unknown link {self.link!r}")

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(n, n_classes)``, as the original's ``predict_proba``."""
        if self.link not in ("sigmoid", "softmax", "proba"):
            raise AttributeError(f"converted {self.ensemble_source} regressor has no predict_proba")
        proba = self._transform(self.predict_raw(X))
        return proba if proba.ndim == 2 else np.column_stack([1.0 - proba, proba])

    def predict(self, X: Any) -> np.ndarray:
        """Class labels for classifiers (argmax of the probabilities); otherwise the booster's prediction."""
        if self.classes_ is not None:
            labels = np.argmax(self.predict_proba(X), axis=1)
            return np.asarray(self.classes_)[labels]
        return self._transform(self.predict_raw(X))


def build_network(ensemble: Ensemble) -> HammockTrees:
    """The exact network for a library-neutral ensemble description."""
    thresholds: list[list[float]] = [[] for _ in range(ensemble.n_features)]
    for leaf in ensemble.leaves:
        for split, _ in leaf.path:
            thresholds[split.feature].extend(split.edges())
    binning = thresholds_to_edges(
        thresholds, ensemble.n_features, right_closed=ensemble.right_closed, cast_float32=ensemble.cast_float32
    )
    n_leaves = len(ensemble.leaves)
    if binning.total_bins * max(n_leaves, 1) > MAX_TABLE_ENTRIES:
        raise ConversionError(
            f"{ensemble.source} ensemble is too large to convert: {n_leaves} leaves x {binning.total_bins} bins "
            f"exceeds {MAX_TABLE_ENTRIES} table entries; limit the trees' leaves (max_leaf_nodes / num_leaves)"
        )
    reps = [binning.representatives(f) for f in range(ensemble.n_features)]
    table = np.zeros((binning.total_bins, n_leaves), dtype=np.float64)
    need = np.zeros(n_leaves, dtype=np.float64)
    values = np.zeros((n_leaves, ensemble.n_outputs), dtype=np.float64)
    decisions: dict[int, np.ndarray] = {}  # id(split) -> goes-left per bin of its feature
    for j, leaf in enumerate(ensemble.leaves):
        masks: dict[int, np.ndarray] = {}
        for split, went_left in leaf.path:
            key = id(split)
            if key not in decisions:
                decisions[key] = split.goes_left(reps[split.feature], ensemble.right_closed)
            ok = decisions[key] if went_left else ~decisions[key]
            f = split.feature
            masks[f] = masks[f] & ok if f in masks else ok
        for f, mask in masks.items():
            start = binning.offsets[f]
            table[start : start + mask.size, j] = mask
        need[j] = len(masks)
        values[j] = leaf.value
    return HammockTrees(ensemble, binning, table, need, values)


def from_trees(model: Any) -> HammockTrees:
    """Convert a fitted LightGBM, XGBoost or scikit-learn tree ensemble into an exact Hammock network.

    Raises ``ConversionError`` (a ``ValueError``) naming the model and the reason when the model is of
    an unsupported type, unfitted, or uses what has no exact equivalent here (categorical splits,
    linear trees, DART, multi-output trees, a custom init estimator).
    """
    return build_network(describe(model))


__all__ = ["ConversionError", "HammockTrees", "MAX_TABLE_ENTRIES", "build_network", "from_trees"]
