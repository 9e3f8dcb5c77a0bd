"""Readers: Parquet row groups and chunking; Criteo TSV columns, block alignment and bad lines."""

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, assert_same_order, delivered_ids
from intune.pipeline import SourceError
from intune.pipeline.criteo import CAT_COLUMNS, COLUMNS, INT_COLUMNS

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture
def parquet_dir(tmp_path):
    for k in range(3):
        ids = np.arange(k * 1000, (k + 1) * 1000)
        table = pa.table({"id": ids, "x": ids.astype(np.float32) / 2, "s": ids % 7})
        pq.write_table(table, tmp_path / f"part-{k}.parquet", row_group_size=300)
    return tmp_path


def test_parquet_chunks_never_span_row_groups_and_respect_chunk_rows(parquet_dir):
    pipe = intune.Pipeline.from_parquet(str(parquet_dir / "*.parquet"), columns=["id", "x"], chunk_rows=128)
    with pipe:
        chunks = list(pipe)
    sizes = [len(c["id"]) for c in chunks]
    # each file: row groups 300, 300, 300, 100 -> chunks 128, 128, 44 (x3) and 100
    assert sizes == ([128, 128, 44] * 3 + [100]) * 3
    assert set(chunks[0]) == {"id", "x"}
    assert_same_order(delivered_ids(chunks), np.arange(3000))
    np.testing.assert_allclose(chunks[5]["x"], chunks[5]["id"] / 2)


def test_parallel_readers_keep_the_order(parquet_dir):
    orders = []
    for workers in (1, 3):
        pipe = intune.Pipeline.from_parquet(
            [str(p) for p in sorted(parquet_dir.glob("*.parquet"))], chunk_rows=100
        )
        pipe.knobs["read.workers"].set(workers)
        with pipe:
            orders.append(delivered_ids(pipe))
    assert_same_order(orders[0], orders[1])
    assert_exactly_once(orders[1], range(3000))


def criteo_line(label, ints, cats):
    return "\t".join(
        [str(label), *("" if v is None else str(v) for v in ints), *("" if c is None else c for c in cats)]
    )


def test_criteo_columns_types_and_missing_values(tmp_path):
    ints = [5, None, -3, 0, 12, 1, 2, 3, 4, 5, 6, 7, 100000]
    cats = ["0000000a", None, "FFFFFFFF", "7fffffff"] + ["00000001"] * 22
    path = tmp_path / "day_0"
    path.write_text(criteo_line(1, ints, cats) + "\n" + criteo_line(0, [None] * 13, [None] * 26) + "\n")
    with intune.Pipeline.from_criteo_tsv(str(path)) as pipe:
        (chunk,) = list(pipe)
    assert list(chunk) == COLUMNS
    assert chunk["label"].dtype == np.int64 and chunk["label"].tolist() == [1, 0]
    assert all(chunk[c].dtype == np.float32 for c in INT_COLUMNS)
    assert all(chunk[c].dtype == np.int64 for c in CAT_COLUMNS)
    assert (
        chunk["I1"][0] == 5
        and np.isnan(chunk["I2"][0])
        and chunk["I3"][0] == -3
        and chunk["I13"][0] == 100000
    )
    assert np.isnan(chunk["I1"][1])
    assert chunk["C1"].tolist() == [10, -1]
    assert chunk["C2"].tolist() == [-1, -1]
    assert chunk["C3"][0] == 0xFFFFFFFF and chunk["C4"][0] == 0x7FFFFFFF


def _criteo_file(path, n, bad_at=()):
    lines = []
    for i in range(n):
        if i in bad_at:
            lines.append("1\t2\tthree\n")
        else:
            lines.append(criteo_line(i % 2, [i] + [None] * 12, [f"{i:08x}"] + [None] * 25) + "\n")
    path.write_text("".join(lines))


def test_criteo_blocks_split_at_line_boundaries_exactly_once(tmp_path):
    path = tmp_path / "day_1"
    _criteo_file(path, 2000)
    pipe = intune.Pipeline.from_criteo_tsv(str(path), chunk_rows=100, block_bytes=1500)
    pipe.knobs["read.workers"].set(3)
    with pipe:
        ids = np.concatenate([c["C1"] for c in pipe])
    assert_same_order(ids, np.arange(2000))


def test_criteo_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "day_2"
    _criteo_file(path, 500, bad_at={417})
    with pytest.raises(SourceError, match=r"day_2' line 418: expected 40 tab-separated fields, got 3"):
        list(intune.Pipeline.from_criteo_tsv(str(path), block_bytes=2048))
    bad_hex = tmp_path / "day_3"
    bad_hex.write_text(criteo_line(0, [1] * 13, ["zzzzzzzz"] + ["00000000"] * 25) + "\n")
    with pytest.raises(SourceError, match=r"day_3' line 1: C1 = b'zzzzzzzz' is not 8 hex digits"):
        list(intune.Pipeline.from_criteo_tsv(str(bad_hex)))


def test_criteo_skip_drops_and_counts_malformed_lines(tmp_path):
    path = tmp_path / "day_4"
    _criteo_file(path, 500, bad_at={3, 250, 499})
    with intune.Pipeline.from_criteo_tsv(str(path), on_error="skip", block_bytes=4096) as pipe:
        ids = np.concatenate([c["C1"] for c in pipe])
        assert pipe.metrics().stages["read"].skipped == 3
    assert_same_order(ids, np.array([i for i in range(500) if i not in (3, 250, 499)]))
