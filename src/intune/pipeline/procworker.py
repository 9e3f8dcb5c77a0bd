"""Process workers: one child process per pool slot, fed through shared memory, watched for death.

Owns a child's life: start (a fresh interpreter over a socket pair, so neither the parent's threads
nor its ``__main__`` are involved; the function is sent once with cloudpickle so closures work; a
caller may pass another ``Launch``, such as ``forked.fork_child``),
``submit`` chunks and ``collect`` results in order with up to ``SLOTS`` chunks in flight (so the child
never waits for the parent between chunks; each slot has its own reused input and output
shared-memory segments), detect a death at once (end-of-file on its socket), ``restart`` and re-send
the chunks in flight, stop. A parked worker is a child blocked in ``recv`` on its socket: it uses no
CPU. A child that cannot load the function says so (``WorkerInitError``: not a death, not a chunk's
failure); a chunk held longer than ``collect``'s ``timeout_s`` gets its child killed (``ChunkTimeout``).
A child whose parent died (end-of-file, parent gone) unlinks the parent's segments of its worker, then
sweeps what else the parent left (once its lock is free: ``shm``), and the first worker a process
starts sweeps the segments of owners that are gone. This module must not know about
channels, ordering, or how many deaths or timeouts are too many (the pool).
"""

from __future__ import annotations

import errno
import math
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
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NamedTuple

from intune.pipeline import cpu_wait, shm
from intune.pipeline.channel import Stopped


class CpuTime(NamedTuple):
    """What one chunk cost a child: its CPU seconds, and its seconds ready to run while no CPU ran it
    (``cpu_wait``)."""

    cpu_s: float
    wait_s: float


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


class WorkerInitError(Exception):
    """The child could not load the function (e.g. it needs a module the child cannot import).

    Every chunk would fail the same way, so it is neither retried (like a death) nor one chunk's failure
    (``on_error="skip"`` would drop them all): the pool fails the epoch with it.
    """

    def __init__(self, message: str, remote_traceback: str) -> None:
        self.message = message
        self.remote_traceback = remote_traceback
        super().__init__(f"the process worker could not load the function: {message}")


class ChunkTimeout(Exception):
    """The oldest chunk in flight stayed in the child's hands longer than ``seconds``.

    The child has been killed; the chunks in flight are kept (``restart`` re-sends them) and the
    oldest one's ``oldest_deaths`` count includes this kill.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"a chunk took longer than {seconds:g}s in a process worker (the worker was killed)")


SLOTS = 2  # chunks in flight per child
_READY, _INIT_ERROR, _NO_SPACE = "ready", "init-error", "no-space"  # reply kinds besides ok / error
_sweep_lock = threading.Lock()
_start_lock = threading.Lock()  # one child's start at a time: its socket pair, launch, and closing its end
_swept = False


def _sweep_once() -> None:
    """Remove the segments of owners that are gone, once per process (before its first child starts)."""
    global _swept
    with _sweep_lock:
        if _swept:
            return
        _swept = True
        shm.sweep_stale()


def send(conn: Connection, message: Any) -> None:
    """A per-chunk message: plain pickle (``Connection.send`` builds a ForkingPickler every time)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def child_main(fd: int) -> None:
    """The child: load the function (or report why it cannot), then serve tasks until told to stop.

    The first reply is ``ready`` or ``init-error``. On end-of-file with the parent gone (SIGKILL: it
    could not clean up), the child unlinks the parent's segments of this worker before leaving.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    first_ppid = os.getppid()
    conn = Connection(fd)
    fn_blob, prefix, sys_path, parent_pid, base = conn.recv()
    sys.path[:] = sys_path
    try:
        import cloudpickle

        fn = cloudpickle.loads(fn_blob)
    except BaseException as exc:  # noqa: BLE001 - the parent raises it as WorkerInitError
        _reply(conn, (0, _INIT_ERROR, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    _reply(conn, (0, _READY))
    outputs = [shm.Segment(f"{prefix}-out{slot}-") for slot in range(SLOTS)]
    try:
        told_to_stop = _serve(conn, fn, outputs)
    finally:
        for segment in outputs:
            segment.close()
    if not told_to_stop and _parent_gone(parent_pid, first_ppid):
        shm.remove_prefix(f"{base}-")
        owner = shm.owner_of(base)
        if owner is not None:  # the rest of the dead parent's segments, and its lock file
            shm.sweep_stale(owner=owner)


def _reply(conn: Connection, reply: tuple) -> bool:
    """Send ``reply``; False if the parent's end is closed."""
    try:
        send(conn, reply)
    except OSError:
        return False
    return True


