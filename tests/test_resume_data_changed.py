"""Data rewritten behind a checkpoint with the same byte sizes is refused, naming the file: a state
records each input file's size, modification time and (Parquet) footer digest. A file that is only
copied with its time kept resumes as before."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import intune
from _exactly_once import assert_exactly_once
from intune.checkpoint import CheckpointError

ROWS = 3000


def write(path, shift=0):
    """A Parquet file whose byte size does not depend on its values (plain, uncompressed int64)."""
    ids = np.arange(ROWS, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids + shift})
    pq.write_table(table, path, compression="NONE", use_dictionary=False, row_group_size=500)


def build(path):
    return intune.Pipeline.from_parquet(str(path), chunk_rows=128).shuffle(buffer_rows=400, seed=1).batch(100)


def checkpoint(path, k=7):
    pipe = build(path)
    it = iter(pipe)
    before = [np.asarray(next(it)["id"]).copy() for _ in range(k)]
    state = pipe.state_dict()
    pipe.close()
    return state, before


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "part-0.parquet"
    write(path)
    return path


def refused(path, state, words):
    pipe = build(path)
    with pytest.raises(CheckpointError) as info:
        pipe.load_state_dict(state)
    pipe.close()
    message = str(info.value)
    assert "the data changed since the checkpoint" in message and str(path) in message and words in message, message
    return message


def test_a_file_rewritten_with_the_same_size_is_refused_naming_it(data):
    state, _ = checkpoint(data)
    size = data.stat().st_size
    stat = data.stat()
    write(data, shift=1)  # other values, same bytes
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later write (coarse clocks tie)
    assert data.stat().st_size == size
    refused(data, state, "same size, another Parquet footer")


def test_a_rewrite_that_keeps_the_time_is_found_by_the_footer(data):
    state, _ = checkpoint(data)
    stat = data.stat()
    write(data, shift=5)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the time put back (rsync -t, cp -p of other data)
    assert data.stat().st_size == stat.st_size and data.stat().st_mtime_ns == stat.st_mtime_ns
    refused(data, state, "another Parquet footer")


def test_a_file_whose_time_alone_changed_is_refused_with_the_fix_and_resumes_after_it(data):
    state, before = checkpoint(data)
    stat = data.stat()
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5 * 10**9))  # touched, or copied without -p
    message = refused(data, state, "modified since the checkpoint")
    assert f"touch -d @{stat.st_mtime_ns // 10**9}." in message
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what the message says to do
    pipe = build(data)
    pipe.load_state_dict(state)
    rest = [np.asarray(b["id"]) for b in pipe]
    pipe.close()
    assert_exactly_once(np.concatenate(before + rest), range(ROWS))


def test_a_copy_with_its_time_kept_resumes(data, tmp_path):
    state, before = checkpoint(data)
    elsewhere = tmp_path / "moved"
    elsewhere.mkdir()
    shutil.copy2(data, elsewhere / data.name)  # content and time
    shutil.move(elsewhere / data.name, data)
    pipe = build(data)
    pipe.load_state_dict(state)
    rest = [np.asarray(b["id"]) for b in pipe]
    pipe.close()
    assert_exactly_once(np.concatenate(before + rest), range(ROWS))


def test_a_criteo_file_rewritten_with_the_same_size_is_refused(tmp_path):
    path = tmp_path / "day_0"

    def lines(offset):
        return "".join("\t".join([str(i % 2), f"{(i + offset) % 10}"] + [""] * 12 + [f"{i:08x}"] + [""] * 25) + "\n" for i in range(2000))

    path.write_text(lines(0))

    def build_tsv():
        return intune.Pipeline.from_criteo_tsv(str(path), chunk_rows=128, block_bytes=4096).shuffle(buffer_rows=300, seed=2).batch(50)

    pipe = build_tsv()
    it = iter(pipe)
    for _ in range(5):
        next(it)
    state = pipe.state_dict()
    pipe.close()
    stat = path.stat()
    path.write_text(lines(3))  # other values, same bytes
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert path.stat().st_size == stat.st_size
    other = build_tsv()
    with pytest.raises(CheckpointError, match=rf"the data changed since the checkpoint.*{path}: modified since the checkpoint"):
        other.load_state_dict(state)
    other.close()
