"""Shared-memory transport: numpy chunks laid out in reused POSIX shared-memory segments (``/dev/shm``).

Owns the byte layout of a chunk in a segment and the segments' lifetimes. Each process worker has two
segments that live as long as the worker and grow when a chunk does not fit: the input segment
(written by the parent, read in place by the child) and the output segment (written by the child,
copied out by the parent before the next task). Fresh segments per chunk would cost more than the
copy (a new tmpfs page must be allocated and zeroed for every byte). An output column that *is* one
of the input views (a pass-through column) is not copied by the child: its layout entry points into
the input segment. Only the small layout crosses the pipe. Columns of ``object`` dtype are pickled
into the layout (slow path: the Parquet reader gives strings as fixed-width ``S`` / ``U`` arrays so
that they do not take it; a UDF returning object arrays does, and the worker counts it). This module must not know about processes or pools.
"""

from __future__ import annotations

import glob
import math
import mmap
import os
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm"
ALIGN = 64
IN, OUT, PICKLED = 0, 1, 2

# (column, dtype.str, shape, offset, where): where is IN / OUT (a segment) or PICKLED (shape holds bytes)
Layout = list[tuple[str, str, Any, int, int]]


def plan(
    chunk: Mapping[str, Any], where: int = IN, passthrough: Mapping[int, tuple] | None = None
) -> tuple[Layout, int]:
    """The layout of ``chunk`` in a segment and the bytes it needs there.

    ``passthrough`` maps ``id(array)`` of input views to their input layout entry: such columns are
    laid out as references into the input segment.
    """
    layout: Layout = []
    offset = 0
    for name, column in chunk.items():
        if passthrough and id(column) in passthrough:
            _, dtype, shape, off, place = passthrough[id(column)]
            # a pickled input column goes back as the same pickle (not re-pickled)
            layout.append((name, dtype, shape, off, PICKLED if place == PICKLED else IN))
            continue
        array = np.asarray(column)
        if array.dtype.hasobject:
            layout.append((name, "", pickle.dumps(array, protocol=5), -1, PICKLED))
            continue
        layout.append((name, array.dtype.str, array.shape, offset, where))
        offset += -(-array.nbytes // ALIGN) * ALIGN
    return layout, offset


def count_pickled(layout: Layout) -> int:
    """How many columns of ``layout`` took the pickled slow path."""
    return sum(1 for entry in layout if entry[4] == PICKLED)


def write(buffer: Any, chunk: Mapping[str, Any], layout: Layout, where: int) -> None:
    """Copy the chunk's columns laid out in ``where`` into ``buffer`` at their offsets."""
    for (_, dtype, shape, offset, place), column in zip(layout, chunk.values(), strict=True):
        if place != where:
            continue
        array = np.asarray(column)
        if array.nbytes == 0:
            continue
        target = np.frombuffer(buffer, dtype=np.dtype(dtype), count=array.size, offset=offset)
        np.copyto(target.reshape(shape), array, casting="no")


def read(buffers: tuple[Any, Any], layout: Layout, copy: bool) -> dict[str, np.ndarray]:
    """The columns: views into the segments (``copy=False``) or private copies (``copy=True``)."""
    out: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset, where in layout:
        if where == PICKLED:
            out[name] = pickle.loads(shape)
            continue
        dt = np.dtype(dtype)
        count = math.prod(shape)  # np.prod costs ~7 us per column: a per-chunk cost on both sides
        buffer = buffers[where]
        if count == 0 or buffer is None:
            out[name] = np.empty(shape, dtype=dt)
            continue
        view = np.frombuffer(buffer, dtype=dt, count=count, offset=offset).reshape(shape)
        out[name] = view.copy() if copy else view
    return out


class Segment:
    """A named shared-memory segment that one side writes and grows, and the other side maps."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._count = 0
        self.name = ""
        self.size = 0
        self.buffer: mmap.mmap | None = None

    def ensure(self, size: int) -> None:
        """Make room for ``size`` bytes (a new, larger segment replaces the old one)."""
        if self.buffer is not None and size <= self.size:
            return
        self.close()
        self.size = max(size, 1 << 16, int(self.size * 1.5))
        self.name = f"{self._prefix}{self._count}"
        self._count += 1
        fd = os.open(os.path.join(SHM_DIR, self.name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self.buffer = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.buffer is not None:
            try:
                self.buffer.close()
            except BufferError:  # a view is still alive somewhere; the mapping goes with it
                pass
            self.buffer = None
        if self.name:
            remove(self.name)
            self.name = ""


class Mapping_:
    """The reading side of a ``Segment``: re-mapped whenever the writer moved to a new name."""

    def __init__(self) -> None:
        self.name = ""
        self.buffer: mmap.mmap | None = None

    def follow(self, name: str, size: int) -> mmap.mmap | None:
        if name != self.name:
            self.close()
            if size:
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
                try:
                    self.buffer = mmap.mmap(fd, size)
                finally:
                    os.close(fd)
            self.name = name
        return self.buffer

    def close(self) -> None:
        if self.buffer is not None:
            try:
                self.buffer.close()
            except BufferError:
                pass
        self.buffer = None
        self.name = ""


def remove(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def remove_prefix(prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix`` (left behind by a killed worker)."""
    paths = glob.glob(os.path.join(SHM_DIR, glob.escape(prefix) + "*"))
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    return len(paths)
