"""A resizable pool of workers serving one stage for one epoch.

Owns the worker loop: park while retired, reserve a slot downstream, take a chunk, process it, deliver
it under its sequence number. Exactly-once follows from that loop: a chunk taken from the input
channel is held by one worker until it is delivered, and a worker only retires between chunks, so a
resize (from any thread, at any moment) can neither lose nor repeat a row. Raising the target wakes
parked workers (or starts threads); lowering it lets surplus workers park after the chunk in hand.
``ProcessPoolRun`` is the same loop for process workers, keeping two chunks in flight per child; it
owns the handling of a child's outcome (result, error, timeout, death, failed start) that the
DataLoader's pool (``dataloader.dispatch``) reuses with its own intake.
``Rescue`` hands the chunks of a remote worker that was lost (``remote_ray``) to the stage's other
workers under their original sequence numbers, so that they too are delivered once.
This module must not know what ``process`` does (read a unit, apply a function in a thread).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from intune.pipeline import cpu_wait
from intune.pipeline.channel import END, TIMEOUT, Channel, Item, Stopped
from intune.pipeline.errors import StageError
from intune.pipeline.procworker import SLOTS, ChunkTimeout, RemoteError, WorkerDied, WorkerInitError
from intune.pipeline.stats import StageStats, WorkerStats

# process(worker_index, item, stats) -> items to deliver (0..n)
Process = Callable[[int, Item, WorkerStats], list[Item]]


class PoolRun:
    """The threads of one pooled stage during one epoch."""

    def __init__(
        self,
        name: str,
        target: Callable[[], int],
        process: Process,
        inp: Channel,
        out: Channel,
        stats: StageStats,
        fail: Callable[[BaseException], None],
        stop: threading.Event,
    ) -> None:
        self.name = name
        self._target = target
        self._process = process
        self._inp = inp
        self._out = out
        self._stats = stats
        self._fail = fail
        self._stop = stop
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._done = False

    def start(self) -> None:
        self.resize()

    def resize(self) -> None:
        """Apply the current target: start missing threads, wake parked ones."""
        with self._cond:
            if self._done or self._stop.is_set():
                return
            for index in range(len(self._threads), self._target()):
                thread = threading.Thread(
                    target=self._run, args=(index,), name=f"intune-{self.name}-{index}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._cond.notify_all()

    def threads(self) -> list[threading.Thread]:
        with self._cond:
            return list(self._threads)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _park(self, index: int) -> bool:
        """Wait while this worker is retired; True if the epoch's input has ended meanwhile."""
        with self._cond:
            while index >= self._target() and not self._stop.is_set() and not self._done:
                self._cond.wait(0.5)
            return self._done

    def _input_ended(self) -> None:
        """The input's end reached this worker: the output learns how many chunks it will get, the
        worker's reserved slot is given back, and the other workers are woken to see the pool done."""
        self._out.finish(self._inp.handed_out)
        self._out.unreserve()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def _run(self, index: int) -> None:
        stats = self._stats.worker(index)
        reserved = False
        clock = time.perf_counter
        try:
            while not self._stop.is_set():
                if index >= self._target():
                    if reserved:
                        self._out.unreserve()
                        reserved = False
                    if self._park(index):
                        return  # the input has ended: a retired worker has nothing left to do
                    continue
                t0 = clock()
                if not reserved:
                    reserved = self._out.reserve(timeout=0.2)
                    t1 = clock()
                    stats.blocked_s += t1 - t0
                    if not reserved:
                        continue
                    t0 = t1
                got = self._inp.get(timeout=0.2)
                t1 = clock()
                stats.starved_s += t1 - t0
                if got is TIMEOUT:
                    continue
                if got is END:
                    self._input_ended()
                    reserved = False
                    return
                seq, item = got
                reserved = False
                stats.held_bytes = item.nbytes
                stats.work_item, stats.work_since = item, t1
                c0, q0 = time.thread_time(), cpu_wait.thread_wait_s()
                results = self._process(index, item, stats)
                stats.cpu_s += time.thread_time() - c0
                stats.cpu_wait_s += cpu_wait.thread_wait_s() - q0
                stats.work_since, stats.work_item = 0.0, None
                stats.busy_s += clock() - t1
                count_out(stats, results)
                self._out.put_at(seq, results)
                stats.held_bytes = 0
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the consumer
            self._fail(exc)
        finally:
            stats.held_bytes = 0
            stats.work_since, stats.work_item = 0.0, None

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads():
            thread.join(max(0.0, deadline - time.monotonic()))


def count_out(stats: WorkerStats, results: list[Item]) -> None:
    """A worker's delivered items, rows and bytes, in its stats."""
    stats.items += len(results)
    for r in results:
        stats.rows += r.rows
        stats.bytes_out += r.nbytes


