"""The remote half of a map stage's pool: worker threads that each drive one remote worker.

Owns the dispatch loop of remote workers for one epoch, beside the stage's local ``ProcessPoolRun`` on
the same input and output channels: take a chunk (a rescued one first, else reserve a slot downstream
and take one from the input), send it, collect results oldest first, deliver each under its input's
sequence number (so the order is the one local workers give), count what the transfers cost.

Exactly once, whatever happens to the cluster. A chunk taken from the input is held by one thread
until its result is delivered. When its remote worker is lost (the actor, its node or the connection
died) the chunks it had in flight go to the stage's ``Rescue``, where the local workers (and any
other remote worker) take them under their original sequence numbers; a chunk is never sent twice at
once, so it is delivered once. A remote worker is only sent chunks once it is ready, so a worker that
cannot be placed (no free CPU on the cluster, no cluster any more) holds nothing: the stage goes on
with its local workers. A remote worker retires (the knob went down) after delivering its chunks in
flight, and is then released so that its CPU goes back to the cluster.

Errors are those of local process mode: the function's failure on a chunk is the stage's
``StageError`` (or a skip with ``on_error="skip"``); a chunk past ``timeout_s`` gets its worker killed
and is skipped or fails the epoch; a chunk in flight on ``max_attempts`` lost workers in a row fails
the epoch (``WorkerLostError``); a worker that cannot load the function fails it at once.

It must not import Ray: the remote workers come from a ``RemoteWorkers`` registry
(``remote_ray``) behind the small ``RemoteWorker`` protocol, so this loop is the same for any cluster.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from intune.pipeline.channel import END, TIMEOUT, Channel, Item, Stopped
from intune.pipeline.chunks import nbytes
from intune.pipeline.errors import StageError
from intune.pipeline.pool import ChunkHandling, PoolRun, Rescue
from intune.pipeline.procworker import SLOTS, RemoteError
from intune.pipeline.stats import StageStats, WorkerStats

RETRY_AFTER_S = 1.0
"""How long a thread whose remote worker could not be created or died while starting waits before
it asks for another one (a cluster that is gone would otherwise be asked in a tight loop)."""


class RemoteLost(Exception):
    """The remote worker is gone (its actor or node died, the cluster went away): its chunks in
    flight must be finished elsewhere."""


class RemoteInitError(Exception):
    """A remote worker could not load the function. Every chunk would fail alike (as with a local
    process worker's ``WorkerInitError``), so the epoch fails with it."""

    def __init__(self, message: str, remote_traceback: str) -> None:
        self.message = message
        self.remote_traceback = remote_traceback
        super().__init__(f"the remote worker could not load the function: {message}")


class RemoteWorker(Protocol):
    """One remote worker as the loop sees it (``ray_actor.RayActor``)."""

    where: str  # for messages: the worker, its node

    def ready(self, timeout: float) -> bool:
        """Whether it can take chunks; waits up to ``timeout``. Raises ``RemoteLost`` or
        ``RemoteInitError``."""
        ...

    def submit(self, chunk: dict) -> Any:
        """Send a chunk; a ticket for ``done`` / ``result``. Raises ``RemoteLost``."""
        ...

    def done(self, ticket: Any, timeout: float) -> bool:
        """Whether the ticket's reply is in; waits up to ``timeout``."""
        ...

    def result(self, ticket: Any) -> tuple:
        """``("ok", output, cpu_s, wall_s)`` or ``("error", message, traceback, cpu_s, wall_s)``, the
        output copied out of the cluster's store. Raises ``RemoteLost``."""
        ...


class RemoteRegistry(Protocol):
    """The stage's remote workers by index (``remote_ray.RemoteWorkers``)."""

    def worker(self, index: int) -> RemoteWorker:
        """Worker ``index``: the live one, or a new one (starting). Raises ``Stopped`` once closed,
        ``RemoteLost`` when none can be created."""
        ...

    def release(self, index: int) -> None:
        """End worker ``index`` (retired, or hung past ``timeout_s``): its CPU goes back."""
        ...

    def lost(self, index: int, cause: BaseException, chunks: int) -> None:
        """Worker ``index`` was lost with ``chunks`` in flight: forget it, say so once."""
        ...


class _Flight:
    """A chunk sent to a remote worker and not yet delivered."""

    __slots__ = ("seq", "item", "deaths", "ticket", "sent_at", "put_s")

    def __init__(self, seq: int, item: Item, deaths: int) -> None:
        self.seq = seq
        self.item = item
        self.deaths = deaths  # remote workers lost while this chunk was in their hands
        self.ticket: Any = None
        self.sent_at = 0.0
        self.put_s = 0.0


class RemotePoolRun(PoolRun):
    """The remote workers of one map stage during one epoch (see the module docstring)."""

    def __init__(
        self,
        name: str,
        target: Callable[[], int],
        registry: RemoteRegistry,
        handling: ChunkHandling,
        inp: Channel,
        out: Channel,
        stats: StageStats,
        fail: Callable[[BaseException], None],
        stop: threading.Event,
        rescue: Rescue,
    ) -> None:
        super().__init__(name, target, _unused, inp, out, stats, fail, stop)
        self._registry = registry
        self._handling = handling
        self._rescue = rescue

    def _run(self, index: int) -> None:
        stats = self._stats.worker(index)
        flights: deque[_Flight] = deque()
        worker: RemoteWorker | None = None
        reserved = ended = False
        last_reply = 0.0  # perf_counter() of the worker's last reply: a later chunk's clock starts there
        clock = time.perf_counter
        rescue = self._rescue
        try:
            while not self._stop.is_set():
                retired = index >= self._target()
                if not flights and (retired or ended):
                    if reserved:
                        self._out.unreserve()
                        reserved = False
                    if retired and worker is not None:
                        self._registry.release(index)  # its CPU goes back to the cluster
                        worker = None
                    if ended or self._park(index):
                        return
                    continue
                if worker is None:
                    try:
                        worker = self._registry.worker(index)
                    except RemoteLost:
                        self._stop.wait(RETRY_AFTER_S)  # no cluster: the local workers go on
                        continue
                try:
                    ready = worker.ready(0.0 if flights else 0.2)
                except RemoteLost as exc:
                    self._give_back(flights, stats)
                    self._registry.lost(index, exc, 0)
                    worker = None
                    self._stop.wait(RETRY_AFTER_S)
                    continue
                except RemoteInitError as exc:
                    raise StageError(self.name, "the remote worker's start", exc.message, exc.remote_traceback) from exc
                t0 = clock()
                while ready and not retired and not ended and len(flights) < SLOTS:
                    rescued = rescue.take(remote=True)
                    if rescued is not None:
                        flight = _Flight(*rescued)
                    else:
                        wait = 0.0 if flights else 0.2
                        if not reserved:
                            reserved = self._out.reserve(timeout=wait)
                            if not reserved:
                                break
                        rescue.hold()  # before the chunk leaves the input: see ``Rescue``
                        got = self._inp.get(timeout=wait)
                        if got is TIMEOUT or got is END:
                            rescue.release()
                            if got is END:
                                self._input_ended()
                                reserved, ended = False, True
                            break
                        reserved = False
                        flight = _Flight(got[0], got[1], 0)
                    flights.append(flight)
                    stats.held_bytes += flight.item.nbytes
                    t_put = clock()
                    try:
                        flight.ticket = worker.submit(flight.item.chunk)
                    except RemoteLost as exc:
                        stats.restarts += 1
                        self._registry.lost(index, exc, len(flights))
                        self._give_back(flights, stats)
                        worker = None
                        break
                    flight.sent_at = clock()
                    flight.put_s = flight.sent_at - t_put
                t1 = clock()
                if not flights:
                    if ready:
                        stats.starved_s += t1 - t0
                    continue
                oldest = flights[0]
                if stats.work_item is not oldest.item:  # progress is a delivered result: time from here
                    stats.work_item, stats.work_since = oldest.item, t1
                wait = 0.1
                deadline = None
                if self._handling.timeout_s is not None:
                    deadline = max(oldest.sent_at, last_reply) + self._handling.timeout_s
                    wait = max(0.0, min(wait, deadline - t1))
                if not worker.done(oldest.ticket, wait):
                    if self._stop.is_set():
                        raise Stopped
                    if deadline is not None and clock() >= deadline:
                        self._registry.release(index)  # the hung worker goes; its other chunks go elsewhere
                        worker = None
                        flights.popleft()
                        stats.held_bytes -= oldest.item.nbytes
                        stats.work_since, stats.work_item = 0.0, None
                        rescue.release()
                        self._out.put_at(oldest.seq, self._handling.timed_out(oldest.item, stats))
                        self._give_back(flights, stats)
                    continue
                try:
                    reply = worker.result(oldest.ticket)
                except RemoteLost as exc:
                    stats.restarts += 1
                    oldest.deaths += 1
                    if self._stop.is_set():
                        raise Stopped from None
                    if oldest.deaths >= self._handling.max_attempts:
                        raise self._handling.lost(oldest.item, exc) from None
                    self._registry.lost(index, exc, len(flights))
                    self._give_back(flights, stats)
                    worker = None
                    continue
                now = clock()
                # in transit: the put, and the round trip (reading the reply out of the store included)
                # less the function's time and less the wait behind the chunk before it
                started = max(oldest.sent_at, last_reply)
                stats.transfer_s += oldest.put_s + max(0.0, now - started - reply[-1])
                last_reply = now
                flights.popleft()
                if reply[0] == "ok":
                    _, output, cpu_s, wall_s = reply
                    results = self._handling.deliver(output, oldest.item, stats)
                    stats.transfer_bytes += oldest.item.nbytes + nbytes(output)
                else:
                    _, message, text, cpu_s, wall_s = reply
                    error = RemoteError(message, f"(on the remote worker {worker.where})\n{text}")
                    results = self._handling.failed(oldest.item, stats, error)
                stats.cpu_s += cpu_s
                stats.busy_s += wall_s
                stats.held_bytes -= oldest.item.nbytes
                stats.work_since, stats.work_item = 0.0, None
                stats.items += len(results)
                for r in results:
                    stats.rows += r.rows
                    stats.bytes_out += r.nbytes
                rescue.release()
                self._out.put_at(oldest.seq, results)
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the consumer
            self._fail(exc)
        finally:
            if flights:
                rescue.release(len(flights))
                if worker is not None:  # chunks abandoned by a stopped epoch must not delay the next one
                    try:
                        self._registry.release(index)
                    except Exception:  # noqa: BLE001 - the cluster may be gone as well
                        pass
            stats.held_bytes = 0
            stats.work_since, stats.work_item = 0.0, None

    def _give_back(self, flights: deque[_Flight], stats: WorkerStats) -> None:
        """The chunks in flight, to the stage's other workers (``Rescue``)."""
        if flights:
            self._rescue.give([(f.seq, f.item, f.deaths) for f in flights])
            flights.clear()
        stats.held_bytes = 0
        stats.work_since, stats.work_item = 0.0, None


def _unused(index: int, item: Item, stats: WorkerStats) -> list[Item]:
    raise AssertionError("a remote pool delivers through its workers' results")
