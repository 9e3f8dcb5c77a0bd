"""The shuffle buffer: tf.data's buffered shuffle, done a chunk at a time with numpy.

Owns the algorithm only (pure, single-threaded, testable): fill a buffer of ``capacity`` rows; once it
is full each incoming row takes the slot of a uniformly chosen buffered row, which is emitted; at the
end the rest is emitted in a random permutation. Per chunk of k rows the cost is O(k) (a gather and a
scatter), not O(buffer). The order depends only on the input order, the capacity and the generator.
It must not know about threads, knobs or bytes (the stage turns its MB knob into ``capacity``).
"""

from __future__ import annotations

import mmap
import platform
import sys
from collections.abc import Iterator

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

    def drain(self, chunk_rows: int) -> Iterator[Chunk]:
        """The end of input: everything held, in a random permutation, ``chunk_rows`` at a time.

        The permutation is drawn now; the chunks are built one at a time as the caller takes them, and
        each one's rows go back to the system before the next is built: the rows still to leave that
        sit past the new end move into the slots the chunk emptied, and the pages past the end are
        released (as in ``resize``). So the buffer and what it has let out hold at most the buffer
        plus one chunk, and the permutation (4 bytes a row), where building every chunk first held a
        second copy of the buffer (a 148 MB buffer peaked at 321 MB in its cgroup). Rows and their
        order are those of slicing the permutation: only where they sit while they wait changes.
        """
        if self.size == 0:
            self._buf, self._maps = {}, {}
            return iter(())
        # int32 where it fits: the same permutation (one shuffle of 0..size-1), half the bytes
        order = np.arange(self.size, dtype=np.int32 if self.size < 2**31 else np.int64)
        self._rng.shuffle(order)
        return self._drain(order, max(1, chunk_rows))

    def _drain(self, order: np.ndarray, step: int) -> Iterator[Chunk]:
        """``order[i]`` is the slot the i-th row to leave sits in now; a row that moves has its entry
        changed, found through ``where``: the position in ``order`` of each row in the slots that the
        next block of chunks will empty (a sixteenth of what is held), from one scan per block, so that
        no second array of the buffer's length is needed."""
        start = 0
        while start < len(order):
            held = self.size
            block = min(held, -(-max(step, held // _DRAIN_BLOCKS) // step) * step)
            base = held - block  # the slots this block empties: [base, held)
            where = np.empty(block, dtype=order.dtype)
            for lo in range(start, len(order), _SCAN):
                part = order[lo : lo + _SCAN]
                hit = np.flatnonzero(part >= base)
                where[part[hit] - base] = lo + hit
            for first in range(start, start + block, step):
                slots = order[first : first + step].copy()
                out = {n: c[slots] for n, c in self._buf.items()}
                keep = self.size - len(slots)
                holes = slots[slots < keep]
                staying = np.ones(self.size - keep, dtype=bool)
                staying[slots[slots >= keep] - keep] = False
                movers = keep + np.flatnonzero(staying)
                for c in self._buf.values():
                    c[holes] = c[movers]
                positions = where[movers - base]
                order[positions] = holes
                inside = holes >= base  # moved into a slot this block empties later
                where[holes[inside] - base] = positions[inside]
                self.size = keep
                self._release_past(keep)
                yield out
            start += block
        self._buf, self._maps = {}, {}

    def column_copy(self, name: str) -> np.ndarray:
        """A copy of the rows one column holds, in slot order (a resume's record of the buffer's ids)."""
        column = self._buf.get(name)
        return copy_rows(column[: self.size]) if column is not None and self.size else np.empty(0, np.int64)

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
        """An empty column of ``rows`` rows shaped like ``like``: in pages of its own (``own_pages``),
        which a shrink gives back (``_release_past``), or plain ``np.empty`` for object columns."""
        self._maps.pop(name, None)
        shape = (rows, *like.shape[1:])
        if like.dtype.hasobject or int(np.prod(shape, dtype=np.int64)) == 0:
            return np.empty(shape, dtype=like.dtype)
        column, pages = own_pages(shape, like.dtype)
        self._maps[name] = pages
        return column

    def _release_past(self, rows: int) -> None:
        """Give the pages of every row from ``rows`` on back to the system (they read as zeros after):
        the memory cgroup's usage falls by them at once."""
        if _DONTNEED is None:
            return
        for n, pages in self._maps.items():
            column = self._buf[n]
            start = -(-rows * (column.nbytes // max(len(column), 1)) // mmap.PAGESIZE) * mmap.PAGESIZE
            if start < len(pages):
                pages.madvise(_DONTNEED, start, len(pages) - start)


_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
# Linux's MADV_WIPEONFORK (4.14+), which Python's mmap module may not name; its value where the
# architecture takes the generic one
_WIPEONFORK = getattr(mmap, "MADV_WIPEONFORK", None) or (
    18 if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "aarch64", "arm64", "riscv64") else None
)
_OWN_PAGES_FROM = 1 << 20  # copies smaller than this come from the heap
_DRAIN_BLOCKS = 16  # the drain looks up the rows to move a sixteenth of the buffer at a time ...
_SCAN = 1 << 16  # ... scanning the permutation this many entries at a time


def own_pages(shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, mmap.mmap]:
    """An empty array in a private anonymous mapping of its own (zero pages until written).

    Private, because ``MADV_DONTNEED`` frees private anonymous pages at once, where it leaves a shared
    mapping's pages in the memory cgroup until the whole mapping goes. Wiped in a fork's child
    (``MADV_WIPEONFORK``): a process worker forked while the buffer exists (``forked``) gets the range
    empty, instead of sharing its pages copy-on-write, which would copy them page by page as the
    shuffle rewrites them and keep them alive in the child after the parent gave them back. (Not
    ``MADV_DONTFORK``: the child then lacks the range, and an inherited array freed there would unmap
    whatever the child had mapped in its place since.) The mapping goes back to the system when the
    array goes, as malloc's heap does not always do with large blocks it has handed out.
    """
    count = int(np.prod(shape, dtype=np.int64))
    pages = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=mmap.MAP_PRIVATE)
    if _WIPEONFORK is not None:
        try:
            pages.madvise(_WIPEONFORK)
        except OSError:  # a kernel before 4.14: a fork shares the pages copy-on-write, like the heap's
            pass
    return np.frombuffer(pages, dtype=dtype, count=count).reshape(shape), pages


def copy_rows(column: np.ndarray) -> np.ndarray:
    """A copy of ``column``; a large one in pages of its own (``own_pages``), so that it goes back to
    the system when dropped (resume anchors keep copies of the buffer's ids for a while, and the heap
    kept 50 MB of freed ones after a cut from 256 MB, where glibc had raised its mmap threshold)."""
    if column.nbytes < _OWN_PAGES_FROM or column.dtype.hasobject:
        return column.copy()
    out, _ = own_pages(column.shape, column.dtype)
    out[...] = column
    return out
