"""The synthetic Criteo generator: schema, cardinalities, click rate, determinism, CLI, errors; speed (slow)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from intune.dlrm import data


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return pa.concat_tables(data.iter_chunks(40_000, seed=3, chunk_rows=10_000))


def test_schema_and_types(table: pa.Table) -> None:
    assert (
        table.column_names
        == list(data.COLUMNS)
        == ["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]]
    )
    assert set(np.unique(table["label"].to_numpy())) == {0, 1}
    for name in data.DENSE_COLUMNS:
        assert table[name].type == pa.int32()
    for name in data.SPARSE_COLUMNS:
        assert table[name].type == pa.string()
        values = [v for v in table[name].slice(0, 500).to_pylist() if v is not None]
        assert values and all(len(v) == 8 and int(v, 16) >= 0 and v == v.lower() for v in values)


def test_kaggle_cardinalities_bound_the_distinct_ids(table: pa.Table) -> None:
    assert data.KAGGLE_CARDINALITIES[8] == 3 and data.KAGGLE_CARDINALITIES[2] == 10131227
    for name, card in zip(data.SPARSE_COLUMNS, data.KAGGLE_CARDINALITIES, strict=True):
        distinct = len(pc_unique(table[name]))
        assert distinct <= card, name
        if card <= 24:  # the tiny vocabularies are fully used by 40k Zipf draws
            assert distinct == card, (name, distinct, card)
    # the largest vocabularies are heavy-tailed: many distinct IDs, yet the top one is frequent
    c3 = table["C3"].drop_null().to_numpy(zero_copy_only=False)
    _, counts = np.unique(c3, return_counts=True)
    assert len(counts) > 5_000 and counts.max() > 0.05 * len(c3)


def pc_unique(column: pa.ChunkedArray) -> list:
    return [v for v in column.unique().to_pylist() if v is not None]


def test_category_hash_is_a_bijection_on_ranks() -> None:
    ranks = np.arange(200_000)
    for feature in (0, 2, 25):
        assert len(np.unique(data.category_hash(feature, ranks))) == len(ranks)
    assert data.hex_strings(np.array([0x0A, 0x68FD1E64], dtype=np.uint32)).tobytes() == b"0000000a68fd1e64"


def test_click_rate_missing_values_negatives_and_tails(table: pa.Table) -> None:
    assert 0.22 < float(np.mean(table["label"].to_numpy())) < 0.28
    assert abs(table["I12"].null_count / table.num_rows - 0.77) < 0.02
    assert table["I2"].null_count == 0 and table["C22"].null_count > 0.7 * table.num_rows
    i2 = table["I2"].to_numpy()
    assert 0.02 < np.mean(i2 < 0) < 0.06 and i2.min() >= -3
    i5 = table["I5"].drop_null().to_numpy()
    assert i5.max() > 100 * np.median(i5)  # heavy tail


def test_labels_follow_the_hidden_model() -> None:
    """The ground-truth logit ranks the generated clicks well: there is something for a model to learn."""
    from intune.dlrm.train import roc_auc

    n = 20_000
    labels = data.generate_chunk(seed=5, index=0, rows=n)["label"].to_numpy()
    rng = np.random.default_rng([5, 0])  # the same draws generate_chunk makes, in the same order
    features = data._generate_features(rng, n, data.KAGGLE_CARDINALITIES)
    logit = data._logit(data.ground_truth(), *features)
    assert roc_auc(labels, logit) > 0.75


def test_deterministic_and_independent_of_file_layout(tmp_path) -> None:
    a = data.generate(30_000, tmp_path / "a", seed=7, rows_per_file=30_000)
    b = data.generate(30_000, tmp_path / "b", seed=7, rows_per_file=8_000, row_group_rows=4_000)
    c = data.generate(30_000, tmp_path / "c", seed=8)
    assert len(a) == 1 and len(b) == 4
    ta = pq.read_table(a[0])
    tb = pa.concat_tables(pq.read_table(p) for p in b)
    assert ta.equals(tb)
    assert not ta.equals(pq.read_table(c[0]))
    assert pq.ParquetFile(b[0]).metadata.num_row_groups == 2
    # regenerating a smaller set in the same place leaves no stale file behind
    assert len(data.generate(9_000, tmp_path / "b", seed=7, rows_per_file=8_000)) == 2
    assert len(data.data_files(tmp_path / "b")) == 2


def test_row_groups_are_sized_for_parallel_reads(tmp_path) -> None:
    paths = data.generate(300_000, tmp_path, seed=0)
    assert len(paths) == 2  # 262,144 rows per file
    groups = [pq.ParquetFile(p).metadata.num_row_groups for p in paths]
    assert groups == [4, 1]  # 65,536-row groups
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in paths) == 300_000


def test_chunks_add_up_to_the_rows_asked_for() -> None:
    assert [t.num_rows for t in data.iter_chunks(25_000, seed=1, chunk_rows=10_000)] == [10_000, 10_000, 5_000]


@pytest.mark.slow
def test_generation_speed() -> None:
    """1M rows must take < 60 s (measured: about 3 s); ``intune data generate`` prints its rows/s."""
    data.ground_truth()  # calibrated once per process, cached
    start = time.perf_counter()
    rows = sum(t.num_rows for t in data.iter_chunks(1_000_000, seed=1))
    assert rows == 1_000_000
    assert time.perf_counter() - start < 60.0


def test_tsv_is_the_raw_criteo_layout(tmp_path) -> None:
    [tsv] = data.generate(2_000, tmp_path / "t", fmt="tsv", seed=4)
    [parquet] = data.generate(2_000, tmp_path / "p", seed=4)
    lines = tsv.read_text().splitlines()
    assert len(lines) == 2_000
    table = pq.read_table(parquet)
    for i in (0, 1, 777, 1999):
        fields = lines[i].split("\t")
        assert len(fields) == 40
        row = table.slice(i, 1).to_pylist()[0]
        expected = ["" if row[c] is None else str(row[c]) for c in data.COLUMNS]
        assert fields == expected


def test_bad_arguments_and_empty_directories(tmp_path) -> None:
    with pytest.raises(ValueError, match="format"):
        data.generate(10, tmp_path, fmt="csv")
    with pytest.raises(ValueError, match="rows must be positive"):
        data.generate(0, tmp_path)
    with pytest.raises(ValueError, match="26 positive cardinalities"):
        data.generate_chunk(0, 0, 10, cardinalities=[5] * 25)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no .parquet files"):
        data.data_files(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.data_files(tmp_path / "nowhere")


def test_read_chunks_names_missing_columns_and_bad_files(tmp_path) -> None:
    [path] = data.generate(1_000, tmp_path, seed=0)
    chunks = list(data.read_chunks([path], chunk_rows=300, columns=["label", "I1", "C1"]))
    assert [len(c["label"]) for c in chunks] == [300, 300, 300, 100]
    assert np.isnan(chunks[0]["I1"]).any()  # nulls in counts become NaN
    with pytest.raises(KeyError, match=r"lacks columns \['C27'\]"):
        list(data.read_chunks([path], columns=["label", "C27"]))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="bad.parquet"):
        list(data.read_chunks([bad]))


def test_cli_generate(tmp_path, capsys) -> None:
    from intune.cli import main

    assert main(["data", "generate", "--rows", "5000", "--out", str(tmp_path / "g"), "--seed", "2"]) == 0
    assert "wrote 5,000 rows in 1 parquet file" in capsys.readouterr().out
    assert pq.read_table(data.data_files(tmp_path / "g")[0]).num_rows == 5000
    assert main(["data", "generate", "--rows", "300", "--out", str(tmp_path / "t"), "--format", "tsv"]) == 0
    assert len(data.data_files(tmp_path / "t", "tsv")[0].read_text().splitlines()) == 300


def test_cli_generate_sessions_delegates_to_recd(tmp_path, capsys) -> None:
    pytest.importorskip("intune.recd.sessions")
    from intune.cli import main

    code = main(
        [
            "data",
            "generate",
            "--rows",
            "2000",
            "--out",
            str(tmp_path / "s"),
            "--sessions",
            "--mean-session-len",
            "4",
        ]
    )
    assert code == 0
    assert "session rows" in capsys.readouterr().out
    assert "session_id" in pq.read_table(data.data_files(tmp_path / "s")[0]).column_names
