"""Seconds the calling thread spent ready to run while no CPU ran it: the kernel's run-queue delay
(``/proc/thread-self/schedstat``, its second field).

Why: a worker's busy wall time is its CPU time, its own waits (storage, a lock, the GIL: it sleeps) and
the time it was runnable but descheduled. Only its own waits are a cost that more workers overlap; the
run-queue delay is the CPUs' share, which more workers never buy. Measured, the split needs no guess
(the planner's fallback reads it from the stage that waits least, wrong where every stage waits on
something of its own).

Costs about a microsecond: the file stays open per thread and is re-read in place. A forked child
opens its own (the inherited one is its parent's thread's): the readers are forgotten at a fork.
"""

from __future__ import annotations

import os
import threading

_PATH = "/proc/thread-self/schedstat"
_NS = 1e-9


class _Reader:
    """One thread's open schedstat file, closed with the thread's locals."""

    def __init__(self) -> None:
        try:
            self.fd = os.open(_PATH, os.O_RDONLY)
        except OSError:
            self.fd = -1

    def read_s(self) -> float | None:
        if self.fd < 0:
            return None
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) * _NS
        except (OSError, IndexError, ValueError):
            return None

    def __del__(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass


_local = threading.local()


def _forget_readers() -> None:
    """In a forked child: the readers it inherited read its parent's threads."""
    global _local
    _local = threading.local()


os.register_at_fork(after_in_child=_forget_readers)


def _reader() -> _Reader:
    reader = getattr(_local, "reader", None)
    if reader is None:
        reader = _local.reader = _Reader()
    return reader


def thread_wait_s() -> float:
    """The calling thread's run-queue delay so far, in seconds (0.0 where it is not measured:
    ``measured``). Take differences, as with ``time.thread_time``."""
    return _reader().read_s() or 0.0


def measured() -> bool:
    """Whether this kernel reports the run-queue delay (Linux with scheduler statistics)."""
    global _MEASURED
    if _MEASURED is None:
        _MEASURED = _Reader().read_s() is not None
    return _MEASURED


_MEASURED: bool | None = None

__all__ = ["measured", "thread_wait_s"]
