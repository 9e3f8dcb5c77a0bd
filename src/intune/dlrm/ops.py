"""Preprocessing operations of production DLRM pipelines, vectorised over chunks.

Owns the ops of Meta's ingestion study and TorchArrow's recommendation ops: FillNull, Cast, Clamp,
Log1p, Logit, BoxCox, Bucketize, Onehot, SigridHash, HexHash (modulo hashing of hex IDs), FirstX,
NGram, MapId and Cartesian, plus Stack and Compose to assemble them. Every op is a small picklable
callable ``chunk -> chunk`` (a chunk is ``dict[str, numpy.ndarray]`` of equal-length columns), so any
op or composition is a map UDF. Ops never modify their input arrays (they may be read-only shared
memory) and never loop over rows in Python.

Missing values: NaN in float columns, ``None`` in object columns, the empty string in fixed-width
string columns. A ragged list feature ``f`` is two columns, ``f.values`` and ``f.lengths``.
It must not know about pipelines, models or files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from intune.hashing import splitmix64

Chunk = dict[str, np.ndarray]
NGRAM_BASE = 1_000_003
"""Multiplier that folds consecutive IDs into one n-gram ID (before any hashing)."""

_HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i


def _column(chunk: Mapping[str, np.ndarray], name: str, op: str) -> np.ndarray:
    try:
        return np.asarray(chunk[name])
    except KeyError:
        raise KeyError(f"{op}: chunk has no column {name!r}; columns are {sorted(chunk)}") from None


def _names(columns: str | Sequence[str]) -> tuple[str, ...]:
    return (columns,) if isinstance(columns, str) else tuple(columns)


def missing_mask(values: np.ndarray) -> np.ndarray:
    """True where a value is missing (NaN, None or the empty string); all False for integers."""
    kind = values.dtype.kind
    if kind == "f":
        return np.isnan(values)
    if kind == "O":
        return np.equal(values, None) | np.equal(values, "") | np.equal(values, b"")
    if kind in "SU":
        return values == values.dtype.type()
    return np.zeros(values.shape, dtype=bool)


def hex_to_int(values: np.ndarray, column: str = "?") -> tuple[np.ndarray, np.ndarray]:
    """Hex ID strings (object, ``S`` or ``U`` arrays; up to 15 digits) to int64 and a missing mask.

    Works column-wise over digit positions, not row-wise. Integer input was decoded upstream and is
    returned as is, negative values (the Criteo reader's -1) marked missing. A non-hex character raises ``ValueError`` naming the column and row.
    """
    values = np.asarray(values)
    if values.dtype.kind in "iu":  # decoded upstream (the engine's Criteo reader: -1 = missing)
        ids = values.astype(np.int64, copy=False)
        return ids, ids < 0
    missing = missing_mask(values)
    if values.dtype.kind == "O":
        present = values[~missing]
        is_text = len(present) == 0 or isinstance(present[0], str)
        values = np.where(missing, "" if is_text else b"", values).astype("U" if is_text else "S")
    width = values.dtype.itemsize // (4 if values.dtype.kind == "U" else 1)
    if width > 15:
        raise ValueError(
            f"HexHash: column {column!r} has IDs of up to {width} characters; at most 15 fit in int64"
        )
    codes = values.view(np.uint32 if values.dtype.kind == "U" else np.uint8).reshape(len(values), width)
    result = np.zeros(len(values), dtype=np.int64)
    for pos in range(width):
        code = codes[:, pos]
        present = code != 0  # numpy pads short strings with NUL at the end
        digit = _HEX_LUT[np.minimum(code, 255)]
        bad = present & ((digit == 255) | (code > 255))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"HexHash: column {column!r} row {row}: {values[row].item()!r} is not a hex ID")
        result = np.where(present, result * 16 + digit, result)
    return result, missing


def _ragged(chunk: Mapping[str, np.ndarray], name: str, op: str) -> tuple[np.ndarray, np.ndarray]:
    values = _column(chunk, f"{name}.values", op)
    lengths = _column(chunk, f"{name}.lengths", op).astype(np.int64, copy=False)
    if lengths.sum() != len(values):
        raise ValueError(
            f"{op}: {name}.lengths sums to {int(lengths.sum())} but {name}.values has {len(values)}"
        )
    return values, lengths


def _row_starts(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)


@dataclass(frozen=True)
class FillNull:
    """Replace missing values by ``value`` (NaN in floats, None / empty string in string columns)."""

    columns: tuple[str, ...] | str
    value: float | str = 0

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        for name in _names(self.columns):
            x = _column(chunk, name, "FillNull")
            out[name] = np.where(
                missing_mask(x), np.asarray(self.value, dtype=x.dtype if x.dtype.kind != "O" else None), x
            )
        return out


@dataclass(frozen=True)
class Cast:
    """Convert to ``dtype``; refuses to turn missing floats into integers silently."""

    columns: tuple[str, ...] | str
    dtype: str = "float32"

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        target = np.dtype(self.dtype)
        for name in _names(self.columns):
            x = _column(chunk, name, "Cast")
            if target.kind in "iu" and x.dtype.kind == "f" and np.isnan(x).any():
                raise ValueError(
                    f"Cast: column {name!r} has missing values; apply FillNull before casting to {target}"
                )
            out[name] = x.astype(target)
        return out


@dataclass(frozen=True)
class Clamp:
    """Limit values to ``[min, max]`` (either bound may be None)."""

    columns: tuple[str, ...] | str
    min: float | None = None
    max: float | None = None

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        for name in _names(self.columns):
            out[name] = np.clip(_column(chunk, name, "Clamp"), self.min, self.max)
        return out


@dataclass(frozen=True)
class Log1p:
    """The DLRM reference transform of counts: negatives to 0, then log(x + 1), as float32."""

    columns: tuple[str, ...] | str

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        for name in _names(self.columns):
            x = _column(chunk, name, "Log1p").astype(np.float32)
            out[name] = np.log1p(np.maximum(x, np.float32(0)))
        return out


@dataclass(frozen=True)
class Logit:
    """log(p / (1 - p)) of probabilities, clipped to ``[eps, 1 - eps]`` first."""

    columns: tuple[str, ...] | str
    eps: float = 1e-6

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        for name in _names(self.columns):
            p = np.clip(_column(chunk, name, "Logit").astype(np.float64), self.eps, 1.0 - self.eps)
            out[name] = np.log(p / (1.0 - p)).astype(np.float32)
        return out


@dataclass(frozen=True)
class BoxCox:
    """(x ** lmbda - 1) / lmbda, or log(x) at lmbda = 0; x must be positive (add a shift first)."""

    columns: tuple[str, ...] | str
    lmbda: float

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        for name in _names(self.columns):
            x = _column(chunk, name, "BoxCox").astype(np.float64)
            if (x <= 0).any():
                row = int(np.flatnonzero(x <= 0)[0])
                raise ValueError(
                    f"BoxCox: column {name!r} row {row} is {x[row]}; Box-Cox needs positive values"
                )
            y = np.log(x) if self.lmbda == 0 else (x**self.lmbda - 1.0) / self.lmbda
            out[name] = y.astype(np.float32)
        return out


@dataclass(frozen=True)
class Bucketize:
    """Bin index: the number of ``borders`` <= x (so 0 .. len(borders)); NaN gets len(borders) + 1."""

    column: str
    borders: tuple[float, ...]
    out: str | None = None

    def __post_init__(self) -> None:
        b = np.asarray(self.borders, dtype=np.float64)
        if b.ndim != 1 or (np.diff(b) <= 0).any():
            raise ValueError(
                f"Bucketize {self.column!r}: borders must be strictly increasing, got {self.borders}"
            )

    @property
    def num_buckets(self) -> int:
        return len(self.borders) + 2

    def __call__(self, chunk: Chunk) -> Chunk:
        x = _column(chunk, self.column, "Bucketize").astype(np.float64)
        idx = np.searchsorted(np.asarray(self.borders, dtype=np.float64), x, side="right")
        idx[np.isnan(x)] = len(self.borders) + 1
        return {**chunk, self.out or self.column: idx.astype(np.int64)}


@dataclass(frozen=True)
class Onehot:
    """Class IDs in ``[0, num_classes)`` to a ``(rows, num_classes)`` float32 one-hot matrix."""

    column: str
    num_classes: int
    out: str | None = None

    def __call__(self, chunk: Chunk) -> Chunk:
        ids = _column(chunk, self.column, "Onehot").astype(np.int64)
        bad = (ids < 0) | (ids >= self.num_classes)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"Onehot: column {self.column!r} row {row} is {ids[row]}, outside [0, {self.num_classes})"
            )
        onehot = np.zeros((len(ids), self.num_classes), dtype=np.float32)
        onehot[np.arange(len(ids)), ids] = 1.0
        return {**chunk, self.out or self.column: onehot}


@dataclass(frozen=True)
class SigridHash:
    """Salted hash of integer IDs modulo ``max_value`` (Meta's SigridHash): splitmix64(x + salt) % max."""

    columns: tuple[str, ...] | str
    salt: int
    max_value: int

    def __call__(self, chunk: Chunk) -> Chunk:
        if self.max_value <= 0:
            raise ValueError(f"SigridHash: max_value must be positive, got {self.max_value}")
        out = dict(chunk)
        for name in _names(self.columns):
            ids = _column(chunk, name, "SigridHash")
            out[name] = (splitmix64(ids, self.salt) % np.uint64(self.max_value)).astype(np.int64)
        return out


@dataclass(frozen=True)
class HexHash:
    """The DLRM reference for Criteo categoricals: int(hex, 16) % table_size, missing as 0."""

    columns: tuple[str, ...] | str
    table_size: int

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        for name in _names(self.columns):
            ids, missing = hex_to_int(_column(chunk, name, "HexHash"), name)
            out[name] = np.where(missing, 0, ids % self.table_size)
        return out


@dataclass(frozen=True)
class FirstX:
    """Keep the first ``x`` items of each list of a ragged feature."""

    column: str
    x: int

    def __call__(self, chunk: Chunk) -> Chunk:
        values, lengths = _ragged(chunk, self.column, "FirstX")
        kept = np.minimum(lengths, self.x)
        position = np.arange(len(values)) - np.repeat(_row_starts(lengths), lengths)
        keep = position < np.repeat(kept, lengths)
        return {**chunk, f"{self.column}.values": values[keep], f"{self.column}.lengths": kept}


@dataclass(frozen=True)
class NGram:
    """IDs of the length-``n`` windows of each list: sum of id_k * NGRAM_BASE ** (n - 1 - k), int64."""

    column: str
    n: int
    out: str | None = None

    def __call__(self, chunk: Chunk) -> Chunk:
        values, lengths = _ragged(chunk, self.column, "NGram")
        values = values.astype(np.int64)
        out_lengths = np.maximum(lengths - self.n + 1, 0)
        # window starts: every position whose window fits inside its own list
        starts = np.repeat(_row_starts(lengths), out_lengths) + (
            np.arange(int(out_lengths.sum())) - np.repeat(_row_starts(out_lengths), out_lengths)
        )
        grams = np.zeros(len(starts), dtype=np.int64)
        with np.errstate(over="ignore"):
            for k in range(self.n):
                grams = grams * NGRAM_BASE + values[starts + k]
        name = self.out or f"{self.column}_ngram{self.n}"
        return {**chunk, f"{name}.values": grams, f"{name}.lengths": out_lengths}


@dataclass(frozen=True)
class MapId:
    """Map raw IDs to dense IDs through a vocabulary; unknown IDs get ``default``."""

    column: str
    vocabulary: Mapping[int, int] = field(hash=False)
    default: int = 0
    out: str | None = None

    def __post_init__(self) -> None:
        keys = np.fromiter(self.vocabulary.keys(), dtype=np.int64, count=len(self.vocabulary))
        vals = np.fromiter(self.vocabulary.values(), dtype=np.int64, count=len(self.vocabulary))
        order = np.argsort(keys)
        object.__setattr__(self, "_keys", keys[order])
        object.__setattr__(self, "_values", vals[order])

    def __call__(self, chunk: Chunk) -> Chunk:
        ids = _column(chunk, self.column, "MapId").astype(np.int64)
        keys, vals = self._keys, self._values  # type: ignore[attr-defined]
        if len(keys) == 0:
            return {**chunk, self.out or self.column: np.full(len(ids), self.default, dtype=np.int64)}
        pos = np.minimum(np.searchsorted(keys, ids), len(keys) - 1)
        found = keys[pos] == ids
        return {**chunk, self.out or self.column: np.where(found, vals[pos], self.default)}


@dataclass(frozen=True)
class Cartesian:
    """Feature cross of two ID features: a * NGRAM_BASE + b per pair, optionally mod ``table_size``.

    Scalar columns give one cross per row; ragged features (``a.values``/``a.lengths``) give every
    pair of the two lists of a row, in row-major order (all b for the first a, then the next a).
    """

    a: str
    b: str
    out: str
    table_size: int | None = None

    def __call__(self, chunk: Chunk) -> Chunk:
        if self.a in chunk and self.b in chunk:
            a = _column(chunk, self.a, "Cartesian").astype(np.int64)
            b = _column(chunk, self.b, "Cartesian").astype(np.int64)
            return {**chunk, self.out: self._fold(a * NGRAM_BASE + b)}
        av, al = _ragged(chunk, self.a, "Cartesian")
        bv, bl = _ragged(chunk, self.b, "Cartesian")
        if len(al) != len(bl):
            raise ValueError(f"Cartesian: {self.a!r} has {len(al)} rows but {self.b!r} has {len(bl)}")
        out_lengths = al * bl
        # for each a item, repeat it len(b of its row) times; pair it with that row's b list
        a_rows = np.repeat(np.arange(len(al)), al)
        a_rep = np.repeat(av.astype(np.int64), bl[a_rows])
        b_start = np.repeat(_row_starts(bl)[a_rows], bl[a_rows])
        offset = np.arange(len(a_rep)) - np.repeat(_row_starts(bl[a_rows]), bl[a_rows])
        b_rep = bv.astype(np.int64)[b_start + offset]
        return {
            **chunk,
            f"{self.out}.values": self._fold(a_rep * NGRAM_BASE + b_rep),
            f"{self.out}.lengths": out_lengths,
        }

    def _fold(self, crossed: np.ndarray) -> np.ndarray:
        return crossed % self.table_size if self.table_size else crossed


@dataclass(frozen=True)
class Stack:
    """Columns side by side as one ``(rows, len(columns))`` matrix called ``out`` (inputs dropped)."""

    columns: tuple[str, ...]
    out: str
    dtype: str = "float32"

    def __call__(self, chunk: Chunk) -> Chunk:
        first = _column(chunk, self.columns[0], "Stack")
        matrix = np.empty((len(first), len(self.columns)), dtype=self.dtype)
        for j, name in enumerate(self.columns):
            matrix[:, j] = _column(chunk, name, "Stack")
        rest = {k: v for k, v in chunk.items() if k not in self.columns}
        return {**rest, self.out: matrix}


@dataclass(frozen=True)
class Compose:
    """Apply ops in order: the whole composition is itself a map UDF."""

    ops: tuple[Callable[[Chunk], Chunk], ...]

    def __call__(self, chunk: Chunk) -> Chunk:
        for op in self.ops:
            chunk = op(chunk)
        return chunk


def build_vocabulary(ids: np.ndarray, top: int, start: int = 1) -> dict[int, int]:
    """The ``top`` most frequent IDs mapped to ``start, start + 1, ...`` by falling frequency (ties by ID)."""
    uniq, counts = np.unique(np.asarray(ids, dtype=np.int64), return_counts=True)
    order = np.lexsort((uniq, -counts))[:top]
    return {int(u): start + i for i, u in enumerate(uniq[order])}
