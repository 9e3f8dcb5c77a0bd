"""64-bit hashing of numpy columns: the splitmix64 finaliser and a bit view of any column.

Shared by the session generator (hidden per-user traits) and the dedup transform (row keys). Pure
numpy, no state; it must not decide what a duplicate is (the dedup transform verifies exactly).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15
_U64 = 0xFFFFFFFFFFFFFFFF


def mix64(x: np.ndarray, salt: int = 0) -> np.ndarray:
    """splitmix64 of ``x + salt * golden`` (uint64 arithmetic wraps, as intended)."""
    z = x.astype(np.uint64) + np.uint64((salt * _GOLDEN) & _U64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def column_bits(col: np.ndarray) -> np.ndarray:
    """A column's values as uint64 words (same shape) that are equal exactly when the values are equal.

    Numbers compare by their bits (so NaN equals NaN and -0.0 differs from 0.0, which is what
    "the same stored value" means); other dtypes (strings) are mapped to their rank among the
    column's distinct values.
    """
    col = np.ascontiguousarray(col)
    kind = col.dtype.kind
    if kind in "iufb" and col.dtype.itemsize in (1, 2, 4, 8):
        unsigned = np.dtype(f"u{col.dtype.itemsize}")
        return col.view(unsigned).astype(np.uint64)
    _, codes = np.unique(col, return_inverse=True)
    return codes.astype(np.uint64).ravel()
