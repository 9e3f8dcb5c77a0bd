"""Forked process workers: a child forked from this process, for work whose data is already in memory.

Owns ``fork_child`` (a ``procworker.Launch``): the child is a fork of the calling process, in a session
of its own (a Ctrl-C at the terminal is the parent's to handle), that runs ``child_main`` on its end of
the socket pair and leaves with ``os._exit`` (never the parent's exit handlers, finalizers or buffered
output); and ``ForkedChild``, the parent's handle on it, with what ``ProcessWorker`` uses of
``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``kill``). A fork shares the parent's memory
copy-on-write: a dataset already loaded is neither pickled nor copied, and the interpreter and its
imports cost no start time. The price is the one torch's DataLoader pays with its default ``fork``
start: only the forking thread exists in the child, so the child must not need a lock that another
of the parent's threads held at the fork (the engine's child code takes none). It must not know what
the child computes.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback


def fork_child(parent: socket.socket, child: socket.socket) -> ForkedChild:
    """Fork; the child serves ``child_main`` on ``child`` (closing its copy of ``parent``, so that it
    sees end-of-file when the parent goes) and exits with its status."""
    for stream in (sys.stdout, sys.stderr):  # buffered output would otherwise be written twice
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    pid = os.fork()
    if pid:
        return ForkedChild(pid)
    status = 1
    try:
        gc.freeze()  # collections skip what was inherited, so its pages stay shared with the parent
        os.setsid()
        parent.close()
        from intune.pipeline.procworker import child_main

        child_main(child.detach())
        status = 0
    except BaseException:  # noqa: BLE001 - the parent sees the exit status and end-of-file
        traceback.print_exc()
    finally:
        os._exit(status)


class ForkedChild:
    """The parent's handle on a forked child; ``returncode`` as ``Popen`` gives it (-N: signal N)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()  # the pool's thread and close() may poll at once

    def poll(self) -> int | None:
        """The exit code once the child has ended (reaping it), else None."""
        with self._lock:
            if self.returncode is None:
                try:
                    done, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped by someone else: its status is lost
                    self.returncode = -signal.SIGKILL
                else:
                    if done:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end; ``subprocess.TimeoutExpired`` after ``timeout`` seconds, as ``Popen``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout or 0.0)
            time.sleep(pause)
            pause = min(0.02, pause * 2)
        return code

    def kill(self) -> None:
        """SIGKILL, unless it has already ended (a reaped pid may belong to another process by now)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
