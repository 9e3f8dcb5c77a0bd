"""map_rows: a row -> row function over chunks, its stacked columns, its knob, and errors naming the row."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, delivered_ids
from intune.pipeline import SchemaError, StageError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def parquet_glob(tmp_path_factory):
    d = tmp_path_factory.mktemp("rows")
    for name, start in (("a", 0), ("b", 1000)):
        ids = np.arange(start, start + 1000)
        table = pa.table({"id": ids, "x": (ids % 97).astype(np.float32), "tag": [f"t{i % 5}" for i in ids]})
        pq.write_table(table, d / f"{name}.parquet", row_group_size=250)
    return str(d / "*.parquet")


def features(row):
    """What a Dataset.__getitem__ might do, one row at a time, in plain Python."""
    x = row["x"]
    return {
        "id": row["id"],  # numpy.int64 in, int64 column out
        "x2": x * 2,  # numpy.float32 stays float32
        "big": float(x) > 50,  # Python bool -> bool
        "n": int(row["id"]) % 7,  # Python int -> int64
        "tag": row["tag"] + b"!",  # bytes -> fixed-width S
        "name": row["tag"].decode() * 2,  # str -> fixed-width U
        "vec": [x, x + 1, x + 2],  # a fixed-size list -> (rows, 3)
    }


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_rows_are_stacked_into_typed_columns_exactly_once(parquet_glob, mode):
    pipe = intune.Pipeline.from_parquet(parquet_glob, chunk_rows=100).map_rows(features, mode=mode).batch(64)
    with pipe:
        batches = list(pipe)
    b = batches[0]
    assert {k: v.dtype.str for k, v in b.items()} == {
        "id": "<i8",
        "x2": "<f4",
        "big": "|b1",
        "n": "<i8",
        "tag": "|S3",
        "name": "<U4",
        "vec": "<f4",
    }
    assert b["vec"].shape == (64, 3)
    ids = delivered_ids(batches)
    assert_exactly_once(ids, range(2000))
    allx = np.concatenate([bb["x2"] for bb in batches])
    np.testing.assert_array_equal(allx, (ids % 97).astype(np.float32) * 2)
    assert b["tag"][0] == f"t{b['id'][0] % 5}!".encode() and b["name"][0] == f"t{b['id'][0] % 5}" * 2


def test_a_value_ending_in_nul_survives_as_an_object_column():
    pipe = intune.Pipeline.from_iterable([{"id": np.arange(3)}]).map_rows(
        lambda row: {"raw": bytes([int(row["id"]), 0])}, mode="thread"
    )
    with pipe:
        (chunk,) = list(pipe)
    assert chunk["raw"].tolist() == [b"\x00\x00", b"\x01\x00", b"\x02\x00"]


def test_the_workers_knob_resizes_while_rows_flow(parquet_glob):
    pipe = (
        intune.Pipeline.from_parquet(parquet_glob, chunk_rows=50)
        .map_rows(lambda row: {"id": row["id"]}, name="rows")
        .batch(100)
    )
    knob = pipe.knobs["rows.workers"]
    assert (knob.unit, knob.min, knob.value) == ("cpu", 1, 1)
    stage = pipe.metrics().stages["rows"]
    assert (stage.kind, stage.mode) == ("map", "process")  # what a tuner's observation reads
    with pipe:
        ids = []
        for i, batch in enumerate(pipe):
            ids.append(batch["id"])
            if i == 2:
                knob.set(2)  # as a tuner does: the stage is a map stage with process workers
        assert len(pipe.stage("rows").worker_pids()) == 2
    assert_exactly_once(np.concatenate(ids), range(2000))


def explode_on_1234(row):
    if row["id"] == 1234:
        raise KeyError("no feature for id 1234")
    return {"id": row["id"]}


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_failing_row_is_named_by_file_row_values_and_traceback(parquet_glob, mode):
    pipe = intune.Pipeline.from_parquet(parquet_glob, chunk_rows=100).map_rows(
        explode_on_1234, name="rows", mode=mode
    )
    with pipe, pytest.raises(StageError) as info:
        list(pipe)
    message = str(info.value)
    assert message.startswith("stage 'rows' failed on ") and info.value.stage == "rows"
    assert (
        "b.parquet row 234 (row 34 of a chunk of 50 rows: " in message
        and "b.parquet rows 200-249)" in message
    )
    assert "explode_on_1234() raised KeyError: 'no feature for id 1234'" in message
    assert "the row: id=1234, x=70.0, tag=b't4'" in message
    assert 'in explode_on_1234\n    raise KeyError("no feature for id 1234")' in info.value.remote_traceback


def test_after_a_shuffle_the_failing_row_is_still_named_by_its_source(parquet_glob):
    pipe = (
        intune.Pipeline.from_parquet(parquet_glob, chunk_rows=100)
        .shuffle(buffer_rows=500, seed=3)
        .map_rows(explode_on_1234, name="rows", mode="thread")
    )
    with pipe, pytest.raises(StageError, match=r"failed on \S*b\.parquet row 234 \(row \d+ of a chunk"):
        list(pipe)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_skip_leaves_out_failing_rows_only_and_counts_them(parquet_glob, mode, caplog):
    def fails_on_sevens(row):
        if row["id"] % 500 == 7:
            raise ValueError(f"bad {row['id']}")
        return {"id": row["id"]}

    pipe = intune.Pipeline.from_parquet(parquet_glob, chunk_rows=100).map_rows(
        fails_on_sevens, name="rows", mode=mode, on_error="skip"
    )
    with caplog.at_level(logging.WARNING, logger="intune.pipeline.row_map"), pipe:
        ids = delivered_ids(pipe)
        assert pipe.metrics().stages["rows"].skipped == 4
    bad = {7, 507, 1007, 1507}
    assert_exactly_once(ids, [i for i in range(2000) if i not in bad])
    examples = sorted((where.rsplit("/", 1)[-1], why) for where, why in pipe.stage("rows").skipped_examples)
    assert examples == [
        ("a.parquet row 507", "ValueError: bad 507"),
        ("a.parquet row 7", "ValueError: bad 7"),
        ("b.parquet row 507", "ValueError: bad 1507"),
        ("b.parquet row 7", "ValueError: bad 1007"),
    ]
    assert any(
        "skipped the row at" in r.message and "ValueError: bad 1007" in r.message for r in caplog.records
    )


def test_chunks_with_no_rows_left_flow_through(parquet_glob):
    pipe = intune.Pipeline.from_iterable(
        [{"id": np.arange(0, 5)}, {"id": np.arange(5, 5)}, {"id": np.arange(5, 8)}, {"id": np.arange(8, 10)}]
    ).map_rows(
        lambda row: {"id": row["id"]} if row["id"] < 5 or row["id"] >= 8 else 1 / 0,
        on_error="skip",
        mode="thread",
    )
    with pipe:
        assert delivered_ids(pipe).tolist() == [0, 1, 2, 3, 4, 8, 9]
        assert pipe.metrics().stages["map_rows"].skipped == 3


def _source():
    return [{"id": np.arange(10), "x": np.arange(10, dtype=np.float32)}]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            lambda row: (row["id"], row["x"]),
            r"<lambda>\(\) returned tuple; map_rows needs a dict .* \(name the values",
        ),
        (lambda row: row["x"], r"<lambda>\(\) returned float32; map_rows needs a dict"),
        (
            lambda row: {"a": 1} if row["id"] < 4 else {"b": 1},
            r"row 4 of the chunk's 10 rows.*returned keys \['b'\], but row 0 returned \['a'\] \(missing \['a'\], extra \['b'\]\)",
        ),
        (
            lambda row: {"a": 1 if row["id"] < 6 else 1.5},
            r"row 6 of the chunk's 10 rows.*key 'a' as float, but row 0 returned it as int",
        ),
        (
            lambda row: {"a": row["x"] if row["id"] < 6 else float(row["x"])},
            r"row 6 .*key 'a' as float, but row 0 returned it as numpy.float32",
        ),
        (
            lambda row: {"v": np.zeros(2 if row["id"] < 3 else 3)},
            r"row 3 .*key 'v' as an array of float64 \[3\], but row 0 returned float64 \[2\]",
        ),
        (lambda row: {"a": None}, r"row 0 .*key 'a' as NoneType; values must be scalars"),
        (lambda row: {1: row["x"]}, r"returned a dict whose key 1 is not a str"),
        (lambda row: {}, r"row 0 of the chunk's 10 rows: <lambda>\(\) returned an empty dict"),
        (
            lambda row: {"a": 2**64 if row["id"] == 7 else 1},
            r"row 7 .*key 'a' as the Python int 18446744073709551616",
        ),
        (lambda row: {"v": [[1], [1, 2]]}, r"key 'v' as a ragged or non-numeric array"),
    ],
)
def test_a_broken_row_contract_is_an_error_naming_function_and_row(fn, message):
    for mode in ("thread", "process"):
        pipe = intune.Pipeline.from_iterable(_source()).map_rows(fn, name="rows", mode=mode, on_error="skip")
        with pipe, pytest.raises(StageError, match=message) as info:
            list(pipe)  # even with on_error="skip": the code is wrong, not one row's data
        assert "stage 'rows' failed on source 'read' chunk #0" in str(info.value)


def test_a_type_that_changes_between_chunks_is_a_schema_error():
    chunks = [{"id": np.arange(3)}, {"id": np.arange(3, 6)}]
    pipe = intune.Pipeline.from_iterable(chunks).map_rows(
        lambda row: {"a": 1 if row["id"] < 3 else 1.0}, name="rows", mode="thread"
    )
    with pipe, pytest.raises(SchemaError, match=r"stage 'rows' .*column 'a' is float64, but .* has int64"):
        list(pipe)


def test_bad_arguments_name_the_argument():
    pipe = intune.Pipeline.from_iterable(_source())
    with pytest.raises(ValueError, match="map_rows: fn must be callable"):
        pipe.map_rows(3)
    with pytest.raises(ValueError, match="map_rows: mode must be 'thread' or 'process', got 'fork'"):
        pipe.map_rows(dict, mode="fork")
    with pytest.raises(ValueError, match="map_rows: on_error must be 'raise' or 'skip'"):
        pipe.map_rows(dict, on_error="ignore")
    with pytest.raises(ValueError, match="workers = 0 is out of range"):
        pipe.map_rows(dict, workers=0)
    assert pipe.map_rows(dict, mode="thread").map_rows(dict, mode="thread").stage_names() == [
        "read",
        "map_rows",
        "map_rows2",
    ]


def test_torch_tensors_from_a_dataset_style_function_become_columns():
    torch = pytest.importorskip("torch")
    pipe = intune.Pipeline.from_iterable(_source()).map_rows(
        lambda row: {"t": torch.tensor([row["x"], 2.0]), "label": torch.tensor(int(row["id"]) % 2)},
        mode="thread",
    )
    with pipe:
        (chunk,) = list(pipe)
    assert chunk["t"].shape == (10, 2) and chunk["t"].dtype == np.float32
    assert chunk["label"].tolist() == [i % 2 for i in range(10)] and chunk["label"].dtype == np.int64


def test_a_row_after_skipped_ones_is_still_named_by_its_own_source_row(parquet_glob):
    def skip_7(row):
        if row["id"] == 7:
            raise ValueError("skipped")
        return {"id": row["id"]}

    def explode_on_51(row):
        if row["id"] == 51:
            raise KeyError("no feature for id 51")
        return {"id": row["id"]}

    pipe = (
        intune.Pipeline.from_parquet(parquet_glob, chunk_rows=100)
        .map_rows(skip_7, name="clean", mode="thread", on_error="skip")
        .map_rows(explode_on_51, name="rows", mode="thread")
    )
    with pipe, pytest.raises(StageError, match=r"a\.parquet row 51 \(row 50 of a chunk of 99 rows"):
        list(pipe)
