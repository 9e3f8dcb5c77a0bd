"""The round trip every stage's state passes (``Stage.state_dict`` / ``load_state_dict``, composed by the
pipeline): a state taken after any batch, through checkpoint bytes, into a new pipeline, gives the
uninterrupted run's batches from there, and so does a state taken again from that resumed run."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from _exactly_once import assert_exactly_once, assert_same_order
from intune.checkpoint import dumps_checkpoint, loads_checkpoint


def _ids(batches, column: str) -> list[np.ndarray]:
    return [np.asarray(b[column]).copy() for b in batches]


def _through_bytes(state: dict) -> dict:
    """The state as a checkpoint file holds it (tuples as lists, numpy scalars as numbers)."""
    return loads_checkpoint(dumps_checkpoint(state, kind="pipeline"), kind="pipeline")


def _same(a: list[np.ndarray], b: list[np.ndarray], what: str) -> None:
    assert [len(x) for x in a] == [len(x) for x in b], f"{what}: batch sizes differ"
    for x, y in zip(a, b, strict=True):
        assert_same_order(x, y)


def assert_round_trip(
    build: Callable[[], object],
    positions: Sequence[int],
    column: str = "id",
    rows: Sequence[int] | None = None,
    again_after: int = 2,
) -> list[np.ndarray]:
    """For the pipeline ``build`` makes, at each batch ``k`` of ``positions``: run ``k`` batches, take
    ``state_dict()`` through checkpoint bytes, load it into a new pipeline, and check that

    - the new pipeline's ``state_dict()`` before it iterates is the state loaded;
    - its batches are the uninterrupted epoch's from batch ``k`` on, in order and in size;
    - a state taken from it ``again_after`` batches later, loaded into a third pipeline, gives the rest;
    - with ``rows``, the batches before ``k`` and after it hold every row once.

    Returns the uninterrupted epoch's batches (``column`` of each)."""
    reference = _run(build, column)
    for k in positions:
        pipe = build()
        it = iter(pipe)
        before = [np.asarray(next(it)[column]).copy() for _ in range(k)]
        state = _through_bytes(pipe.state_dict())
        pipe.close()
        resumed = build()
        resumed.load_state_dict(state)
        given_back = dumps_checkpoint(resumed.state_dict(), kind="pipeline")
        assert given_back == dumps_checkpoint(state, kind="pipeline"), "a loaded state is given back until the epoch starts"
        it = iter(resumed)
        middle = []
        for _ in range(min(again_after, len(reference) - k)):
            middle.append(np.asarray(next(it)[column]).copy())
        later = _through_bytes(resumed.state_dict())
        rest = _ids(it, column)
        resumed.close()
        _same(before + middle + rest, reference, f"resumed at batch {k}")
        third = build()
        third.load_state_dict(later)
        last = _ids(third, column)
        third.close()
        _same(before + middle + last, reference, f"resumed at batch {k}, then again {len(middle)} batches later")
        if rows is not None:
            assert_exactly_once(np.concatenate(before + middle + last), rows)
    return reference


def _run(build: Callable[[], object], column: str) -> list[np.ndarray]:
    pipe = build()
    out = _ids(pipe, column)
    pipe.close()
    return out
