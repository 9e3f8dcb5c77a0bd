"""Process workers: one child process per pool slot, fed through shared memory, watched for death.

Owns a child's life: start (a fresh interpreter over a socket pair, so neither the parent's threads
nor its ``__main__`` are involved; the function is sent once with cloudpickle so closures work),
run one chunk (input and result through two reused shared-memory segments), detect a
death at once (end-of-file on its socket), restart, stop. A parked worker is a child blocked in
``recv`` on its pipe: it uses no CPU. This module must not know about channels, ordering or retries
(the pool decides what to re-run).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from typing import Any

from intune.pipeline import shm
from intune.pipeline.channel import Stopped


class WorkerDied(Exception):
    """The child died (signal or exit) while holding a chunk."""

    def __init__(self, exitcode: int | None) -> None:
        self.exitcode = exitcode
        how = f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit {exitcode}"
        super().__init__(f"process worker died ({how})")


class RemoteError(Exception):
    """The function raised in the child; carries its message and traceback text."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        self.remote_traceback = remote_traceback
        super().__init__(message)


def child_main(fd: int) -> None:
    """The child's loop: receive a task, apply the function, reply with the result's layout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(fd)
    fn_blob, prefix, sys_path = conn.recv()
    sys.path[:] = sys_path
    import cloudpickle

    fn = cloudpickle.loads(fn_blob)
    inputs = shm.Mapping_()
    output = shm.Segment(prefix + "-out")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            output.close()
            return
        if message is None:
            output.close()
            return
        task_id, name, size, layout = message
        in_buffer = inputs.follow(name, size)
        cpu0 = time.process_time()
        try:
            views = shm.read((in_buffer, None), layout, copy=False)
            passthrough = {id(v): entry for v, entry in zip(views.values(), layout, strict=True)}
            result = fn(views)
            if not isinstance(result, dict):
                raise TypeError(f"the map function must return a dict of arrays, got {type(result).__name__}")
            out_layout, out_size = shm.plan(result, shm.OUT, passthrough)
            if out_size:
                output.ensure(out_size)
                shm.write(output.buffer, result, out_layout, shm.OUT)
            del result, views
            reply = (task_id, "ok", output.name, output.size, out_layout, time.process_time() - cpu0)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            text = traceback.format_exc()
            reply = (task_id, "error", f"{type(exc).__name__}: {exc}", text, time.process_time() - cpu0)
        conn.send(reply)


class ProcessWorker:
    """The parent's handle on one child: start lazily, run chunks, notice death, stop."""

    def __init__(self, fn_blob: bytes, label: str) -> None:
        self._fn_blob = fn_blob
        self._label = label
        self._proc: Any = None
        self._conn: Any = None
        self._input: shm.Segment | None = None
        self._output = shm.Mapping_()
        self._life = threading.Lock()  # kill() may come from the pool thread and from close() at once
        self._task = 0
        self._generation = 0
        self.busy = False

    @property
    def shm_bytes(self) -> int:
        """Bytes of shared memory this worker's segments hold (input and mapped output)."""
        held = self._input.size if self._input is not None and self._input.buffer is not None else 0
        out = self._output.buffer
        return held + (len(out) if out is not None else 0)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _prefix(self) -> str:
        return f"intune-{os.getpid()}-{self._label}-g{self._generation}"

    def start(self) -> None:
        self._generation += 1
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        code = "import sys; from intune.pipeline.procworker import child_main; child_main(int(sys.argv[1]))"
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code, str(child.fileno())],
                pass_fds=(child.fileno(),),
                env=env,
                start_new_session=True,
            )
        finally:
            child.close()
        self._proc = proc
        self._conn = Connection(parent.detach())
        self._conn.send((self._fn_blob, self._prefix(), list(sys.path)))

    def run(self, chunk: dict, stop: threading.Event) -> tuple[dict, float]:
        """Apply the function to ``chunk`` in the child; returns (result, child CPU seconds).

        Raises ``WorkerDied`` (the child is gone; call ``restart``), ``RemoteError`` (the function
        raised) or ``Stopped`` when ``stop`` is set while waiting (the child is killed).
        """
        if stop.is_set():
            raise Stopped
        if self._proc is None:
            self.start()
        layout, size = shm.plan(chunk)
        if self._input is None:
            self._input = shm.Segment(f"intune-{os.getpid()}-{self._label}-in")
        self._input.ensure(size)
        shm.write(self._input.buffer, chunk, layout, shm.IN)
        self._task += 1
        self.busy = True
        try:
            self._conn.send((self._task, self._input.name, self._input.size, layout))
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._exitcode()) from None
        while True:
            ready = wait_ready([self._conn], timeout=0.1)
            if stop.is_set():
                self.kill()
                raise Stopped
            if ready:  # a reply, or end-of-file because the child is gone
                try:
                    reply = self._conn.recv()
                except (EOFError, OSError):
                    raise WorkerDied(self._exitcode()) from None
                break
        self.busy = False
        if reply[1] == "error":
            _, _, message, text, _cpu = reply
            raise RemoteError(message, text)
        _, _, out_name, out_size, out_layout, cpu = reply
        out_buffer = self._output.follow(out_name, out_size) if out_name else None
        # copy out: the segments are reused by the next task
        return shm.read((self._input.buffer, out_buffer), out_layout, copy=True), cpu

    def _exitcode(self) -> int | None:
        try:
            return self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

    def restart(self) -> None:
        """Replace a dead child (its leftover result segments are unlinked)."""
        self.kill()
        self.start()

    def kill(self) -> None:
        """End the child now (SIGKILL if it does not leave at once) and clean its segments."""
        self.busy = False
        with self._life:
            proc, conn = self._proc, self._conn
            self._proc = self._conn = None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
        conn.close()
        self._output.close()
        shm.remove_prefix(f"intune-{os.getpid()}-{self._label}-g{self._generation}-")

    def close(self) -> None:
        self.kill()
        if self._input is not None:
            self._input.close()
            self._input = None
