"""The pipeline schema: chunks that disagree on columns or types fail loudly instead of being cast."""

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, delivered_ids
from intune.pipeline import SchemaError, StageError
from intune.pipeline.schema import Column, Schema, unify, widen

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

BIG = 2**40


def write(path, **columns):
    pq.write_table(pa.table(columns), path, row_group_size=1000)
    return str(path)


def test_files_with_int64_and_float64_fail_before_any_data_flows_naming_both(tmp_path):
    write(tmp_path / "a.parquet", id=np.arange(5000, dtype=np.float64))
    write(tmp_path / "b.parquet", id=BIG + np.arange(5000, dtype=np.int64))
    pipe = intune.Pipeline.from_parquet(str(tmp_path / "*.parquet"), chunk_rows=500).shuffle(3000).batch(700)
    with pipe, pytest.raises(SchemaError) as info:
        iter(pipe)
    message = str(info.value)
    assert "b.parquet" in message and "a.parquet" in message and "'id'" in message
    assert "int64" in message and "float64" in message


def test_widen_reads_both_exactly_through_the_shuffle(tmp_path):
    write(tmp_path / "a.parquet", id=np.arange(5000, dtype=np.float32))
    write(tmp_path / "b.parquet", id=BIG + np.arange(5000, dtype=np.int64))
    pipe = (
        intune.Pipeline.from_parquet(str(tmp_path / "*.parquet"), chunk_rows=500, widen=True)
        .shuffle(3000, seed=1)
        .batch(700)
    )
    with pipe:
        batches = list(pipe)
    assert {b["id"].dtype for b in batches} == {np.dtype(np.float64)}
    ids = delivered_ids(batches)
    expected = np.concatenate([np.arange(5000), BIG + np.arange(5000)]).astype(np.float64)
    assert np.array_equal(np.sort(ids), np.sort(expected))  # every 2**40 + k exact


def test_widen_refuses_int64_values_that_float64_cannot_hold(tmp_path):
    write(tmp_path / "a.parquet", id=np.arange(10, dtype=np.float64))
    write(tmp_path / "b.parquet", id=np.array([2**60 + 1] * 10, dtype=np.int64))
    pipe = intune.Pipeline.from_parquet(str(tmp_path / "*.parquet"), widen=True)
    with pipe, pytest.raises(SchemaError, match=r"b\.parquet.*'id'.*exactly"):
        list(pipe)


def test_files_with_different_columns_fail_naming_the_columns(tmp_path):
    write(tmp_path / "a.parquet", id=np.arange(10), x=np.ones(10))
    write(tmp_path / "b.parquet", id=np.arange(10), y=np.ones(10))
    pipe = intune.Pipeline.from_parquet(str(tmp_path / "*.parquet")).batch(4)
    with pipe, pytest.raises(SchemaError, match=r"b\.parquet.*missing \['x'\].*extra \['y'\]"):
        iter(pipe)
    # the columns they share read fine
    shared = intune.Pipeline.from_parquet(str(tmp_path / "*.parquet"), columns=["id"]).batch(4)
    with shared:
        assert len(delivered_ids(shared)) == 20


def test_a_requested_column_that_does_not_exist_fails_at_from_parquet(tmp_path):
    path = write(tmp_path / "a.parquet", id=np.arange(10))
    with pytest.raises(SchemaError, match=r"no column\(s\) \['nosuch'\]"):
        intune.Pipeline.from_parquet(path, columns=["id", "nosuch"])


def test_an_int_column_with_nulls_is_float64_in_every_chunk(tmp_path):
    values = pa.array([None if i % 997 == 5 and i < 1000 else i for i in range(3000)], pa.int32())
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": values, "id": np.arange(3000)}), path, row_group_size=1000)
    pipe = intune.Pipeline.from_parquet(str(path), chunk_rows=400).batch(500)
    with pipe:
        batches = list(pipe)
    assert {b["x"].dtype for b in batches} == {np.dtype(np.float64)}
    x = np.concatenate([b["x"] for b in batches])
    assert np.isnan(x).sum() == 1 and x[np.isfinite(x)].sum() == sum(range(3000)) - 5


def test_iterable_chunks_with_a_changed_type_fail_naming_the_chunk():
    chunks = [{"id": np.arange(10, dtype=np.int64)}, {"id": np.arange(10, 20, dtype=np.float32)}]
    pipe = intune.Pipeline.from_iterable(chunks).batch(4)
    with pipe, pytest.raises(SchemaError, match=r"chunk #1: column 'id' is float32.*int64"):
        list(pipe)


