"""Synthetic click logs in the Criteo schema, with a hidden ground-truth model behind the labels.

Owns the schema (``label``, ``I1..I13``, ``C1..C26``), the published Criteo Kaggle cardinalities, and a
deterministic, vectorised generator that writes Parquet (row groups sized for parallel reads) or the
raw Criteo TSV layout. Real Criteo rows may not be redistributed, so tests and benchmarks use these.

What the data looks like, and why:
- ``I1..I13``: integer counts with heavy tails (log-normal), per-feature missing rates close to the
  Kaggle set, and occasional negatives in ``I2`` (the real set has -1..-3 there).
- ``C1..C26``: 8-hex-digit hashes. Each feature draws a Zipf-like rank in ``[0, cardinality)``; the
  rank goes through a bijective 32-bit mix salted per feature, so distinct ranks give distinct hashes.
- ``label``: Bernoulli(sigmoid(logit)) where the logit is a fixed hidden model of the dense features
  (log scale) and of per-category effects on a few categorical features, with an intercept calibrated
  for a click rate near 25%. The hidden model does not depend on the data seed, so a held-out set
  generated with another seed is the same task.

It must not know about pipelines, preprocessing or models.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
LABEL = "label"
DENSE_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
SPARSE_COLUMNS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
COLUMNS: tuple[str, ...] = (LABEL, *DENSE_COLUMNS, *SPARSE_COLUMNS)

# Approximate per-feature statistics of the Kaggle set: missing rates, and the log1p-scale location and
# spread of the counts (I5 runs to the millions, I9 in the hundreds, I12 is mostly missing).
DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0005, 0.04, 0.45, 0.04, 0.77, 0.22)
DENSE_LOG_MEAN = (0.8, 2.0, 1.9, 1.8, 7.5, 3.5, 1.5, 2.4, 3.6, 0.5, 1.1, 0.4, 1.8)
DENSE_LOG_STD = (1.0, 1.5, 1.3, 1.0, 2.0, 1.5, 1.3, 1.1, 1.4, 0.6, 0.9, 0.8, 1.1)
SPARSE_MISSING = (
    0.0, 0.0, 0.034, 0.034, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.034, 0.0,
    0.0, 0.0, 0.034, 0.0, 0.0, 0.44, 0.44, 0.034, 0.76, 0.0, 0.034, 0.44, 0.44,
)  # fmt: skip
NEGATIVE_I2_RATE = 0.04
ZIPF_EXPONENT = 1.1
TARGET_CLICK_RATE = 0.25
ROW_GROUP_ROWS = 65_536
"""Rows per Parquet row group: a chunk that one read worker decodes in a few tens of milliseconds."""
ROWS_PER_FILE = 262_144
"""Rows per Parquet file, so that even a small data set has several files to read in parallel."""

_TRUTH_SEED = 20_230_828  # the hidden model is fixed: independent of the data seed
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_SHIFTS = np.arange(28, -1, -4, dtype=np.uint32)


@dataclass(frozen=True)
class GroundTruth:
    """The hidden model behind the labels (exposed so tests can check that it is learnable)."""

    dense_weight: np.ndarray  # (13,) per standardised log-count
    dense_missing_effect: np.ndarray  # (13,) added when the count is missing
    sparse_scale: np.ndarray  # (26,) spread of the per-category effects; 0 = no signal
    intercept: float


def category_hash(feature: int, ranks: np.ndarray) -> np.ndarray:
    """Bijective 32-bit mix of category ranks, salted by the feature index (0-based): the raw ID."""
    x = ranks.astype(np.uint32) + np.uint32((feature * 0x9E3779B9 + 0x7F4A7C15) & 0xFFFFFFFF)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    return x


def hex_strings(ids: np.ndarray) -> np.ndarray:
    """uint32 IDs as an ``(n, 8)`` uint8 array of lowercase hex digits (no Python loop)."""
    nibbles = (ids.astype(np.uint32)[:, None] >> _SHIFTS) & np.uint32(0xF)
    return _HEX[nibbles]


def zipf_ranks(
    rng: np.random.Generator, n: int, cardinality: int, exponent: float = ZIPF_EXPONENT
) -> np.ndarray:
    """Ranks in ``[0, cardinality)`` with P(rank r) roughly proportional to (r + 1) ** -exponent.

    Inverse CDF of the continuous power law on ``[1, cardinality + 1)``, floored: exact enough for
    the shape and a single vectorised expression.
    """
    u = rng.random(n)
    a = 1.0 - exponent
    top = (cardinality + 1.0) ** a
    x = (1.0 + u * (top - 1.0)) ** (1.0 / a)
    return np.minimum(np.floor(x).astype(np.int64) - 1, cardinality - 1)


def _category_effect(feature: int, ranks: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random effect in about [-1.7, 1.7] (unit variance) per (feature, rank)."""
    h = category_hash(feature + 101, ranks)
    return (h.astype(np.float64) / 2.0**32 - 0.5) * np.sqrt(12.0)


