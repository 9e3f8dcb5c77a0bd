"""Criteo TSV through the engine's reader: `intune data convert`, and bad input named by file and line."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from intune.cli import main
from intune.dlrm import data, pipelines
from intune.dlrm.convert_cli import convert_file, input_files
from intune.pipeline import Pipeline


@pytest.fixture(scope="module")
def tsv_and_parquet(tmp_path_factory):
    root = tmp_path_factory.mktemp("criteo")
    [tsv] = data.generate(3_000, root / "tsv", fmt="tsv", seed=9)
    [parquet] = data.generate(3_000, root / "pq", seed=9)
    return tsv, parquet


def test_convert_keeps_every_row_and_value(tsv_and_parquet, tmp_path, capsys) -> None:
    tsv, parquet = tsv_and_parquet
    assert main(["data", "convert", str(tsv.parent), str(tmp_path / "out"), "--row-group-rows", "1000"]) == 0
    assert "3,000 rows" in capsys.readouterr().out
    converted = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    assert pq.ParquetFile(tmp_path / "out" / "part-00000.parquet").metadata.num_row_groups == 3
    original = pq.read_table(parquet)
    assert converted["label"].to_pylist() == original["label"].to_pylist()
    i5 = converted["I5"].to_numpy()
    expected = original["I5"].to_numpy(zero_copy_only=False).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(i5), np.isnan(expected))
    np.testing.assert_allclose(i5[~np.isnan(i5)], expected[~np.isnan(expected)], rtol=1e-6)
    c22 = original["C22"].to_pylist()
    assert converted["C22"].to_pylist() == [-1 if v is None else int(v, 16) for v in c22]


def test_udfs_agree_on_generated_and_converted_data(tsv_and_parquet, tmp_path) -> None:
    """The same rows as hex strings (generated Parquet) and as decoded ints (converted TSV)."""
    tsv, parquet = tsv_and_parquet
    convert_file(str(tsv), tmp_path / "c.parquet")
    strings = next(data.read_chunks([parquet], 3_000))
    decoded = next(data.read_chunks([tmp_path / "c.parquet"], 3_000))
    for udf in (pipelines.dlrm_standard(1000), pipelines.dlrm_heavy(strings, table_size=1000)):
        a, b = udf(strings), udf(decoded)
        np.testing.assert_array_equal(a["sparse"], b["sparse"])
        np.testing.assert_allclose(a["dense"], b["dense"], rtol=1e-6)
        np.testing.assert_array_equal(a["label"], b["label"])


def _corrupt(tmp_path, tsv, line_no: int, transform) -> str:
    lines = tsv.read_text().splitlines(keepends=True)
    lines[line_no - 1] = transform(lines[line_no - 1])
    bad = tmp_path / "bad.tsv"
    bad.write_text("".join(lines))
    return str(bad)


@pytest.mark.parametrize(
    ("transform", "problem"),
    [
        (lambda line: line.replace("\t", "\t\t", 1), "expected 40 tab-separated fields, got 41"),
        (
            lambda line: "\t".join(line.split("\t")[:20] + ["zzzzzzzz"] + line.split("\t")[21:]),
            "C7 = b'zzzzzzzz' is not 8 hex digits",
        ),
        (
            lambda line: "\t".join(line.split("\t")[:3] + ["1.5"] + line.split("\t")[4:]),
            "I3 = b'1.5' is not an integer",
        ),
    ],
)
def test_malformed_lines_are_named_by_file_and_line(tsv_and_parquet, tmp_path, transform, problem) -> None:
    tsv, _ = tsv_and_parquet
    bad = _corrupt(tmp_path, tsv, 1234, transform)
    with pytest.raises(Exception, match=rf"bad.tsv'? line 1234: {problem}") as info:
        convert_file(bad, tmp_path / "x.parquet")
    assert "bad.tsv" in str(info.value)
    rows = convert_file(bad, tmp_path / "y.parquet", on_error="skip")
    assert rows == 2_999  # skipped and counted instead


def test_missing_or_empty_inputs(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        input_files(str(tmp_path / "nope.tsv"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no files"):
        input_files(str(tmp_path / "empty"))


def test_parquet_without_the_criteo_columns_is_named(tmp_path) -> None:
    import pyarrow as pa

    pq.write_table(pa.table({"label": [1, 0], "I1": [1, 2]}), tmp_path / "thin.parquet")
    chunk = next(iter(Pipeline.from_parquet(str(tmp_path / "thin.parquet"))))
    with pytest.raises(KeyError, match=r"dlrm_standard: chunk lacks the Criteo columns \['I2'"):
        pipelines.dlrm_standard()(chunk)
    with pytest.raises(KeyError, match="lacks columns"):
        list(data.read_chunks([tmp_path / "thin.parquet"], columns=list(data.COLUMNS)))
