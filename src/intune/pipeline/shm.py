"""Shared-memory transport: numpy chunks laid out in reused POSIX shared-memory segments (``/dev/shm``).

Owns the byte layout of a chunk in a segment and the segments' lifetimes. Each process worker has two
segments that live as long as the worker and grow when a chunk does not fit: the input segment
(written by the parent, read in place by the child) and the output segment (written by the child,
copied out by the parent before the next task). Fresh segments per chunk would cost more than the
copy (a new tmpfs page must be allocated and zeroed for every byte). An output column that *is* one
of the input views (a pass-through column) is not copied by the child: its layout entry points into
the input segment. Only the small layout crosses the pipe. Columns of ``object`` dtype are pickled
into the layout (slow path: the Parquet reader gives strings as fixed-width ``S`` / ``U`` arrays so
that they do not take it; a UDF returning object arrays does, and the worker counts it).

Also owns where a segment's bytes live. A segment's space is reserved when it is created
(``posix_fallocate``): ``ftruncate`` alone leaves a sparse tmpfs file, and the first write past a full
``/dev/shm`` (Docker's default is 64 MiB) kills the writer with SIGBUS. When ``/dev/shm`` has no room, the
segment becomes a file-backed mapping in the fallback directory (``$INTUNE_SHM_FALLBACK_DIR``, else the
temporary directory), with one warning per process; when neither has room, ``SegmentSpaceError``. The
reading side is given the segment's full path, so it finds it in either place.

Also owns who may remove a segment. A segment's name starts with its owner's prefix
``intune-<pid>-<nonce>-`` (``owner_prefix``; the nonce is random per process, so that two processes of
the same pid in two PID namespaces sharing ``/dev/shm`` never share names). Before it creates its first
segment in a directory, the owner takes an exclusive ``flock`` on ``intune-<pid>-<nonce>.lock`` there,
and holds it until it exits. ``sweep_stale`` removes an owner's segments (and its lock file) only when it
can take that lock: the owner is provably gone, whatever its pid number means here (a trainer in
another container sharing ``/dev/shm``, or ``--ipc=host``, has a pid that names nothing or another
process in this one). A segment without a lock file beside it is never swept. This module must not
know about workers or pools (only that a segment's name carries its owner's prefix).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import glob
import math
import mmap
import os
import pickle
import re
import tempfile
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm"
FALLBACK_ENV = "INTUNE_SHM_FALLBACK_DIR"  # where segments go when /dev/shm is full
MIN_SEGMENT = 1 << 16
GROWTH = 1.5  # a segment that grows takes this much more than asked, space permitting
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


class SegmentSpaceError(OSError):
    """Neither ``/dev/shm`` nor the fallback directory has room for a segment (errno ENOSPC)."""


_warn_lock = threading.Lock()
_warned = False


def fallback_dir() -> str:
    """The directory for file-backed segments: ``$INTUNE_SHM_FALLBACK_DIR``, else the temporary directory.

    Read at each call, so that a process can point it elsewhere at any time."""
    return os.environ.get(FALLBACK_ENV) or tempfile.gettempdir()


def places() -> list[str]:
    """Where segments may live, in order of preference: ``/dev/shm``, then the fallback directory."""
    fallback = fallback_dir()
    if os.path.realpath(fallback) == os.path.realpath(SHM_DIR):
        return [SHM_DIR]
    return [SHM_DIR, fallback]


def free_bytes(directory: str) -> int | None:
    """Bytes an unprivileged writer may still allocate in ``directory`` (None if it cannot be asked)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _reserve(path: str, size: int) -> mmap.mmap:
    """Create ``path`` with ``size`` bytes allocated for real, and map it.

    ``posix_fallocate`` makes a full filesystem fail here with ENOSPC, where a sparse file (``ftruncate``)
    would fail later with SIGBUS on the first write past the space. A filesystem that cannot allocate
    ahead (EOPNOTSUPP / EINVAL) gets a sparse file: the best that can be done there.
    """
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except BaseException:
        _unlink(path)
        raise
    finally:
        os.close(fd)


def _sizes(grown: int, needed: int, free: int | None) -> list[int]:
    """The sizes worth trying in a place with ``free`` bytes: the grown size, else exactly the need."""
    sizes = [grown] if grown == needed else [grown, needed]
    return [size for size in sizes if free is None or size <= free]


def _warn_fallback(directory: str, size: int) -> None:
    """Warn once per process that segments spill out of ``/dev/shm`` (slower, and usually a too-small
    ``/dev/shm``: Docker's default is 64 MiB)."""
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    warnings.warn(
        f"intune: {SHM_DIR} has no room for a {_mib(size)} shared-memory segment "
        f"({_mib(free_bytes(SHM_DIR) or 0)} free); using file-backed memory in {directory} instead "
        f"(slower). Give {SHM_DIR} more space (e.g. docker run --shm-size=2g) or set {FALLBACK_ENV}.",
        RuntimeWarning,
        stacklevel=3,
    )


