"""Ragged features in the engine: ``<name>.values`` / ``<name>.lengths`` pairs, rows counted by lengths."""

from __future__ import annotations

import numpy as np

from intune.pipeline.chunks import num_rows, ragged_lengths_name


def test_rows_of_a_chunk_are_counted_by_lengths_not_by_values() -> None:
    chunk = {"f.values": np.arange(5), "f.lengths": np.array([2, 0, 3]), "label": np.zeros(3)}
    assert num_rows(chunk) == 3
    assert ragged_lengths_name(chunk, "f.values") == "f.lengths"
    assert ragged_lengths_name(chunk, "label") is None
    # a .values column without its partner is a plain column
    assert num_rows({"g.values": np.arange(4)}) == 4
    assert num_rows({}) == 0
