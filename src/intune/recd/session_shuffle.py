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


def shuffle_sessions(
    chunks: Iterable[Mapping[str, np.ndarray]],
    window_rows: int,
    seed: int = 0,
    epoch: int = 0,
    key: str = "session_id",
) -> Iterator[Chunk]:
    """Shuffle sessions within windows of about ``window_rows`` rows; yields one chunk per window.

    A window is cut at the last session boundary, so a session that continues into the next chunk is
    carried over whole (unless one session alone exceeds the window). Every row comes out once.
    """
    if window_rows <= 0:
        raise ValueError(f"window_rows must be positive, got {window_rows}")
    rng = np.random.default_rng([seed, epoch])
    pending: list[Mapping[str, np.ndarray]] = []
    held = 0
    for chunk in chunks:
        if key not in chunk:
            raise ValueError(f"session shuffle needs column {key!r}; the chunk has {sorted(chunk)}")
        pending.append(chunk)
        held += num_rows(chunk)
        if held < window_rows:
            continue
        window = concat_chunks(pending)
        starts, _ = session_runs(window[key])
        cut = int(starts[-1]) if starts.size > 1 else held  # keep the last (maybe open) session
        yield take_rows(window, session_permutation(window[key][:cut], rng))
        rest = take_rows(window, np.arange(cut, held))
        pending, held = ([rest], held - cut) if held > cut else ([], 0)
    if held:
        window = concat_chunks(pending)
        yield take_rows(window, session_permutation(window[key], rng))
