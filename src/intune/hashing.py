"""64-bit hashing of numpy columns: the splitmix64 mix and a bit view of any column.

The one definition of splitmix64, shared by the DLRM ops (``SigridHash``, Hammock's bucketing), the
RecD session generator (hidden per-user traits) and the RecD dedup transform (row keys). Pure numpy,
no state; it must not decide what a duplicate is (the dedup transform verifies exactly).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = 0x9E3779B97F4A7C15
_U64 = 0xFFFFFFFFFFFFFFFF
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(values: np.ndarray, salt: int = 0) -> np.ndarray:
    """splitmix64's finaliser of ``values + salt * golden`` as uint64 (the arithmetic wraps mod 2^64).

    Integer values are taken by their 64-bit two's-complement bits, so -1 and 2^64 - 1 hash alike.
    """
    x = values if values.dtype == np.uint64 else values.astype(np.int64, copy=False).view(np.uint64)
    with np.errstate(over="ignore"):
        z = x + np.uint64((salt * _GOLDEN) & _U64)
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def splitmix64(values: np.ndarray, salt: int = 0) -> np.ndarray:
    """splitmix64's output for the state ``values + salt * golden``: one step (add golden) then the
    finaliser, i.e. ``mix64(values, salt + 1)``. ``splitmix64(0)`` is the published first output for
    seed 0, 0xE220A8397B1DCDAF."""
    return mix64(values, salt + 1)


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
