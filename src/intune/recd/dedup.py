"""The dedup transform: a batch chunk in, a chunk carrying one IKJT per feature group out.

For each group (e.g. ``{"user": ["user_id", "user_clicks", "user_history"]}``) the rows whose values
are identical in every column of the group are found (hash, then an exact check), the group's columns
are replaced by the unique rows and an inverse index (encoding in ``ikjt.py``), and the other columns
pass through. ``GroupUDF`` then runs a group's preprocessing on the unique rows only when the chunk
is deduplicated, and on every row when it is not, so the same pipeline code serves both; that is where
the preprocessing saving comes from. This module must not shuffle, batch or read files.

In the engine: ``pipe.batch(n).map(dedup_transform(groups)).map(GroupUDF("user", cols, fn))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from intune.hashing import column_bits, mix64
from intune.recd._chunks import ranges
from intune.recd.ikjt import IKJT, INVERSE, UNIQUE, gather_jagged

Chunk = dict[str, np.ndarray]


def resolve_columns(chunk: Mapping[str, np.ndarray], group: str, columns: Sequence[str]) -> list[str]:
    """The group's keys: a jagged feature may be named ``x``, ``x.values`` or ``x.lengths``.

    A name that matches nothing in the chunk is a ``ValueError`` naming it and the group.
    """
    keys: list[str] = []
    for name in columns:
        base = name
        if name.endswith((".values", ".lengths")):
            stem = name.rsplit(".", 1)[0]
            if stem + ".values" in chunk and stem + ".lengths" in chunk:
                base = stem
        if base in chunk or (base + ".values" in chunk and base + ".lengths" in chunk):
            if base not in keys:
                keys.append(base)
            continue
        available = sorted({c[: -len(".values")] if c.endswith(".values") else c for c in chunk
                            if not c.endswith(".lengths")})
        raise ValueError(f"dedup group {group!r} names column {name!r}, which is not in the batch; "
                         f"columns: {available}")
    return keys


def _is_jagged(chunk: Mapping[str, np.ndarray], key: str) -> bool:
    return key not in chunk and key + ".values" in chunk


def row_keys(chunk: Mapping[str, np.ndarray], keys: Sequence[str], lists: bool = True) -> np.ndarray:
    """A uint64 hash per row over the group's columns (equal rows hash equal; collisions are checked).

    ``lists=False`` hashes only the lengths of jagged columns: a cheap first pass that already tells
    distinct rows apart in most batches (see ``find_unique_rows``).
    """
    n = _num_rows(chunk, keys)
    h = np.full(n, 0x243F6A8885A308D3, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    for salt, key in enumerate(keys, start=1):
        if _is_jagged(chunk, key):
            lengths = chunk[key + ".lengths"].astype(np.int64)
            col = lengths.view(np.uint64)
            if lists:
                values = chunk[key + ".values"]
                ends = np.cumsum(lengths)
                starts = ends - lengths
                position = np.arange(values.shape[0], dtype=np.int64) - np.repeat(starts, lengths)
                elem = mix64(column_bits(values) ^ mix64(position, salt), salt)
                summed = np.concatenate([[np.uint64(0)], np.cumsum(elem, dtype=np.uint64)])
                col = col ^ (summed[ends] - summed[starts])
        else:
            col = column_bits(chunk[key])
            if col.ndim > 1:  # a fixed-width vector per row: fold its words into one
                words = col.reshape(n, -1)
                col = words[:, 0].copy()
                for j in range(1, words.shape[1]):
                    col = (col * prime) ^ words[:, j]
        np.multiply(h, prime, out=h)  # word-wise FNV-style combine; one avalanche at the end
        np.bitwise_xor(h, col, out=h)
    return mix64(h)


def _num_rows(chunk: Mapping[str, np.ndarray], keys: Sequence[str]) -> int:
    key = keys[0]
    return int(chunk[key + ".lengths"].shape[0] if _is_jagged(chunk, key) else chunk[key].shape[0])


def _same_values(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise "the same stored value": integers directly, anything else by its bits."""
    if x.dtype.kind in "iub":
        return x == y
    return column_bits(x) == column_bits(y)


