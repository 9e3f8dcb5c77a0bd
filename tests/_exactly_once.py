"""Shared checks for pipeline tests: every source row delivered exactly once, and in which order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np


def delivered_ids(batches: Iterable[Mapping[str, np.ndarray]], column: str = "id") -> np.ndarray:
    """The row ids of all batches, in delivery order."""
    parts = [np.asarray(b[column]) for b in batches]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def assert_exactly_once(ids: np.ndarray, expected: Iterable[int]) -> None:
    """``ids`` equals ``expected`` as a multiset: nothing lost, nothing repeated, nothing invented."""
    expected = np.sort(np.asarray(list(expected) if not isinstance(expected, np.ndarray) else expected))
    got = np.sort(np.asarray(ids))
    if got.shape == expected.shape and np.array_equal(got, expected):
        return
    values, counts = np.unique(got, return_counts=True)
    repeated = values[counts > 1][:10]
    missing = np.setdiff1d(expected, got)[:10]
    extra = np.setdiff1d(got, expected)[:10]
    raise AssertionError(
        f"not exactly once: {len(got)} rows delivered, {len(expected)} expected; "
        f"repeated {repeated.tolist()}, missing {missing.tolist()}, unexpected {extra.tolist()}"
    )


def assert_same_order(a: np.ndarray, b: np.ndarray) -> None:
    """Two deliveries of the same rows came in the same order."""
    assert len(a) == len(b), f"lengths differ: {len(a)} vs {len(b)}"
    diff = np.flatnonzero(np.asarray(a) != np.asarray(b))
    assert diff.size == 0, f"orders differ first at position {diff[0]}: {a[diff[0]]} vs {b[diff[0]]}"
