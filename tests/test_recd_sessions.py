"""Session data: lengths, repetition of user features within a session, writer orders, storage."""

import argparse

import numpy as np
import pytest

from intune.recd.sessions import (
    ITEM_SPARSE,
    USER_DENSE,
    USER_SPARSE,
    SessionSpec,
    add_cli_arguments,
    generate_sessions,
    read_session_chunks,
    session_lengths,
    write_session_dataset,
)


def test_session_lengths_sum_to_rows_with_the_requested_mean():
    rng = np.random.default_rng(0)
    lengths = session_lengths(200_000, SessionSpec(mean_session_len=8.0), rng)
    assert lengths.sum() == 200_000 and lengths.min() >= 1
    assert 7.5 < lengths.mean() < 8.5
    assert lengths.max() > 8 * 8  # heavy tail
    assert (session_lengths(1000, SessionSpec(mean_session_len=1.0), rng) == 1).all()
    with pytest.raises(ValueError, match="mean_session_len must be >= 1"):
        session_lengths(10, SessionSpec(mean_session_len=0.5), rng)


def test_user_features_repeat_within_a_session_and_items_vary():
    data = generate_sessions(5000, seed=1, spec=SessionSpec(mean_session_len=6.0))
    sid = data["session_id"]
    starts = np.concatenate([[0], np.flatnonzero(np.diff(sid)) + 1])
    first = np.repeat(starts, np.diff(np.append(starts, sid.size)))
    for name in (*USER_DENSE, *USER_SPARSE, "user_history.lengths"):
        assert np.array_equal(data[name], data[name][first]), name
    offsets = np.concatenate([[0], np.cumsum(data["user_history.lengths"])])
    for row in range(0, 5000, 97):
        a, b = first[row], row
        assert np.array_equal(data["user_history.values"][offsets[a]:offsets[a + 1]],
                              data["user_history.values"][offsets[b]:offsets[b + 1]])
    multi = first != np.arange(5000)
    assert (data["item_id"][multi] != data["item_id"][first[multi]]).mean() > 0.5
    assert 0.15 < data["label"].mean() < 0.35
    assert set(ITEM_SPARSE) <= set(data)


def test_label_depends_on_features():
    data = generate_sessions(50_000, seed=2, spec=SessionSpec(mean_session_len=4.0))
    early = data["label"][data["position"] == 0].mean()
    late = data["label"][data["position"] >= 20].mean()
    assert early > late + 0.05


def test_clustered_and_arrival_order_hold_the_same_rows_and_clustered_is_smaller(tmp_path):
    a = write_session_dataset(tmp_path / "c", 20_000, seed=3, mean_session_len=8, clustered=True)
    b = write_session_dataset(tmp_path / "a", 20_000, seed=3, mean_session_len=8, clustered=False)
    assert a["rows"] == b["rows"] == 20_000 and a["sessions"] == b["sessions"]
    ca = list(read_session_chunks(a["files"], chunk_rows=4096))
    cb = list(read_session_chunks(b["files"], chunk_rows=4096))
    sid_a = np.concatenate([c["session_id"] for c in ca])
    sid_b = np.concatenate([c["session_id"] for c in cb])
    assert np.array_equal(sid_a, np.sort(sid_a)) and not np.array_equal(sid_b, np.sort(sid_b))
    assert np.array_equal(np.sort(sid_a), np.sort(sid_b))
    hist_a = sum(int(c["user_history.lengths"].sum()) for c in ca)
    assert hist_a == sum(int(c["user_history.values"].size) for c in cb)
    assert b["bytes"] > 1.5 * a["bytes"]


def test_writer_errors_and_cli_options(tmp_path):
    with pytest.raises(ValueError, match="Parquet only"):
        write_session_dataset(tmp_path, 10, fmt="tsv")
    with pytest.raises(ValueError, match="no Parquet files match"):
        next(read_session_chunks(str(tmp_path / "none*.parquet")))
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    args = parser.parse_args(["--mean-session-len", "4", "--arrival-order"])
    assert args.mean_session_len == 4.0 and args.arrival_order and args.codec == "zstd"


def test_intune_data_generate_sessions_delegates_here(tmp_path, capsys):
    from intune.cli import main

    out = tmp_path / "sessions"
    rc = main(["data", "generate", "--sessions", "--rows", "3000", "--out", str(out), "--mean-session-len", "4",
               "--rows-per-file", "1000", "--seed", "7"])
    assert rc == 0
    files = sorted(out.glob("*.parquet"))
    assert len(files) == 3
    chunks = list(read_session_chunks([str(f) for f in files], chunk_rows=5000))
    assert sum(len(c["session_id"]) for c in chunks) == 3000
    assert "session rows" in capsys.readouterr().out