@pytest.mark.parametrize("first,second", [({"x", "y"}, {"x"}), ({"x"}, {"x", "y"})])
def test_iterable_chunks_with_other_columns_fail_instead_of_dropping_or_key_error(first, second):
    def chunk(cols, start):
        return {c: np.arange(start, start + 5) for c in sorted(cols)}

    pipe = intune.Pipeline.from_iterable([chunk(first, 0), chunk(second, 5)]).batch(10)
    with pipe, pytest.raises(SchemaError, match=r"chunk #1: (missing|extra) column\(s\) \['y'\]"):
        list(pipe)


def test_iterable_widen_takes_a_narrower_int_exactly():
    chunks = [{"id": np.arange(10, dtype=np.int64)}, {"id": np.arange(10, 20, dtype=np.int32)}]
    pipe = intune.Pipeline.from_iterable(chunks, widen=True).batch(20)
    with pipe:
        [batch] = list(pipe)
    assert batch["id"].dtype == np.int64 and np.array_equal(batch["id"], np.arange(20))


def test_a_given_schema_states_the_types():
    chunks = [{"id": np.arange(10, dtype=np.int32)}]
    pipe = intune.Pipeline.from_iterable(chunks, schema={"id": "int64"})
    with pipe:
        [chunk] = list(pipe)
    assert chunk["id"].dtype == np.int64


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_map_whose_output_type_changes_fails_naming_the_stage_and_chunk(mode):
    chunks = [{"id": np.arange(i * 10, i * 10 + 10)} for i in range(6)]
    pipe = intune.Pipeline.from_iterable(chunks).map(_float_from_chunk_3, name="udf", mode=mode).batch(60)
    with pipe, pytest.raises(SchemaError) as info:
        list(pipe)
    message = str(info.value)
    assert "stage 'udf'" in message and "chunk #3" in message and "float64" in message and "int64" in message


def _float_from_chunk_3(chunk):
    return {"id": chunk["id"].astype(np.float64) if chunk["id"][0] >= 30 else chunk["id"]}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_unequal_or_scalar_map_output_is_blamed_on_the_map_and_its_chunk(mode):
    chunks = [{"id": np.arange(i * 10, i * 10 + 10)} for i in range(3)]

    pipe = intune.Pipeline.from_iterable(chunks).map(_ragged, name="udf", mode=mode).batch(30)
    with pipe, pytest.raises(StageError, match=r"stage 'udf' failed on source 'read' chunk #0.*unequal lengths"):
        list(pipe)
    pipe = intune.Pipeline.from_iterable(chunks).map(_scalar, name="udf", mode=mode).batch(30)
    with pipe, pytest.raises(StageError, match=r"stage 'udf'.*column 'n' as a scalar"):
        list(pipe)


def _ragged(chunk):
    return {"id": chunk["id"], "half": chunk["id"][:5]}


def _scalar(chunk):
    return {"id": chunk["id"], "n": np.int64(len(chunk["id"]))}


def test_a_map_after_batch_may_change_lengths():
    chunks = [{"id": np.arange(i * 10, i * 10 + 10)} for i in range(3)]
    pipe = intune.Pipeline.from_iterable(chunks).batch(15).map(_ragged, name="udf")
    with pipe:
        out = list(pipe)
    assert [len(b["half"]) for b in out] == [5, 5]


def test_strings_of_growing_width_are_not_cut_by_the_shuffle():
    chunks = [{"s": np.array([b"a" * (1 + i)] * 50), "id": np.arange(i * 50, i * 50 + 50)} for i in range(6)]
    pipe = intune.Pipeline.from_iterable(chunks).shuffle(120, seed=2).batch(300)
    with pipe:
        [batch] = list(pipe)
    assert_exactly_once(batch["id"], range(300))
    assert np.all(batch["s"] == np.array([b"a" * (1 + i // 50) for i in batch["id"]]))


def test_widen_rules_by_hand():
    assert widen(np.array([1, 2], np.int32), np.dtype(np.int64)).dtype == np.int64
    assert widen(np.array([2**53], np.int64), np.dtype(np.float64)) is not None
    assert widen(np.array([2**53 + 2], np.int64), np.dtype(np.float64)) is None
    assert widen(np.array([2**24 + 1], np.int64), np.dtype(np.float32)) is None
    assert widen(np.array([1.5]), np.dtype(np.int64)) is None
    assert unify(Column(np.dtype(np.int32)), Column(np.dtype(np.int64))) == Column(np.dtype(np.int64))
    assert unify(Column(np.dtype(np.float32)), Column(np.dtype(np.int64))) == Column(np.dtype(np.float64))
    assert unify(Column(np.dtype("S3")), Column(np.dtype(np.int64))) is None
    schema = Schema.given({"s": "S1"})
    assert schema.conform({"s": np.array([b"abcdef"])}, "here")["s"][0] == b"abcdef"
