"""Rebatching: chunks of any size in, batches of exactly ``batch_rows`` rows out (the last may be short).

Owns the algorithm only (pure, single-threaded): a chunk that already is one batch passes without a
copy; otherwise slices are concatenated column by column. Rows are counted by ``num_rows``, so a
ragged feature (``<f>.values`` / ``<f>.lengths``) is batched by its rows: a batch takes the values of
its rows, and a chunk whose lengths do not sum to its values raises, naming the column. Provenance
(``Origin``) is sliced and merged alongside. It must not know about threads or channels.
"""

from __future__ import annotations

import numpy as np

from intune.pipeline.chunks import (
    Chunk,
    Origin,
    Segment,
    check_ragged,
    merge_origins,
    nbytes,
    num_rows,
    slice_rows,
)


def slice_origin(origin: Origin | None, lo: int, hi: int) -> Origin | None:
    if origin is None:
        return None
    if origin.row_ids is not None:
        return Origin((), origin.row_ids[lo:hi], origin.table)
    if len(origin.segments) == 1:
        s = origin.segments[0]
        return Origin((Segment(s.source, s.unit, s.lo + lo, s.lo + hi),))
    return origin


class Batcher:
    def __init__(self, batch_rows: int, drop_last: bool) -> None:
        self.batch_rows = batch_rows
        self.drop_last = drop_last
        self._pending: list[tuple[Chunk, Origin | None]] = []
        self._rows = 0
        self.nbytes = 0

    def add(self, chunk: Chunk, origin: Origin | None) -> list[tuple[Chunk, Origin | None]]:
        rows = num_rows(chunk)
        check_ragged(chunk, "batch")
        if rows == 0:
            return []
        if not self._pending and rows == self.batch_rows:
            return [(chunk, origin)]
        self._pending.append((chunk, origin))
        self._rows += rows
        self.nbytes += sum(c.nbytes for c in chunk.values())
        out = []
        while self._rows >= self.batch_rows:
            out.append(self._take(self.batch_rows))
        return out

    def flush(self) -> list[tuple[Chunk, Origin | None]]:
        if self._rows == 0 or self.drop_last:
            self._pending, self._rows, self.nbytes = [], 0, 0
            return []
        return [self._take(self._rows)]

    def _take(self, n: int) -> tuple[Chunk, Origin | None]:
        pieces: list[Chunk] = []
        origins: list[Origin | None] = []
        need = n
        while need:
            chunk, origin = self._pending[0]
            rows = num_rows(chunk)
            if rows <= need:
                pieces.append(chunk)
                origins.append(origin)
                self._pending.pop(0)
                self.nbytes -= sum(c.nbytes for c in chunk.values())
                need -= rows
            else:
                offsets = check_ragged(chunk, "batch")
                head = slice_rows(chunk, 0, need, offsets)
                pieces.append(head)
                origins.append(slice_origin(origin, 0, need))
                rest = slice_rows(chunk, need, rows, offsets)
                self._pending[0] = (rest, slice_origin(origin, need, rows))
                self.nbytes -= nbytes(head)
                need = 0
        self._rows -= n
        if len(pieces) == 1:
            return pieces[0], origins[0]
        names = pieces[0].keys()
        for piece in pieces[1:]:
            if piece.keys() != names:  # concatenating by the first piece's names would drop columns
                raise ValueError(f"batch: chunks with columns {sorted(names)} and {sorted(piece)} meet in one batch")
        batch = {k: np.concatenate([p[k] for p in pieces]) for k in names}
        known = [o for o in origins if o is not None]
        return batch, (merge_origins(known) if known else None)
