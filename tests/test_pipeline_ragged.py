"""Ragged features in the engine: ``<name>.values`` / ``<name>.lengths`` pairs, rows counted by lengths."""

from __future__ import annotations

import numpy as np
import pytest

import intune
from intune.pipeline.batcher import Batcher
from intune.pipeline.chunks import num_rows, ragged_lengths_name
from intune.pipeline.errors import SourceError


def test_rows_of_a_chunk_are_counted_by_lengths_not_by_values() -> None:
    chunk = {"f.values": np.arange(5), "f.lengths": np.array([2, 0, 3]), "label": np.zeros(3)}
    assert num_rows(chunk) == 3
    assert ragged_lengths_name(chunk, "f.values") == "f.lengths"
    assert ragged_lengths_name(chunk, "label") is None
    # a .values column without its partner is a plain column
    assert num_rows({"g.values": np.arange(4)}) == 4
    assert num_rows({}) == 0


def _ragged(lengths: list[int], first_value: int, first_row: int) -> dict[str, np.ndarray]:
    """A chunk of ragged rows: row ``r`` (numbered from ``first_row``) holds ``lengths[i]`` values."""
    total = sum(lengths)
    return {
        "f.values": np.arange(first_value, first_value + total),
        "f.lengths": np.array(lengths, dtype=np.int64),
        "row": np.arange(first_row, first_row + len(lengths)),
    }


def test_the_batcher_batches_ragged_rows_and_splits_their_values_at_the_row_offsets() -> None:
    b = Batcher(2, drop_last=False)
    # rows 0..2 hold values [0], [1, 2, 3], [4, 5]; rows 3..4 hold [], [6, 7]
    out = b.add(_ragged([1, 3, 2], 0, 0), None) + b.add(_ragged([0, 2], 6, 3), None) + b.flush()
    batches = [batch for batch, _ in out]
    assert [x["row"].tolist() for x in batches] == [[0, 1], [2, 3], [4]]
    assert [x["f.lengths"].tolist() for x in batches] == [[1, 3], [2, 0], [2]]
    assert [x["f.values"].tolist() for x in batches] == [[0, 1, 2, 3], [4, 5], [6, 7]]
    assert b.nbytes == 0


def test_a_whole_batch_of_ragged_rows_passes_without_a_copy() -> None:
    chunk = _ragged([3, 1], 0, 0)
    ((same, _),) = Batcher(2, drop_last=False).add(chunk, None)
    assert same is chunk


def test_lengths_that_do_not_sum_to_the_values_raise_naming_the_column() -> None:
    bad = {"f.values": np.arange(4), "f.lengths": np.array([2, 1])}
    with pytest.raises(ValueError, match=r"batch: ragged column 'f.values' has 4 values but 'f.lengths' sums to 3"):
        Batcher(8, drop_last=False).add(bad, None)


def test_a_source_that_emits_a_ragged_pair_is_refused_naming_the_feature() -> None:
    source = [{"f.values": np.arange(5), "f.lengths": np.array([2, 3]), "id": np.arange(2)}]
    with intune.Pipeline.from_iterable(source, name="read").batch(2) as pipe:
        with pytest.raises(SourceError, match=r"source 'read' chunk #0: .*\['f.values'\] are ragged features"):
            list(pipe)
