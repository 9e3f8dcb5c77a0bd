"""``HammockClassifier`` / ``HammockRegressor``: the trainable Hammock with the scikit-learn estimator API.

Owns: input validation, the fit recipe (validation split, bin edges from the training split only,
optional GBDT initialisation, Adam with early stopping) and prediction. It must not hold the network
(``network.py``), the loop (``training.py``) or the conversion (``convert.py``).

What trains well (measured with ``intune bench hammock``; see docs/hammock.md for the numbers):

* **encoding**: thermometer beats one-hot from scratch. With one-hot, every bin's row learns only from
  the rows in that bin, so with 32 bins per feature the model overfits and is jagged; thermometer rows
  are shared by all bins above a cut, which acts like the ordering a tree's split exploits.
* **width**: 256 hidden units with ReLU is enough on every benchmark set; wider did not help and
  costs time.
* **bin edges**: ``edges="lightgbm"`` (the thresholds a LightGBM fitted on the training split chose,
  network still from scratch) beats 32 quantile bins where the target has sharp or uneven cuts
  (single-split check: Hastie 0.990 vs 0.966, random-trees 0.862 vs 0.852 AUC).
* **initialisation**: ``init="lightgbm"`` fits a small LightGBM on the training split, converts it
  exactly, relaxes the step to ``sigmoid(10 z)`` and fine-tunes. Because early stopping keeps the best
  epoch including epoch 0, it starts at the GBDT's validation loss and only moves if that improves.
  From-scratch training (``init=None``) is the paper's Hammock and is the default.

The models accept only finite inputs: NaN or infinity raise ``ValueError`` naming the row and feature
(impute first; the exact conversion, by contrast, routes NaN the way the original ensemble does).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from intune.hammock.convert import from_trees
from intune.hammock.network import RelaxedHammock
from intune.hammock.quantize import BinEdges, quantile_edges
from intune.hammock.training import TrainConfig, TrainResult, split_validation, train


class NotFittedError(ValueError, AttributeError):
    """predict / predict_proba before fit."""


def _check_features(X: Any, where: str, n_features: int | None = None) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{where}: X must be 2-D (rows, features), got shape {X.shape}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"{where}: X has {X.shape[1]} features, the model was fitted with {n_features}")
    bad = ~np.isfinite(X)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        kind = "NaN" if np.isnan(X[row, col]) else "an infinite value"
        raise ValueError(
            f"{where}: X has {kind} at row {row}, feature {col} ({int(bad.sum())} non-finite values in all); "
            "Hammock models need finite inputs, impute missing values first"
        )
    return X


class _HammockBase:
    """Shared parameters and fit recipe; subclasses set the output layer and the loss."""

    _estimator_type = "regressor"

    def __init__(
        self,
        *,
        max_bins: int = 32,
        edges: str = "quantile",
        encoding: str = "thermometer",
        hidden: int = 256,
        activation: str = "relu",
        init: str | None = None,
        init_trees: int = 100,
        init_leaves: int = 15,
        init_max_units: int = 3000,
        init_temperature: float = 10.0,
        learning_rate: float = 3e-3,
        weight_decay: float = 0.0,
        batch_size: int = 512,
        max_epochs: int = 100,
        patience: int = 8,
        validation_fraction: float = 0.15,
        random_state: int = 0,
        n_threads: int | None = None,
    ):
        self.max_bins = max_bins
        self.edges = edges
        self.encoding = encoding
        self.hidden = hidden
        self.activation = activation
        self.init = init
        self.init_trees = init_trees
        self.init_leaves = init_leaves
        self.init_max_units = init_max_units
        self.init_temperature = init_temperature
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.validation_fraction = validation_fraction
        self.random_state = random_state
        self.n_threads = n_threads

    # ---------------------------------------------------------------- scikit-learn protocol
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(_HammockBase.__init__)
        return [p for p in sig.parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> _HammockBase:
        valid = set(self._param_names())
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {name!r}; valid: {sorted(valid)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = inspect.signature(_HammockBase.__init__).parameters
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if defaults[k].default != v]
        return f"{type(self).__name__}({', '.join(changed)})"

    # ---------------------------------------------------------------- subclass hooks
    def _prepare_targets(self, y: np.ndarray) -> tuple[torch.Tensor, int]:
        raise NotImplementedError

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _init_model(self, X: np.ndarray, y: np.ndarray) -> Any:
        raise NotImplementedError

    def _init_rounds(self, n_outputs: int) -> int:
        """Boosting rounds for the init GBDT: ``init_trees``, fewer if the hidden layer would exceed
        ``init_max_units`` (one unit per leaf; multiclass grows one tree per class per round)."""
        return max(1, min(self.init_trees, self.init_max_units // max(1, self.init_leaves * n_outputs)))

    # ---------------------------------------------------------------- fit / predict
    def fit(self, X: Any, y: Any) -> _HammockBase:
        X = _check_features(X, f"{type(self).__name__}.fit")
        y = np.asarray(y)
        if y.ndim != 1 or len(y) != len(X):
            raise ValueError(f"{type(self).__name__}.fit: y must be 1-D with {len(X)} entries, got shape {y.shape}")
        if self.init not in (None, "lightgbm"):
            raise ValueError(f"init must be None or 'lightgbm', got {self.init!r}")
        if self.edges not in ("quantile", "lightgbm"):
            raise ValueError(f"edges must be 'quantile' or 'lightgbm', got {self.edges!r}")
        threads = torch.get_num_threads()
        if self.n_threads:
            torch.set_num_threads(self.n_threads)
        try:
            torch.manual_seed(self.random_state)
            target, n_outputs = self._prepare_targets(y)
            is_cls = self._estimator_type == "classifier"
            train_rows, val_rows = split_validation(y, self.validation_fraction, self.random_state, stratify=is_cls)
            if self.init == "lightgbm":
                trees = from_trees(self._init_model(X[train_rows], y[train_rows]))
                self.binning_: BinEdges = trees.binning
                self.network_ = RelaxedHammock.from_trees(
                    trees, encoding=self.encoding, temperature=self.init_temperature
                )
            else:
                if self.edges == "lightgbm":  # the thresholds a GBDT chose, on the training split only
                    self.binning_ = from_trees(self._init_model(X[train_rows], y[train_rows])).binning
                else:
                    self.binning_ = quantile_edges(X[train_rows], self.max_bins)
                self.network_ = RelaxedHammock(
                    self.binning_.n_bins, self.hidden, n_outputs, encoding=self.encoding,
                    activation=self.activation, seed=self.random_state,
                )
            idx = torch.from_numpy(self.binning_.global_index(X))
            config = TrainConfig(
                learning_rate=self.learning_rate, weight_decay=self.weight_decay, batch_size=self.batch_size,
                max_epochs=self.max_epochs, patience=self.patience, seed=self.random_state,
            )
            self.train_result_: TrainResult = train(
                self.network_, self._loss, idx[train_rows], target[train_rows], idx[val_rows], target[val_rows], config
            )
        finally:
            torch.set_num_threads(threads)
        self.n_features_in_ = X.shape[1]
        return self

    def _logits(self, X: Any, where: str) -> np.ndarray:
        if not hasattr(self, "network_"):
            raise NotFittedError(f"{type(self).__name__}.{where} called before fit")
        X = _check_features(X, f"{type(self).__name__}.{where}", self.n_features_in_)
        idx = torch.from_numpy(self.binning_.global_index(X))
        with torch.no_grad():
            parts = [self.network_(idx[s : s + 8192]) for s in range(0, len(idx), 8192)]
        return torch.cat(parts).double().numpy() if parts else np.zeros((0, 1))


class HammockClassifier(_HammockBase):
    """Binary (sigmoid) or multiclass (softmax) Hammock classifier."""

    _estimator_type = "classifier"

    def _prepare_targets(self, y: np.ndarray) -> tuple[torch.Tensor, int]:
        self.classes_, codes = np.unique(y, return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError(f"HammockClassifier.fit: y has a single class {self.classes_.tolist()}")
        if self.classes_.size == 2:
            return torch.from_numpy(codes.astype(np.float32))[:, None], 1
        return torch.from_numpy(codes.astype(np.int64)), int(self.classes_.size)

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if logits.shape[1] == 1:
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        return torch.nn.functional.cross_entropy(logits, target)

    def _init_model(self, X: np.ndarray, y: np.ndarray) -> Any:
        import lightgbm

        n_classes = np.unique(y).size
        return lightgbm.LGBMClassifier(
            n_estimators=self._init_rounds(1 if n_classes == 2 else n_classes), num_leaves=self.init_leaves, n_jobs=self.n_threads or 1,
            random_state=self.random_state, verbose=-1,
        ).fit(X, y)

    def decision_function(self, X: Any) -> np.ndarray:
        logits = self._logits(X, "decision_function")
        return logits[:, 0] if logits.shape[1] == 1 else logits

    def predict_proba(self, X: Any) -> np.ndarray:
        logits = self._logits(X, "predict_proba")
        if logits.shape[1] == 1:
            p = 1.0 / (1.0 + np.exp(-logits[:, 0]))
            return np.column_stack([1.0 - p, p])
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    def score(self, X: Any, y: Any) -> float:
        return float(np.mean(self.predict(X) == np.asarray(y)))


class HammockRegressor(_HammockBase):
    """Squared-error Hammock regressor; the target is standardised for training and restored after."""

    def _prepare_targets(self, y: np.ndarray) -> tuple[torch.Tensor, int]:
        y = y.astype(np.float64)
        if not np.isfinite(y).all():
            raise ValueError("HammockRegressor.fit: y has NaN or infinite values")
        self.y_mean_, self.y_scale_ = float(y.mean()), float(y.std() or 1.0)
        if self.init == "lightgbm":  # the converted GBDT predicts y itself, not the standardised y
            self.y_mean_, self.y_scale_ = 0.0, 1.0
        return torch.from_numpy(((y - self.y_mean_) / self.y_scale_).astype(np.float32))[:, None], 1

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(logits, target)

    def _init_model(self, X: np.ndarray, y: np.ndarray) -> Any:
        import lightgbm

        return lightgbm.LGBMRegressor(
            n_estimators=self._init_rounds(1), num_leaves=self.init_leaves, n_jobs=self.n_threads or 1,
            random_state=self.random_state, verbose=-1,
        ).fit(X, y)

    def predict(self, X: Any) -> np.ndarray:
        return self._logits(X, "predict")[:, 0] * self.y_scale_ + self.y_mean_

    def score(self, X: Any, y: Any) -> float:
        y = np.asarray(y, dtype=np.float64)
        resid = ((y - self.predict(X)) ** 2).sum()
        return float(1.0 - resid / max(((y - y.mean()) ** 2).sum(), 1e-300))
