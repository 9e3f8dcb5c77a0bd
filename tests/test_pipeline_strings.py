"""Parquet string / binary columns as fixed-width numpy arrays that cross to process workers unpickled."""

import numpy as np
import pytest

import intune
from intune.pipeline.columns import to_numpy

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _hex_ids(n):
    return [None if i % 5 == 0 else f"{(i * 2654435761) % (1 << 32):08x}" for i in range(n)]


@pytest.fixture
def hex_file(tmp_path):
    n = 600
    table = pa.table(
        {"row": np.arange(n), "C1": pa.array(_hex_ids(n)), "tag": pa.array(["a", "bcd", ""] * 200)}
    )
    path = tmp_path / "hex.parquet"
    pq.write_table(table, path, row_group_size=250)
    return path, n


def test_string_columns_become_fixed_width_bytes_with_nulls_empty():
    col = pa.chunked_array([pa.array(["ab", None, "", "xyz", "héllo"])])
    got = to_numpy(col)
    assert got.dtype == np.dtype("S6")
    assert got.tolist() == [b"ab", b"", b"", b"xyz", "héllo".encode()]
    text = to_numpy(col, "str")
    assert text.dtype == np.dtype("U5") and text.tolist() == ["ab", "", "", "xyz", "héllo"]
    assert to_numpy(col, "object").tolist() == ["ab", None, "", "xyz", "héllo"]
    # a sliced array, a large_string array, a null slot that owns bytes, a dictionary column
    assert to_numpy(pa.array(["aa", "bbb", "c"]).slice(1)).tolist() == [b"bbb", b"c"]
    assert to_numpy(pa.array(["ab", "c"], type=pa.large_string()), "str").tolist() == ["ab", "c"]
    validity = pa.array([True, False, True]).buffers()[1]
    offsets = pa.py_buffer(np.array([0, 2, 4, 6], dtype=np.int32))
    owning = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, pa.py_buffer(b"aabbcc")])
    assert to_numpy(owning).tolist() == [b"aa", b"", b"cc"]
    assert to_numpy(pa.array(["a", "b", "a"]).dictionary_encode()).tolist() == [b"a", b"b", b"a"]


def test_values_a_fixed_width_cannot_hold_stay_object_arrays():
    nul = to_numpy(pa.array([b"a\x00", b"b"], type=pa.binary()))  # numpy would strip the NUL
    assert nul.dtype == object and nul.tolist() == [b"a\x00", b"b"]
    uneven = to_numpy(pa.array(["x" * 100_000] + ["y"] * 5_000))  # padded: 500 MB for 105 kB
    assert uneven.dtype == object and uneven[0] == "x" * 100_000
    assert to_numpy(pa.array([1.0, None])).tolist()[0] == 1.0  # numbers as before


def test_parquet_strings_reach_process_workers_through_shared_memory(hex_file):
    path, n = hex_file
    seen = []

    def describe(chunk):
        return {
            "row": chunk["row"],
            "C1": chunk["C1"],
            "kinds": np.array([chunk["C1"].dtype.kind])[[0] * len(chunk["row"])],
        }

    pipe = intune.Pipeline.from_parquet(str(path), chunk_rows=100).map(describe, name="udf", mode="process")
    with pipe:
        for chunk in pipe:
            seen.append(chunk)
        pickled = pipe.stage("udf").pickled_columns()
    assert pickled == 0  # before: the object-dtype C1 and tag columns were pickled both ways
    assert {k for c in seen for k in c["kinds"].tolist()} == {"S"}
    rows = np.concatenate([c["row"] for c in seen])
    ids = np.concatenate([c["C1"] for c in seen])
    assert rows.tolist() == list(range(n))
    assert ids.tolist() == [(v or "").encode() for v in _hex_ids(n)]


def test_object_columns_from_a_udf_still_cross_pickled_and_counted(hex_file):
    path, n = hex_file

    def to_objects(chunk):
        return {
            "row": chunk["row"],
            "words": np.array([v.decode() or None for v in chunk["tag"]], dtype=object),
        }

    pipe = (
        intune.Pipeline.from_parquet(str(path), chunk_rows=100)
        .map(to_objects, name="objects", mode="process")
        .map(
            lambda c: {**c, "n": np.array([len(w or "") for w in c["words"]])}, name="lengths", mode="process"
        )
    )
    with pipe:
        chunks = list(pipe)
        out_pickled = pipe.stage("objects").pickled_columns()
        both_pickled = pipe.stage("lengths").pickled_columns()
    assert out_pickled == 7  # one object column out of each of the 7 chunks (row groups 250, 250, 100)
    assert both_pickled == 14  # in, and back out (a pass-through column returns as the same pickle)
    words = [w for c in chunks for w in c["words"].tolist()]
    assert words == ["a", "bcd", None] * 200
    assert np.concatenate([c["n"] for c in chunks]).tolist() == [1, 3, 0] * 200


def test_dlrm_udfs_accept_the_bytes_columns(hex_file):
    dlrm_ops = pytest.importorskip("intune.dlrm.ops")
    path, n = hex_file
    (chunk,) = list(intune.Pipeline.from_parquet(str(path), columns=["C1"], chunk_rows=1000))[:1]
    ids, missing = dlrm_ops.hex_to_int(chunk["C1"], "C1")
    expected = [int(v, 16) if v else 0 for v in _hex_ids(250)]
    assert ids.tolist() == expected and missing.tolist() == [v is None for v in _hex_ids(250)]


def test_strings_option_is_validated(hex_file):
    path, _ = hex_file
    with pytest.raises(ValueError, match=r"strings must be one of \['bytes', 'str', 'object'\]"):
        intune.Pipeline.from_parquet(str(path), strings="utf8")
    with intune.Pipeline.from_parquet(str(path), strings="str") as pipe:
        assert next(iter(pipe))["tag"].dtype.kind == "U"
