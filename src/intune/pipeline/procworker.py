"""Process workers: one child process per pool slot, fed through shared memory, watched for death.

Owns a child's life: start (a fresh interpreter over a socket pair, so neither the parent's threads
nor its ``__main__`` are involved; the function is sent once with cloudpickle so closures work),
``submit`` chunks and ``collect`` results in order with up to ``SLOTS`` chunks in flight (so the child
never waits for the parent between chunks; each slot has its own reused input and output
shared-memory segments), detect a death at once (end-of-file on its socket), ``restart`` and re-send
the chunks in flight, stop. A parked worker is a child blocked in ``recv`` on its socket: it uses no
CPU. This module must not know about channels, ordering or how many deaths are too many (the pool).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
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


SLOTS = 2  # chunks in flight per child


def send(conn: Connection, message: Any) -> None:
    """A per-chunk message: plain pickle (``Connection.send`` builds a ForkingPickler every time)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def child_main(fd: int) -> None:
    """The child's loop: receive a task, apply the function, reply with the result's layout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(fd)
    fn_blob, prefix, sys_path = conn.recv()
    sys.path[:] = sys_path
    import cloudpickle

    fn = cloudpickle.loads(fn_blob)
    inputs = [shm.Mapping_() for _ in range(SLOTS)]
    outputs = [shm.Segment(f"{prefix}-out{slot}-") for slot in range(SLOTS)]
    while True:
        try:
            message = recv(conn)
        except (EOFError, OSError):
            message = None
        if message is None:
            for segment in outputs:
                segment.close()
            return
        task_id, slot, name, size, layout = message
        in_buffer = inputs[slot].follow(name, size)
        output = outputs[slot]
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
        send(conn, reply)


class _Task:
    """A chunk sent to the child and not yet collected (kept to re-send it after a death)."""

    __slots__ = ("task_id", "chunk", "deaths")

    def __init__(self, task_id: int, chunk: dict) -> None:
        self.task_id = task_id
        self.chunk = chunk
        self.deaths = 0


class ProcessWorker:
    """The parent's handle on one child: start lazily, submit and collect chunks, notice death, stop."""

    def __init__(self, fn_blob: bytes, label: str) -> None:
        self._fn_blob = fn_blob
        self._label = label
        self._proc: Any = None
        self._conn: Any = None
        self._poller: Any = None
        base = f"intune-{os.getpid()}-{label}"
        self._inputs = [shm.Segment(f"{base}-in{slot}-") for slot in range(SLOTS)]
        self._outputs = [shm.Mapping_() for _ in range(SLOTS)]
        self._pending: deque[_Task] = deque()
        self._life = threading.Lock()  # kill() may come from the pool thread and from close() at once
        self._task = 0
        self._generation = 0
        self._closed = False
        self.pickled_columns = 0  # object-dtype columns pickled through the pipe (both ways): slow

    @property
    def shm_bytes(self) -> int:
        """Bytes of shared memory this worker's segments hold (inputs and mapped outputs)."""
        held = sum(seg.size for seg in self._inputs if seg.buffer is not None)
        return held + sum(len(m.buffer) for m in self._outputs if m.buffer is not None)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _prefix(self) -> str:
        return f"intune-{os.getpid()}-{self._label}-g{self._generation}"

    def start(self) -> None:
        if self._closed:
            raise Stopped  # closed: no child may start any more (a pool thread racing with close)
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
        with self._life:
            if self._closed:  # closed while the child started (a pool thread racing with close): end it
                parent.close()
                proc.kill()
                proc.wait()
                raise Stopped
            self._proc = proc
            self._conn = Connection(parent.detach())
        self._poller = select.poll()
        self._poller.register(self._conn.fileno(), select.POLLIN)
        self._conn.send((self._fn_blob, self._prefix(), list(sys.path)))

    def ensure_started(self) -> None:
        """Start the child now if it has none (a pool starts its children with the epoch, so that their
        memory shows before data flows and the first chunk does not wait for an interpreter)."""
        if self._proc is None:
            self.start()

    def submit(self, chunk: dict) -> None:
        """Send ``chunk`` to the child (at most ``SLOTS`` uncollected). A dead child shows in ``collect``."""
        if len(self._pending) >= SLOTS:
            raise RuntimeError("collect() a result before submitting more chunks")
        self._task += 1
        task = _Task(self._task, chunk)
        self._pending.append(task)
        self.ensure_started()
        self._send(task)

    def _send(self, task: _Task) -> None:
        slot = task.task_id % SLOTS
        layout, size = shm.plan(task.chunk)
        self.pickled_columns += shm.count_pickled(layout)
        segment = self._inputs[slot]
        segment.ensure(size)
        shm.write(segment.buffer, task.chunk, layout, shm.IN)
        try:
            send(self._conn, (task.task_id, slot, segment.name, segment.size, layout))
        except (BrokenPipeError, OSError):
            pass  # the child is gone: collect() sees end-of-file and reports it

    def collect(self, stop: threading.Event) -> tuple[dict, float]:
        """The result of the oldest chunk in flight: (result, child CPU seconds).

        Raises ``WorkerDied`` (the child is gone; ``restart`` re-sends the chunks in flight),
        ``RemoteError`` (the function raised on the oldest chunk, which is then dropped) or
        ``Stopped`` when ``stop`` is set while waiting (the child is killed, the chunks dropped).
        """
        task = self._pending[0]
        while True:
            # a poll object made once per child: multiprocessing's wait() builds a selector per call
            ready = self._poller.poll(100)
            if stop.is_set():
                self.kill()
                raise Stopped
            if ready:  # a reply, or end-of-file because the child is gone
                try:
                    reply = recv(self._conn)
                except (EOFError, OSError):
                    task.deaths += 1
                    raise WorkerDied(self._exitcode()) from None
                break
        if reply[0] != task.task_id:
            raise RuntimeError(f"process worker replied to task {reply[0]}, expected {task.task_id}")
        self._pending.popleft()
        if reply[1] == "error":
            _, _, message, text, _cpu = reply
            raise RemoteError(message, text)
        _, _, out_name, out_size, out_layout, cpu = reply
        self.pickled_columns += shm.count_pickled(out_layout)
        slot = task.task_id % SLOTS
        out_buffer = self._outputs[slot].follow(out_name, out_size) if out_name else None
        # copy out: both segments of this slot are reused by a later chunk
        return shm.read((self._inputs[slot].buffer, out_buffer), out_layout, copy=True), cpu

    def oldest_deaths(self) -> int:
        """How many children died while the oldest chunk in flight was in their hands."""
        return self._pending[0].deaths if self._pending else 0

    def run(self, chunk: dict, stop: threading.Event) -> tuple[dict, float]:
        """``submit`` then ``collect``: one chunk, synchronously."""
        if stop.is_set():
            raise Stopped
        self.submit(chunk)
        return self.collect(stop)

    def _exitcode(self) -> int | None:
        try:
            return self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

    def restart(self) -> None:
        """Replace a dead child and re-send the chunks that were in flight, in order."""
        self.kill(drop_pending=False)
        self.start()
        for task in self._pending:
            self._send(task)

    def kill(self, drop_pending: bool = True) -> None:
        """End the child now (SIGKILL if it does not leave at once) and clean its segments."""
        if drop_pending:
            self._pending.clear()
        with self._life:
            proc, conn = self._proc, self._conn
            self._proc = self._conn = None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                send(conn, None)
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
        for mapping in self._outputs:
            mapping.close()
        shm.remove_prefix(f"intune-{os.getpid()}-{self._label}-g{self._generation}-")

    def close(self) -> None:
        self._closed = True
        self.kill()
        for segment in self._inputs:
            segment.close()