class Segment:
    """A named shared-memory segment that one side writes and grows, and the other side maps.

    ``path`` is where it lives (``/dev/shm`` or the fallback directory): it is what crosses the pipe.
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._count = 0
        self.name = ""
        self.path = ""
        self.size = 0
        self.buffer: mmap.mmap | None = None

    def ensure(self, size: int) -> None:
        """Make room for ``size`` bytes (a new, larger segment replaces the old one).

        Tries ``/dev/shm`` then the fallback directory, each with the grown size (``GROWTH`` times the
        old one, so that a slowly growing chunk does not re-create its segment every time) and then
        exactly ``size``. The old segment is released first: its space counts against the same
        filesystem. Raises ``SegmentSpaceError`` when no place has room.
        """
        if self.buffer is not None and size <= self.size:
            return
        needed = max(size, 1)  # a zero-length file cannot be mapped
        grown = max(needed, MIN_SEGMENT, int(self.size * GROWTH))
        self.close()
        self.size = 0
        tried: list[str] = []
        for directory in places():
            free = free_bytes(directory)
            sizes = _sizes(grown, needed, free)
            if not sizes:
                tried.append(f"{directory}: {_mib(free or 0)} free")
            for want in sizes:
                try:
                    self._create(directory, want)
                except OSError as exc:
                    tried.append(f"{directory}: {exc.strerror or exc}")
                    continue
                if directory != SHM_DIR:
                    _warn_fallback(directory, needed)
                return
        raise SegmentSpaceError(
            errno.ENOSPC,
            f"no room for a {_mib(needed)} shared-memory segment ({'; '.join(tried)}). "
            f"Give {SHM_DIR} more space (e.g. docker run --shm-size=2g) or point {FALLBACK_ENV} "
            "at a directory with room",
        )

    def _create(self, directory: str, size: int) -> None:
        name = f"{self._prefix}{self._count}"
        self._count += 1  # a failed try may leave nothing behind, but its name is not reused
        path = os.path.join(directory, name)
        if self._prefix.startswith(owner_prefix()):
            with _owner_mutex:  # the owner's lock is held before its segment exists (see ``release_owner``)
                _hold_owner_locks(directory)
                self.buffer = _reserve(path, size)
        else:  # a worker's output segment, named with (and covered by the lock of) the parent's prefix
            self.buffer = _reserve(path, size)
        self.name, self.path, self.size = name, path, size

    def close(self) -> None:
        if self.buffer is not None:
            try:
                self.buffer.close()
            except BufferError:  # a view is still alive somewhere; the mapping goes with it
                pass
            self.buffer = None
        if self.path:
            _unlink(self.path)
        self.name = self.path = ""


class Mapping_:
    """The reading side of a ``Segment``: re-mapped whenever the writer moved to a new name."""

    def __init__(self) -> None:
        self.name = ""
        self.buffer: mmap.mmap | None = None

    def follow(self, name: str, size: int) -> mmap.mmap | None:
        """Map the writer's segment ``name`` (its full path; a bare name is looked for in ``/dev/shm``)."""
        if name != self.name:
            self.close()
            if size:
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)  # an absolute name wins the join
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


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def remove(name: str) -> None:
    """Unlink segment ``name`` (a full path, or a bare name in ``/dev/shm``)."""
    _unlink(os.path.join(SHM_DIR, name))


def remove_prefix(prefix: str) -> int:
    """Unlink every segment whose name starts with ``prefix`` (left behind by a killed worker), in
    ``/dev/shm`` and in the fallback directory."""
    removed = 0
    for directory in places():
        for path in glob.glob(os.path.join(directory, glob.escape(prefix) + "*")):
            removed += _unlink(path)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists here (a zombie counts; so does one this user may not signal).

    Only for a process of this PID namespace (a worker asking about its parent): a segment's owner may
    live in another one, which is why ``sweep_stale`` asks its lock instead."""
    if pid <= 0:
        return True  # not a process id: never treat it as dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


# ---- owners ---------------------------------------------------------------------------------------------

_OWNED = re.compile(r"intune-(\d+-[0-9a-f]{8})(-|\.lock$)")  # a segment (-...) or an owner's lock file
_owner_mutex = threading.Lock()  # taking and giving back this process's locks; creating its segments
_owner_pid = 0  # the pid _owner_tag was made for (a forked child makes its own)
_owner_tag = ""
_owner_locks: dict[str, int] = {}  # directory -> the descriptor holding this process's lock there
_at_exit = False


def owner_prefix() -> str:
    """This process's segment-name prefix, ``intune-<pid>-<nonce>-``."""
    global _owner_pid, _owner_tag
    pid = os.getpid()
    if _owner_pid != pid:
        _owner_pid, _owner_tag = pid, f"{pid}-{os.urandom(4).hex()}"
    return f"intune-{_owner_tag}-"


