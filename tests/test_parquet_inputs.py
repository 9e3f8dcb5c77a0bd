"""Parquet inputs as real writers make them (issue 46 items 5, 6 and 7): files of no rows among
others, column names with a dot, text that is not UTF-8."""

from __future__ import annotations

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once
from intune.pipeline import SchemaError, SourceError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def read_all(pattern, **options) -> dict:
    pipe = intune.Pipeline.from_parquet(pattern, **options)
    with pipe:
        chunks = list(pipe)
    return {n: np.concatenate([c[n] for c in chunks]) for n in chunks[0]} if chunks else {}


def table(lo: int, hi: int):
    return pa.table({"id": np.arange(lo, hi, dtype=np.int64), "x": np.arange(lo, hi, dtype=np.int32)})


def empty_no_row_groups(path, schema) -> None:
    """A file of no rows and no row group: what Spark writes for an empty partition."""
    pq.ParquetWriter(path, schema).close()


@pytest.mark.parametrize("widen", [False, True])
@pytest.mark.parametrize("kind", ["no-row-group", "empty-row-group"])
def test_files_of_no_rows_do_not_change_the_schema(tmp_path, kind, widen):
    """An empty file first, between and last: ints stay ints (they were float64 for every file, or
    an error blaming the full file's int64 against the empty one's float64)."""
    for name, (lo, hi) in {"a": (0, 0), "b": (0, 50), "c": (0, 0), "d": (50, 100), "e": (0, 0)}.items():
        path = tmp_path / f"part-{name}.parquet"
        if hi == 0 and kind == "no-row-group":
            empty_no_row_groups(path, table(0, 1).schema)
        else:
            pq.write_table(table(lo, hi), path)
    got = read_all(str(tmp_path / "*.parquet"), widen=widen)
    assert got["id"].dtype == np.int64 and got["x"].dtype == np.int32
    assert_exactly_once(got["id"], range(100))
    assert np.array_equal(got["x"], got["id"])


def test_an_empty_file_of_other_int_types_neither_widens_nor_fails(tmp_path):
    empty_no_row_groups(tmp_path / "part-0.parquet", pa.schema([("id", pa.int32()), ("x", pa.int64())]))
    pq.write_table(table(0, 10), tmp_path / "part-1.parquet")
    got = read_all(str(tmp_path / "*.parquet"))
    assert got["id"].dtype == np.int64 and got["x"].dtype == np.int32


def test_a_type_clash_between_full_files_names_them_not_the_empty_one(tmp_path):
    empty_no_row_groups(tmp_path / "part-0.parquet", table(0, 1).schema)
    pq.write_table(table(0, 10), tmp_path / "part-1.parquet")
    pq.write_table(pa.table({"id": np.arange(10.0), "x": np.arange(10, dtype=np.int32)}), tmp_path / "part-2.parquet")
    with pytest.raises(SchemaError) as err:
        read_all(str(tmp_path / "*.parquet"))
    message = str(err.value)
    assert "part-2.parquet' column 'id' is float64, but" in message and "part-1.parquet' has int64" in message
    assert "part-0" not in message


def test_an_empty_file_must_still_have_the_columns(tmp_path):
    empty_no_row_groups(tmp_path / "part-0.parquet", pa.schema([("id", pa.int64())]))
    pq.write_table(table(0, 10), tmp_path / "part-1.parquet")
    with pytest.raises(SchemaError, match=r"part-0.parquet' has other columns than .*part-1.parquet'"):
        read_all(str(tmp_path / "*.parquet"))


def test_only_empty_files_read_as_no_rows_with_their_types(tmp_path):
    empty_no_row_groups(tmp_path / "part-0.parquet", table(0, 1).schema)
    pq.write_table(table(0, 0), tmp_path / "part-1.parquet")
    pipe = intune.Pipeline.from_parquet(str(tmp_path / "*.parquet"))
    with pipe:
        assert list(pipe) == []
    assert pipe.stage("read").source.schema.describe() == "id: int64, x: int32"


def test_a_dotted_column_name_has_its_own_null_count(tmp_path):
    """``user.age`` (no null) beside ``user`` (a null): each keeps its own type. The null counts were
    keyed by ``user``, so ``user.age`` read as float64."""
    path = tmp_path / "dots.parquet"
    pq.write_table(pa.table({
        "user.age": pa.array([30, 40, 50], pa.int64()),
        "user": pa.array([1, None, 3], pa.int64()),
        "s": pa.array([{"a": 1}, {"a": None}, {"a": 3}]),
        "session.id": pa.array([7, 8, 9], pa.int64()),
    }), path)
    got = read_all(str(path))
    assert got["user.age"].dtype == np.int64 and got["user.age"].tolist() == [30, 40, 50]
    assert got["session.id"].dtype == np.int64
    assert got["user"].dtype == np.float64 and np.isnan(got["user"][1])


def test_a_dotted_int64_column_past_2_53_is_not_refused_for_nulls_it_does_not_hold(tmp_path):
    path = tmp_path / "ids.parquet"
    big = np.array([2**60 + 1, 2**60 + 3], dtype=np.int64)
    pq.write_table(pa.table({"user.id": big, "user": pa.array([1.0, None])}), path)
    got = read_all(str(path))
    assert got["user.id"].dtype == np.int64 and np.array_equal(got["user.id"], big)


def write_bad_text(path, rows_per_group: int = 4) -> None:
    """Two row groups of text, the second group's third value (row 6 of the file) not UTF-8."""
    values = [b"a", b"bb", b"c", b"d", b"e", b"f", b"\xff\xfeg", b"h"]
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
    text = pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))])
    pq.write_table(pa.table({"id": np.arange(8), "name": text}), path, row_group_size=rows_per_group)


@pytest.mark.parametrize("strings", ["str", "object"])
def test_text_that_is_not_utf8_names_the_file_row_group_column_and_row(tmp_path, strings):
    path = tmp_path / "bad.parquet"
    write_bad_text(path)
    with pytest.raises(SourceError) as err:
        read_all(str(path), strings=strings)
    message = str(err.value)
    assert f"Parquet file {str(path)!r} row group 1 column 'name' row 6 (of the file)" in message, message
    assert "not valid UTF-8" in message and "0xff" in message and "strings='bytes'" in message


def test_text_that_is_not_utf8_reads_as_its_bytes(tmp_path):
    path = tmp_path / "bad.parquet"
    write_bad_text(path)
    got = read_all(str(path))
    assert got["name"][6] == b"\xff\xfeg"
