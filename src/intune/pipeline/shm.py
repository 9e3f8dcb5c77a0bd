"""Shared-memory transport: numpy chunks laid out in POSIX shared memory (``/dev/shm``) segments.

Owns the byte layout of a chunk in a segment and the segments' lifetimes. The parent writes a task's
chunk into a per-worker input segment it reuses; the worker writes each result into a fresh segment
whose ownership passes to the parent, which maps it, unlinks its name at once and wraps the mapping in
numpy arrays without copying (the memory is freed when the last array goes). Only the small layout
(names, dtypes, shapes, offsets) crosses the pipe. This module must not know about processes or
pools; columns of ``object`` dtype are pickled into the layout (slow path, rare).
"""

from __future__ import annotations

import glob
import mmap
import os
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm"
ALIGN = 64

# (column, dtype.str, shape, offset) for raw columns; (column, "pickle", bytes, -1) for object columns
Layout = list[tuple[str, str, Any, int]]


def plan(chunk: Mapping[str, np.ndarray]) -> tuple[Layout, int]:
    """The layout of ``chunk`` in a segment and the segment size it needs."""
    layout: Layout = []
    offset = 0
    for name, column in chunk.items():
        array = np.asarray(column)
        if array.dtype.hasobject:
            layout.append((name, "pickle", pickle.dumps(array, protocol=5), -1))
            continue
        layout.append((name, array.dtype.str, array.shape, offset))
        offset += -(-array.nbytes // ALIGN) * ALIGN
    return layout, offset


def write(buffer: Any, chunk: Mapping[str, np.ndarray], layout: Layout) -> None:
    """Copy the chunk's columns into ``buffer`` (an mmap) at the planned offsets."""
    for (name, dtype, shape, offset), column in zip(layout, chunk.values()):
        if offset < 0:
            continue
        array = np.asarray(column)
        if array.nbytes == 0:
            continue
        target = np.frombuffer(buffer, dtype=np.dtype(dtype), count=array.size, offset=offset)
        np.copyto(target.reshape(shape), array, casting="no")


def read(buffer: Any, layout: Layout) -> dict[str, np.ndarray]:
    """Numpy views of the columns in ``buffer`` (no copy)."""
    out: dict[str, np.ndarray] = {}
    for name, dtype, shape, offset in layout:
        if offset < 0:
            out[name] = pickle.loads(shape)
            continue
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0 or buffer is None:
            out[name] = np.empty(shape, dtype=dt)
        else:
            out[name] = np.frombuffer(buffer, dtype=dt, count=count, offset=offset).reshape(shape)
    return out


def create(name: str, size: int) -> mmap.mmap:
    """A new named segment of ``size`` bytes, mapped read-write."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def attach(name: str, size: int, unlink: bool = False) -> mmap.mmap:
    """Map an existing segment; with ``unlink`` remove its name at once (the mapping stays valid)."""
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
        if unlink:
            remove(name)


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


def take(name: str, layout: Layout, size: int) -> dict[str, np.ndarray]:
    """Take ownership of a result segment: map it, unlink it, return zero-copy arrays over it."""
    if size == 0:
        remove(name)
        return read(None, layout)
    return read(attach(name, size, unlink=True), layout)