def any_alive(threads: list[Any]) -> bool:
    return any(t.is_alive() for t in threads)


class Rescue:
    """Chunks taken from a stage's input whose remote worker was lost, for its other workers to finish.

    A remote worker that takes a chunk (from the input or from here) holds it until its result is
    delivered or it ``give``s it back; ``hold`` is called *before* it asks the input for a chunk, so
    that between a chunk leaving the input and a rescue there is never a moment when the chunk is
    counted nowhere. The local workers take rescued chunks before new input and, once the input has
    ended, stay until ``settled``: nothing left here and nothing held remotely that could come back.
    A rescued chunk keeps its sequence number and the window slot reserved for it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: deque[tuple[int, Item, int]] = deque()  # (seq, item, remote deaths so far)
        self._held = 0

    def hold(self, n: int = 1) -> None:
        """A remote worker holds (or is about to take) ``n`` more chunks."""
        with self._cond:
            self._held += n

    def release(self, n: int = 1) -> None:
        """A remote worker no longer holds ``n`` chunks (delivered, or nothing came from the input)."""
        with self._cond:
            self._held -= n
            self._cond.notify_all()

    def give(self, chunks: list[tuple[int, Item, int]]) -> None:
        """A remote worker's chunks in flight, for another worker (they stop being held)."""
        with self._cond:
            self._items.extend(chunks)
            self._held -= len(chunks)
            self._cond.notify_all()

    def take(self, remote: bool = False) -> tuple[int, Item, int] | None:
        """The oldest rescued chunk, if any; a ``remote`` taker holds it from then on."""
        with self._cond:
            if not self._items:
                return None
            if remote:
                self._held += 1
            return self._items.popleft()

    @property
    def waiting(self) -> int:
        return len(self._items)

    def settled(self) -> bool:
        """Nothing to rescue now, and no remote worker holds a chunk that could come back."""
        with self._cond:
            return not self._items and self._held <= 0

    def wait(self, timeout: float) -> None:
        with self._cond:
            if self._items or self._held <= 0:
                return
            self._cond.wait(timeout)


@dataclass(frozen=True)
class ChunkHandling:
    """What a map stage does with a chunk's outcome, shared by its local and remote pools: the result
    (``deliver``), the function's error (``failed``), a chunk past ``timeout_s`` (``timed_out``), and
    the error that ends the epoch once ``max_attempts`` workers in a row were lost on it (``lost``)."""

    deliver: Callable[[dict, Item, WorkerStats], list[Item]]
    failed: Callable[[Item, WorkerStats, BaseException], list[Item]]
    timed_out: Callable[[Item, WorkerStats], list[Item]]
    lost: Callable[[Item, BaseException], BaseException]
    timeout_s: float | None
    max_attempts: int


