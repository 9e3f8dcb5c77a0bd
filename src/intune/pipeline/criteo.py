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
workers); a block is parsed with pyarrow's CSV reader and, only if that fails, by the slow path:
each line is checked by ``line_problem`` (which accepts exactly what the fast parser accepts, integer
syntax and int64 range included), the lines it accepts are parsed again with pyarrow, and if that
still fails the block is bisected down to the single lines pyarrow rejects, so a malformed line is
always found by its own line, never blamed on the block. ``on_error="raise"`` raises ``SourceError``
naming the file, the true 1-based line (lines end at ``\\n``) and the problem; ``"skip"`` drops the
line and counts it (``skipped_lines``, shown as the read stage's ``skipped``), keeps the first
``SKIPPED_KEPT`` as ``(file, line, problem)`` in ``skipped_examples`` and logs each of those as a
warning. Empty lines hold no row: both paths ignore them, uncounted.

With a ``sharding.Shard`` the rows of every block are counted first (one pass over the files, once per
source), so that each rank reads only the blocks of its range of rows; a block whose malformed lines
were skipped repeats its own rows to keep the rank's count.
This module must not know about threads or stages.
"""

from __future__ import annotations

import io
import logging
import os
import re
import threading
from typing import Any

import numpy as np

from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment
from intune.pipeline.errors import SourceError
from intune.pipeline.sharding import Shard, pad_to, range_slices
from intune.pipeline.sources import Source, file_facts, split_rows

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

# pyarrow's int64 syntax after it trims spaces: decimal with an optional '-' (no '+', no '_'), or
# '0x'/'0X' and 1..16 hex digits (read as uint64 bits, so 0x8000000000000000 is -2**63)
_DECIMAL = re.compile(rb"-?[0-9]+")
_HEX_INT = re.compile(rb"0[xX][0-9a-fA-F]{1,16}")
_INT64_DIGITS = 19  # 2**63 has 19 decimal digits
SKIPPED_KEPT = 20  # skipped lines kept (and logged) by file and line; all of them are counted

log = logging.getLogger(__name__)


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


def parse_lines(lines: list[bytes], kept: list[int]) -> tuple[list[dict[str, np.ndarray]], dict[int, str]]:
    """Parse ``lines[j] for j in kept`` with the fast parser, bisecting around the lines it rejects.

    Returns the parsed pieces in line order and ``{j: problem}`` for each single line the parser
    rejects. This is the safety net for any line ``line_problem`` accepts but pyarrow does not: the
    line itself is found (in about ``log2(len(kept))`` parses per bad line), never the whole block.
    """
    if not kept:
        return [], {}
    try:
        return [parse_block(b"".join(lines[j] for j in kept))], {}
    except MalformedBlock as exc:
        if len(kept) == 1:
            return [], {kept[0]: f"rejected by the CSV parser: {exc}"}
    mid = len(kept) // 2
    head, head_bad = parse_lines(lines, kept[:mid])
    tail, tail_bad = parse_lines(lines, kept[mid:])
    return head + tail, {**head_bad, **tail_bad}


def empty_chunk() -> dict[str, np.ndarray]:
    chunk = {"label": np.empty(0, np.int64)}
    chunk.update({c: np.empty(0, np.float32) for c in INT_COLUMNS})
    chunk.update({c: np.empty(0, np.int64) for c in CAT_COLUMNS})
    return chunk


def int64_problem(value: bytes) -> str | None:
    """Why a non-empty integer field is not one pyarrow's int64 conversion accepts, or None.

    The rule is pyarrow's, not Python's ``int()``: spaces around the value are trimmed, then it
    must be decimal digits with an optional leading '-' within the int64 range, or '0x' and 1..16
    hex digits. ``int()`` also takes '+5', '1_000' and unbounded values, which pyarrow rejects; a
    check looser than the parser would keep a line whose block then fails again.
    """
    text = value.strip(b" ")
    if _HEX_INT.fullmatch(text):
        return None
    if not _DECIMAL.fullmatch(text):
        return "is not an integer"
    negative = text.startswith(b"-")
    digits = text.lstrip(b"-").lstrip(b"0")  # any number of leading zeros is valid
    if len(digits) > _INT64_DIGITS or int(digits or b"0") > 2**63 - 1 + negative:
        return "is outside the int64 range"
    return None


def count_rows(data: bytes) -> int:
    """Rows that complete lines ``data`` hold: its non-empty lines, split as pyarrow splits them."""
    if b"\r" not in data and b"\n\n" not in data and not data.startswith(b"\n"):
        return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    return sum(1 for line in data.splitlines() if line)


def line_problem(line: bytes) -> str | None:
    """Why a single non-empty line is malformed, or None if the fast parser accepts it.

    It must accept exactly what ``parse_block`` accepts, so that whether a line is kept does not
    depend on whether another line of its block is malformed.
    """
    fields = line.rstrip(b"\r\n").split(b"\t")
    if len(fields) != FIELDS:
        return f"expected {FIELDS} tab-separated fields, got {len(fields)}"
    if not fields[0]:
        return "the label is missing"
    problem = int64_problem(fields[0])
    if problem:
        return f"label {fields[0][:20]!r} {problem}"
    for name, value in zip(INT_COLUMNS, fields[1:14], strict=True):
        problem = int64_problem(value) if value else None
        if problem:
            return f"{name} = {value[:20]!r} {problem}"
    for name, value in zip(CAT_COLUMNS, fields[14:], strict=True):
        if value and (len(value) != 8 or (_HEX[np.frombuffer(value, np.uint8)] == 255).any()):
            return f"{name} = {value[:20]!r} is not 8 hex digits"
    return None


class CriteoTsvSource(Source):
    """Criteo TSV files, split into byte blocks aligned to lines."""

    name = "criteo"

    def __init__(
        self, paths: list[str], chunk_rows: int, on_error: str, block_bytes: int, shard: Shard | None = None
    ) -> None:
        self.paths = paths
        self.shard = shard if shard is not None and shard.world_size > 1 else None
        self._slices: list[tuple[int, int, int]] | None = None  # this rank's (block, lo, hi), sharded
        self.chunk_rows = chunk_rows
        self.on_error = on_error
        self.block_bytes = block_bytes
        self.skipped_lines = 0
        self.skipped_examples: list[tuple[str, int, str]] = []  # the first SKIPPED_KEPT skipped
        self._line_marks: dict[int, dict[int, int]] = {}  # file -> {byte offset: lines before it}
        self._plan: list[tuple[int, int, int]] | None = None
        self._starts: dict[int, int] = {}  # unit -> byte offset of its first line (once read)
        self._lock = threading.Lock()

    def fingerprint(self) -> dict[str, Any]:
        """The files (path, size, modification time: a TSV file has no footer to digest), the chunking
        (``chunk_rows``, ``block_bytes``) and ``on_error`` (which decides the rows of a block)."""
        return {
            "kind": "criteo_tsv",
            "files": file_facts(self.paths),
            "chunk_rows": self.chunk_rows,
            "block_bytes": self.block_bytes,
            "on_error": self.on_error,
        }

    def max_chunk_rows(self) -> int:
        return self.chunk_rows

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
                if self.shard is not None:  # rows per block are not known without counting the lines
                    counts = [count_rows(self._read_block(unit)[0]) for unit in range(len(plan))]
                    self._slices = range_slices(counts, self.shard)
            return len(self._plan) if self._slices is None else len(self._slices)

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
        lo = 0
        if self._slices is not None:  # a sharded unit: rows lo..hi-1 of a block
            unit, lo, hi = self._slices[unit]
        data, first = self._read_block(unit)
        self._starts[unit] = first
        try:
            chunk = parse_block(data)
        except MalformedBlock:
            chunk = self._parse_slowly(unit, data, first)
        if self._slices is not None:
            chunk = {name: column[lo:hi] for name, column in chunk.items()}
            # lines skipped (on_error="skip") leave the block short: repeat its rows to keep the count
            assert self._plan is not None
            where = f"Criteo TSV file {self.paths[self._plan[unit][0]]!r} (rank {self.shard.rank})"
            short = hi - lo - len(chunk["label"])
            if short > 0:
                log.warning("%s: %d skipped line(s) made up by repeating rows of the same block", where, short)
                chunk = pad_to(chunk, hi - lo, where)

        def origin(a: int, b: int) -> Origin:
            return Origin((Segment(self, unit, lo + a, lo + b),))

        return split_rows(chunk, origin, self.chunk_rows)

    def _parse_slowly(self, unit: int, data: bytes, first: int) -> dict[str, np.ndarray]:
        """Parse a block the fast parser rejected, dropping (skip) or raising on its bad lines.

        Lines are split as pyarrow splits them (``\\n``, ``\\r\\n`` or a lone ``\\r``), so a kept
        line is exactly one row; line numbers count ``\\n`` as everywhere else in this module.
        """
        lines = data.splitlines(keepends=True)
        problems: dict[int, str] = {}
        kept: list[int] = []
        for j, line in enumerate(lines):
            if not line.rstrip(b"\r\n"):
                continue  # an empty line holds no row; pyarrow skips it too
            problem = line_problem(line)
            if problem is None:
                kept.append(j)
            else:
                problems[j] = problem
        chunks, rejected = parse_lines(lines, kept)
        problems.update(rejected)
        if problems:
            self._bad_lines(unit, lines, problems)
        if not chunks:
            return empty_chunk()
        return {name: np.concatenate([c[name] for c in chunks]) for name in COLUMNS}

    def _bad_lines(self, unit: int, lines: list[bytes], problems: dict[int, str]) -> None:
        """Raise on the block's first bad line, or count them all (and keep the first few) to skip."""
        assert self._plan is not None
        path = self.paths[self._plan[unit][0]]
        order = sorted(problems)
        if self.on_error != "skip":
            (line_no,) = self._line_numbers(unit, lines, order[:1])
            raise SourceError(
                f"malformed line in Criteo TSV file {path!r} line {line_no}: {problems[order[0]]}"
            )
        with self._lock:
            self.skipped_lines += len(order)
            room = SKIPPED_KEPT - len(self.skipped_examples)
        if room <= 0:
            return  # counted; numbering more lines would cost a scan of the file for a log nobody reads
        numbers = self._line_numbers(unit, lines, order[:room])
        kept = [(path, n, problems[j]) for n, j in zip(numbers, order, strict=False)]
        with self._lock:
            kept = kept[: SKIPPED_KEPT - len(self.skipped_examples)]
            self.skipped_examples.extend(kept)
        for name, line_no, problem in kept:
            log.warning("skipped malformed line in Criteo TSV file %r line %d: %s", name, line_no, problem)

    def _line_numbers(self, unit: int, lines: list[bytes], js: list[int]) -> list[int]:
        """1-based line numbers in its file of the block's lines ``js`` (ascending; split as pyarrow)."""
        base = self._line_base(unit)
        numbers: list[int] = []
        seen = newlines = 0
        for j in js:
            newlines += sum(line.endswith(b"\n") for line in lines[seen:j])
            seen = j
            numbers.append(base + newlines + 1)
        return numbers

    def _line_base(self, unit: int) -> int:
        """Lines before the unit's first line (counted only when a message needs it).

        Counts ``\\n`` from the nearest earlier offset already counted in the file, and remembers
        the result, so numbering many lines of one file does not rescan it from the start each time.
        """
        assert self._plan is not None
        f = self._plan[unit][0]
        first = self._starts.get(unit, self._plan[unit][1])
        with self._lock:
            marks = self._line_marks.setdefault(f, {0: 0})
            start = max(offset for offset in marks if offset <= first)
            count = marks[start]
        with open(self.paths[f], "rb") as handle:
            handle.seek(start)
            remaining = first - start
            while remaining > 0:
                block = handle.read(min(remaining, 1 << 22))
                if not block:
                    break
                count += block.count(b"\n")
                remaining -= len(block)
        with self._lock:
            marks[first] = count
        return count

    def describe(self, unit: int, lo: int, hi: int) -> str:
        assert self._plan is not None
        path = self.paths[self._plan[unit][0]]
        base = self._line_base(unit)
        lines = f"line {base + hi}" if hi - lo == 1 else f"lines {base + lo + 1}-{base + hi}"
        return f"{path} {lines}"
