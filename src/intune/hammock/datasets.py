"""The benchmark's data sets: scikit-learn's bundled sets, two generators, and targets from random trees.

Owns: loading each named data set as ``(X, y, task)`` with a fixed seed, and the random axis-aligned
tree target (the case that favours gradient-boosted trees). It must not fit models or score them.

``wine`` and ``digits`` are kept multiclass (3 and 10 classes); the benchmark scores them with the
macro-averaged one-vs-rest AUC and multiclass log-loss.
"""

from __future__ import annotations

import numpy as np

SMALL = ("breast_cancer", "wine", "digits", "diabetes")
SYNTHETIC = ("make_classification", "hastie_10_2", "random_trees")


def random_trees_target(
    n_rows: int, *, n_features: int = 10, n_trees: int = 8, depth: int = 4, sharpness: float = 3.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian features; the label is Bernoulli(sigmoid(sharpness * f)) with f a sum of random trees.

    Each tree has ``depth`` levels of axis-aligned splits on random features at random thresholds and
    Gaussian leaf values; ``f`` is standardised. Label noise keeps the Bayes AUC below 1.
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, n_features))
    f = np.zeros(n_rows)
    rows = np.arange(n_rows)
    n_inner = 2**depth - 1
    for _ in range(n_trees):
        feature = rng.integers(0, n_features, size=n_inner)
        threshold = rng.normal(scale=0.8, size=n_inner)
        leaf_value = rng.normal(size=2**depth)
        node = np.zeros(n_rows, dtype=np.int64)  # heap order: children of i are 2i+1, 2i+2
        for _ in range(depth):
            node = 2 * node + 1 + (X[rows, feature[node]] > threshold[node])
        f += leaf_value[node - n_inner]
    f = (f - f.mean()) / (f.std() or 1.0)
    y = (rng.random(n_rows) < 1.0 / (1.0 + np.exp(-sharpness * f))).astype(np.int64)
    return X, y


def load(name: str, n_rows: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray, str]:
    """``(X, y, task)`` with task ``binary``, ``multiclass`` or ``regression``; ``n_rows`` for generators only."""
    from sklearn import datasets

    if name == "breast_cancer":
        X, y = datasets.load_breast_cancer(return_X_y=True)
        return X, y, "binary"
    if name == "wine":
        X, y = datasets.load_wine(return_X_y=True)
        return X, y, "multiclass"
    if name == "digits":
        X, y = datasets.load_digits(return_X_y=True)
        return X, y, "multiclass"
    if name == "diabetes":
        X, y = datasets.load_diabetes(return_X_y=True)
        return X, y, "regression"
    if n_rows is None:
        raise ValueError(f"data set {name!r} is generated: give n_rows")
    if name == "make_classification":
        X, y = datasets.make_classification(
            n_samples=n_rows, n_features=20, n_informative=10, n_redundant=4, flip_y=0.02, random_state=seed
        )
        return X, y, "binary"
    if name == "hastie_10_2":
        X, y = datasets.make_hastie_10_2(n_samples=n_rows, random_state=seed)
        return X, (y > 0).astype(np.int64), "binary"
    if name == "random_trees":
        X, y = random_trees_target(n_rows, seed=seed)
        return X, y, "binary"
    raise ValueError(f"unknown data set {name!r}; known: {SMALL + SYNTHETIC}")
