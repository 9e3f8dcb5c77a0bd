"""Shared check for process tests: which of some processes are still running after a while."""

from __future__ import annotations

import time
from collections.abc import Iterable

import psutil


def still_running(pids: Iterable[int], within_s: float) -> list[tuple[int, str, int, list[str]]]:
    """The processes among ``pids`` still running after at most ``within_s`` seconds, as (pid, status,
    parent pid, command) for the failure message; zombies waiting to be reaped do not count."""
    pids = list(pids)
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for pid in pids:
            try:
                info = psutil.Process(pid)
                if info.status() != psutil.STATUS_ZOMBIE:
                    alive.append((pid, info.status(), info.ppid(), info.cmdline()[:2]))
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