def _serve(conn: Connection, fn: Any, outputs: list[shm.Segment]) -> bool:
    """Apply ``fn`` to each task until the parent says stop (True) or its end closes (False)."""
    inputs = [shm.Mapping_() for _ in range(SLOTS)]
    while True:
        try:
            message = recv(conn)
        except (EOFError, OSError):
            return False
        if message is None:
            return True
        if not _reply(conn, _apply(fn, message, inputs, outputs)):
            return False


def _apply(fn: Any, message: tuple, inputs: list[shm.Mapping_], outputs: list[shm.Segment]) -> tuple:
    """One task: read the chunk in place, apply ``fn``, lay the result out; the reply to send."""
    task_id, slot, name, size, layout = message
    in_buffer = inputs[slot].follow(name, size)
    output = outputs[slot]
    cpu0, wait0 = time.process_time(), cpu_wait.thread_wait_s()
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
        return (task_id, "ok", output.path, output.size, out_layout, _spent(cpu0, wait0))
    except shm.SegmentSpaceError as exc:  # no room for the result: not the function's failure
        return (task_id, _NO_SPACE, str(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        text = traceback.format_exc()
        return (task_id, "error", f"{type(exc).__name__}: {exc}", text, _spent(cpu0, wait0))


def _spent(cpu0: float, wait0: float) -> CpuTime:
    """This process's CPU seconds and its run-queue delay since ``cpu0`` / ``wait0``."""
    return CpuTime(time.process_time() - cpu0, cpu_wait.thread_wait_s() - wait0)


def _parent_gone(parent_pid: int, first_ppid: int, wait_s: float = 2.0) -> bool:
    """Whether the parent died. End-of-file reaches the child before the kernel re-parents it (a dying
    process closes its files first), so a live-looking parent is re-checked for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        if os.getppid() != first_ppid or not shm.pid_alive(parent_pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


class _Task:
    """A chunk sent to the child and not yet collected (kept to re-send it after a death)."""

    __slots__ = ("task_id", "chunk", "deaths", "sent_at")

    def __init__(self, task_id: int, chunk: dict) -> None:
        self.task_id = task_id
        self.chunk = chunk
        self.deaths = 0
        self.sent_at = 0.0  # time.monotonic() of the last send (a restart re-sends)


Launch = Callable[[socket.socket, socket.socket], Any]
"""Starts a child running ``child_main`` on the ``child`` end of the socket pair (the parent keeps the
``parent`` end); returns a handle with ``pid``, ``poll()``, ``wait(timeout)`` and ``kill()`` as
``subprocess.Popen`` has them."""


def start_interpreter(parent: socket.socket, child: socket.socket) -> subprocess.Popen:
    """The default launch: a fresh interpreter that inherits nothing but the child's end."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    code = "import sys; from intune.pipeline.procworker import child_main; child_main(int(sys.argv[1]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, str(child.fileno())],
        pass_fds=(child.fileno(),),
        env=env,
        start_new_session=True,
    )


class ProcessWorker:
    """The parent's handle on one child: start lazily, submit and collect chunks, notice death, stop."""

    def __init__(self, fn_blob: bytes, label: str, launch: Launch | None = None) -> None:
        self._fn_blob = fn_blob
        self._label = label
        self._launch = launch or start_interpreter
        self._proc: Any = None
        self._conn: Any = None
        self._poller: Any = None
        self._base = f"{shm.owner_prefix()}{label}"
        self._inputs = [shm.Segment(f"{self._base}-in{slot}-") for slot in range(SLOTS)]
        self._outputs = [shm.Mapping_() for _ in range(SLOTS)]
        self._pending: deque[_Task] = deque()
        self._life = threading.Lock()  # kill() may come from the pool thread and from close() at once
        self._task = 0
        self._last_reply = 0.0  # time.monotonic() when the child last answered (a result or ready)
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

    def memory_bytes(self) -> int | None:
        """What this worker holds alone: the child's private pages (``Private_Clean + Private_Dirty`` of
        ``/proc/<pid>/smaps_rollup``) plus its shared-memory segments; what one more worker like it
        would add. None while the child is not running or where ``/proc`` cannot tell."""
        pid = self.pid
        if pid is None:
            return None
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            return None
        private = 0
        found = 0
        for line in text.splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                private += int(line.split()[1]) * 1024
                found += 1
        return private + self.shm_bytes if found == 2 else None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _prefix(self) -> str:
        return f"{shm.owner_prefix()}{self._label}-g{self._generation}"

    def start(self) -> None:
        if self._closed:
            raise Stopped  # closed: no child may start any more (a pool thread racing with close)
        _sweep_once()
        self._generation += 1
        # one start at a time: a fork (``forked.fork_child``) while another start's child end is open
        # would copy that end, and the other child's death would never reach its parent as end-of-file
        with _start_lock:
            parent, child = socket.socketpair()
            try:
                proc = self._launch(parent, child)
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
        self._conn.send((self._fn_blob, self._prefix(), list(sys.path), os.getpid(), self._base))

    def ensure_started(self) -> None:
        """Start the child now if it has none (a pool starts its children with the epoch, so that their
        memory shows before data flows and the first chunk does not wait for an interpreter)."""
        if self._proc is None:
            self.start()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Start the child if it has none and wait until it has loaded the function: ``WorkerInitError``
        if it could not (the child is ended), ``WorkerDied`` if it died first. For a caller that must
        report a failed start before any chunk is sent; a child with chunks in flight, or whose start was
        seen already, returns at once, and past ``timeout_s`` the first ``collect`` reports it instead."""
        self.ensure_started()
        if self._pending or self._last_reply:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._poller.poll(100):
                continue
            try:
                reply = recv(self._conn)
            except (EOFError, OSError):
                raise WorkerDied(self._exitcode()) from None
            if reply[1] == _INIT_ERROR:
                self.kill()
                raise WorkerInitError(reply[2], reply[3])
            self._last_reply = time.monotonic()
            return

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
        task.sent_at = time.monotonic()
        try:
            send(self._conn, (task.task_id, slot, segment.path, segment.size, layout))
        except (BrokenPipeError, OSError):
            pass  # the child is gone: collect() sees end-of-file and reports it

    def collect(self, stop: threading.Event, timeout_s: float | None = None) -> tuple[dict, CpuTime]:
        """The result of the oldest chunk in flight: (result, the child's CPU time and run-queue delay).

        Raises ``WorkerDied`` (the child is gone; ``restart`` re-sends the chunks in flight),
        ``RemoteError`` (the function raised on the oldest chunk, which is then dropped),
        ``WorkerInitError`` (the child could not load the function; the child is ended, the chunks
        dropped), ``ChunkTimeout`` (the oldest chunk was in the child's hands more than ``timeout_s``:
        see ``_deadline``; the child is killed, the chunks kept for ``restart``),
        ``shm.SegmentSpaceError`` (no room for the result anywhere; the chunks are kept) or
        ``Stopped`` when ``stop`` is set while waiting (the child is killed, the chunks dropped).
        """
        task = self._pending[0]
        reply = self._next_reply(task, stop, timeout_s)
        if reply[1] == _INIT_ERROR:
            self.kill()
            raise WorkerInitError(reply[2], reply[3])
        if reply[1] == _NO_SPACE:
            raise shm.SegmentSpaceError(errno.ENOSPC, reply[2])
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

    def _next_reply(self, task: _Task, stop: threading.Event, timeout_s: float | None) -> tuple:
        """The child's next reply other than ``ready``, waiting in steps of at most 100 ms."""
        while True:
            wait_ms = 100
            if timeout_s is not None:
                left = self._deadline(task, timeout_s) - time.monotonic()
                wait_ms = max(0, min(wait_ms, math.ceil(left * 1000)))
            # a poll object made once per child: multiprocessing's wait() builds a selector per call
            ready = self._poller.poll(wait_ms)
            if stop.is_set():
                self.kill()
                raise Stopped
            if ready:  # a reply, or end-of-file because the child is gone
                try:
                    reply = recv(self._conn)
                except (EOFError, OSError):
                    task.deaths += 1
                    raise WorkerDied(self._exitcode()) from None
                self._last_reply = time.monotonic()
                if reply[1] != _READY:
                    return reply
            elif timeout_s is not None and time.monotonic() >= self._deadline(task, timeout_s):
                task.deaths += 1
                self.kill(drop_pending=False)
                raise ChunkTimeout(timeout_s)

    def _deadline(self, task: _Task, timeout_s: float) -> float:
        """When the oldest chunk has been the child's for ``timeout_s``: counted from its send or from
        the child's last answer, whichever is later, so that a chunk queued behind another one (or
        behind a fresh child's start) is not charged for that wait."""
        return max(task.sent_at, self._last_reply) + timeout_s

    def drop_oldest(self) -> None:
        """Forget the oldest chunk in flight (given up on after a ``ChunkTimeout`` or a death, while
        the child is gone): ``restart`` then re-sends only the others."""
        if self.pid is not None:
            raise RuntimeError("drop_oldest() needs the child gone (the chunk may be in its hands)")
        self._pending.popleft()

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
        shm.remove_prefix(f"{self._prefix()}-")

    def close(self) -> None:
        self._closed = True
        self.kill()
        for segment in self._inputs:
            segment.close()
