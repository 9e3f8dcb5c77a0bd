"""The dedup transform inside the real engine: Parquet -> batch -> lists -> dedup -> group UDF."""

import numpy as np
import pyarrow.parquet as pq
import pytest

import intune
from intune.recd import IKJT, GroupUDF, ListsToJagged, dedup_transform
from intune.recd.sessions import USER_COLUMNS, SessionSpec, chunk_to_table, generate_sessions


def _write(tmp_path, rows=3000):
    data = generate_sessions(rows, 5, SessionSpec(mean_session_len=6.0))
    data.pop("_time")
    data["row"] = np.arange(rows)
    path = tmp_path / "s.parquet"
    pq.write_table(chunk_to_table(data), path, row_group_size=1000)
    return path, data


def test_engine_dedup_delivers_every_row_once_and_expands_to_the_source(tmp_path):
    path, data = _write(tmp_path)
    calls = []

    def double_clicks(rows):
        calls.append(len(rows["user_clicks"]))
        return {**rows, "user_clicks": rows["user_clicks"] * 2}

    pipe = (
        intune.Pipeline.from_parquet(str(path), chunk_rows=700)
        .batch(512)
        .map(ListsToJagged(["user_history"]), name="lists")
        .map(dedup_transform({"user": list(USER_COLUMNS)}), name="dedup")
        .map(GroupUDF("user", list(USER_COLUMNS), double_clicks), name="user_udf")
        .prefetch(2)
    )
    seen, unique = [], 0
    offsets = np.concatenate([[0], np.cumsum(data["user_history.lengths"])])
    with pipe:
        for batch in pipe:
            ikjt = IKJT.from_chunk(batch, "user")
            plain = ikjt.to_jagged()
            rows = batch["row"]
            seen.append(rows)
            unique += ikjt.num_unique
            np.testing.assert_array_equal(plain["user_clicks"], 2 * data["user_clicks"][rows])
            np.testing.assert_array_equal(plain["user_id"], data["user_id"][rows])
            hist = np.concatenate([data["user_history.values"][offsets[r]:offsets[r + 1]] for r in rows])
            np.testing.assert_array_equal(plain["user_history.values"], hist)
    assert sorted(np.concatenate(seen).tolist()) == list(range(3000))
    assert sum(calls) == unique < 3000 / 3  # the UDF saw unique rows only


def test_engine_dedup_missing_column_error_names_it(tmp_path):
    path, _ = _write(tmp_path, rows=600)
    pipe = (
        intune.Pipeline.from_parquet(str(path))
        .batch(256)
        .map(dedup_transform({"user": ["user_id", "user_age"]}), name="dedup")
    )
    with pipe, pytest.raises(Exception, match=r"dedup group 'user' names column 'user_age'") as info:
        list(pipe)
    assert "dedup" in str(info.value)  # the engine names the stage as well
