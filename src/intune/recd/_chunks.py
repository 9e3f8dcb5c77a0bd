"""Row operations on chunks that keep ``<name>.values`` / ``<name>.lengths`` pairs aligned.

A chunk is ``dict[str, numpy.ndarray]``; a jagged feature's ``.values`` column is longer than the
chunk. These helpers own row selection and concatenation only; they must not interpret features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from intune.pipeline.chunks import num_rows, ragged_lengths_name

Chunk = dict[str, np.ndarray]


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n): the gather index of jagged rows."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    row_off = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=row_off[1:])
    return np.repeat(np.asarray(starts, dtype=np.int64) - row_off, lengths) + np.arange(total, dtype=np.int64)


def take_rows(chunk: Mapping[str, np.ndarray], rows: np.ndarray) -> Chunk:
    """The given rows of a chunk, in that order."""
    rows = np.asarray(rows, dtype=np.int64)
    out: Chunk = {}
    for name, col in chunk.items():
        lengths_name = ragged_lengths_name(chunk, name)
        if lengths_name is None:
            out[name] = col[rows]
        else:
            lengths = chunk[lengths_name]
            offsets = np.zeros(lengths.size + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            out[name] = col[ranges(offsets[rows], lengths[rows])]
    return out


def concat_chunks(chunks: Sequence[Mapping[str, np.ndarray]]) -> Chunk:
    """Chunks with the same columns, one after the other."""
    if not chunks:
        return {}
    names = list(chunks[0])
    for i, c in enumerate(chunks[1:], start=1):
        if list(c) != names:
            raise ValueError(f"chunk {i} has columns {sorted(c)}, expected {sorted(names)}")
    return {n: np.concatenate([c[n] for c in chunks]) for n in names}


def rebatch(chunks, batch_size: int, drop_last: bool = False):
    """Chunks of any size in, chunks of exactly ``batch_size`` rows out (the last may be short)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    pending: list[Mapping[str, np.ndarray]] = []
    held = 0
    for chunk in chunks:
        pending.append(chunk)
        held += num_rows(chunk)
        if held < batch_size:
            continue
        window = concat_chunks(pending)
        start = 0
        while held - start >= batch_size:
            yield take_rows(window, np.arange(start, start + batch_size))
            start += batch_size
        pending = [take_rows(window, np.arange(start, held))] if held > start else []
        held -= start
    if held and not drop_last:
        yield concat_chunks(pending)


class ListsToJagged:
    """Chunk -> chunk: object columns holding one array per row become ``.values`` / ``.lengths``.

    The engine's Parquet reader hands list columns over as object arrays (one array per row) and keeps
    columns equal-length until ``batch``; this map, placed after ``batch``, turns them into the jagged
    pair that the dedup transform and the model read. ``names=None`` converts every object column.
    """

    def __init__(self, names: Sequence[str] | None = None):
        self.names = None if names is None else list(names)

    def __call__(self, chunk: Chunk) -> Chunk:
        names = self.names if self.names is not None else [n for n, c in chunk.items() if c.dtype == object]
        out = dict(chunk)
        for name in names:
            if name not in chunk:
                raise ValueError(f"list column {name!r} is not in the batch; columns: {sorted(chunk)}")
            rows = [np.asarray(x) for x in out.pop(name)]
            out[name + ".lengths"] = np.fromiter((r.shape[0] for r in rows), dtype=np.int64, count=len(rows))
            out[name + ".values"] = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        return out
