"""A shuffle that moves whole sessions, not rows, so in-batch duplication survives shuffling.

A row-level shuffle scatters a session's samples over many batches and leaves nothing to
deduplicate. Here a window of rows is cut into sessions (runs of equal session id), the sessions are
permuted and each keeps its rows together. Randomness is reproducible from ``seed`` and ``epoch``.
This module owns the permutation (``session_permutation``, the hook for the engine's shuffle stage)
and a streaming window over chunks (``shuffle_sessions``); it must not batch or deduplicate.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from intune.recd._chunks import Chunk, concat_chunks, num_rows, ranges, take_rows


def session_runs(session_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each run of equal consecutive ids: the sessions of a clustered window."""
    n = int(session_ids.shape[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], np.flatnonzero(session_ids[1:] != session_ids[:-1]) + 1]).astype(np.int64)
    lengths = np.diff(np.append(starts, n))
    return starts, lengths


def session_permutation(session_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A row order that permutes the sessions of a window and keeps each session's rows in order.

    Drop-in for ``rng.permutation(n)`` in a buffer shuffle. Sessions are runs of equal consecutive
    ids (data clustered by session); an id that reappears later counts as a new run.
    """
    starts, lengths = session_runs(np.asarray(session_ids))
    order = rng.permutation(starts.size)
    return ranges(starts[order], lengths[order])


class SessionShuffleBuffer:
    """A window of rows released as whole sessions in random order.

    It has the interface of the engine's tf.data-style ``ShuffleBuffer`` (``add``, ``resize``,
    ``drain``, ``size``, ``capacity``, ``nbytes``), so a shuffle stage can swap it in when asked to
    keep sessions together. A window is cut at its last session boundary: the last (maybe still open)
    session waits for the next window, unless it alone fills the buffer. Jagged ``.values`` columns
    follow their rows.
    """

    def __init__(self, rng: np.random.Generator, capacity: int, key: str = "session_id") -> None:
        if capacity < 1:
            raise ValueError(f"session shuffle capacity must be >= 1 row, got {capacity}")
        self._rng, self.capacity, self.key = rng, capacity, key
        self._pending: list[Mapping[str, np.ndarray]] = []
        self.size = 0

    @property
    def nbytes(self) -> int:
        return sum(int(c.nbytes) for chunk in self._pending for c in chunk.values())

    def add(self, chunk: Mapping[str, np.ndarray]) -> list[Chunk]:
        """Take a chunk in; return the window it completes, if any."""
        if self.key not in chunk:
            raise ValueError(f"session shuffle needs column {self.key!r}; the chunk has {sorted(chunk)}")
        rows = num_rows(chunk)
        if rows:
            self._pending.append(chunk)
            self.size += rows
        return self._release(keep_last=True) if self.size >= self.capacity else []

    def resize(self, capacity: int, max_out: int | None = None) -> list[Chunk]:
        """Change the capacity; a buffer now over it releases a window, in chunks of at most ``max_out``
        rows if given (a process worker downstream copies each chunk it takes several times)."""
        self.capacity = max(1, capacity)
        out = self._release(keep_last=True) if self.size > self.capacity else []
        return _pieces(out[0], max_out) if out and max_out is not None else out

    def drain(self, chunk_rows: int) -> list[Chunk]:
        """The end of input: everything held, sessions shuffled, ``chunk_rows`` rows at a time."""
        out = self._release(keep_last=False)
        return _pieces(out[0], chunk_rows) if out else []

    def _release(self, keep_last: bool) -> list[Chunk]:
        if not self.size:
            return []
        window = concat_chunks(self._pending) if len(self._pending) > 1 else dict(self._pending[0])
        starts, _ = session_runs(window[self.key])
        cut = int(starts[-1]) if keep_last and starts.size > 1 else self.size
        out = take_rows(window, session_permutation(window[self.key][:cut], self._rng))
        rest = self.size - cut
        self._pending = [take_rows(window, np.arange(cut, self.size))] if rest else []
        self.size = rest
        return [out]


def shuffle_sessions(
    chunks: Iterable[Mapping[str, np.ndarray]],
    window_rows: int,
    seed: int = 0,
    epoch: int = 0,
    key: str = "session_id",
) -> Iterator[Chunk]:
    """Shuffle sessions within windows of about ``window_rows`` rows; yields one chunk per window.

    Every row comes out once; a session is split only if it alone exceeds the window.
    """
    if window_rows <= 0:
        raise ValueError(f"window_rows must be positive, got {window_rows}")
    buffer = SessionShuffleBuffer(np.random.default_rng([seed, epoch]), window_rows, key)
    for chunk in chunks:
        yield from buffer.add(chunk)
    yield from buffer.drain(max(1, buffer.size))


def _pieces(window: Chunk, rows: int) -> list[Chunk]:
    """``window`` cut, in order, into chunks of at most ``rows`` rows."""
    n, step = num_rows(window), max(1, rows)
    return [take_rows(window, np.arange(lo, min(n, lo + step))) for lo in range(0, n, step)]
