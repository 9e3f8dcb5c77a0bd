"""The pipeline schema: which columns a chunk has, and of which numpy type.

Owns the one rule every source and every map stage checks its chunks against: the same column names
and the same dtype (and trailing shape) in every chunk, because a stage downstream that sees another
type either casts it (the shuffle buffer's assignment, a batch's concatenation) or drops it, and a
silent cast corrupts values (int64 ids of 2**40 stored as float32). A schema is fixed by its first
chunk, or given by the user, or read from the Parquet files' own schema; a chunk that does not match
raises ``SchemaError`` naming where the chunk came from, the column and both types.

Two differences are not errors: fixed-width strings (``S`` / ``U``) of another width (the width is the
longest value of that chunk, so it varies by nature; buffers widen to the longest; a text column may
also come as an object array where a fixed width cannot hold it faithfully), and, only where
the caller states it (``widen=True`` or a given schema), a type that holds every value of the chunk
exactly (int32 -> int64, float32 -> float64, int -> float64 while every value is within 2**53).
It must not know about stages, threads or files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from intune.pipeline.errors import SchemaError

STRING_KINDS = ("S", "U")


@dataclass(frozen=True)
class Column:
    """One column: its dtype and the shape of one row (``()`` for a scalar column)."""

    dtype: np.dtype
    row_shape: tuple[int, ...] = ()

    def describe(self) -> str:
        kind = self.dtype.kind
        name = {"S": "bytes", "U": "str"}.get(kind, str(self.dtype))
        return name if not self.row_shape else f"{name}{list(self.row_shape)}"

    def same_type(self, other: Column) -> bool:
        """Equal; or fixed-width strings of one kind whatever their widths; or a text column as an
        object array where fixed width could not hold it faithfully (``columns.to_numpy``)."""
        if self.row_shape != other.row_shape:
            return False
        kinds = {self.dtype.kind, other.dtype.kind}
        if kinds & set(STRING_KINDS):
            return len(kinds) == 1 or kinds <= {"S", "O"} or kinds <= {"U", "O"}
        return self.dtype == other.dtype


def column_of(array: np.ndarray) -> Column:
    return Column(array.dtype, tuple(array.shape[1:]))


def exact_float_bound(dtype: np.dtype) -> int:
    """The largest integer magnitude below which every integer is exact in float ``dtype``."""
    return 2 ** (np.finfo(dtype).nmant + 1)


def widen(array: np.ndarray, to: np.dtype) -> np.ndarray | None:
    """``array`` as ``to`` if every value survives exactly, else ``None``.

    Safe casts between ints, between floats, bool to numbers; int to float only while every value is
    within the float's exact-integer range (checked on the values, not the types: int64 ids of 2**40
    fit float64 exactly, of 2**60 do not).
    """
    src = array.dtype
    if src == to:
        return array
    if src.kind in STRING_KINDS or to.kind in STRING_KINDS or src.hasobject or to.hasobject:
        return None
    if src.kind in "iub" and to.kind == "f":
        if array.size and src.kind != "b":
            bound = exact_float_bound(to)
            if int(array.max()) > bound or int(array.min()) < -bound:
                return None
        return array.astype(to)
    if np.can_cast(src, to, casting="safe"):
        return array.astype(to)
    return None


class Schema:
    """Column names in order, each a ``Column``; checks and (where allowed) widens chunks."""

    def __init__(self, columns: Mapping[str, Column], origin: str) -> None:
        self.columns = dict(columns)
        self.origin = origin  # where the schema came from, for error messages

    @classmethod
    def of(cls, chunk: Mapping[str, np.ndarray], origin: str) -> Schema:
        return cls({name: column_of(np.asarray(a)) for name, a in chunk.items()}, origin)

    @classmethod
    def given(cls, spec: Mapping[str, Any], origin: str = "the schema given") -> Schema:
        """From ``{name: dtype}`` (anything ``numpy.dtype`` accepts), or ``{name: (dtype, row_shape)}``."""
        columns = {}
        for name, value in spec.items():
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
                dtype, shape = value
            else:
                dtype, shape = value, ()
            try:
                columns[str(name)] = Column(np.dtype(dtype), tuple(shape))
            except TypeError as exc:
                raise ValueError(f"schema: column {name!r} has no numpy dtype {dtype!r} ({exc})") from None
        if not columns:
            raise ValueError("schema: at least one column is needed")
        return cls(columns, origin)

    def describe(self) -> str:
        return ", ".join(f"{n}: {c.describe()}" for n, c in self.columns.items())

    def conform(
        self, chunk: Mapping[str, np.ndarray], where: str | Callable[[], str], widen_ok: bool = False
    ) -> dict:
        """``chunk`` checked against the schema (and widened where ``widen_ok``), in schema order.

        Raises ``SchemaError`` naming ``where``, the column and both types on a missing or extra
        column or a type the schema's cannot hold exactly. ``where`` may be a function, called only
        for an error: describing a chunk's origin costs more than checking it.
        """
        if callable(where):
            try:
                return self.conform(chunk, "", widen_ok)
            except SchemaError as exc:
                raise SchemaError(f"{where()}{exc}") from None
        names = chunk.keys()
        if names != self.columns.keys():
            missing = [n for n in self.columns if n not in names]
            extra = [n for n in names if n not in self.columns]
            parts = []
            if missing:
                parts.append(f"missing column(s) {missing}")
            if extra:
                parts.append(f"extra column(s) {extra}")
            if parts:
                raise SchemaError(
                    f"{where}: {' and '.join(parts)}; the pipeline's schema ({self.origin}) has "
                    f"columns {list(self.columns)}"
                )
        out = {}
        for name, want in self.columns.items():
            array = np.asarray(chunk[name])
            if array.dtype == want.dtype and array.shape[1:] == want.row_shape:
                out[name] = array  # the common case, without building a Column per column per chunk
                continue
            got = column_of(array)
            if not want.same_type(got):
                fixed = widen(array, want.dtype) if widen_ok and got.row_shape == want.row_shape else None
                if fixed is None:
                    how = (
                        "some values do not fit it exactly"
                        if widen_ok
                        else "pass widen=True or a schema to convert types that hold every value exactly"
                    )
                    raise SchemaError(
                        f"{where}: column {name!r} is {got.describe()}, but the pipeline's schema "
                        f"({self.origin}) has {want.describe()}; {how}"
                    )
                array = fixed
            out[name] = array
        return out


def unify(a: Column, b: Column) -> Column | None:
    """The narrowest column type holding every value of both exactly, or ``None`` (for ``widen=True``
    across files: int32 and int64 give int64; int64 and float64 give float64, checked per value)."""
    if a.same_type(b):
        return a
    if a.row_shape != b.row_shape:
        return None
    kinds = {a.dtype.kind, b.dtype.kind}
    if kinds & set(STRING_KINDS) or a.dtype.hasobject or b.dtype.hasobject:
        return None
    promoted = np.promote_types(a.dtype, b.dtype)
    if promoted.kind == "f" and kinds & {"i", "u"}:
        promoted = np.promote_types(promoted, np.float64)
    return Column(promoted, a.row_shape)