def _check_cardinalities(cardinalities: Sequence[int]) -> tuple[int, ...]:
    cards = tuple(int(c) for c in cardinalities)
    if len(cards) != 26 or min(cards) < 1:
        raise ValueError(f"need 26 positive cardinalities (C1..C26), got {len(cards)}: {cards}")
    return cards


def ground_truth(cardinalities: Sequence[int] = KAGGLE_CARDINALITIES) -> GroundTruth:
    """The hidden model for these cardinalities, with its intercept calibrated on a pilot sample."""
    return _ground_truth(_check_cardinalities(cardinalities))


@functools.lru_cache(maxsize=8)
def _ground_truth(cardinalities: tuple[int, ...]) -> GroundTruth:
    rng = np.random.default_rng(_TRUTH_SEED)
    dense_weight = rng.normal(0.0, 0.35, 13)
    dense_missing_effect = rng.normal(0.0, 0.3, 13)
    sparse_scale = np.zeros(26)
    signal = rng.choice(26, size=10, replace=False)
    sparse_scale[signal] = rng.uniform(0.3, 0.8, size=10)
    truth = GroundTruth(dense_weight, dense_missing_effect, sparse_scale, 0.0)
    pilot = _generate_features(np.random.default_rng(_TRUTH_SEED + 1), 100_000, tuple(cardinalities))
    logit = _logit(truth, *pilot)
    lo, hi = -10.0, 10.0
    for _ in range(60):  # bisection on the intercept for the target click rate
        mid = (lo + hi) / 2
        rate = float(np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))))
        lo, hi = (mid, hi) if rate < TARGET_CLICK_RATE else (lo, mid)
    return GroundTruth(dense_weight, dense_missing_effect, sparse_scale, (lo + hi) / 2)


