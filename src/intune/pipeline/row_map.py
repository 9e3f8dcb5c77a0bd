"""Per-row functions (``Pipeline.map_rows``): a row -> row function applied to columnar chunks.

Owns the adapter between the engine's chunks (dicts of columns) and a function written for one row
(what a ``Dataset.__getitem__`` does): ``RowFunction`` cuts a chunk into rows, calls the function on
each and stacks its outputs back into columns, checking the row contract as it goes; ``RowMapStage`` is
the map stage that runs it (thread or process workers, the ``<stage>.workers`` knob, remote workers, the
stage's schema and timeouts, all as ``map``), and turns a failure into an error that names the row.

The row contract. The function gets a ``dict`` of the chunk's columns at one row: numpy scalars
(``numpy.float32``, ``numpy.int64``, ``numpy.bytes_`` / ``numpy.str_`` for string columns, which are
``bytes`` / ``str``), a read-only array view for a column of fixed-size arrays, the object for an
object column. It returns a ``dict`` of ``str`` -> a scalar (Python ``bool`` / ``int`` / ``float`` /
``str`` / ``bytes`` or a numpy scalar) or a fixed-size array (a numpy array, a list or tuple of numbers,
or anything with ``__array__`` such as a CPU torch tensor). Every row of the stage returns the same
keys, each with the same type (and for arrays the same dtype and shape, strings of any length):
a column's type never depends on the data. Columns stack as: Python ``int`` -> int64, ``float`` ->
float64, ``bool`` -> bool, ``str`` / ``bytes`` -> fixed-width ``U`` / ``S`` (an object array where a
value ends in NUL, which fixed width would strip), a numpy scalar -> its own dtype, an array of shape
``s`` -> a column of rows of shape ``s``. Anything else is an error naming the function, the row and
the key, never a silent cast.

Errors. A function that raises on a row fails the epoch with ``StageError`` naming the stage, the
row's source (file and row, or chunk and row), its index in the chunk, a short repr of its values and
the function's traceback. A broken contract (not a dict; keys, types or shapes that change between
rows) is an error whatever ``on_error`` says: the code is wrong, not one row's data. With
``on_error="skip"`` a row whose function raises is left out and counted in the stage's ``skipped``
(rows, for this stage), and the first ``SKIPPED_KEPT`` are logged with their source and exception.
It must not know about sources, channels or pools beyond the map stage it extends.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment, num_rows
from intune.pipeline.errors import StageError
from intune.pipeline.metrics import StageMetrics
from intune.pipeline.procworker import RemoteError
from intune.pipeline.stages import MapStage, origin_words
from intune.pipeline.stats import WorkerStats

log = logging.getLogger(__name__)

RESERVED = "__intune_"
DROPPED = "__intune_dropped__"  # indices (in the input chunk) of the rows skipped, when any were
WHY = "__intune_dropped_why__"  # their exceptions, as text
SKIPPED_KEPT = 20  # skipped rows logged (and kept in ``skipped_examples``) per stage
_SCALARS = (bool, int, float, str, bytes)
_DEFAULT_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64)}
_REPR_CHARS = 200
_ROW_MESSAGE = re.compile(r"^(?:\w+: )?row (\d+) of the chunk's (\d+) rows: ")


class RowError(Exception):
    """The function failed on a row (it raised, or broke the row contract); names the row.

    The message is ``row <i> of the chunk's <n> rows: <detail>; the row: <values>``, so that the stage
    can find the row again from the text alone when the error crossed from a process worker."""

    def __init__(self, row: int, rows: int, values: str, detail: str) -> None:
        self.row = row
        self.rows = rows
        message = f"row {row} of the chunk's {rows} rows: {detail}"
        super().__init__(f"{message}; the row: {values}" if values else message)


class RowFunctionError(RowError):
    """The function raised on a row."""


class RowContractError(RowError):
    """The function's output broke the row contract (see the module docstring)."""


def function_name(fn: Callable[..., Any]) -> str:
    """How messages name ``fn``: its qualified name, or its class's for a callable object."""
    inner = getattr(fn, "func", None)  # functools.partial
    for candidate in (fn, inner):
        name = getattr(candidate, "__qualname__", None)
        if isinstance(name, str):
            return name
    return type(fn).__name__


def row_repr(row: Mapping[str, Any]) -> str:
    """A short repr of a row's values for an error message."""
    text = ", ".join(f"{k}={_short(v)}" for k, v in row.items())
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


