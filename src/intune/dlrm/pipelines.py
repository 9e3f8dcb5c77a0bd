"""Two ready preprocessing UDFs for Criteo-format chunks: ``dlrm_standard`` and ``dlrm_heavy``.

Both take a chunk with ``label``, ``I1..I13`` and ``C1..C26`` as the engine's readers give them:
counts as integers or floats with NaN for missing; IDs as hex strings (object, ``S`` or ``U`` arrays,
None or empty for missing: the generated Parquet) or as decoded int64 with -1 for missing (the Criteo
TSV reader and Parquet converted from it). They return the model's input: ``dense`` (rows, 13)
float32, ``sparse`` (rows, features) int64 indices inside each table, and ``label`` float32.

- ``dlrm_standard``: the DLRM reference preprocessing, vectorised (missing counts to 0, negatives to
  0, log(x + 1); hex IDs modulo the table size). Cheap: the reader dominates.
- ``dlrm_heavy``: a production-like UDF that works row by row in Python, as the UDFs of the paper's
  pipelines do: it parses each hex ID, looks it up in a per-feature vocabulary dict (frequent IDs get
  their own rows, the rest share hashed rows), parses the counts, and builds feature crosses. It holds
  the GIL, so only process workers scale it, and it dominates the pipeline's CPU time.

The UDFs are picklable objects (not closures) so process workers receive them cheaply. This module must
not read files or build pipelines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from intune.dlrm.data import DENSE_COLUMNS, KAGGLE_CARDINALITIES, LABEL, SPARSE_COLUMNS
from intune.dlrm.ops import Compose, FillNull, HexHash, Log1p, Stack, build_vocabulary, hex_to_int

DEFAULT_TABLE_SIZE = 100_000
"""Rows per embedding table at most: larger cardinalities are hashed down to this."""
DEFAULT_CROSSES: tuple[tuple[int, int], ...] = ((0, 1), (4, 8), (5, 13), (16, 19), (22, 25))
"""Pairs of categorical features (0-based, C1 = 0) that ``dlrm_heavy`` crosses."""


def table_sizes(
    table_size: int = DEFAULT_TABLE_SIZE, cardinalities: Sequence[int] = KAGGLE_CARDINALITIES
) -> list[int]:
    """Rows of each embedding table: the feature's cardinality, capped by hashing at ``table_size``."""
    if table_size < 2:
        raise ValueError(f"table_size must be >= 2, got {table_size}")
    return [min(int(c), table_size) for c in cardinalities]


def _require(chunk: Mapping[str, np.ndarray], where: str) -> None:
    missing = [c for c in (LABEL, *DENSE_COLUMNS, *SPARSE_COLUMNS) if c not in chunk]
    if missing:
        raise KeyError(f"{where}: chunk lacks the Criteo columns {missing}; it has {sorted(chunk)}")


