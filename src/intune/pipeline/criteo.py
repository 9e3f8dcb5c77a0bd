"""The raw Criteo TSV reader (Criteo 1TB / Kaggle display-advertising format).

Each line: ``label \\t I1..I13 \\t C1..C26``, tab-separated, an empty field is missing. Integer
features may be negative; categorical features are 8 hexadecimal digits. Output columns (one chunk
per at most ``chunk_rows`` lines, all of equal length):

- ``label``: ``int64`` (0 or 1 in the real data; a missing label is a malformed line).
- ``I1`` .. ``I13``: ``float32``; a missing value is ``NaN`` (so ``np.isnan`` is the missing mask;
  DLRM preprocessing typically does ``log1p(max(x, 0))`` after filling NaN with 0). Values above
  2**24 lose integer precision in float32.
- ``C1`` .. ``C26``: ``int64`` decoded from the hex string (0 .. 2**32-1); a missing value is ``-1``.

A file is split into blocks of ``block_bytes`` (read units, parsed in parallel by the read stage's
workers); a block is parsed with pyarrow's CSV reader and, only if that fails, line by line to find
the malformed line: ``on_error="raise"`` raises ``SourceError`` naming the file and 1-based line,
``"skip"`` drops the line and counts it (``skipped_lines``, shown as the read stage's ``skipped``).
This module must not know about threads or stages.
"""

from __future__ import annotations

import io
import os
import threading

import numpy as np

from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment
from intune.pipeline.errors import SourceError
from intune.pipeline.sources import Source, split_rows

INT_COLUMNS = [f"I{i}" for i in range(1, 14)]
CAT_COLUMNS = [f"C{i}" for i in range(1, 27)]
COLUMNS = ["label", *INT_COLUMNS, *CAT_COLUMNS]
FIELDS = len(COLUMNS)

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_SHIFTS = np.arange(28, -1, -4, dtype=np.int64)


class MalformedBlock(Exception):
    """The fast parser rejected a block; the slow path will find the line."""


def decode_hex(array: object, name: str) -> np.ndarray:
    """A pyarrow string array of 8-hex-digit values (or empty) as int64, -1 for empty."""
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    if array.null_count:
        array = array.fill_null("")
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=n + 1, offset=array.offset * 4)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    lengths = np.diff(offsets)
    out = np.full(n, -1, dtype=np.int64)
    full = lengths == 8
    if not np.all(full | (lengths == 0)):
        raise MalformedBlock(f"{name}: a value is not 8 hex digits")
    if full.any():
        starts = offsets[:-1][full]
        digits = _HEX[data[starts[:, None] + np.arange(8)]]
        if (digits == 255).any():
            raise MalformedBlock(f"{name}: a value is not hexadecimal")
        out[full] = (digits.astype(np.int64) << _SHIFTS).sum(axis=1)
    return out


