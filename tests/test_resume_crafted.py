"""Crafted checkpoints (a sha256 is no key: anyone can write a state and its digest): every field of a
pipeline's state is bounded against the pipeline before anything is allocated, and each bad one raises
``CheckpointError`` naming the field; a damaged file's header and array descriptors too."""

from __future__ import annotations

import copy
import json
import struct
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import intune
from intune import checkpoint
from intune.checkpoint import (
    CheckpointError,
    dumps_checkpoint,
    load_checkpoint,
    loads_checkpoint,
    save_checkpoint,
)
from intune.pipeline import resume

ROWS = 6000


@pytest.fixture(scope="module")
def parquet_glob(tmp_path_factory):
    d = tmp_path_factory.mktemp("crafted")
    for f in range(3):
        ids = np.arange(f * ROWS // 3, (f + 1) * ROWS // 3, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), d / f"part-{f}.parquet", row_group_size=700)
    return str(d / "*.parquet")


def build(parquet_glob):
    return intune.Pipeline.from_parquet(parquet_glob, chunk_rows=256).shuffle(buffer_rows=900, seed=3).batch(100)


def state_at(pipe, k=12):
    it = iter(pipe)
    for _ in range(k):
        next(it)
    state = loads_checkpoint(dumps_checkpoint(pipe.state_dict(), kind="pipeline"))
    pipe.close()
    return state


@pytest.fixture(scope="module")
def good_state(parquet_glob):
    return state_at(build(parquet_glob))


def refused(pipe, state, field):
    """``load_state_dict(state)`` raises ``CheckpointError`` naming ``field``, and the pipeline still
    runs its epoch afresh afterwards (nothing half-loaded)."""
    with pytest.raises(CheckpointError) as info:
        pipe.load_state_dict(state)
    assert field in str(info.value), str(info.value)
    rows = sum(len(b["id"]) for b in pipe)
    pipe.close()
    assert rows == ROWS
    return str(info.value)


def test_a_state_claiming_a_huge_chunk_is_refused_before_anything_is_allocated(parquet_glob, good_state, tmp_path):
    """10**10 rows in one chunk: the replay would allocate 75 GiB of row ids."""
    state = copy.deepcopy(good_state)
    state["shuffle"]["rows"] = state["shuffle"]["rows"].astype(np.int64)
    state["shuffle"]["rows"][2] = 10**10
    save_checkpoint(tmp_path / "ck", state, kind="pipeline")  # a file with a valid digest
    pipe = build(parquet_glob)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"shuffle\.rows: holds 10000000000, out of bounds \[0, 256\]"):
            pipe.load_state_dict(load_checkpoint(tmp_path / "ck", kind="pipeline"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pipe.close()
    assert peak < 32 << 20, f"{peak} bytes allocated while refusing the state"


def test_a_state_naming_a_missing_read_unit_is_refused(parquet_glob, good_state):
    state = copy.deepcopy(good_state)
    state["shuffle"]["units"][-1] = 99  # the source has 9 row groups
    message = refused(build(parquet_glob), state, "shuffle.units")
    assert "[0, 8]" in message


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda s: s.update(epoch=-1), "epoch"),
        (lambda s: s.update(epoch="3"), "epoch"),
        (lambda s: s.update(rows=-100), "rows"),
        (lambda s: s.update(batches=s["rows"] + 1), "batches"),
        (lambda s: s.update(batches=[1]), "batches"),
        (lambda s: s["knobs"].update({"shuffle.buffer_mb": "lots"}), "knobs['shuffle.buffer_mb']"),
        (lambda s: s.update(knobs=[1, 2]), "knobs"),
        (lambda s: s.update(version=1), "state version 1"),
        (lambda s: s.update(shuffle=[1, 2, 3]), "input log"),
        (lambda s: s["shuffle"].pop("events"), "lacks ['events']"),
        (lambda s: s["shuffle"]["items"].__setitem__(0, -1), "shuffle.items"),
        (lambda s: s["shuffle"].update(rows=s["shuffle"]["rows"][:-1]), "differ in length"),
        (lambda s: s["shuffle"].update(rows=s["shuffle"]["rows"].astype(np.float64)), "shuffle.rows"),
        (lambda s: s["shuffle"].update(rows=s["shuffle"]["rows"].reshape(1, -1)), "shuffle.rows: shape"),
        (lambda s: s["shuffle"]["events"].__setitem__((0, 1), 7), "unknown step kind 7"),
        (lambda s: s["shuffle"]["events"].__setitem__((0, 2), 10**9), "the stage's buffer_rows"),
        (lambda s: s["shuffle"]["events"].__setitem__((0, 0), -1), "shuffle.events"),
        (lambda s: s["shuffle"].update(row_bytes=-8), "shuffle.row_bytes"),
        (lambda s: s["shuffle"].update(first_id=-1), "shuffle.first_id"),
        (lambda s: s["shuffle"].update(first_chunk=2**70), "shuffle.first_chunk"),
        (lambda s: s["shuffle"].update(max_rows_before=10**12), "shuffle.max_rows_before"),
    ],
)
def test_each_field_is_bounded_and_named(parquet_glob, good_state, edit, field):
    state = copy.deepcopy(good_state)
    edit(state)
    refused(build(parquet_glob), state, field)


