"""Chunks: the columnar unit that flows between stages, and where its rows came from.

A chunk is a ``dict[str, numpy.ndarray]``. Sources guarantee equal-length columns; a map stage placed
after ``batch`` may change lengths (a dedup stage emits unique rows plus inverse indices), so nothing
here re-validates after a map. A ragged feature is a pair of columns ``<f>.values`` / ``<f>.lengths``:
the chunk's rows are counted by ``lengths`` (one entry per row) and row ``i`` holds the next
``lengths[i]`` entries of ``values``. Sources may not emit them (``validate_chunk`` says so: the
shuffle and the sharding cut rows by position); the batcher carries them (``num_rows``,
``check_ragged``, ``slice_rows`` here). ``Origin`` records which source rows a chunk holds, cheaply (ranges or
a row-id array), and is only turned into words when an error needs it. This module must not know
about threads, queues or stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from intune.pipeline.errors import SourceError

Chunk = dict[str, np.ndarray]


def validate_chunk(chunk: Any, where: str) -> Chunk:
    """Check that a source produced equal-length numpy columns; raise ``SourceError`` naming ``where``."""
    if not isinstance(chunk, Mapping):
        raise SourceError(f"{where}: a chunk must be a dict of numpy arrays, got {type(chunk).__name__}")
    if not chunk:
        raise SourceError(f"{where}: a chunk must have at least one column")
    out: Chunk = {}
    length = -1
    for name, column in chunk.items():
        array = column if isinstance(column, np.ndarray) else np.asarray(column)
        if array.ndim == 0:
            raise SourceError(f"{where}: column {name!r} is a scalar, not an array")
        if length < 0:
            length = len(array)
        elif len(array) != length:
            lengths = {n: len(c) for n, c in chunk.items()}
            ragged = sorted(ragged_pairs(chunk))
            hint = (
                f"; {ragged} are ragged features, which a source may not emit (the shuffle and the "
                "sharding cut rows by position): make them in a map stage"
                if ragged
                else ""
            )
            raise SourceError(f"{where}: columns have unequal lengths {lengths}{hint}")
        out[str(name)] = array
    return out


def ragged_lengths_name(chunk: Mapping[str, Any], name: str) -> str | None:
    """The ``<feature>.lengths`` column that counts the rows of ``name`` when ``name`` is a
    ``<feature>.values`` column of ``chunk`` with that partner; ``None`` for a plain column.

    A ragged feature is the pair: row ``i`` holds ``lengths[i]`` consecutive entries of ``values``, so
    ``values`` is as long as ``lengths`` sums to, and every other column has one entry per row."""
    if name.endswith(".values"):
        lengths = name[: -len(".values")] + ".lengths"
        if lengths in chunk:
            return lengths
    return None


def num_rows(chunk: Mapping[str, np.ndarray]) -> int:
    """Rows of a chunk: the length of its first column that is not a ragged ``.values`` column (0 for
    an empty dict)."""
    for name, column in chunk.items():
        if ragged_lengths_name(chunk, name) is None:
            return len(column)
    return 0


def ragged_pairs(chunk: Mapping[str, Any]) -> dict[str, str]:
    """Each ragged feature of ``chunk`` as ``{"<f>.values": "<f>.lengths"}`` (empty for plain chunks)."""
    return {name: lengths for name in chunk if (lengths := ragged_lengths_name(chunk, name)) is not None}


def check_ragged(chunk: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """The row offsets of each ragged ``.values`` column (``offsets[i]`` = where row ``i`` starts; one
    more entry than rows), after checking that its ``.lengths`` sum to its length; a mismatch raises
    ``ValueError`` naming ``where`` and the column."""
    offsets: dict[str, np.ndarray] = {}
    for values, lengths_name in ragged_pairs(chunk).items():
        lengths = np.asarray(chunk[lengths_name])
        ends = np.cumsum(lengths, dtype=np.int64)
        total = int(ends[-1]) if ends.size else 0
        if total != len(chunk[values]) or (ends.size and int(lengths.min()) < 0):
            raise ValueError(
                f"{where}: ragged column {values!r} has {len(chunk[values])} values but {lengths_name!r} "
                f"sums to {total}" + (" with a negative length" if ends.size and int(lengths.min()) < 0 else "")
            )
        offsets[values] = np.concatenate(([0], ends))
    return offsets


def slice_rows(
    chunk: Mapping[str, np.ndarray], lo: int, hi: int, offsets: Mapping[str, np.ndarray] | None = None
) -> Chunk:
    """Rows ``lo..hi-1`` of ``chunk`` as views: a ragged ``.values`` column gives the values of those
    rows (``offsets`` from ``check_ragged``, computed here when not given), every other column
    ``[lo:hi]``."""
    if offsets is None:
        offsets = check_ragged(chunk, "slice_rows")
    out: Chunk = {}
    for name, column in chunk.items():
        if name in offsets:
            out[name] = column[int(offsets[name][lo]) : int(offsets[name][hi])]
        else:
            out[name] = column[lo:hi]
    return out


def nbytes(chunk: Mapping[str, Any]) -> int:
    """Bytes the chunk's arrays occupy (views count their own extent)."""
    total = 0
    for column in chunk.values():
        total += getattr(column, "nbytes", 0)
    return total


