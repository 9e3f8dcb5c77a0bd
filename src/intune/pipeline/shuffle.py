"""The shuffle buffer: tf.data's buffered shuffle, done a chunk at a time with numpy.

Owns the algorithm only (pure, single-threaded, testable): fill a buffer of ``capacity`` rows; once it
is full each incoming row takes the slot of a uniformly chosen buffered row, which is emitted; at the
end the rest is emitted in a random permutation. Per chunk of k rows the cost is O(k) (a gather and a
scatter), not O(buffer). The order depends only on the input order, the capacity and the generator.
It must not know about threads, knobs or bytes (the stage turns its MB knob into ``capacity``).
"""

from __future__ import annotations

import mmap

import numpy as np

from intune.pipeline.chunks import Chunk

IDS = "__row_ids__"  # internal column: epoch-global row numbers, for error messages


class ShuffleBuffer:
    def __init__(self, rng: np.random.Generator, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"shuffle capacity must be >= 1 row, got {capacity}")
        self._rng = rng
        self.capacity = capacity
        self._buf: Chunk = {}
        self._maps: dict[str, mmap.mmap] = {}  # the anonymous mappings behind the columns that have one
        self.size = 0  # rows held

    @property
    def nbytes(self) -> int:
        return sum(int(a[: self.size].nbytes) for a in self._buf.values())

    def row_bytes(self) -> int:
        return sum(a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in self._buf.values())

    def add(self, chunk: Chunk) -> list[Chunk]:
        """Take a chunk in; return the chunks (0 or 1) this lets out."""
        rows = len(next(iter(chunk.values())))
        if not self._buf:
            self._allocate(chunk)
        elif chunk.keys() != self._buf.keys():
            raise ValueError(
                f"shuffle: chunk columns {sorted(chunk)} differ from earlier chunks' {sorted(self._buf)}"
            )
        else:
            self._match_types(chunk)
        free = max(0, self.capacity - self.size)  # held above a shrunk capacity: full
        fill = min(free, rows)
        if fill:
            self._ensure(self.size + fill)
            for name, column in chunk.items():
                self._buf[name][self.size : self.size + fill] = column[:fill]
            self.size += fill
        rest = rows - fill
        if rest == 0:
            return []
        if rest <= self.size:
            slots = self._rng.choice(self.size, size=rest, replace=False)
            out = {name: column[slots] for name, column in self._buf.items()}
            for name, column in chunk.items():
                self._buf[name][slots] = column[fill:]
            return [out]
        # a chunk larger than the buffer: mix it all, keep `capacity` rows, let the rest out
        merged = {n: np.concatenate([self._buf[n][: self.size], c[fill:]]) for n, c in chunk.items()}
        order = self._rng.permutation(self.size + rest)
        keep, out_idx = order[: self.size], order[self.size :]
        out = {n: c[out_idx] for n, c in merged.items()}
        for n, c in merged.items():
            self._buf[n][: self.size] = c[keep]
        return [out]

    def _match_types(self, chunk: Chunk) -> None:
        """Make every buffered column able to take the chunk's values as they are, never by a cast
        that changes them: a wider fixed-width string widens the column (assigning it would cut the
        values), a text column as objects turns it into objects; any other difference is an error."""
        for name, column in chunk.items():
            have = self._buf[name]
            if column.dtype == have.dtype and column.shape[1:] == have.shape[1:]:
                continue
            kinds = (have.dtype.kind, column.dtype.kind)
            if column.shape[1:] == have.shape[1:] and kinds[0] == kinds[1] and kinds[0] in "SU":
                if column.dtype.itemsize > have.dtype.itemsize:
                    self._replace_column(name, column.dtype)
                continue
            if column.shape[1:] == have.shape[1:] and kinds in (("S", "O"), ("U", "O")):
                self._replace_column(name, np.dtype(object))
                continue
            if kinds[0] == "O" and kinds[1] in "SU":
                continue
            raise ValueError(
                f"shuffle: column {name!r} is {column.dtype}{list(column.shape[1:])} in this chunk but "
                f"{have.dtype}{list(have.shape[1:])} in the buffer; storing it would change its values"
            )

    def _replace_column(self, name: str, dtype: np.dtype) -> None:
        old = self._buf[name]
        new = self._new_column(name, len(old), np.empty((0, *old.shape[1:]), dtype=dtype))
        new[: self.size] = old[: self.size]
        self._buf[name] = new

    def resize(self, capacity: int, max_out: int | None = None) -> list[Chunk]:
        """Change the capacity; if it shrinks below what is held, let random rows out: all the excess,
        or at most ``max_out`` rows per call (the rest goes at later calls; ``add`` treats a buffer held
        above its capacity as full).

        In place: the rows kept past the new size fill the slots of the rows let out below it, and the
        memory past it goes back to the system. Copying the kept rows to a smaller array would hold both
        for a moment, and a shrink happens under memory pressure (live, that copy of a nearly full 360 MB
        buffer got the job OOM-killed under a 1 GB limit). ``max_out`` bounds the rows let out at once:
        they leave as one chunk, which a process worker downstream copies three or four times (live, a
        shrink from 143 MB let out one 140 MB chunk, and the job was OOM-killed under a 1 GB limit).
        """
        capacity = max(1, capacity)
        self.capacity = capacity
        if self.size <= capacity:
            return []
        excess = self.size - capacity if max_out is None else min(self.size - capacity, max(1, max_out))
        keep = self.size - excess
        slots = self._rng.choice(self.size, size=excess, replace=False)
        out = {n: c[slots] for n, c in self._buf.items()}
        holes = slots[slots < keep]
        kept_past = np.ones(self.size - keep, dtype=bool)
        kept_past[slots[slots >= keep] - keep] = False
        movers = keep + np.flatnonzero(kept_past)
        for c in self._buf.values():
            c[holes] = c[movers]
        self.size = keep
        self._release_past(keep)
        return [out]

    def drain(self, chunk_rows: int) -> list[Chunk]:
        """The end of input: everything held, in a random permutation, ``chunk_rows`` at a time."""
        if self.size == 0:
            return []
        order = self._rng.permutation(self.size)
        out = []
        for start in range(0, self.size, max(1, chunk_rows)):
            idx = order[start : start + chunk_rows]
            out.append({n: c[idx] for n, c in self._buf.items()})
        self._buf, self._maps = {}, {}
        self.size = 0
        return out

    def column_copy(self, name: str) -> np.ndarray:
        """A copy of the rows one column holds, in slot order (a resume's record of the buffer's ids)."""
        column = self._buf.get(name)
        return column[: self.size].copy() if column is not None and self.size else np.empty(0, np.int64)

    def restore(self, rows: Chunk) -> None:
        """Hold ``rows`` in slots ``0..n-1`` (a resume rebuilding a buffer whose slot order a replay
        found, ``resume.replay``); the generator must be the one the replay advanced, so that the
        draws that follow are the draws an uninterrupted run makes."""
        n = len(next(iter(rows.values()))) if rows else 0
        if not n:
            return
        self._buf, self._maps = {}, {}
        for name, column in rows.items():
            self._buf[name] = self._new_column(name, max(n, self.capacity), column)
            self._buf[name][:n] = column
        self.size = n

    def _allocate(self, chunk: Chunk) -> None:
        # the whole capacity at once, in fresh pages that become resident only as rows are written, so
        # memory grows with the fill and never by copying a growing buffer
        self._buf, self._maps = {}, {}
        for n, c in chunk.items():
            self._buf[n] = self._new_column(n, self.capacity, c)

    def _ensure(self, rows: int) -> None:
        """Room for ``rows`` after the capacity was raised: one copy to the new capacity, column by column."""
        have = len(next(iter(self._buf.values())))
        if rows <= have:
            return
        new = max(rows, self.capacity)
        for n in list(self._buf):
            c = self._buf[n]
            grown = self._new_column(n, new, c)
            grown[: self.size] = c[: self.size]
            self._buf[n] = grown

    def _new_column(self, name: str, rows: int, like: np.ndarray) -> np.ndarray:
        """An empty column of ``rows`` rows shaped like ``like``: in an anonymous mapping whose pages can
        be given back on a shrink (``_release_past``), or plain ``np.empty`` for object columns."""
        self._maps.pop(name, None)
        shape = (rows, *like.shape[1:])
        count = int(np.prod(shape, dtype=np.int64))
        if like.dtype.hasobject or count == 0:
            return np.empty(shape, dtype=like.dtype)
        pages = mmap.mmap(-1, count * like.dtype.itemsize)
        self._maps[name] = pages
        return np.frombuffer(pages, dtype=like.dtype, count=count).reshape(shape)

    def _release_past(self, rows: int) -> None:
        """Give the pages of every row from ``rows`` on back to the system (they read as zeros after)."""
        advise = getattr(mmap, "MADV_DONTNEED", None)
        if advise is None:
            return
        for n, pages in self._maps.items():
            column = self._buf[n]
            start = -(-rows * (column.nbytes // max(len(column), 1)) // mmap.PAGESIZE) * mmap.PAGESIZE
            if start < len(pages):
                pages.madvise(advise, start, len(pages) - start)