def _rows_equal(chunk: Mapping[str, np.ndarray], keys: Sequence[str], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact per-row equality of rows ``a[i]`` and ``b[i]`` over the group's columns."""
    same = np.ones(a.size, dtype=bool)
    for key in keys:
        if _is_jagged(chunk, key):
            values, lengths = chunk[key + ".values"], chunk[key + ".lengths"]
            same &= lengths[a] == lengths[b]
            offsets = np.zeros(lengths.size + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            rows = np.flatnonzero(same)
            n = lengths[a[rows]]
            differ = ~_same_values(values[ranges(offsets[a[rows]], n)], values[ranges(offsets[b[rows]], n)])
            if differ.any():
                same[np.unique(np.repeat(rows, n)[differ])] = False
        else:
            col = chunk[key]
            same &= _same_values(col[a], col[b]).reshape(a.size, -1).all(axis=1)
    return same


def _group_by_hash(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct hash in order of first appearance, inverse index per row).

    One stable argsort; a batch whose hashes are all distinct returns at once (the common case
    where nothing repeats costs a sort and a compare).
    """
    n = hashes.shape[0]
    order = np.argsort(hashes, kind="stable")  # equal hashes keep row order: a group's first is its min
    ordered = hashes[order]
    starts_group = np.empty(n, dtype=bool)
    starts_group[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts_group[1:])
    if starts_group.all():
        everyone = np.arange(n, dtype=np.int64)
        return everyone, everyone
    group_of_sorted = np.cumsum(starts_group) - 1
    first_of_group = order[starts_group]
    by_appearance = np.argsort(first_of_group, kind="stable")
    rank = np.empty_like(by_appearance)
    rank[by_appearance] = np.arange(by_appearance.size)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = rank[group_of_sorted]
    return first_of_group[by_appearance].astype(np.int64), inverse


def find_unique_rows(chunk: Mapping[str, np.ndarray], keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct value, in order of first appearance; inverse index per row).

    First rows are grouped by a hash of the scalar columns and list lengths only; every row grouped
    with an earlier one is then compared exactly, lists included. Only if that finds a difference
    are the list values hashed too (and after a 64-bit collision, a slow exact pass).
    """
    n = _num_rows(chunk, keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for lists in (False, True):
        first_rows, inverse = _group_by_hash(row_keys(chunk, keys, lists=lists))
        representative = first_rows[inverse]
        repeated = np.flatnonzero(representative != np.arange(n))
        if not repeated.size or _rows_equal(chunk, keys, repeated, representative[repeated]).all():
            return first_rows, inverse
    return _exact_unique(chunk, keys, n)


def _exact_unique(chunk: Mapping[str, np.ndarray], keys: Sequence[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Slow exact dedup by Python tuples of each row's bits; only used after a hash collision."""
    parts = []
    for key in keys:
        if _is_jagged(chunk, key):
            lengths = chunk[key + ".lengths"]
            bits = column_bits(chunk[key + ".values"])
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            parts.append([tuple(bits[offsets[i]: offsets[i + 1]].tolist()) for i in range(n)])
        else:
            parts.append([tuple(r) for r in column_bits(chunk[key]).reshape(n, -1).tolist()])
    seen: dict[tuple, int] = {}
    inverse = np.empty(n, dtype=np.int64)
    first: list[int] = []
    for i, row in enumerate(zip(*parts, strict=True)):
        j = seen.setdefault(row, len(first))
        if j == len(first):
            first.append(i)
        inverse[i] = j
    return np.asarray(first, dtype=np.int64), inverse


def build_ikjt(chunk: Mapping[str, np.ndarray], group: str, columns: Sequence[str]) -> IKJT:
    """The IKJT of one group of a plain batch (a batch without duplication gives unique = all rows)."""
    keys = resolve_columns(chunk, group, columns)
    first_rows, inverse = find_unique_rows(chunk, keys)
    everyone = first_rows.size == inverse.size  # no row repeats: the unique rows are the columns as they are
    values: dict[str, np.ndarray] = {}
    lengths: dict[str, np.ndarray] = {}
    for key in keys:
        if everyone:
            if _is_jagged(chunk, key):
                values[key], lengths[key] = chunk[key + ".values"], chunk[key + ".lengths"]
            else:
                values[key] = chunk[key]
        elif _is_jagged(chunk, key):
            values[key], lengths[key] = gather_jagged(chunk[key + ".values"], chunk[key + ".lengths"], first_rows)
        else:
            values[key] = chunk[key][first_rows]
    return IKJT(group=group, keys=tuple(keys), values=values, lengths=lengths, inverse=inverse)


def _validate_groups(groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    if not groups:
        raise ValueError("dedup needs at least one group, e.g. {'user': ['user_id', 'user_history']}")
    owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for group, columns in groups.items():
        if not isinstance(group, str) or not group or "." in group:
            raise ValueError(f"dedup group name {group!r} must be a non-empty string without '.'")
        if isinstance(columns, str) or not columns:
            raise ValueError(f"dedup group {group!r} needs a non-empty list of column names, got {columns!r}")
        for col in columns:
            base = col.removesuffix(".values").removesuffix(".lengths")
            if base in owner and owner[base] != group:
                raise ValueError(f"column {col!r} is in dedup groups {owner[base]!r} and {group!r}")
            owner[base] = group
        out[group] = list(columns)
    return out


class DedupTransform:
    """Chunk -> chunk: replace each group's columns by its IKJT encoding (see ``ikjt.py``).

    A plain picklable object (not a closure), so process workers can run it. With ``min_saving`` > 0
    a group whose batch would lose less than that fraction of its rows stays plain in that batch (as
    RecD deduplicates only where duplication pays); ``GroupUDF`` and the model read both forms.
    """

    def __init__(self, groups: Mapping[str, Sequence[str]], min_saving: float = 0.0):
        self.groups = _validate_groups(groups)
        if not 0.0 <= min_saving < 1.0:
            raise ValueError(f"min_saving must be in [0, 1), got {min_saving}")
        self.min_saving = min_saving

    def __call__(self, chunk: Chunk) -> Chunk:
        out = dict(chunk)
        for group, columns in self.groups.items():
            if f"{group}.{INVERSE}" in chunk:
                raise ValueError(f"dedup group {group!r}: the batch is already deduplicated")
            ikjt = build_ikjt(chunk, group, columns)
            if ikjt.batch_size - ikjt.num_unique < self.min_saving * ikjt.batch_size:
                continue  # too little repeats in this batch to pay for the encoding
            for key in ikjt.keys:
                for name in (key, key + ".values", key + ".lengths"):
                    out.pop(name, None)
            out.update(ikjt.to_chunk())
        return out

    def __repr__(self) -> str:
        return f"DedupTransform({self.groups!r}, min_saving={self.min_saving})"


def dedup_transform(groups: Mapping[str, Sequence[str]], min_saving: float = 0.0) -> DedupTransform:
    """The map function of a dedup stage after ``.batch()``; errors name the group and column."""
    return DedupTransform(groups, min_saving)


class GroupUDF:
    """Run ``fn`` on a feature group's rows: the unique rows of a deduplicated batch, else all rows.

    ``fn`` takes and returns a plain chunk of the group's columns (jagged ones as ``.values`` /
    ``.lengths``) with the same number of rows; it may add, drop or rewrite columns. Its output
    replaces the group's columns (or its unique rows, keeping the inverse index).
    """

    def __init__(self, group: str, columns: Sequence[str], fn: Callable[[Chunk], Chunk], name: str | None = None):
        self.group, self.columns, self.fn = group, list(columns), fn
        self.name = name or getattr(fn, "__name__", "udf")

    def __call__(self, chunk: Chunk) -> Chunk:
        inverse_name = f"{self.group}.{INVERSE}"
        if inverse_name in chunk:
            ikjt = IKJT.from_chunk(chunk, self.group)  # validates what arrives
            prefix = f"{self.group}.{UNIQUE}."
            result = self._apply(ikjt.unique_chunk(), ikjt.num_unique)
            out = {k: v for k, v in chunk.items() if not k.startswith(prefix) and k != inverse_name}
            out.update({prefix + name: col for name, col in result.items()})
            out[inverse_name] = ikjt.inverse
            return out
        keys = resolve_columns(chunk, self.group, self.columns)
        rows = {}
        for key in keys:
            if _is_jagged(chunk, key):
                rows[key + ".values"], rows[key + ".lengths"] = chunk[key + ".values"], chunk[key + ".lengths"]
            else:
                rows[key] = chunk[key]
        result = self._apply(rows, _num_rows(chunk, keys))
        out = {k: v for k, v in chunk.items() if k not in rows}
        out.update(result)
        return out

    def _apply(self, rows: Chunk, n: int) -> Chunk:
        result = self.fn(rows)
        for name, col in result.items():
            if name.endswith(".values"):
                continue
            if col.shape[0] != n:
                raise ValueError(f"UDF {self.name!r} of group {self.group!r} returned {col.shape[0]} rows in "
                                 f"column {name!r}, expected {n}")
        return result
