"""Sources: where rows come from, split into read units that workers can read in parallel.

Owns file discovery, the unit plan (a Parquet row group; a generic iterable is one sequential
stream; with a ``sharding.Shard``, this rank's slices of the row groups or share of each chunk),
reading a unit into chunks of at most ``chunk_rows`` rows with equal-length columns, the
source's schema (``schema.Schema``: from the Parquet files' own schemas, checked across all files
before any data flows; from the first chunk of an iterable; or given), and describing a unit's rows in
words for error messages. Errors name the file. It must not know about threads, channels or knobs.
"""

from __future__ import annotations

import glob
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment, nbytes, num_rows, validate_chunk
from intune.pipeline.columns import to_numpy
from intune.pipeline.errors import SchemaError, SourceError
from intune.pipeline.schema import Column, Schema, unify, widen
from intune.pipeline.sharding import Shard, range_slices, shard_stream


class Source:
    """A source of chunks. Parallel sources have ``units()``; sequential ones ``stream()``."""

    name = "source"
    parallel = True

    def units(self) -> int:
        raise NotImplementedError

    def read_unit(self, unit: int) -> list[Item]:
        raise NotImplementedError

    def stream(self) -> Iterator[Item]:
        raise NotImplementedError

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"{self.name} unit {unit} rows {lo}-{hi}"

    def fingerprint(self) -> dict[str, Any]:
        """The facts a checkpoint of an epoch over this source is only valid for (its files, chunking,
        options); a source of its own kind says what it can (here: only its type)."""
        return {"kind": type(self).__name__}

    def max_chunk_rows(self) -> int | None:
        """The most rows a chunk of this source holds (what a checkpoint's chunk sizes are bounded by),
        or None where the chunks are the user's."""
        return None


def file_facts(paths: Sequence[str], footers: dict[str, tuple[tuple[int, int, int], str | None]] | None = None) -> list[dict[str, Any]]:
    """Each file's path, size and modification time (ns), what a checkpoint records of its input; with
    ``footers`` (a cache the source keeps), also the digest of each Parquet file's footer, read again only
    when the file's size, time or inode changed (``parquet_footer_digest``).

    Size and time are a stat; the footer (a few KB: every row group's offsets, sizes and column
    statistics) changes with the content even when a rewrite keeps the byte size and the time. A file
    that cannot be read has size -1 (the resume then refuses it)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append({"path": path, "size": -1, "mtime_ns": -1})
            continue
        fact: dict[str, Any] = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if footers is not None:
            key = (st.st_size, st.st_mtime_ns, st.st_ino)
            cached = footers.get(path)
            if cached is None or cached[0] != key:
                cached = footers[path] = (key, parquet_footer_digest(path))
            fact["footer"] = cached[1]
        out.append(fact)
    return out


def parquet_footer_digest(path: str) -> str | None:
    """The sha256 of a Parquet file's footer (its metadata, as written), or None if it has none."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            if size < 12:
                return None
            handle.seek(size - 8)
            tail = handle.read(8)
            length = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or length > size - 12:
                return None
            handle.seek(size - 8 - length)
            return hashlib.sha256(handle.read(length)).hexdigest()
    except OSError:
        return None