def _generate_features(
    rng: np.random.Generator, n: int, cardinalities: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Dense counts (n, 13) int64 and their missing mask; sparse ranks (n, 26) and their missing mask."""
    mean = np.asarray(DENSE_LOG_MEAN)
    std = np.asarray(DENSE_LOG_STD)
    dense = np.floor(np.expm1(np.maximum(rng.normal(mean, std, (n, 13)), 0.0))).astype(np.int64)
    negative = rng.random(n) < NEGATIVE_I2_RATE
    dense[negative, 1] = -rng.integers(1, 4, int(negative.sum()))
    dense_missing = rng.random((n, 13)) < np.asarray(DENSE_MISSING)
    ranks = np.empty((n, 26), dtype=np.int64)
    for f, card in enumerate(cardinalities):
        ranks[:, f] = zipf_ranks(rng, n, card)
    sparse_missing = rng.random((n, 26)) < np.asarray(SPARSE_MISSING)
    return dense, dense_missing, ranks, sparse_missing


def _logit(truth: GroundTruth, dense: np.ndarray, dense_missing: np.ndarray, ranks=None, sparse_missing=None):
    z = (np.log1p(np.maximum(dense, 0)) - np.asarray(DENSE_LOG_MEAN)) / np.asarray(DENSE_LOG_STD)
    logit = np.where(dense_missing, truth.dense_missing_effect, z * truth.dense_weight).sum(axis=1)
    if ranks is not None:
        for f in np.flatnonzero(truth.sparse_scale):
            effect = truth.sparse_scale[f] * _category_effect(int(f), ranks[:, f])
            logit += np.where(sparse_missing[:, f], 0.0, effect)
    return logit + truth.intercept


def generate_chunk(
    seed: int,
    index: int,
    rows: int,
    cardinalities: Sequence[int] = KAGGLE_CARDINALITIES,
    truth: GroundTruth | None = None,
) -> pa.Table:
    """Chunk ``index`` of the data set with ``seed``: the same rows whatever the chunking around it."""
    cards = _check_cardinalities(cardinalities)
    truth = truth or ground_truth(cards)
    rng = np.random.default_rng([seed, index])
    dense, dense_missing, ranks, sparse_missing = _generate_features(rng, rows, cards)
    logit = _logit(truth, dense, dense_missing, ranks, sparse_missing)
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int32)
    columns: dict[str, pa.Array] = {LABEL: pa.array(label)}
    for j, name in enumerate(DENSE_COLUMNS):
        columns[name] = pa.array(dense[:, j].astype(np.int32), mask=dense_missing[:, j])
    offsets = pa.py_buffer(np.arange(0, 8 * rows + 1, 8, dtype=np.int32))
    for f, name in enumerate(SPARSE_COLUMNS):
        chars = hex_strings(category_hash(f, ranks[:, f]))
        validity = pa.array(~sparse_missing[:, f]).buffers()[1] if sparse_missing[:, f].any() else None
        columns[name] = pa.Array.from_buffers(pa.string(), rows, [validity, offsets, pa.py_buffer(chars)])
    return pa.table(columns)


def iter_chunks(
    rows: int,
    seed: int = 0,
    chunk_rows: int = ROW_GROUP_ROWS,
    cardinalities: Sequence[int] = KAGGLE_CARDINALITIES,
) -> Iterator[pa.Table]:
    """The data set as Arrow tables of ``chunk_rows`` rows (the last one shorter)."""
    if rows < 0 or chunk_rows <= 0:
        raise ValueError(f"rows must be >= 0 and chunk_rows > 0, got rows={rows}, chunk_rows={chunk_rows}")
    truth = ground_truth(cardinalities)
    for index, start in enumerate(range(0, rows, chunk_rows)):
        yield generate_chunk(seed, index, min(chunk_rows, rows - start), cardinalities, truth)


def generate(
    rows: int,
    out: str | os.PathLike[str],
    fmt: str = "parquet",
    seed: int = 0,
    rows_per_file: int = ROWS_PER_FILE,
    row_group_rows: int = ROW_GROUP_ROWS,
    cardinalities: Sequence[int] = KAGGLE_CARDINALITIES,
) -> list[Path]:
    """Write ``rows`` rows under ``out`` as ``part-NNNNN.parquet`` (or ``.tsv``) files; return them.

    Existing ``part-*`` files of the same format in ``out`` are replaced, never mixed in.

    The rows depend only on ``seed`` (and the cardinalities), never on the file or row-group sizes.
    """
    if fmt not in ("parquet", "tsv"):
        raise ValueError(f"format must be 'parquet' or 'tsv', got {fmt!r}")
    if rows <= 0:
        raise ValueError(f"rows must be positive, got {rows}")
    if rows_per_file <= 0 or row_group_rows <= 0:
        raise ValueError(
            f"rows_per_file and row_group_rows must be positive, got {rows_per_file}, {row_group_rows}"
        )
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(f"part-*.{fmt}"):  # a previous, larger data set must not mix in
        stale.unlink()
    stream = _RowStream(iter_chunks(rows, seed, GENERATION_BLOCK_ROWS, cardinalities))
    paths: list[Path] = []
    for first in range(0, rows, rows_per_file):
        path = out_dir / f"part-{len(paths):05d}.{fmt}"
        paths.append(path)
        in_file = min(rows_per_file, rows - first)
        writer = None
        try:
            for lo in range(0, in_file, row_group_rows):
                group = stream.take(min(row_group_rows, in_file - lo))
                writer = writer or _open_writer(path, fmt, group.schema)
                writer.write(group)  # one call per row group
        finally:
            if writer is not None:
                writer.close()
    return paths


GENERATION_BLOCK_ROWS = 16_384
"""Rows generated per random-number block: the unit of determinism, independent of the file layout."""


class _RowStream:
    """Hands out tables of exactly ``n`` rows from a stream of generated blocks."""

    def __init__(self, blocks: Iterator[pa.Table]) -> None:
        self._blocks = blocks
        self._head: pa.Table | None = None

    def take(self, n: int) -> pa.Table:
        parts: list[pa.Table] = []
        while n > 0:
            if self._head is None or self._head.num_rows == 0:
                self._head = next(self._blocks)
            part = self._head.slice(0, n)
            self._head = self._head.slice(part.num_rows)
            parts.append(part)
            n -= part.num_rows
        return pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]


class _TsvWriter:
    """The raw Criteo layout: tab-separated, no header, empty field for a missing value."""

    def __init__(self, path: Path) -> None:
        import pyarrow.csv as pcsv

        self._file = open(path, "wb")
        self._pcsv = pcsv
        self._options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")

    def write(self, table: pa.Table) -> None:
        self._pcsv.write_csv(table, self._file, self._options)

    def close(self) -> None:
        self._file.close()


def _open_writer(path: Path, fmt: str, schema: pa.Schema):
    if fmt == "tsv":
        return _TsvWriter(path)
    import pyarrow.parquet as pq

    # dictionary encoding pays off for the Zipf-distributed low-cardinality columns and costs little
    return pq.ParquetWriter(path, schema, compression="snappy", use_dictionary=True)


def data_files(directory: str | os.PathLike[str], fmt: str = "parquet") -> list[Path]:
    """The data files of a generated (or converted) directory, in order; a clear error if none."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"data directory {str(d)!r} does not exist")
    files = sorted(p for p in d.iterdir() if p.suffix == f".{fmt}" and p.is_file())
    if not files:
        raise FileNotFoundError(f"data directory {str(d)!r} holds no .{fmt} files")
    return files


def read_chunks(
    paths: Sequence[str | os.PathLike[str]], chunk_rows: int = 8192, columns: Sequence[str] | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Plain sequential chunks of Parquet files (for held-out sets and baselines outside the engine).

    Same conversion as a user would write: ``pyarrow`` record batches to numpy, nulls as NaN in
    counts and ``None`` in strings. Names the file and the missing columns on bad input.
    """
    import pyarrow.parquet as pq

    if not paths:
        raise FileNotFoundError("read_chunks: no Parquet files given")
    for path in paths:
        try:
            reader = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for missing or corrupt files
            raise ValueError(f"cannot read Parquet file {str(path)!r}: {exc}") from exc
        if columns is not None:
            absent = [c for c in columns if c not in reader.schema_arrow.names]
            if absent:
                raise KeyError(
                    f"Parquet file {str(path)!r} lacks columns {absent}; it has {reader.schema_arrow.names}"
                )
        for batch in reader.iter_batches(batch_size=chunk_rows, columns=list(columns) if columns else None):
            yield {
                name: batch.column(i).to_numpy(zero_copy_only=False)
                for i, name in enumerate(batch.schema.names)
            }