def parse_block(data: bytes) -> dict[str, np.ndarray]:
    """Parse complete lines with pyarrow; raise ``MalformedBlock`` on anything irregular."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    if not data.strip():
        return empty_chunk()
    types = {
        "label": pa.int64(),
        **{c: pa.int64() for c in INT_COLUMNS},
        **{c: pa.string() for c in CAT_COLUMNS},
    }
    try:
        table = pcsv.read_csv(
            io.BytesIO(data),
            read_options=pcsv.ReadOptions(
                column_names=COLUMNS, use_threads=False, block_size=max(1 << 20, len(data) + 1)
            ),
            parse_options=pcsv.ParseOptions(
                delimiter="\t", quote_char=False, escape_char=False, newlines_in_values=False
            ),
            convert_options=pcsv.ConvertOptions(
                column_types=types, null_values=[""], strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise MalformedBlock(str(exc)) from None
    label = table.column("label")
    if label.null_count:
        raise MalformedBlock("missing label")
    chunk = {"label": label.to_numpy()}
    for name in INT_COLUMNS:
        chunk[name] = table.column(name).to_numpy().astype(np.float32)
    for name in CAT_COLUMNS:
        chunk[name] = decode_hex(table.column(name), name)
    return chunk


def empty_chunk() -> dict[str, np.ndarray]:
    chunk = {"label": np.empty(0, np.int64)}
    chunk.update({c: np.empty(0, np.float32) for c in INT_COLUMNS})
    chunk.update({c: np.empty(0, np.int64) for c in CAT_COLUMNS})
    return chunk


def line_problem(line: bytes) -> str | None:
    """Why a single line is malformed, or None if it is fine (the slow path)."""
    fields = line.rstrip(b"\r\n").split(b"\t")
    if len(fields) != FIELDS:
        return f"expected {FIELDS} tab-separated fields, got {len(fields)}"
    try:
        int(fields[0])
    except ValueError:
        return f"label {fields[0][:20]!r} is not an integer"
    for name, value in zip(INT_COLUMNS, fields[1:14], strict=True):
        if value:
            try:
                int(value)
            except ValueError:
                return f"{name} = {value[:20]!r} is not an integer"
    for name, value in zip(CAT_COLUMNS, fields[14:], strict=True):
        if value and (len(value) != 8 or (_HEX[np.frombuffer(value, np.uint8)] == 255).any()):
            return f"{name} = {value[:20]!r} is not 8 hex digits"
    return None


class CriteoTsvSource(Source):
    """Criteo TSV files, split into byte blocks aligned to lines."""

    name = "criteo"

    def __init__(self, paths: list[str], chunk_rows: int, on_error: str, block_bytes: int) -> None:
        self.paths = paths
        self.chunk_rows = chunk_rows
        self.on_error = on_error
        self.block_bytes = block_bytes
        self.skipped_lines = 0
        self._plan: list[tuple[int, int, int]] | None = None
        self._starts: dict[int, int] = {}  # unit -> byte offset of its first line (once read)
        self._lock = threading.Lock()

    def units(self) -> int:
        with self._lock:
            if self._plan is None:
                plan = []
                for f, path in enumerate(self.paths):
                    try:
                        size = os.path.getsize(path)
                    except OSError as exc:
                        raise SourceError(f"cannot read Criteo TSV file {path!r}: {exc}") from None
                    for start in range(0, max(size, 1), self.block_bytes):
                        plan.append((f, start, min(size, start + self.block_bytes)))
                self._plan = plan
            return len(self._plan)

    def _read_block(self, unit: int) -> tuple[bytes, int]:
        assert self._plan is not None
        f, start, end = self._plan[unit]
        path = self.paths[f]
        try:
            with open(path, "rb") as handle:
                if start > 0:
                    handle.seek(start - 1)
                    handle.readline()  # the line holding byte start-1 belongs to the previous block
                first = handle.tell()
                if first >= end:
                    return b"", first
                data = handle.read(end - first)
                if data and not data.endswith(b"\n"):
                    data += handle.readline()
        except OSError as exc:
            raise SourceError(f"cannot read Criteo TSV file {path!r}: {exc}") from None
        return data, first

    def read_unit(self, unit: int) -> list[Item]:
        data, first = self._read_block(unit)
        self._starts[unit] = first
        try:
            chunk = parse_block(data)
        except MalformedBlock:
            chunk = self._parse_slowly(unit, data, first)

        def origin(lo: int, hi: int) -> Origin:
            return Origin((Segment(self, unit, lo, hi),))

        return split_rows(chunk, origin, self.chunk_rows)

    def _parse_slowly(self, unit: int, data: bytes, first: int) -> dict[str, np.ndarray]:
        good = []
        lines = data.splitlines(keepends=True)
        for j, line in enumerate(lines):
            problem = line_problem(line) if line.strip() else "empty line"
            if problem is None:
                good.append(line)
                continue
            if self.on_error == "skip":
                with self._lock:
                    self.skipped_lines += 1
                continue
            path = self.paths[self._plan[unit][0]]  # type: ignore[index]
            line_no = self._line_base(unit) + j + 1
            raise SourceError(f"malformed line in Criteo TSV file {path!r} line {line_no}: {problem}")
        try:
            return parse_block(b"".join(good))
        except MalformedBlock as exc:  # a problem the line check does not know; report the block
            path = self.paths[self._plan[unit][0]]  # type: ignore[index]
            raise SourceError(
                f"malformed Criteo TSV file {path!r} near line {self._line_base(unit) + 1}: {exc}"
            ) from None

    def _line_base(self, unit: int) -> int:
        """Lines before the unit's first line (counted only when an error message needs it)."""
        assert self._plan is not None
        f = self._plan[unit][0]
        first = self._starts.get(unit, self._plan[unit][1])
        count = 0
        with open(self.paths[f], "rb") as handle:
            remaining = first
            while remaining > 0:
                block = handle.read(min(remaining, 1 << 22))
                if not block:
                    break
                count += block.count(b"\n")
                remaining -= len(block)
        return count

    def describe(self, unit: int, lo: int, hi: int) -> str:
        assert self._plan is not None
        path = self.paths[self._plan[unit][0]]
        base = self._line_base(unit)
        return f"{path} lines {base + lo + 1}-{base + hi}"
