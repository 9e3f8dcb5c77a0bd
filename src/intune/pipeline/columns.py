"""Arrow columns as numpy arrays: string and binary columns as fixed-width ``S`` / ``U`` arrays.

Owns how the Parquet reader turns one pyarrow column into a numpy column. Numeric columns convert as
pyarrow does (nulls in them become float NaN). String and binary columns become fixed-width numpy
arrays built straight from Arrow's offsets and bytes buffers (vectorised, no Python object per
value), because fixed-width arrays are plain buffers: they cross to process workers through shared
memory, while object arrays have to be pickled (about 4 us per row for 26 hex-ID columns).

``strings`` picks the representation:

- ``"bytes"`` (default): numpy ``S<width>`` holding the UTF-8 bytes (values are ``bytes``; compact:
  one byte per character).
- ``"str"``: numpy ``U<width>`` (values are ``str``; four bytes per character).
- ``"object"``: the old object array of ``str`` / ``bytes`` / ``None`` (pickled to process workers).

In ``S`` / ``U`` arrays a null becomes the empty value (``b""`` / ``""``), as numpy has no null.
A column keeps the object form when a fixed width cannot hold it faithfully or cheaply: a value
ending in a NUL byte (numpy strips trailing NULs), or values so uneven in length that the padded
array would be far larger than the data (``_MAX_PADDING``). Other types (lists, structs, ...) stay
as pyarrow converts them (object arrays). This module must not know about sources or workers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

STRINGS = ("bytes", "str", "object")
_MAX_PADDING = 8  # padded bytes may be at most this many times the data bytes (+ 1 MiB) ...
_SLACK = 1 << 20  # ... else the column stays an object array


def to_numpy(column: Any, strings: str = "bytes") -> np.ndarray:
    """A pyarrow ``Array`` / ``ChunkedArray`` as numpy; see the module docstring for strings."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if strings != "object":
        kind = column.type
        if pa.types.is_dictionary(kind):
            column = column.dictionary_decode()
            kind = column.type
        if _is_text(pa, kind) or _is_binary(pa, kind):
            fixed = fixed_width(column, text=strings == "str" and _is_text(pa, kind))
            if fixed is not None:
                return fixed
    return column.to_numpy(zero_copy_only=False)


def _is_text(pa: Any, kind: Any) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _is_binary(pa: Any, kind: Any) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


def fixed_width(array: Any, text: bool = False) -> np.ndarray | None:
    """A (large) string / binary Arrow array as ``S`` (or ``U`` with ``text``); None if unfaithful.

    Gathers every value's bytes into a zero-padded ``(rows, width)`` byte matrix in one vectorised
    scatter; ``U`` widens the bytes when they are all ASCII and decodes through Python otherwise.
    """
    import pyarrow as pa

    n = len(array)
    if n == 0:
        return np.empty(0, dtype="U1" if text else "S1")
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    validity, offsets_buf, data_buf = array.buffers()[:3]
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)[
        array.offset : array.offset + n + 1
    ]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    lengths = np.diff(offsets)
    src = data[offsets[0] : offsets[-1]]
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        if lengths[~valid].any():  # null slots may own bytes: drop them
            src = src[np.repeat(valid, lengths)]
        lengths = np.where(valid, lengths, 0)
    width = int(lengths.max())
    total = int(lengths.sum())
    if n * max(width, 1) > _MAX_PADDING * total + _SLACK:
        return None  # a few long values would blow the padded array up
    if total and (src[np.cumsum(lengths)[lengths > 0] - 1] == 0).any():
        return None  # a value ends in NUL: numpy would strip it
    if width == 0:
        return np.full(n, "" if text else b"", dtype="U1" if text else "S1")
    if total == n * width:  # every value has the full width (fixed-length IDs): a plain reshape
        matrix = src.reshape(n, width)
    else:
        matrix = np.zeros((n, width), dtype=np.uint8)
        starts = np.cumsum(lengths) - lengths  # where each value starts in src
        dest = np.arange(total, dtype=np.int64) + np.repeat(
            np.arange(n, dtype=np.int64) * width - starts, lengths
        )
        matrix.reshape(-1)[dest] = src
    if not text:
        return np.ascontiguousarray(matrix).view(f"S{width}").reshape(n)
    if total == 0 or int(src.max()) < 128:  # ASCII: one code point per byte
        return matrix.astype(np.uint32).view(f"U{width}").reshape(n)
    decoded = np.ascontiguousarray(matrix).view(f"S{width}").reshape(n)
    return np.char.decode(decoded, "utf-8")
