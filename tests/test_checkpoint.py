"""checkpoint.py: exact round trips without pickle, loud refusals of damaged or foreign files, atomic saves."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

from intune import checkpoint
from intune.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def _state():
    return {
        "epoch": 3,
        "seed": -7,
        "ratio": 0.25,
        "big": 2**70,
        "flags": [True, False, None],
        "name": "pipeline ☃",
        "nan": float("nan"),
        "inf": float("-inf"),
        "nested": {
            "ids": np.arange(10, dtype=np.int64) * (2**40),
            "weights": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
            "bytes": np.array([0, 1, 255], dtype=np.uint8),
            "mask": np.array([[True, False], [False, True]]),
            "scalar": np.array(5.5, dtype=np.float64),
            "empty": np.zeros((0, 4), dtype=np.int32),
            "list": [np.array([1, 2], dtype=np.int16), {"deep": [1, 2.0, "x"]}],
            "dict": {"list": "keys that look like the tree's tags"},
        },
    }


def _assert_same(a, b, where="state"):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b), where
        assert b.flags.writeable, where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, where
    else:
        assert type(a) is type(b) and a == b, where


@pytest.fixture
def no_pickle(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")

    for name in ("loads", "dumps", "load", "dump"):
        monkeypatch.setattr(pickle, name, refuse)


def test_round_trip_is_exact_and_uses_no_pickle(tmp_path, no_pickle):
    state = _state()
    path = save_checkpoint(tmp_path / "ck.intune", state, kind="pipeline")
    loaded = load_checkpoint(path, kind="pipeline")
    _assert_same(state, loaded)
    assert load_checkpoint(path)["epoch"] == 3  # kind is optional on load
    assert checkpoint.checkpoint_kind(path) == "pipeline"


def test_arrays_are_raw_bytes_not_json(tmp_path):
    big = np.arange(100_000, dtype=np.int64)
    path = save_checkpoint(tmp_path / "ck", {"a": big}, kind="pipeline")
    size = path.stat().st_size
    assert big.nbytes <= size < big.nbytes + 1024
    header_len = struct.unpack_from("<Q", path.read_bytes(), 8)[0]
    assert header_len < 1024


def test_tuples_and_numpy_scalars_come_back_as_lists_and_numbers(tmp_path):
    path = save_checkpoint(tmp_path / "ck", {"t": (1, 2), "s": np.int64(4), "f": np.float32(0.5)}, kind="x")
    loaded = load_checkpoint(path)
    assert loaded == {"t": [1, 2], "s": 4, "f": 0.5}


@pytest.mark.parametrize(
    "state, fragment",
    [
        ({1: "a"}, "keys must be str"),
        ({"a": {"b": object()}}, "state['a']['b']"),
        ({"a": np.array(["x"])}, "dtype <U1"),
        ({"a": np.array([object()], dtype=object)}, "dtype object"),
        ({"a": {3.0}}, "set"),
    ],
)
def test_unsupported_values_are_refused_naming_where(tmp_path, state, fragment):
    with pytest.raises(TypeError, match=None) as info:
        save_checkpoint(tmp_path / "ck", state, kind="x")
    assert fragment in str(info.value)
    assert not (tmp_path / "ck").exists()


def _saved(tmp_path):
    return save_checkpoint(tmp_path / "ck.intune", _state(), kind="pipeline")


def test_truncated_file_is_refused(tmp_path):
    path = _saved(tmp_path)
    data = path.read_bytes()
    header_len = struct.unpack_from("<Q", data, 8)[0]
    for cut in (0, 5, 12, 16 + header_len // 2, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=": truncated") as info:
            load_checkpoint(path)
        assert str(path) in str(info.value)


def test_flipped_bits_are_refused(tmp_path):
    path = _saved(tmp_path)
    data = path.read_bytes()
    header_len = struct.unpack_from("<Q", data, 8)[0]
    # a bit in the payload (an array's value), and a digit in the header's tree (a scalar's value)
    damaged = bytearray(data)
    damaged[-3] ^= 0x01
    path.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="checksum") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    header = data[16 : 16 + header_len].replace(b'"epoch":3', b'"epoch":4')
    assert header != data[16 : 16 + header_len]
    path.write_bytes(data[:16] + header + data[16 + header_len :])
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(path)
    path.write_bytes(data[:16] + b"[" + data[17:])
    with pytest.raises(CheckpointError, match="corrupted header"):
        load_checkpoint(path)


def test_wrong_magic_is_refused(tmp_path):
    path = tmp_path / "not-a-checkpoint.pt"
    path.write_bytes(pickle.dumps({"epoch": 1}) + b"\0" * 32)
    with pytest.raises(CheckpointError, match="not an intune checkpoint") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_newer_format_version_is_refused(tmp_path):
    path = _saved(tmp_path)
    data = path.read_bytes()
    header_len = struct.unpack_from("<Q", data, 8)[0]
    header = json.loads(data[16 : 16 + header_len])
    header["format"] = checkpoint.FORMAT_VERSION + 1
    raw = json.dumps(header).encode()
    path.write_bytes(data[:8] + struct.pack("<Q", len(raw)) + raw + data[16 + header_len :])
    with pytest.raises(CheckpointError, match="format version") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_other_kind_is_refused(tmp_path):
    path = _saved(tmp_path)
    with pytest.raises(CheckpointError, match="'pipeline'.*expected 'tuner'") as info:
        load_checkpoint(path, kind="tuner")
    assert str(path) in str(info.value)


def test_kind_is_covered_by_the_checksum(tmp_path):
    path = _saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"kind":"pipeline"', b'"kind":"tuner___"', 1))
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(path, kind="tuner___")


def test_crash_before_the_rename_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "ck", {"step": 1}, kind="x")

    def crash(src, dst):
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"step": 2, "a": np.ones(1000)}, kind="x")
    monkeypatch.undo()
    assert load_checkpoint(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # the temporary file was removed


def test_a_temporary_file_left_by_a_killed_writer_is_never_read(tmp_path):
    path = save_checkpoint(tmp_path / "ck", {"step": 1}, kind="x")
    # what a SIGKILL between write and rename leaves: a half-written temporary file beside the checkpoint
    half = checkpoint.dumps_checkpoint({"step": 2}, kind="x")
    (tmp_path / ".ck.abc123.tmp").write_bytes(half[: len(half) // 2])
    assert load_checkpoint(path) == {"step": 1}
    save_checkpoint(path, {"step": 3}, kind="x")
    assert load_checkpoint(path) == {"step": 3}


def test_save_replaces_atomically_and_fsyncs(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = save_checkpoint(tmp_path / "ck", {"step": 1}, kind="x")
    assert len(synced) == 2  # the file, then its directory
    assert load_checkpoint(path) == {"step": 1}


_STALLED_WRITER = """
import os, sys, time
import numpy as np
from intune.checkpoint import save_checkpoint

