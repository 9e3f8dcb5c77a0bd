"""Bins, representatives and encodings, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from intune.hammock.quantize import BinEdges, one_hot, quantile_edges, thermometer


def test_right_and_left_closed_bins_and_nan_bin():
    x = np.array([[0.5], [1.0], [1.5], [2.0], [3.0], [np.nan]])
    right = BinEdges((np.array([1.0, 2.0]),), right_closed=True)  # x <= t goes low (LightGBM, sklearn)
    left = BinEdges((np.array([1.0, 2.0]),), right_closed=False)  # x < t goes low (XGBoost)
    assert right.bin_index(x)[:, 0].tolist() == [0, 0, 1, 1, 2, 3]
    assert left.bin_index(x)[:, 0].tolist() == [0, 1, 1, 2, 2, 3]
    assert right.n_bins.tolist() == [4] and right.nan_bin(0) == 3


def test_global_index_offsets_and_float32_rounding():
    edge = float(np.float32(0.1))
    b = BinEdges((np.array([edge]), np.array([0.0, 1.0])), right_closed=False, cast_float32=True)
    assert b.offsets.tolist() == [0, 3] and b.total_bins == 7
    just_below = np.nextafter(edge, -np.inf)  # rounds to the float32 edge, so it is not below it any more
    assert b.bin_index(np.array([[just_below, 0.5]])).tolist() == [[1, 1]]
    assert b.global_index(np.array([[just_below, 0.5]])).tolist() == [[1, 4]]
    exact = BinEdges((np.array([edge]), np.array([0.0, 1.0])), right_closed=False)
    assert exact.bin_index(np.array([[just_below, 0.5]])).tolist() == [[0, 1]]


@pytest.mark.parametrize("right_closed", [True, False])
def test_representatives_fall_in_their_own_bin(right_closed):
    b = BinEdges((np.array([-1.0, 0.0, 2.5]), np.array([])), right_closed=right_closed)
    for f in range(2):
        reps = b.representatives(f)
        X = np.zeros((len(reps), 2))
        X[:, f] = reps
        assert b.bin_index(X)[:, f].tolist() == list(range(len(reps)))


def test_quantile_edges_one_bin_per_value_when_few_values_and_at_most_max_bins():
    X = np.column_stack([np.repeat([0.0, 1.0, 5.0], 10), np.linspace(0, 1, 30)])
    b = quantile_edges(X, max_bins=4)
    np.testing.assert_allclose(b.edges[0], [0.5, 3.0])
    assert b.edges[1].size == 3  # 4 bins
    with pytest.raises(ValueError, match="max_bins"):
        quantile_edges(X, 1)
    with pytest.raises(ValueError, match="not strictly increasing"):
        BinEdges((np.array([2.0, 1.0]),))


def test_thermometer_is_cumulative_one_hot():
    b = BinEdges((np.array([1.0, 2.0]),))
    idx = b.bin_index(np.array([[0.0], [1.5], [9.0], [np.nan]]))
    assert one_hot(idx, b).tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert thermometer(idx, b).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