class SourceDescriber(Protocol):
    """What a source offers to turn a (unit, row range) back into words, lazily."""

    def describe(self, unit: int, lo: int, hi: int) -> str: ...


@dataclass(frozen=True)
class Segment:
    """Rows [lo, hi) of read unit ``unit`` of a source (a Parquet row group, a TSV byte block)."""

    source: SourceDescriber
    unit: int
    lo: int
    hi: int

    def describe(self) -> str:
        return self.source.describe(self.unit, self.lo, self.hi)


@dataclass(frozen=True)
class Origin:
    """Which source rows a chunk holds.

    Before a shuffle a chunk is a few contiguous ``segments``; after it, ``row_ids`` (epoch-global
    row numbers) with ``table`` mapping them back to segments. Formatting is lazy and only on errors.

    ``read_at`` is where the read stage got the chunk: ``(unit, i)``, the ``i``-th chunk its
    ``read_unit(unit)`` returned (for a stream, ``(k, 0)``: its ``k``-th chunk); the shuffle records it
    so that a resume can read the same rows again (``resume``). ``refill`` marks rows a resumed read
    stage sends to rebuild the shuffle buffer, not new input.
    """

    segments: tuple[Segment, ...] = ()
    row_ids: np.ndarray | None = None
    table: RowTable | None = None
    read_at: tuple[int, int] | None = None
    refill: bool = False

    def describe(self, limit: int = 4) -> str:
        segments = list(self.segments)
        if self.row_ids is not None and self.table is not None:
            segments = self.table.segments_of(self.row_ids)
        if not segments:
            return "rows of unknown origin"
        segments = _merge_by_file(segments)
        words = [s.describe() for s in segments[:limit]]
        if len(segments) > limit:
            words.append(f"and {len(segments) - limit} more ranges")
        return "; ".join(words)


def _merge_by_file(segments: list[Segment]) -> list[Segment]:
    """One range per file where the source numbers rows per file (``file_of``), else as given."""
    merged: dict[tuple[int, int], Segment] = {}
    for s in segments:
        file_of = getattr(s.source, "file_of", None)
        key = (id(s.source), file_of(s.unit) if file_of is not None else -1 - s.unit)
        if key in merged:
            m = merged[key]
            merged[key] = Segment(m.source, m.unit, min(m.lo, s.lo), max(m.hi, s.hi))
        else:
            merged[key] = s
    return list(merged.values())


def merge_origins(origins: Sequence[Origin]) -> Origin:
    """The origin of a chunk built by concatenating chunks (a batch)."""
    if len(origins) == 1:
        return origins[0]
    ids = [o.row_ids for o in origins if o.row_ids is not None]
    table = next((o.table for o in origins if o.table is not None), None)
    segments = tuple(s for o in origins for s in o.segments)
    if ids:
        return Origin(segments, np.concatenate(ids), table)
    return Origin(segments)


class RowTable:
    """Epoch-global row numbers assigned in read order, mapped back to source segments.

    The shuffle stage appends one entry per chunk it receives (cheap) and carries row ids per row;
    ``segments_of`` runs only when an error message is written.
    """

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._segments: list[Segment] = []
        self.total = 0

    def add(self, origin: Origin, rows: int) -> int:
        """Register a chunk of ``rows`` rows; return the global id of its first row."""
        start = self.total
        if origin.segments:
            offset = start
            for segment in origin.segments:
                self._starts.append(offset)
                self._segments.append(segment)
                offset += segment.hi - segment.lo
        self.total += rows
        return start

    def segments_of(self, row_ids: np.ndarray) -> list[Segment]:
        if not self._starts or len(row_ids) == 0:
            return []
        starts = np.asarray(self._starts)
        which = np.searchsorted(starts, row_ids, side="right") - 1
        out = []
        for index in np.unique(which[which >= 0]):  # below the first start: rows a resume refilled
            seg = self._segments[int(index)]
            local = row_ids[which == index] - starts[index] + seg.lo
            out.append(Segment(seg.source, seg.unit, int(local.min()), int(local.max()) + 1))
        return out