def stall(fd):  # a slow disk: the bytes are written, the fsync never returns
    print("WRITING", flush=True)
    time.sleep(600)

os.fsync = stall
save_checkpoint(sys.argv[1], {"step": 2, "a": np.ones(1 << 20)}, kind="x")
"""


def _temporaries(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_the_next_save_removes_what_a_killed_save_left_but_not_a_live_writers_file(tmp_path):
    path = save_checkpoint(tmp_path / "ck", {"step": 1}, kind="x")
    other = save_checkpoint(tmp_path / "ck.1", {"step": 1}, kind="x")  # another checkpoint's name
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    writer = subprocess.Popen(
        [sys.executable, "-c", _STALLED_WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert writer.stdout.readline().strip() == "WRITING"  # stalled mid-save, holding its temporary file
        [left] = _temporaries(tmp_path)
        assert left.startswith(".ck.") and (tmp_path / left).stat().st_size > 8 << 20
        save_checkpoint(path, {"step": 3}, kind="x")  # a save beside a live writer leaves its file alone
        assert _temporaries(tmp_path) == [left]
        writer.kill()  # SIGKILL mid-write: nothing cleans up after it
        writer.wait(timeout=30)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert _temporaries(tmp_path) == [left]
    save_checkpoint(other, {"step": 4}, kind="x")  # another checkpoint's save is not this one's
    assert _temporaries(tmp_path) == [left]
    save_checkpoint(path, {"step": 5}, kind="x")
    assert _temporaries(tmp_path) == []
    assert load_checkpoint(path) == {"step": 5} and load_checkpoint(other) == {"step": 4}


def test_a_temporary_file_without_a_writer_is_removed_but_not_a_symlink_or_another_name(tmp_path):
    path = save_checkpoint(tmp_path / "ck", {"step": 1}, kind="x")
    half = checkpoint.dumps_checkpoint({"step": 2}, kind="x")
    (tmp_path / ".ck.k2j4h5g6.tmp").write_bytes(half[: len(half) // 2])  # as an older intune left it
    (tmp_path / "target").write_bytes(b"keep")
    (tmp_path / ".ck.symlinked.tmp").symlink_to(tmp_path / "target")
    (tmp_path / ".ck.notmine.tmp.bak").write_bytes(b"keep")
    save_checkpoint(path, {"step": 3}, kind="x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ck.notmine.tmp.bak", ".ck.symlinked.tmp", "ck", "target"]
    assert (tmp_path / "target").read_bytes() == b"keep"