@dataclass(frozen=True)
class DlrmStandard:
    """The DLRM reference preprocessing as a chunk -> chunk UDF (vectorised)."""

    table_size: int = DEFAULT_TABLE_SIZE

    @property
    def sparse_sizes(self) -> list[int]:
        return table_sizes(self.table_size)

    def __call__(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        _require(chunk, "dlrm_standard")
        dense = Compose((FillNull(DENSE_COLUMNS, 0), Log1p(DENSE_COLUMNS), Stack(DENSE_COLUMNS, "dense")))(
            {c: chunk[c] for c in DENSE_COLUMNS}
        )["dense"]
        sparse = np.empty((len(dense), len(SPARSE_COLUMNS)), dtype=np.int64)
        for f, (name, size) in enumerate(zip(SPARSE_COLUMNS, self.sparse_sizes, strict=True)):
            sparse[:, f] = HexHash(name, size)({name: chunk[name]})[name]
        label = np.asarray(chunk[LABEL], dtype=np.float32)
        return {"dense": dense, "sparse": sparse, LABEL: label}


@dataclass(frozen=True)
class DlrmHeavy:
    """Row-by-row Python preprocessing: vocabulary lookups, hex and count parsing, feature crosses.

    Index layout per feature: 0 = missing, 1..len(vocab) = frequent IDs, the rest = hashed IDs.
    """

    table_size: int = DEFAULT_TABLE_SIZE
    vocabularies: tuple[Mapping[int, int], ...] = field(default=(), repr=False)
    crosses: tuple[tuple[int, int], ...] = DEFAULT_CROSSES

    @property
    def sparse_sizes(self) -> list[int]:
        return table_sizes(self.table_size) + [self.table_size] * len(self.crosses)

    def __call__(self, chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        _require(chunk, "dlrm_heavy")
        n = len(chunk[LABEL])
        sizes = table_sizes(self.table_size)
        vocabs = list(self.vocabularies) or [{} for _ in SPARSE_COLUMNS]
        # hashed IDs share the rows after the vocabulary; keep at least one such row
        hashed_base = [min(len(v) + 1, s - 1) for v, s in zip(vocabs, sizes, strict=True)]
        hashed_rows = [s - b for s, b in zip(sizes, hashed_base, strict=True)]
        dense_cols = [np.asarray(chunk[c]).tolist() for c in DENSE_COLUMNS]
        sparse_cols = [np.asarray(chunk[c]).tolist() for c in SPARSE_COLUMNS]
        is_text = [np.asarray(chunk[c]).dtype.kind not in "iu" for c in SPARSE_COLUMNS]
        crosses = self.crosses
        cross_size = self.table_size
        log1p = math.log1p
        dense_rows: list[list[float]] = []
        sparse_rows: list[list[int]] = []
        for i in range(n):
            counts = []
            for col in dense_cols:
                v = col[i]
                if v is None or v != v or v <= 0:  # missing (None / NaN) or negative count
                    counts.append(0.0)
                else:
                    counts.append(log1p(v))
            ids = []
            for f, col in enumerate(sparse_cols):
                value = col[i]
                if is_text[f]:
                    if not value:  # None or empty: missing
                        ids.append(0)
                        continue
                    raw = int(value, 16)  # parse the hex ID
                elif value < 0:  # already decoded by the reader; -1 = missing
                    ids.append(0)
                    continue
                else:
                    raw = value
                known = vocabs[f].get(raw)
                ids.append(known if known is not None else hashed_base[f] + raw % hashed_rows[f])
            for a, b in crosses:
                ids.append(hash((ids[a], ids[b])) % cross_size)
            dense_rows.append(counts)
            sparse_rows.append(ids)
        width = len(SPARSE_COLUMNS) + len(crosses)
        dense = np.array(dense_rows, dtype=np.float32).reshape(n, len(DENSE_COLUMNS))
        sparse = np.array(sparse_rows, dtype=np.int64).reshape(n, width)
        return {"dense": dense, "sparse": sparse, LABEL: np.asarray(chunk[LABEL], dtype=np.float32)}


def dlrm_standard(table_size: int = DEFAULT_TABLE_SIZE) -> DlrmStandard:
    """The DLRM reference preprocessing UDF."""
    table_sizes(table_size)
    return DlrmStandard(table_size)


def dlrm_heavy(
    sample: Mapping[str, np.ndarray] | None = None,
    table_size: int = DEFAULT_TABLE_SIZE,
    vocabulary_size: int = 10_000,
    crosses: Sequence[tuple[int, int]] = DEFAULT_CROSSES,
) -> DlrmHeavy:
    """The row-by-row production-like UDF; vocabularies of the most frequent IDs come from ``sample``.

    Without a sample every ID is hashed (the vocabularies are empty), which is correct but learns less.
    """
    sizes = table_sizes(table_size)
    for a, b in crosses:
        if not (0 <= a < len(SPARSE_COLUMNS) and 0 <= b < len(SPARSE_COLUMNS)):
            raise ValueError(f"dlrm_heavy: cross {(a, b)} names a feature outside C1..C26 (0-based 0..25)")
    vocabs: tuple[Mapping[int, int], ...] = ()
    if sample is not None:
        built = []
        for name, size in zip(SPARSE_COLUMNS, sizes, strict=True):
            if name not in sample:
                raise KeyError(f"dlrm_heavy: the vocabulary sample lacks column {name!r}")
            ids, missing = hex_to_int(np.asarray(sample[name]), name)
            # the vocabulary may fill the table except row 0 (missing) and one hashed row
            built.append(build_vocabulary(ids[~missing], min(vocabulary_size, size - 2), start=1))
        vocabs = tuple(built)
    return DlrmHeavy(table_size, vocabs, tuple(tuple(c) for c in crosses))
