"""Sources: where rows come from, split into read units that workers can read in parallel.

Owns file discovery, the unit plan (a Parquet row group; a generic iterable is one sequential
stream), reading a unit into chunks of at most ``chunk_rows`` rows with equal-length columns, and
describing a unit's rows in words for error messages. Errors name the file. It must not know about
threads, channels or knobs.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment, nbytes, num_rows, validate_chunk
from intune.pipeline.columns import to_numpy
from intune.pipeline.errors import SourceError


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


def split_rows(chunk: dict, origin_of: Callable[[int, int], Origin], chunk_rows: int) -> list[Item]:
    """Cut a table's columns into items of at most ``chunk_rows`` rows (views, no copy)."""
    rows = num_rows(chunk)
    items = []
    for lo in range(0, rows, chunk_rows):
        hi = min(rows, lo + chunk_rows)
        piece = {k: v[lo:hi] for k, v in chunk.items()}
        items.append(Item(piece, origin_of(lo, hi), hi - lo, nbytes(piece)))
    return items


class ParquetSource(Source):
    """Parquet files read with pyarrow, one row group per unit (strings as ``columns.to_numpy`` says)."""

    name = "parquet"

    def __init__(
        self, paths: list[str], columns: Sequence[str] | None, chunk_rows: int, strings: str = "bytes"
    ) -> None:
        self.paths = paths
        self.columns = list(columns) if columns is not None else None
        self.chunk_rows = chunk_rows
        self.strings = strings
        self._plan: list[tuple[int, int, int]] | None = None  # (file index, row group, first row)
        self._lock = threading.Lock()
        self._local = threading.local()

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

    def units(self) -> int:
        with self._lock:
            if self._plan is None:
                plan = []
                for f, path in enumerate(self.paths):
                    meta = self._open(path).metadata
                    first = 0
                    for g in range(meta.num_row_groups):
                        plan.append((f, g, first))
                        first += meta.row_group(g).num_rows
                self._plan = plan
            return len(self._plan)

    def read_unit(self, unit: int) -> list[Item]:
        assert self._plan is not None
        f, group, first = self._plan[unit]
        path = self.paths[f]
        try:
            table = self._open(path).read_row_group(group, columns=self.columns)
            chunk = {name: to_numpy(table.column(name), self.strings) for name in table.column_names}
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(f"cannot read Parquet file {path!r} (row group {group}): {exc}") from exc
        chunk = validate_chunk(chunk, f"Parquet file {path!r} row group {group}")

        def origin(lo: int, hi: int) -> Origin:
            return Origin((Segment(self, unit, first + lo, first + hi),))

        return split_rows(chunk, origin, self.chunk_rows)

    def file_of(self, unit: int) -> int:
        """Rows are numbered per file, so ranges of one file can be merged in messages."""
        return self._plan[unit][0] if self._plan else 0

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"{self.paths[self.file_of(unit)]} rows {lo}-{hi - 1}"


class IterableSource(Source):
    """A user's chunks: an iterable (re-iterated each epoch) or a callable returning one per epoch."""

    parallel = False

    def __init__(self, chunks: Iterable[Any] | Callable[[], Iterable[Any]], name: str) -> None:
        self._chunks = chunks
        self.name = name
        self._epochs = 0

    def stream(self) -> Iterator[Item]:
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
            chunk = validate_chunk(chunk, f"source {self.name!r} chunk #{index}")
            rows = num_rows(chunk)
            yield Item(chunk, Origin((Segment(self, index, first, first + rows),)), rows, nbytes(chunk))
            first += rows

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"source {self.name!r} chunk #{unit} (rows {lo}-{hi - 1})"
