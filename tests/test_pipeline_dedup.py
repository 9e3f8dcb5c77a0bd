"""RecD through the engine: ``shuffle(by=...)`` keeps sessions whole, ``dedup`` after ``batch``."""

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once


def session_chunks(sessions=400, per_session=8, chunk=500):
    """Rows in arrival order by session: ``user`` repeats within a session, ``item`` never repeats."""
    sid = np.repeat(np.arange(sessions), per_session)
    rows = len(sid)
    cols = {"id": np.arange(rows), "session_id": sid, "user": sid * 7 + 3, "item": np.arange(rows) * 11}
    return [{k: v[i : i + chunk] for k, v in cols.items()} for i in range(0, rows, chunk)]


def _unique_share(batches):
    return np.mean([len(np.unique(b["user.unique.user"])) / len(b["user.inverse"]) for b in batches])


def test_session_shuffle_and_dedup_deliver_every_row_once_and_keep_duplication():
    def build(by):
        return (
            intune.Pipeline.from_iterable(session_chunks())
            .shuffle(buffer_rows=1600, seed=3, by=by)
            .batch(256)
            .dedup({"user": ["user"]})
        )

    with build("session_id") as by_session, build(None) as by_row:
        sessions, rows = list(by_session), list(by_row)
    for batches in (sessions, rows):
        ids = np.concatenate([b["id"] for b in batches])
        assert_exactly_once(ids, range(3200))
        for b in batches:  # the IKJT expands back to the plain column
            assert np.array_equal(b["user.unique.user"][b["user.inverse"]], b["session_id"] * 7 + 3)
    # sessions of 8 kept together: about 1/8 of a batch is unique; a row shuffle destroys that
    assert _unique_share(sessions) < 0.2 < 0.5 < _unique_share(rows)
    # the order of sessions is shuffled, not arrival order
    first = np.concatenate([b["session_id"] for b in sessions])
    assert not np.array_equal(first, np.sort(first))


def test_dedup_before_batch_and_a_missing_column_are_refused():
    with pytest.raises(ValueError, match="after batch"):
        intune.Pipeline.from_iterable(session_chunks()).dedup({"user": ["user"]})
    pipe = intune.Pipeline.from_iterable(session_chunks()).batch(256).dedup({"user": ["nope"]})
    with pipe, pytest.raises(Exception, match="nope"):
        list(pipe)