def expand_paths(glob_or_paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand globs, keep explicit paths (a missing one is an error naming it), sort each glob."""
    items = [glob_or_paths] if isinstance(glob_or_paths, (str, os.PathLike)) else list(glob_or_paths)
    if not items:
        raise ValueError("no input paths given")
    paths: list[str] = []
    for item in items:
        text = os.fspath(item)
        if glob.has_magic(text):
            found = sorted(glob.glob(text))
            if not found:
                raise FileNotFoundError(f"no file matches {text!r}")
            paths.extend(found)
        else:
            if not os.path.exists(text):
                raise FileNotFoundError(f"input file not found: {text!r}")
            paths.append(text)
    return paths


def row_range(lo: int, hi: int) -> str:
    """Rows ``lo..hi-1`` in words: ``row 7`` or ``rows 0-99``."""
    return f"row {lo}" if hi - lo == 1 else f"rows {lo}-{hi - 1}"


def split_rows(chunk: dict, origin_of: Callable[[int, int], Origin], chunk_rows: int) -> list[Item]:
    """Cut a table's columns into items of at most ``chunk_rows`` rows (views, no copy)."""
    rows = num_rows(chunk)
    items = []
    for lo in range(0, rows, chunk_rows):
        hi = min(rows, lo + chunk_rows)
        piece = {k: v[lo:hi] for k, v in chunk.items()}
        items.append(Item(piece, origin_of(lo, hi), hi - lo, nbytes(piece)))
    return items


def arrow_column(kind: Any, has_nulls: bool, strings: str) -> Column:
    """The numpy column a Parquet column of Arrow type ``kind`` is read as, in every chunk.

    An integer column that holds a null anywhere in the files is float64 with NaN in every chunk
    (numpy ints have no null; deciding per chunk would change the type from chunk to chunk); text as
    ``strings`` says (``columns.to_numpy``); everything else as pyarrow converts it.
    """
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_integer(kind):
        return Column(np.dtype(np.float64) if has_nulls else np.dtype(kind.to_pandas_dtype()))
    if pa.types.is_boolean(kind) and has_nulls:
        return Column(np.dtype(object))
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if text or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        if strings == "object":
            return Column(np.dtype(object))
        return Column(np.dtype("U1" if strings == "str" and text else "S1"))
    return Column(pa.array([], type=kind).to_numpy(zero_copy_only=False).dtype)


def _nulls_by_column(meta: Any, arrow: Any) -> dict[str, bool]:
    """Whether each top-level column of a file may hold a null, from its row groups' statistics.

    A column chunk without statistics may; a row group of no rows holds none (Spark writes a file of
    no rows for an empty partition, with no statistics). Leaf columns are matched to their top-level
    field by position (a field has as many leaves as ``_leaves`` counts, in order), never by splitting
    their dotted path: a column named ``user.age`` is one field, not a field ``user``.
    """
    names = list(arrow.names)
    owner: list[int] = []
    for index, name in enumerate(names):
        owner += [index] * _leaves(arrow.field(name).type)
    if len(owner) != meta.num_columns:  # a layout this count does not know: every column may
        return dict.fromkeys(names, True)
    nulls = dict.fromkeys(names, False)
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if group.num_rows == 0:
            continue
        for c in range(group.num_columns):
            stats = group.column(c).statistics
            if stats is None or not stats.has_null_count or stats.null_count > 0:
                nulls[names[owner[c]]] = True
    return nulls


def _leaves(kind: Any) -> int:
    """How many Parquet leaf columns an Arrow type is stored as."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return sum(_leaves(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaves(kind.key_type) + _leaves(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaves(kind.value_type)
    if isinstance(kind, pa.ExtensionType):
        return _leaves(kind.storage_type)
    return 1


class ParquetSource(Source):
    """Parquet files read with pyarrow, one row group per unit (strings as ``columns.to_numpy`` says).

    The schema comes from the files (``arrow_column``), checked across all files when the first epoch
    plans its units: a file with other columns or another type raises ``SchemaError`` naming both
    files, unless ``widen`` allows a type that holds both exactly. A ``schema`` given by the user
    replaces it (chunks are converted to it where every value survives)."""

    name = "parquet"

    def __init__(
        self,
        paths: list[str],
        columns: Sequence[str] | None,
        chunk_rows: int,
        strings: str = "bytes",
        schema: Schema | None = None,
        widen: bool = False,
        shard: Shard | None = None,
    ) -> None:
        self.paths = paths
        self.shard = shard if shard is not None and shard.world_size > 1 else None
        self._slices: list[tuple[int, int, int]] | None = None  # this rank's (unit, lo, hi), sharded
        # a given schema names the columns to read
        wanted = columns if columns is not None else list(schema.columns) if schema is not None else None
        self.columns = list(wanted) if wanted is not None else None
        self.chunk_rows = chunk_rows
        self.strings = strings
        self.schema = schema
        self.widen = widen or schema is not None
        self._plan: list[tuple[int, int, int]] | None = None  # (file index, row group, first row)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._footers: dict[str, tuple[tuple[int, int, int], str | None]] = {}  # for ``fingerprint``
        self._file_schema(paths[0])  # a requested column the first file lacks fails now, not later

    def fingerprint(self) -> dict[str, Any]:
        """The files (path, size, time, footer digest), the columns, ``chunk_rows`` (the shuffle's input
        chunks must be cut where they were) and the strings mode."""
        with self._lock:
            files = file_facts(self.paths, self._footers)
        return {
            "kind": "parquet",
            "files": files,
            "columns": list(self.columns) if self.columns is not None else None,
            "chunk_rows": self.chunk_rows,
            "strings": self.strings,
        }

    def max_chunk_rows(self) -> int:
        return self.chunk_rows

    def _open(self, path: str) -> Any:
        import pyarrow.parquet as pq

        cached = getattr(self._local, "file", None)
        if cached is not None and cached[0] == path:
            return cached[1]
        try:
            handle = pq.ParquetFile(path)
        except FileNotFoundError:
            raise SourceError(f"Parquet file not found: {path!r}") from None
        except Exception as exc:
            raise SourceError(f"cannot read Parquet file {path!r}: {exc}") from exc
        self._local.file = (path, handle)
        return handle

    def _file_schema(self, path: str) -> Schema:
        handle = self._open(path)
        arrow = handle.schema_arrow
        nulls = _nulls_by_column(handle.metadata, arrow)
        names = self.columns if self.columns is not None else arrow.names
        missing = [n for n in names if n not in arrow.names]
        if missing:
            raise SchemaError(f"Parquet file {path!r} has no column(s) {missing}; its columns are {arrow.names}")
        return Schema(
            {n: arrow_column(arrow.field(n).type, nulls.get(n, True), self.strings) for n in names},
            f"file {path!r}",
        )

    def _files_schema(self) -> Schema:
        """One schema for all files: equal column names, and equal types (or unified under ``widen``).

        A file of no rows (Spark's empty partition) must have the columns, but its types do not count:
        it gives no value to hold, and its statistics-free columns would read as nullable. Its types
        are the schema only where every file is empty."""
        schemas = [(path, self._file_schema(path)) for path in self.paths]
        full = [(p, s) for p, s in schemas if self._open(p).metadata.num_rows > 0]
        reference, first = (full or schemas)[0]
        columns = dict(first.columns)
        for path, other in schemas:
            if other.columns.keys() != columns.keys():
                missing = [n for n in columns if n not in other.columns]
                extra = [n for n in other.columns if n not in columns]
                raise SchemaError(
                    f"Parquet file {path!r} has other columns than {reference!r}: missing {missing}, "
                    f"extra {extra}; pass columns=[...] to read the ones they share"
                )
        for path, other in full[1:]:
            for name, col in other.columns.items():
                if columns[name].same_type(col):
                    continue
                merged = unify(columns[name], col) if self.widen else None
                if merged is None:
                    how = "no type holds both exactly" if self.widen else "pass widen=True to read both as one type that holds every value exactly"
                    raise SchemaError(
                        f"Parquet file {path!r} column {name!r} is {col.describe()}, but {reference!r} "
                        f"has {columns[name].describe()}; {how}"
                    )
                columns[name] = merged
        origin = f"file {reference!r}" if len(self.paths) == 1 else f"files {reference!r} ... ({len(self.paths)})"
        return Schema(columns, origin)

    def units(self) -> int:
        with self._lock:
            if self._plan is None:
                if self.schema is None:
                    self.schema = self._files_schema()
                plan, rows = [], []
                for f, path in enumerate(self.paths):
                    meta = self._open(path).metadata
                    first = 0
                    for g in range(meta.num_row_groups):
                        plan.append((f, g, first))
                        rows.append(meta.row_group(g).num_rows)
                        first += rows[-1]
                if self.shard is not None:  # this rank's contiguous range of rows (``sharding``)
                    self._slices = range_slices(rows, self.shard)
                self._plan = plan
            return len(self._plan) if self._slices is None else len(self._slices)

    def read_unit(self, unit: int) -> list[Item]:
        assert self._plan is not None and self.schema is not None
        lo = 0
        if self._slices is not None:  # a sharded unit: rows lo..hi-1 of a row group
            unit, lo, hi = self._slices[unit]
        f, group, first = self._plan[unit]
        path = self.paths[f]
        try:
            table = self._open(path).read_row_group(group, columns=self.columns)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(f"cannot read Parquet file {path!r} (row group {group}): {exc}") from exc
        if self._slices is not None:
            table, first = table.slice(lo, hi - lo), first + lo
        if table.num_rows == 0:  # no rows: nothing to check its types against (``_files_schema``)
            return []
        where = f"Parquet file {path!r} row group {group}"
        chunk = {name: self._column(table.column(name), name, where, first) for name in table.column_names}
        # types were checked across files when planning; what is left is the null rule and unify's
        # widening, both stated, so widening is allowed here (and still checked value by value)
        chunk = self.schema.conform(validate_chunk(chunk, where), where, widen_ok=True)

        def origin(lo: int, hi: int) -> Origin:
            return Origin((Segment(self, unit, first + lo, first + hi),))

        return split_rows(chunk, origin, self.chunk_rows)

    def _column(self, column: Any, name: str, where: str, first: int) -> np.ndarray:
        """``_convert``, with a value that cannot be converted (text that is not UTF-8, read as ``str``)
        raised as ``SourceError`` naming the file, row group, column and row."""
        import pyarrow as pa

        try:
            return self._convert(column, name, where)
        except (UnicodeDecodeError, pa.ArrowException) as exc:
            bad = _first_non_utf8(column)
            if bad is None:
                raise SourceError(f"{where} column {name!r}: cannot convert it to numpy: {exc}") from exc
            row, reason = bad
            raise SourceError(
                f"{where} column {name!r} row {first + row} (of the file): the text is not valid UTF-8 "
                f"({reason}); read the files with strings='bytes' to get the raw bytes"
            ) from None

    def _convert(self, column: Any, name: str, where: str) -> np.ndarray:
        """One Arrow column as numpy; an integer column read as float converts exactly or fails
        (pyarrow's own conversion of an int column with nulls rounds values past 2**53 silently)."""
        import pyarrow as pa

        want = self.schema.columns.get(name) if self.schema is not None else None
        if want is None or want.dtype.kind != "f" or not pa.types.is_integer(column.type):
            return to_numpy(column, self.strings)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        values = column.fill_null(0).to_numpy(zero_copy_only=False)
        out = widen(values, want.dtype)
        if out is None:
            raise SchemaError(
                f"{where}: column {name!r} is {values.dtype} read as {want.describe()} (it holds nulls, or "
                f"another file has {want.describe()}), but some of its values {want.describe()} cannot hold "
                "exactly; fill the nulls when writing, or read the files apart"
            )
        if column.null_count:
            out = out.copy() if out is values else out
            out[~column.is_valid().to_numpy(zero_copy_only=False)] = np.nan
        return out

    def file_of(self, unit: int) -> int:
        """Rows are numbered per file, so ranges of one file can be merged in messages."""
        return self._plan[unit][0] if self._plan else 0

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"{self.paths[self.file_of(unit)]} {row_range(lo, hi)}"


def _first_non_utf8(column: Any) -> tuple[int, str] | None:
    """The first row of a string column whose bytes are not UTF-8 and why, or ``None`` (an error's
    path only: one Python value per row)."""
    import pyarrow as pa

    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode() if isinstance(column, pa.Array) else column.combine_chunks().dictionary_decode()
    raw = column.cast(pa.large_binary() if pa.types.is_large_string(kind) else pa.binary())
    for row, value in enumerate(raw.to_pylist()):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                return row, str(exc)
    return None


class IterableSource(Source):
    """A user's chunks: an iterable (re-iterated each epoch) or a callable returning one per epoch.

    The schema is the first chunk's (or the one given); every chunk is checked against it."""

    parallel = False

    def __init__(
        self,
        chunks: Iterable[Any] | Callable[[], Iterable[Any]],
        name: str,
        schema: Schema | None = None,
        widen: bool = False,
        shard: Shard | None = None,
    ) -> None:
        self._chunks = chunks
        self.shard = shard if shard is not None and shard.world_size > 1 else None
        self.name = name
        self._epochs = 0
        self.schema = schema
        self.widen = widen or schema is not None

    def fingerprint(self) -> dict[str, Any]:
        """Its name only: a user's chunks cannot be fingerprinted (a chunk whose rows changed raises
        when a resume reads it)."""
        return {"kind": "iterable", "name": self.name}

    def stream(self) -> Iterator[Item]:
        """Every chunk, checked; with a shard, this rank's share of each (``sharding.shard_stream``)."""
        items = self._all_chunks()
        return items if self.shard is None else shard_stream(items, self.shard)

    def _all_chunks(self) -> Iterator[Item]:
        produced = self._chunks() if callable(self._chunks) else self._chunks
        if produced is self._chunks and iter(produced) is produced:  # a one-shot iterator
            if self._epochs:
                raise SourceError(
                    f"source {self.name!r} is a one-shot iterator and was used up by epoch 0; pass a "
                    "list or a callable that returns a fresh iterable for every epoch"
                )
        self._epochs += 1
        first = 0
        for index, chunk in enumerate(produced):
            where = f"source {self.name!r} chunk #{index}"
            chunk = validate_chunk(chunk, where)
            if self.schema is None:
                self.schema = Schema.of(chunk, f"fixed by {where} of epoch {self._epochs - 1}")
            chunk = self.schema.conform(chunk, where, widen_ok=self.widen)
            rows = num_rows(chunk)
            yield Item(chunk, Origin((Segment(self, index, first, first + rows),)), rows, nbytes(chunk))
            first += rows

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"source {self.name!r} chunk #{unit} ({row_range(lo, hi)})"
