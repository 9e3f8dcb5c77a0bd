"""Session shuffle: sessions move whole, every row comes out once, reproducible from the seed."""

import numpy as np
import pytest

from intune.recd import session_permutation, shuffle_sessions


def _chunks(session_lengths, chunk_rows):
    sid = np.repeat(np.arange(len(session_lengths)), session_lengths)
    rows = np.arange(sid.size)
    hist_len = (sid % 3).astype(np.int64)
    values = np.repeat(sid, hist_len)
    offsets = np.concatenate([[0], np.cumsum(hist_len)])
    for lo in range(0, sid.size, chunk_rows):
        hi = min(lo + chunk_rows, sid.size)
        yield {"session_id": sid[lo:hi], "row": rows[lo:hi], "h.values": values[offsets[lo]:offsets[hi]],
               "h.lengths": hist_len[lo:hi]}


def test_session_permutation_keeps_runs_together_in_order():
    sid = np.array([4, 4, 4, 1, 1, 9, 7, 7])
    perm = session_permutation(sid, np.random.default_rng(0))
    assert sorted(perm.tolist()) == list(range(8))
    runs = {4: [0, 1, 2], 1: [3, 4], 9: [5], 7: [6, 7]}
    out = perm.tolist()
    for rows in runs.values():
        i = out.index(rows[0])
        assert out[i:i + len(rows)] == rows


def test_stream_delivers_every_row_once_with_sessions_contiguous():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 12, 300)
    out = list(shuffle_sessions(_chunks(lengths, 97), window_rows=256, seed=5))
    rows = np.concatenate([c["row"] for c in out])
    assert sorted(rows.tolist()) == list(range(int(lengths.sum())))
    sid = np.concatenate([c["session_id"] for c in out])
    starts = np.flatnonzero(np.diff(sid)) + 1
    assert len(starts) + 1 == len(lengths)  # each session is one run: none was split
    assert not np.array_equal(sid, np.sort(sid))  # and the order did change
    for c in out:  # jagged columns followed their rows
        assert np.array_equal(c["h.values"], np.repeat(c["session_id"], c["session_id"] % 3))


def test_reproducible_from_seed_and_epoch():
    lengths = np.full(50, 3)
    a = np.concatenate([c["row"] for c in shuffle_sessions(_chunks(lengths, 40), 64, seed=2, epoch=0)])
    b = np.concatenate([c["row"] for c in shuffle_sessions(_chunks(lengths, 40), 64, seed=2, epoch=0)])
    c = np.concatenate([c["row"] for c in shuffle_sessions(_chunks(lengths, 40), 64, seed=2, epoch=1)])
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_errors():
    with pytest.raises(ValueError, match="window_rows must be positive"):
        list(shuffle_sessions(_chunks([1], 1), 0))
    with pytest.raises(ValueError, match="needs column 'session_id'"):
        list(shuffle_sessions([{"x": np.arange(3)}], 2))


def test_buffer_interface_resize_and_drain_keep_rows_exactly_once():
    from intune.recd.session_shuffle import SessionShuffleBuffer

    lengths = np.random.default_rng(4).integers(1, 6, 120)
    buf = SessionShuffleBuffer(np.random.default_rng(0), capacity=64)
    out = []
    for i, chunk in enumerate(_chunks(lengths, 25)):
        out += buf.add(chunk)
        if i == 3:
            out += buf.resize(16)  # shrinking below what is held lets a window out at once
            assert buf.size <= 16 + 5
    assert buf.nbytes > 0 or buf.size == 0
    out += buf.drain(chunk_rows=10)
    assert buf.size == 0 and buf.drain(10) == []
    rows = np.concatenate([c["row"] for c in out])
    assert sorted(rows.tolist()) == list(range(int(lengths.sum())))
    sid = np.concatenate([c["session_id"] for c in out])
    assert len(np.flatnonzero(np.diff(sid))) + 1 == len(lengths)  # no session was split