def _short(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class RowFunction:
    """``fn`` over every row of a chunk, its outputs stacked into columns (picklable for process mode).

    With ``skip`` a row whose function raises is left out; the output then also carries ``DROPPED``
    (the rows' indices) and ``WHY`` (their exceptions), which ``RowMapStage`` takes off again."""

    def __init__(self, fn: Callable[[dict[str, Any]], Mapping[str, Any]], skip: bool = False) -> None:
        self.fn = fn
        self.skip = skip
        self.name = function_name(fn)

    def __call__(self, chunk: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = list(chunk)
        n = num_rows(chunk)
        if any(len(chunk[k]) != n for k in names):
            lengths = {k: len(chunk[k]) for k in names}
            raise ValueError(
                f"map_rows: the chunk's columns have unequal lengths {lengths}, so it has no rows to give "
                f"{self.name}() (a stage after dedup changes lengths; place map_rows before it)"
            )
        fn = self.fn
        stacker: _Stacker | None = None
        dropped: list[int] = []
        why: list[str] = []
        for i, values in enumerate(zip(*(chunk[k] for k in names), strict=False)):  # lengths checked
            row = dict(zip(names, values, strict=False))
            try:
                out = fn(row)
            except Exception as exc:
                if self.skip:
                    dropped.append(i)
                    why.append(f"{type(exc).__name__}: {exc}")
                    continue
                raise RowFunctionError(
                    i, n, row_repr(row), f"{self.name}() raised {type(exc).__name__}: {exc}"
                ) from exc
            if stacker is None:
                stacker = _Stacker(self.name, out, i, n, row)
            stacker.add(out, i, n, row)
        result = stacker.stack() if stacker is not None else {}
        if dropped:
            result[DROPPED] = np.asarray(dropped, dtype=np.int64)
            result[WHY] = np.asarray(why, dtype=str)
        elif not result:
            result[DROPPED] = np.empty(0, dtype=np.int64)  # no rows in, no rows out
        return result


class _Stacker:
    """The rows' outputs, column by column, checked against the first row's keys and types."""

    def __init__(self, fn_name: str, first: Any, row: int, rows: int, values: Mapping[str, Any]) -> None:
        self.fn_name = fn_name
        if not isinstance(first, Mapping):
            raise RowContractError(row, rows, row_repr(values), self._not_a_dict(first))
        self.names = list(first)
        if not self.names:
            raise RowContractError(row, rows, row_repr(values), f"{fn_name}() returned an empty dict")
        for key in self.names:
            if not isinstance(key, str) or key.startswith(RESERVED):
                what = f"key {key!r} is reserved" if isinstance(key, str) else f"key {key!r} is not a str"
                raise RowContractError(
                    row, rows, row_repr(values), f"{fn_name}() returned a dict whose {what}"
                )
        self.keys = set(self.names)
        self.get = operator.itemgetter(*self.names) if len(self.names) > 1 else None
        self.types = self._types(first)
        self.arrays = [i for i, t in enumerate(self.types) if _is_array_type(t)]  # their positions
        self.seen: list[tuple[np.dtype, tuple[int, ...]] | None] = [None] * len(self.names)
        self.rows: list[tuple[Any, ...]] = []
        self.row_numbers: list[int] = []  # each stacked row's index in the chunk (rows may be skipped)
        self.rows_in = rows
        self.first_row = row
        for key, kind in zip(self.names, self.types, strict=True):
            if not (kind in _SCALARS or issubclass(kind, np.generic) or _is_array_type(kind)):
                raise RowContractError(
                    row,
                    rows,
                    row_repr(values),
                    f"{fn_name}() returned key {key!r} as {kind.__name__}; values must be scalars "
                    "(bool, int, float, str, bytes, numpy scalars) or fixed-size arrays",
                )

    def _not_a_dict(self, out: Any) -> str:
        hint = " (name the values: return {'x': x, 'y': y})" if isinstance(out, (tuple, list)) else ""
        return (
            f"{self.fn_name}() returned {type(out).__name__}; map_rows needs a dict of column name -> "
            f"scalar or fixed-size array for every row{hint}"
        )

    def _values(self, out: Mapping[str, Any]) -> tuple[Any, ...]:
        return self.get(out) if self.get is not None else (out[self.names[0]],)

    def _types(self, out: Mapping[str, Any]) -> tuple[type, ...]:
        return tuple(map(type, self._values(out)))

    def add(self, out: Any, row: int, rows: int, values: Mapping[str, Any]) -> None:
        if type(out) is not dict and not isinstance(out, Mapping):
            raise RowContractError(row, rows, row_repr(values), self._not_a_dict(out))
        if out.keys() != self.keys:
            missing = [k for k in self.names if k not in out]
            extra = [k for k in out if k not in self.keys]
            raise RowContractError(
                row,
                rows,
                row_repr(values),
                f"{self.fn_name}() returned keys {list(out)}, but row {self.first_row} returned "
                f"{self.names} (missing {missing}, extra {extra}); every row must return the same keys",
            )
        got = self._values(out)
        kinds = tuple(map(type, got))
        if kinds != self.types:
            key, was, now = next(
                (k, a, b) for k, a, b in zip(self.names, self.types, kinds, strict=True) if a is not b
            )
            raise RowContractError(
                row,
                rows,
                row_repr(values),
                f"{self.fn_name}() returned key {key!r} as {_type_name(now)}, but row {self.first_row} "
                f"returned it as {_type_name(was)}; every row must return the same type for a key",
            )
        if self.arrays:
            got = self._check_arrays(got, row, rows, values)
        self.rows.append(got)
        self.row_numbers.append(row)

    def _check_arrays(
        self, got: tuple[Any, ...], row: int, rows: int, values: Mapping[str, Any]
    ) -> tuple[Any, ...]:
        """Array values as numpy arrays, each of the first row's dtype (strings: kind) and shape."""
        fixed: list[Any] | None = None
        for index in self.arrays:
            value = got[index]
            array = value if type(value) is np.ndarray else self._as_array(value, index, row, rows, values)
            seen = self.seen[index]
            if seen is None:
                if array.dtype.hasobject:
                    self._ragged(value, index, row, rows, values)
                seen = self.seen[index] = (array.dtype, array.shape)
            if array.shape != seen[1] or array.dtype != seen[0]:
                strings = array.dtype.kind == seen[0].kind and array.dtype.kind in "SU"
                if array.shape != seen[1] or not strings:
                    raise RowContractError(
                        row,
                        rows,
                        row_repr(values),
                        f"{self.fn_name}() returned key {self.names[index]!r} as an array of {array.dtype} "
                        f"{list(array.shape)}, but row {self.first_row} returned {seen[0]} {list(seen[1])}; "
                        "every row must return the same dtype and shape for a key",
                    )
            if array is not value:
                fixed = list(got) if fixed is None else fixed
                fixed[index] = array
        return got if fixed is None else tuple(fixed)

    def _as_array(self, value: Any, index: int, row: int, rows: int, values: Mapping[str, Any]) -> np.ndarray:
        try:
            return np.asarray(value)
        except ValueError:  # numpy refuses ragged nested lists
            self._ragged(value, index, row, rows, values)
            raise

    def _ragged(self, value: Any, index: int, row: int, rows: int, values: Mapping[str, Any]) -> None:
        raise RowContractError(
            row,
            rows,
            row_repr(values),
            f"{self.fn_name}() returned key {self.names[index]!r} as a ragged or non-numeric array "
            f"({type(value).__name__}); arrays must be fixed-size, of numbers or strings",
        )

    def stack(self) -> dict[str, np.ndarray]:
        columns = zip(*self.rows, strict=True) if self.rows else ()
        return {
            key: self._column(key, kind, list(values))
            for key, kind, values in zip(self.names, self.types, columns, strict=True)
        }

    def _column(self, key: str, kind: type, values: list[Any]) -> np.ndarray:
        if _is_array_type(kind):
            return np.stack(values)
        if kind in (str, bytes) or kind in (np.str_, np.bytes_):
            nul = "\0" if issubclass(kind, str) else b"\0"
            if any(v.endswith(nul) for v in values):
                return np.array(values, dtype=object)  # fixed width would strip the trailing NULs
            return np.array(values)
        try:
            return np.array(values, dtype=_DEFAULT_DTYPES.get(kind))
        except OverflowError:
            bad = next(i for i, v in enumerate(values) if not -(2**63) <= v < 2**63)
            raise RowContractError(
                self.row_numbers[bad],
                self.rows_in,
                "",
                f"{self.fn_name}() returned key {key!r} as the Python int {values[bad]}, beyond int64; "
                "return numpy.uint64 or float values for it",
            ) from None


def _is_array_type(kind: type) -> bool:
    if kind in _SCALARS or issubclass(kind, np.generic):
        return False
    return issubclass(kind, (np.ndarray, list, tuple)) or hasattr(kind, "__array__")


def _type_name(kind: type) -> str:
    return f"numpy.{kind.__name__}" if issubclass(kind, np.generic) else kind.__name__


def row_origin(origin: Origin | None, row: int) -> Origin | None:
    """The origin of row ``row`` of a chunk whose origin is ``origin`` (None when it cannot be told)."""
    if origin is None:
        return None
    if origin.row_ids is not None:
        if row < len(origin.row_ids):
            return Origin((), origin.row_ids[row : row + 1], origin.table)
        return None
    for s in origin.segments:
        if row < s.hi - s.lo:
            return Origin((Segment(s.source, s.unit, s.lo + row, s.lo + row + 1),))
        row -= s.hi - s.lo
    return None


def keep_rows(origin: Origin | None, kept: np.ndarray) -> Origin | None:
    """The origin of the rows ``kept`` (ascending indices) of a chunk whose origin is ``origin``."""
    if origin is None:
        return None
    if origin.row_ids is not None:
        return Origin((), origin.row_ids[kept], origin.table)
    pieces: list[Segment] = []
    base = 0
    for s in origin.segments:
        mine = kept[(kept >= base) & (kept < base + s.hi - s.lo)] - base + s.lo
        for run in np.split(mine, np.flatnonzero(np.diff(mine) != 1) + 1) if len(mine) else []:
            pieces.append(Segment(s.source, s.unit, int(run[0]), int(run[-1]) + 1))
        base += s.hi - s.lo
    return Origin(tuple(pieces))


class RowMapStage(MapStage):
    """A map stage running ``RowFunction(fn)``: knobs, workers, schema and timeouts as ``map``; errors
    name the row; ``on_error="skip"`` leaves out rows (not chunks) and ``skipped`` counts rows."""

    def __init__(
        self,
        fn: Callable[[dict[str, Any]], Mapping[str, Any]],
        name: str,
        mode: str,
        on_error: str,
        max_workers: int,
        workers: int = 1,
        timeout_s: float | None = None,
        remote: str | None = None,
        address: str | None = None,
        remote_workers: int = 0,
    ) -> None:
        super().__init__(
            RowFunction(fn, on_error == "skip"),
            name,
            mode,
            on_error,
            max_workers,
            workers,
            timeout_s,
            remote,
            address,
            remote_workers,
        )
        self._rows_lock = threading.Lock()
        self.skipped_rows = 0
        self.skipped_examples: list[tuple[str, str]] = []  # (source row, exception) of the first skipped

    def _result(self, out: Any, item: Item) -> list[Item]:
        """The stacked rows as an item: the skipped rows counted and logged, their origin left out."""
        if isinstance(out, dict) and (DROPPED in out or WHY in out):
            dropped = np.asarray(out.pop(DROPPED, np.empty(0, np.int64)))
            why = out.pop(WHY, None)
            if len(dropped):
                self._skipped(item, dropped, why)
            if not out:  # every row skipped, or none came in
                return []
            kept = np.setdiff1d(np.arange(num_rows(item.chunk)), dropped)
            item = Item(item.chunk, keep_rows(item.origin, kept), len(kept), item.nbytes)
        return super()._result(out, item)

    def _skipped(self, item: Item, dropped: np.ndarray, why: Any) -> None:
        with self._rows_lock:
            self.skipped_rows += len(dropped)
            room = SKIPPED_KEPT - len(self.skipped_examples)
        examples = []
        reasons = [] if why is None else np.asarray(why).tolist()
        for index, reason in list(zip(dropped.tolist(), reasons, strict=False))[: max(0, room)]:
            examples.append((row_words(item, index), str(reason)))
        with self._rows_lock:
            self.skipped_examples.extend(examples[: SKIPPED_KEPT - len(self.skipped_examples)])
        for where, reason in examples:
            log.warning("stage %r skipped the row at %s: %s", self.name, where, reason)

    def snapshot(self) -> StageMetrics:
        """As every stage, with ``skipped`` counting the rows left out (and chunks timed out, in rows)."""
        base = super().snapshot()
        return (
            dataclasses.replace(base, skipped=base.skipped + self.skipped_rows) if self.skipped_rows else base
        )

    def _timed_out(self, item: Item, stats: WorkerStats) -> list[Item]:
        """A chunk past ``timeout_s``: under ``on_error="skip"`` its rows are counted as skipped."""
        if self.on_error == "skip":
            with self._rows_lock:
                self.skipped_rows += num_rows(item.chunk)
            return []
        return super()._timed_out(item, stats)

    def _failed(self, item: Item, stats: WorkerStats, exc: BaseException, text: str) -> list[Item]:
        """Every failure that reaches the stage ends the epoch (rows to skip were skipped in the function),
        named by its row where it has one."""
        text = text or getattr(exc, "remote_traceback", "")
        message = str(exc) if isinstance(exc, (RemoteError, RowError)) else f"{type(exc).__name__}: {exc}"
        match = _ROW_MESSAGE.match(message) if isinstance(exc, (RemoteError, RowError)) else None
        if match is None:
            raise StageError(self.name, origin_words(item), message, text) from exc
        row, rows = int(match.group(1)), int(match.group(2))
        origin = f"{row_words(item, row)} (row {row} of a chunk of {rows} rows: {origin_words(item)})"
        raise StageError(self.name, origin, message[match.end() :], text) from exc


def row_words(item: Item, row: int) -> str:
    """Where row ``row`` of ``item`` came from, in words (only for messages: it costs)."""
    origin = row_origin(item.origin, row)
    return origin.describe() if origin is not None else f"row {row} of {origin_words(item)}"


__all__ = ["RowContractError", "RowError", "RowFunction", "RowFunctionError", "RowMapStage"]