@pytest.fixture
def anchored_state(parquet_glob, monkeypatch):
    monkeypatch.setattr(resume, "ANCHOR_MIN_CHUNKS", 0)
    state = state_at(build(parquet_glob), k=30)
    assert "anchor" in state["shuffle"]
    return state


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda a: a.update(capacity=10**10), "shuffle.anchor.capacity"),
        (lambda a: a.update(k=10**6), "shuffle.anchor.k"),
        (lambda a: a.update(ids=np.zeros(901, np.uint32)), "shuffle.anchor.ids"),
        (lambda a: a.update(ids=np.array([-5], np.int64)), "shuffle.anchor.ids"),
        (lambda a: a["rng"].update(inc="2"), "shuffle.anchor.rng.inc"),
        (lambda a: a["rng"].update(state="9" * 60), "shuffle.anchor.rng.state"),
        (lambda a: a.update(rng=[1, 2, 3, 4]), "shuffle.anchor.rng"),
        (lambda a: a.pop("base"), "lacks ['base']"),
    ],
)
def test_an_anchor_is_bounded_and_named(parquet_glob, anchored_state, edit, field):
    state = copy.deepcopy(anchored_state)
    edit(state["shuffle"]["anchor"])
    refused(build(parquet_glob), state, field)


def session_build():
    rng = np.random.default_rng(0)
    session = np.repeat(np.arange(3000), rng.integers(1, 9, 3000))[:3000]
    chunks = [{"id": np.arange(i, i + 100), "session_id": session[i : i + 100]} for i in range(0, 3000, 100)]
    return intune.Pipeline.from_iterable(chunks).shuffle(buffer_rows=500, seed=2, by="session_id").batch(100)


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda s: s["releases"].__setitem__((0, 3), 10**12), "shuffle.releases[0]"),
        (lambda s: s["releases"].__setitem__((0, 4), 9), "shuffle.releases[0]"),
        (lambda s: s["releases"].__setitem__((0, 6), 10**9), "shuffle.releases[0]"),
        (lambda s: s.update(rng_states=s["rng_states"][:-1]), "shuffle.rng_states"),
        (lambda s: s["rng_states"][0].update(bit_generator="MT19937"), "shuffle.rng_states[0].bit_generator"),
        (lambda s: s["items"].__setitem__(0, 3), "shuffle.items"),  # a stream's chunk is item 0
        (lambda s: s.pop("releases"), "releases"),
    ],
)
def test_a_session_log_is_bounded_and_named(edit, field):
    state = state_at(session_build(), k=9)
    edit(state["shuffle"])
    pipe = session_build()
    with pytest.raises(CheckpointError) as info:
        pipe.load_state_dict(state)
    assert field in str(info.value), str(info.value)
    assert sum(len(b["id"]) for b in pipe) == 3000
    pipe.close()


def test_a_fingerprint_nested_deep_is_refused_without_recursion_error(parquet_glob, good_state):
    state = copy.deepcopy(good_state)
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["x"] = {}
        node = node["x"]
    state["fingerprint"]["stages"][0]["source"]["deep"] = deep
    refused(build(parquet_glob), state, "stages[0].source.deep: {'x': {'x': {'x': {...}}}} in the checkpoint, missing here")


# ---- the file itself --------------------------------------------------------------------------------


def _file(header: bytes, payload: bytes = b"") -> bytes:
    return checkpoint.MAGIC + struct.pack("<Q", len(header)) + header + payload


def _rewritten(data: bytes, change) -> bytes:
    """``data`` with its header's body changed by ``change`` and the digest recomputed (as a forger would)."""
    (length,) = struct.unpack_from("<Q", data, 8)
    header = json.loads(data[16 : 16 + length])
    payload = data[16 + length :]
    change(header["body"])
    header["sha256"] = checkpoint._digest(header["kind"], checkpoint._canonical(header["body"]), payload)
    return _file(json.dumps(header).encode(), payload)


def test_a_header_nested_700_levels_deep_is_refused():
    tree = '{"dict":{"a":' * 700 + "1" + "}}" * 700
    header = (
        '{"format":1,"kind":"pipeline","intune_version":"0.1.0","payload_bytes":0,"sha256":"' + "0" * 64
        + '","body":{"arrays":[],"tree":' + tree + "}}"
    ).encode()
    with pytest.raises(CheckpointError, match=r"ck\.intune: the header nests 1402 levels deep, more than the 200"):
        loads_checkpoint(_file(header), name="ck.intune")


def test_brackets_inside_strings_do_not_count_as_nesting():
    state = {"name": "[[[[{{{{" * 100, "x": np.arange(3)}
    assert loads_checkpoint(dumps_checkpoint(state, kind="x"))["name"] == state["name"]


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("offset", -8, "array 0's offset -8 is not a non-negative multiple of 8"),
        ("offset", 4, "array 0's offset 4"),
        ("shape", [-1, -4], "array 0's shape [-1, -4]"),
        ("shape", [3, 3], "array 0's shape [3, 3] of int64 is not 32 bytes"),
        ("shape", "4", "array 0's shape"),
        ("nbytes", -32, "array 0's nbytes -32"),
        ("nbytes", 10**12, "array 0's nbytes"),
        ("dtype", "O", "array 0's dtype 'O'"),
        ("dtype", "<U4", "array 0's dtype '<U4'"),
        ("dtype", 7, "array 0's dtype 7"),
    ],
)
def test_array_descriptors_are_bounded_and_named(field, value, words):
    data = dumps_checkpoint({"a": np.arange(4, dtype=np.int64)}, kind="pipeline")

    def change(body):
        body["arrays"][0][field] = value

    with pytest.raises(CheckpointError) as info:
        loads_checkpoint(_rewritten(data, change), name="ck")
    assert words in str(info.value), str(info.value)