def owner_of(name: str) -> str | None:
    """The owner tag (``<pid>-<nonce>``) a segment name or prefix carries, or None."""
    match = _OWNED.match(os.path.basename(name) + "-")
    return match.group(1) if match else None


def _lock_path(directory: str, tag: str) -> str:
    return os.path.join(directory, f"intune-{tag}.lock")


def _hold_owner_locks(directory: str) -> None:
    """Hold this process's lock in ``directory`` and in every place segments may go (its workers'
    output segments, named with its prefix, may go to the fallback directory). Under ``_owner_mutex``."""
    global _at_exit
    tag = owner_prefix()[len("intune-") : -1]
    for place in dict.fromkeys([directory, *places()]):
        if place in _owner_locks:
            continue
        fd = _take_lock(_lock_path(place, tag))
        if fd is not None:
            _owner_locks[place] = fd
    if _owner_locks and not _at_exit:
        _at_exit = True
        atexit.register(release_owner)


def _take_lock(path: str) -> int | None:
    """An exclusive ``flock`` on ``path`` (created if need be), or None where that is not possible.

    A sweep that opened the file before it was locked may take the lock and unlink the file (it finds
    no segment of this owner yet): the name then no longer leads to the locked file, and another is made.
    """
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:  # a directory that is not there or not writable: no segment goes there either
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except OSError:  # a file system without flock
            os.close(fd)
            return None
        os.close(fd)


def release_owner() -> None:
    """At exit: give back this process's lock files where none of its segments is left (the lock goes
    with the process anyway; a lock file with segments beside it stays, for a later sweep)."""
    if _owner_pid != os.getpid():
        return
    prefix = owner_prefix()
    with _owner_mutex:
        for directory, fd in list(_owner_locks.items()):
            try:
                left = any(name.startswith(prefix) for name in os.listdir(directory))
            except OSError:
                left = True
            if not left:
                _unlink(_lock_path(directory, _owner_tag))
                del _owner_locks[directory]
                os.close(fd)


def _forget_owner() -> None:
    """In a forked child: its own prefix and locks (closing the inherited descriptors leaves the
    parent's locks held: the parent keeps its own)."""
    global _owner_pid, _owner_mutex
    _owner_mutex = threading.Lock()  # another thread may have held it at the fork
    _owner_pid = 0
    for fd in _owner_locks.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _owner_locks.clear()


os.register_at_fork(after_in_child=_forget_owner)


def sweep_stale(owner: str | None = None) -> int:
    """Unlink the segments of owners that are provably gone (their lock can be taken); how many.

    A SIGKILLed consumer cannot clean up, and its segments would hold memory until reboot. An owner
    whose lock is held is alive, in this PID namespace or another; one without a lock file (or on a file
    system without ``flock``) cannot be proved gone and is left alone: the cost is a leak, never a live
    segment unlinked. The lock file of a gone owner goes too. ``owner`` (a tag from ``owner_of``) limits
    the sweep to that owner. Only plain files are removed.
    """
    mine = _owner_tag if _owner_pid == os.getpid() else None
    removed = 0
    for directory in places():
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        found: dict[str, list[os.DirEntry[str]]] = {}
        for entry in entries:
            match = _OWNED.match(entry.name)
            if match is None or match.group(1) == mine or (owner is not None and match.group(1) != owner):
                continue
            segments = found.setdefault(match.group(1), [])
            if match.group(2) == "-":
                segments.append(entry)
        for tag, segments in found.items():
            removed += _remove_if_gone(directory, tag, segments)
    return removed


def _remove_if_gone(directory: str, tag: str, segments: list[os.DirEntry[str]]) -> int:
    """Unlink ``segments`` and the lock file of owner ``tag`` in ``directory`` if its lock can be taken."""
    path = _lock_path(directory, tag)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:  # no lock file: the owner cannot be proved gone
        return 0
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: the owner lives (or no flock here)
            return 0
        try:
            if os.stat(path, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
                return 0  # replaced since it was opened
        except FileNotFoundError:
            return 0
        removed = 0
        for entry in segments:
            try:
                if entry.is_file(follow_symlinks=False):
                    removed += _unlink(entry.path)
            except OSError:  # another user's file in a shared /tmp: not ours to remove
                continue
        _unlink(path)
        return removed
    finally:
        os.close(fd)