class ProcessPoolRun(PoolRun):
    """A pool whose workers each drive one child process with up to ``SLOTS`` chunks in flight.

    The same exactly-once argument holds: a chunk taken from the input stays in the worker's
    ``pending`` list until its result (or its failure) is delivered; a dead child is replaced and the
    chunks in flight are re-sent in order. A retiring worker takes no new chunk, delivers the ones in
    flight, then parks (its child idles in ``recv``). With a ``rescue`` (a stage with remote workers) the
    active workers take rescued chunks first and stay past the input's end until it is ``settled``.
    """

    def __init__(
        self,
        name: str,
        target: Callable[[], int],
        worker_for: Callable[[int], Any],
        handling: ChunkHandling,
        inp: Channel,
        out: Channel,
        stats: StageStats,
        fail: Callable[[BaseException], None],
        stop: threading.Event,
        rescue: Rescue | None = None,
    ) -> None:
        super().__init__(name, target, _unused, inp, out, stats, fail, stop)
        self._rescue = rescue
        self._worker_for = worker_for
        self._handling = handling

    def _run(self, index: int) -> None:
        """The worker's thread: its loop (``_loop``), its failure reported, its child killed if the epoch
        stopped with chunks in flight (they must not reach the next epoch)."""
        stats = self._stats.worker(index)
        child = ChildSlot()
        try:
            self._loop(index, stats, child)
        except Stopped:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the consumer
            self._fail(exc)
        finally:
            stats.held_bytes = 0
            stats.work_since, stats.work_item = 0.0, None
            if child.worker is not None and child.worker.in_flight:
                child.worker.kill()  # chunks abandoned by a stopped epoch must not reach the next one

    def _loop(self, index: int, stats: WorkerStats, child: ChildSlot) -> None:
        """Take chunks (rescued ones first) while fewer than ``SLOTS`` are in flight, then collect the
        oldest; park while retired; stay past the input's end until the rescue is settled."""
        pending: deque[tuple[int, Item]] = deque()
        reserved = ended = False
        clock = time.perf_counter
        if index < self._target():
            child.worker = self._worker_for(index)
            child.worker.ensure_started()
        rescue = self._rescue
        while not self._stop.is_set():
            retired = index >= self._target()
            if not pending and (retired or ended):
                if reserved:
                    self._out.unreserve()
                    reserved = False
                if ended and not retired and rescue is not None and not rescue.settled():
                    rescue.wait(0.2)  # a remote worker may still give chunks back
                elif ended or self._park(index):
                    return
                if not ended:
                    continue
            while not retired and len(pending) < SLOTS:
                rescued = rescue.take() if rescue is not None else None
                if rescued is not None:
                    self._submit(index, child, rescued[:2], pending, stats)
                    continue
                if ended:
                    break
                # with chunks in flight the intake only tops up (no wait); with none, the worker waits
                # for room downstream (blocked) and then for input (starved), the wait that ends in a
                # chunk included: busy + starved + blocked is the worker's time, as in a thread pool
                wait = 0.0 if pending else 0.2
                t0 = clock()
                if not reserved:
                    reserved = self._out.reserve(timeout=wait)
                    t1 = clock()
                    stats.blocked_s += t1 - t0
                    if not reserved:
                        break
                    t0 = t1
                got = self._inp.get(timeout=wait)
                stats.starved_s += clock() - t0
                if got is TIMEOUT:
                    break
                if got is END:
                    self._input_ended()
                    reserved, ended = False, True
                    break
                reserved = False
                self._submit(index, child, got, pending, stats)
            if not pending:
                continue
            self._collect_oldest(index, child.worker, pending, stats)

    def _submit(
        self, index: int, child: ChildSlot, got: tuple[int, Item], pending: deque[tuple[int, Item]], stats: WorkerStats
    ) -> None:
        """Send ``got`` to this worker's child (made now if it has none yet) and hold it in ``pending``."""
        if child.worker is None:
            child.worker = self._worker_for(index)
        child.worker.submit(got[1].chunk)
        pending.append(got)
        stats.held_bytes += got[1].nbytes

    def _collect_oldest(
        self, index: int, worker: Any, pending: deque[tuple[int, Item]], stats: WorkerStats
    ) -> bool:
        """The outcome of the oldest chunk in flight, delivered under its sequence number: its result,
        the function's error, a timeout (the hung child is replaced) or the worker's start failing (the
        epoch fails). A dead child is replaced and its chunks sent again (False: nothing delivered),
        unless ``_lost`` says the chunk (or the worker) cannot go on."""
        clock = time.perf_counter
        handling = self._handling
        seq, item = pending[0]
        t1 = clock()
        if stats.work_item is not item:  # progress is a delivered result: time from here
            stats.work_item, stats.work_since = item, t1
        try:
            result, cpu = worker.collect(self._stop, handling.timeout_s)
            stats.cpu_s += cpu.cpu_s
            stats.cpu_wait_s += cpu.wait_s
            results = self._outcome(index, seq, item, result, stats)
        except RemoteError as exc:
            results = handling.failed(item, stats, exc)
        except ChunkTimeout:  # the hung child is gone: fail, or skip its chunk and go on
            results = handling.timed_out(item, stats)
            worker.drop_oldest()
            worker.restart()
        except WorkerInitError as exc:  # every chunk would fail alike: no retry, no skip
            raise StageError(self.name, "the worker's start", str(exc), exc.remote_traceback) from exc
        except WorkerDied as exc:
            stats.restarts += 1
            if self._stop.is_set():
                raise Stopped from None
            self._lost(index, worker, item, exc)
            worker.restart()
            return False
        pending.popleft()
        self._collected(index)
        stats.work_since, stats.work_item = 0.0, None
        stats.held_bytes -= item.nbytes
        stats.busy_s += clock() - t1
        count_out(stats, results)
        self._out.put_at(seq, results)
        return True

    def _outcome(self, index: int, seq: int, item: Item, result: dict, stats: WorkerStats) -> list[Item]:
        """The items a chunk's result delivers."""
        return self._handling.deliver(result, item, stats)

    def _lost(self, index: int, worker: Any, item: Item, exc: WorkerDied) -> None:
        """A child died on ``item``: raise to end the epoch when it may not be sent again."""
        if worker.oldest_deaths() >= self._handling.max_attempts:
            raise self._handling.lost(item, exc) from None

    def _collected(self, index: int) -> None:
        """The oldest chunk in flight of worker ``index`` was delivered."""


class ChildSlot:
    """A pool worker's child process handle, once made (``None`` before): the thread's ``finally``
    kills it if chunks are still in flight."""

    worker: Any = None


def _unused(index: int, item: Item, stats: WorkerStats) -> list[Item]:
    raise AssertionError("a process pool delivers through collect()")
