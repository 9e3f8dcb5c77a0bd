"""The InverseKeyedJaggedTensor (IKJT): one deduplicated feature group of one batch.

An IKJT holds, for a group of features that repeat together (the user features of a session), the
unique rows only, plus inverse indices of length batch size: row ``b`` of every key equals unique
row ``inverse[b]``. A key is either scalar (one value per row, e.g. ``user_id`` or a dense count) or
jagged (a variable-length list per row, ``<key>.values`` / ``<key>.lengths`` in a chunk).

It owns the representation, its validation, its encoding as chunk columns (so that it can flow
through the engine, whose chunks are dicts of numpy arrays) and the conversions to a plain batch and
to ``torchrec.KeyedJaggedTensor``. It must not decide what to deduplicate (see ``dedup.py``).

Chunk encoding of a group ``g`` (what ``to_chunk`` writes and ``from_chunk`` reads):
  ``g.inverse``                   int64, one per batch row
  ``g.unique.<key>``              scalar key: one value per unique row
  ``g.unique.<key>.values``       jagged key: the unique rows' values, concatenated
  ``g.unique.<key>.lengths``      jagged key: one length per unique row
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

INVERSE = "inverse"
UNIQUE = "unique"


def gather_jagged(values: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The jagged rows ``rows`` of (values, lengths), in that order: (values, lengths)."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out_lengths = lengths[rows]
    total = int(out_lengths.sum())
    if total == 0:
        return values[:0], out_lengths
    out_offsets = np.zeros(rows.size, dtype=np.int64)
    np.cumsum(out_lengths[:-1], out=out_offsets[1:])
    index = np.repeat(offsets[rows] - out_offsets, out_lengths) + np.arange(total, dtype=np.int64)
    return values[index], out_lengths


@dataclass(eq=False)
class IKJT:
    """Unique rows of a feature group and the inverse indices that expand them to the batch."""

    group: str
    keys: tuple[str, ...]
    values: dict[str, np.ndarray]
    inverse: np.ndarray
    lengths: dict[str, np.ndarray] = field(default_factory=dict)  # jagged keys only

    def __post_init__(self) -> None:
        self.keys = tuple(self.keys)
        self.inverse = np.asarray(self.inverse)
        self._validate()

    def _validate(self) -> None:
        where = f"IKJT group {self.group!r}"
        if not self.keys:
            raise ValueError(f"{where}: no keys")
        missing = [k for k in self.keys if k not in self.values]
        if missing:
            raise ValueError(f"{where}: no values for keys {missing}")
        extra = sorted(set(self.lengths) - set(self.keys))
        if extra:
            raise ValueError(f"{where}: lengths given for unknown keys {extra}")
        if self.inverse.ndim != 1 or not np.issubdtype(self.inverse.dtype, np.integer):
            raise ValueError(f"{where}: inverse must be a 1-D integer array, got {self.inverse.dtype} "
                             f"with shape {self.inverse.shape}")
        n = self.num_unique
        for key in self.keys:
            vals = self.values[key]
            if key in self.lengths:
                lens = self.lengths[key]
                if lens.shape != (n,):
                    raise ValueError(f"{where}: key {key!r} has {lens.shape[0]} lengths, expected {n} "
                                     f"(one per unique row)")
                if lens.size and lens.min() < 0:
                    raise ValueError(f"{where}: key {key!r} has a negative length")
                if vals.shape[0] != int(lens.sum()):
                    raise ValueError(f"{where}: key {key!r} has {vals.shape[0]} values but its lengths "
                                     f"sum to {int(lens.sum())}")
            elif vals.shape[0] != n:
                raise ValueError(f"{where}: key {key!r} has {vals.shape[0]} unique rows, expected {n}")
        if self.inverse.size:
            lo, hi = int(self.inverse.min()), int(self.inverse.max())
            if lo < 0 or hi >= n:
                bad = int(np.flatnonzero((self.inverse < 0) | (self.inverse >= n))[0])
                raise ValueError(f"{where}: inverse index {int(self.inverse[bad])} at batch row {bad} is out "
                                 f"of range [0, {n}) (number of unique rows)")

    # ---- shape ----------------------------------------------------------------------------------
    @property
    def num_unique(self) -> int:
        """Unique rows, read from the first key (all keys are checked to agree)."""
        first = self.keys[0]
        if first in self.lengths:
            return int(self.lengths[first].shape[0])
        return int(self.values[first].shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.inverse.shape[0])

    def is_jagged(self, key: str) -> bool:
        return key in self.lengths

    def key_lengths(self, key: str) -> np.ndarray:
        """Per unique row lengths of ``key``: all ones for a scalar key (a bag of one)."""
        if key in self.lengths:
            return self.lengths[key]
        return np.ones(self.num_unique, dtype=np.int64)

    def offsets(self, key: str) -> np.ndarray:
        """Offsets of the unique rows of ``key`` into its values (length num_unique + 1)."""
        out = np.zeros(self.num_unique + 1, dtype=np.int64)
        np.cumsum(self.key_lengths(key), out=out[1:])
        return out

    # ---- conversions ------------------------------------------------------------------------------
    def to_jagged(self) -> dict[str, np.ndarray]:
        """The plain (duplicated) batch columns: what the group looked like before deduplication."""
        out: dict[str, np.ndarray] = {}
        for key in self.keys:
            if key in self.lengths:
                vals, lens = gather_jagged(self.values[key], self.lengths[key], self.inverse)
                out[key + ".values"], out[key + ".lengths"] = vals, lens
            else:
                out[key] = self.values[key][self.inverse]
        return out

    def unique_chunk(self) -> dict[str, np.ndarray]:
        """The unique rows as a plain chunk (names without prefix): what a group UDF sees."""
        out: dict[str, np.ndarray] = {}
        for key in self.keys:
            if key in self.lengths:
                out[key + ".values"], out[key + ".lengths"] = self.values[key], self.lengths[key]
            else:
                out[key] = self.values[key]
        return out

    @classmethod
    def from_unique_chunk(cls, group: str, unique: Mapping[str, np.ndarray], inverse: np.ndarray) -> IKJT:
        """An IKJT from unique rows given as a plain chunk (``.values``/``.lengths`` pairs are jagged)."""
        values: dict[str, np.ndarray] = {}
        lengths: dict[str, np.ndarray] = {}
        for name, col in unique.items():
            if name.endswith(".lengths"):
                continue
            if name.endswith(".values"):
                key = name[: -len(".values")]
                if key + ".lengths" not in unique:
                    raise ValueError(f"IKJT group {group!r}: column {name!r} has no {key + '.lengths'!r}")
                values[key], lengths[key] = np.asarray(col), np.asarray(unique[key + ".lengths"])
            else:
                values[name] = np.asarray(col)
        orphans = [n for n in unique if n.endswith(".lengths") and n[: -len(".lengths")] not in values]
        if orphans:
            raise ValueError(f"IKJT group {group!r}: lengths columns {orphans} have no values column")
        return cls(group=group, keys=tuple(values), values=values, lengths=lengths, inverse=inverse)

    def to_chunk(self) -> dict[str, np.ndarray]:
        """The chunk-column encoding (module docstring): ``<group>.inverse``, ``<group>.unique.*``."""
        prefix = f"{self.group}.{UNIQUE}."
        out = {prefix + name: col for name, col in self.unique_chunk().items()}
        out[f"{self.group}.{INVERSE}"] = self.inverse
        return out

    @classmethod
    def from_chunk(cls, chunk: Mapping[str, np.ndarray], group: str) -> IKJT:
        """Read the IKJT of ``group`` back from a chunk written by the dedup transform."""
        inverse_name = f"{group}.{INVERSE}"
        if inverse_name not in chunk:
            groups = sorted(n[: -len(INVERSE) - 1] for n in chunk if n.endswith("." + INVERSE))
            raise ValueError(f"chunk has no deduplicated group {group!r} (no column {inverse_name!r}); "
                             f"groups present: {groups}")
        prefix = f"{group}.{UNIQUE}."
        unique = {n[len(prefix):]: c for n, c in chunk.items() if n.startswith(prefix)}
        return cls.from_unique_chunk(group, unique, chunk[inverse_name])

    def to_torchrec(self, keys: Sequence[str] | None = None) -> Any:
        """A ``torchrec.KeyedJaggedTensor`` of the unique rows (variable batch: ``stride_per_key_per_rank``
        is the unique count per key) carrying ``inverse_indices`` to expand it to the batch.

        ``keys`` defaults to the integer-valued keys (dense float counts are not sparse features).
        """
        try:
            import torch
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except ImportError as exc:  # optional extra
            raise ImportError("IKJT.to_torchrec needs torchrec (optional extra; see README)") from exc
        if keys is None:
            keys = [k for k in self.keys
                    if np.issubdtype(self.values[k].dtype, np.integer) and self.values[k].ndim == 1]
        keys = list(keys)
        for key in keys:
            if key not in self.values:
                raise ValueError(f"IKJT group {self.group!r} has no key {key!r}; keys: {list(self.keys)}")
            if self.values[key].ndim != 1:
                raise ValueError(f"IKJT key {key!r} holds a vector per row; a KeyedJaggedTensor holds ids")
            if not np.issubdtype(self.values[key].dtype, np.integer):
                raise ValueError(f"IKJT key {key!r} has {self.values[key].dtype} values; a KeyedJaggedTensor "
                                 f"holds integer ids")
        values = torch.from_numpy(np.concatenate([self.values[k].astype(np.int64) for k in keys]))
        lengths = torch.from_numpy(np.concatenate([self.key_lengths(k).astype(np.int64) for k in keys]))
        inverse = torch.from_numpy(self.inverse.astype(np.int64)).unsqueeze(0).expand(len(keys), -1)
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            lengths=lengths,
            stride_per_key_per_rank=[[self.num_unique] for _ in keys],
            inverse_indices=(keys, inverse.contiguous()),
        )
