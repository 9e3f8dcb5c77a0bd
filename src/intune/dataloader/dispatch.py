"""Which worker fetches which batch: torch's round-robin hand-out, over resizable process workers.

Owns the fetch stage's epoch with process workers. ``Dispatch`` takes the batches (or an iterable
dataset's requests) from the stage's input one at a time, each with a slot of the output's window,
and queues each for one worker, as torch's loader puts each index into one worker's queue: with
``in_order`` the next worker in the cycle (batch ``k`` of ``n`` workers goes to worker ``k % n``),
else the next one in the cycle holding fewer than ``prefetch_factor`` batches. ``LoaderPoolRun`` is
each worker's thread: it sends its own queue's batches to its child process (two in flight), in
order, and delivers the results under their input's sequence number (the engine's
``ProcessPoolRun`` handles each outcome; this module adds only the intake, an iterable's end and
which deaths are final).

Exactly once: a batch is in one place at a time (the input, one worker's queue, one child, the
output), and each worker works through its queue oldest first, so the oldest batch not yet released
always makes progress and the window cannot fill up behind it. A resize moves the queue of a retired
worker to the others (a retired worker still delivers what its child holds). An iterable worker whose
iterator has ended answers ``EXHAUSTED`` (an empty entry) to its requests and leaves the cycle for the
requests handed out a window after it said so: those before it are already released, in order, when
the window lets the next one go, so which worker gets which request, and so the order of the batches,
depend on the data only, as under torch (whose main thread learns of the end in order too). Once every
worker has left, the epoch ends. A dead child is
replaced and its batches sent again (a map-style batch is the same whoever fetches it), except for an
iterable dataset, whose worker's place in its iterator cannot be rebuilt: that fails the epoch. A
resumed epoch starts its cycle at a given worker. With an ``Opener``, each worker is sent the epoch's
opening before its first batch, and its answer handed back (``worker_state``: the worker's own state,
restored on a resume). It must not know what the workers compute (``fetch``, ``shards``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from intune.pipeline.channel import END, TIMEOUT, Channel, Item, Stopped
from intune.pipeline.errors import StageError, WorkerLostError
from intune.pipeline.pool import ChildSlot, ChunkHandling, ProcessPoolRun
from intune.pipeline.procworker import SLOTS, RemoteError, WorkerDied
from intune.pipeline.stats import StageStats, WorkerStats

Queued = tuple[int, Item]  # (sequence number in the input's order, the batch)


class Dispatch:
    """The epoch's hand-out of batches to workers: one queue per worker, filled round-robin."""

    def __init__(
        self,
        target: Callable[[], int],
        window: Callable[[], int],
        in_order: bool,
        per_worker: int,
        stop: threading.Event,
        out: Channel,
        first: int = 0,
    ) -> None:
        self._target = target
        self._window = window
        self._in_order = in_order
        self._per_worker = max(1, per_worker)
        self._stop = stop
        self._out = out
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)  # the dispatcher's (room for a batch, with in_order=False)
        self._ready: dict[int, threading.Condition] = {}  # each worker's: a batch queued for it, or the end
        self._queues: dict[int, deque[Queued]] = {}
        self._held: dict[int, int] = {}  # taken from its queue by the worker, not yet delivered
        self._cursor = first  # the next worker in the cycle (a resumed epoch's: after the last delivered)
        self._ended = False  # nothing more will be queued
        self._exhausted_at: dict[int, int] = {}  # worker -> the first request it answered EXHAUSTED
        self._next = 0  # the sequence number of the next batch taken from the input

    # ---- the dispatcher's thread -----------------------------------------------------------------
    def run(self, inp: Channel) -> None:
        """Queue every batch of the input for its worker, each holding a window slot, until the input
        ends (or every worker's iterator has); then tell the output how many entries it will get."""
        out = self._out
        try:
            while True:
                if not out.reserve(timeout=0.2):
                    continue
                if self._all_left():
                    out.unreserve()
                    break
                got = inp.get(timeout=0.2)
                if got is TIMEOUT or got is END:
                    out.unreserve()
                    if got is END:
                        break
                    continue
                self._give(got)
        finally:
            with self._cond:
                self._ended = True
                self._wake_all()
        out.finish(inp.handed_out)

    def _give(self, got: Queued) -> None:
        with self._cond:
            self._next = got[0] + 1
            while True:
                worker = self._choose(got[0])
                if worker is not None:
                    self._queues.setdefault(worker, deque()).append(got)
                    self._worker_ready(worker).notify()
                    return
                if self._all_left(got[0]):
                    self._out.put_at(got[0], [])  # no worker has anything left: an empty entry
                    return
                self._wait(self._cond, 0.2)  # in_order=False: every worker holds prefetch_factor batches

    def _choose(self, seq: int) -> int | None:
        """The next worker of the cycle that may take batch ``seq`` (torch's ``_try_put_index``)."""
        n = self._target()
        for step in range(n):
            worker = (self._cursor + step) % n
            if self._left(worker, seq):
                continue
            if self._in_order or self._outstanding(worker) < self._per_worker:
                self._cursor = worker + 1
                return worker
        return None

    def _left(self, worker: int, seq: int) -> bool:
        """Whether ``worker`` is out of the cycle for request ``seq``: with ``in_order``, only an end
        it answered a window earlier counts (everything up to there is released, so known whatever the
        timing); without, any end known now."""
        at = self._exhausted_at.get(worker)
        if at is None:
            return False
        return not self._in_order or at <= seq - self._out_window()

    def _out_window(self) -> int:
        return self._window()

    def _outstanding(self, worker: int) -> int:
        return len(self._queues.get(worker, ())) + self._held.get(worker, 0)

    # ---- the workers' side -----------------------------------------------------------------------
    def take(self, worker: int, timeout: float) -> Any:
        """The oldest batch queued for ``worker``; None if none came within ``timeout``; ``END`` once
        nothing is queued for anyone and nothing more will be (a retired worker takes nothing)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._stop.is_set():
                    raise Stopped
                queue = self._queues.get(worker)
                if queue and worker < self._target():
                    self._held[worker] = self._held.get(worker, 0) + 1
                    return queue.popleft()
                if self.finished():
                    return END
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._wait(self._worker_ready(worker), left)

    def delivered(self, worker: int) -> None:
        """``worker`` delivered one batch it had taken (room for another with ``in_order=False``)."""
        with self._cond:
            self._held[worker] -= 1
            if not self._in_order:
                self._cond.notify()

    def exhausted(self, worker: int, seq: int) -> None:
        """``worker`` answered request ``seq`` that its iterator has ended (it answers so to the requests
        queued for it too): it leaves the cycle a window later."""
        with self._cond:
            self._exhausted_at[worker] = min(seq, self._exhausted_at.get(worker, seq))
            self._cond.notify()

    def rebalance(self) -> None:
        """After a resize: the queues of retired workers go to the active ones."""
        with self._cond:
            n = self._target()
            moved = [got for w in [w for w in self._queues if w >= n] for got in self._queues.pop(w)]
            self._requeue(moved)

    def _requeue(self, moved: list[Queued]) -> None:
        """Give ``moved`` (oldest first) to the cycle's workers, keeping each queue oldest first."""
        for got in sorted(moved, key=lambda g: g[0]):
            worker = self._choose_any()
            queue = self._queues.setdefault(worker, deque())
            queue.append(got)
            if len(queue) > 1 and queue[-2][0] > got[0]:
                self._queues[worker] = deque(sorted(queue, key=lambda g: g[0]))
        self._wake_all()

    def _choose_any(self) -> int:
        worker = self._cursor % self._target()
        self._cursor = worker + 1
        return worker

    def _all_left(self, seq: int | None = None) -> bool:
        """Every worker is out of the cycle for request ``seq`` (default: the next one)."""
        with self._cond:
            seq = self._next if seq is None else seq
            return all(self._left(w, seq) for w in range(self._target()))

    def finished(self) -> bool:
        """Nothing queued for anyone, and nothing more will be."""
        return self._ended and not any(self._queues.values())

    def wake(self) -> None:
        with self._cond:
            self._wake_all()

    def _worker_ready(self, worker: int) -> threading.Condition:
        ready = self._ready.get(worker)
        if ready is None:
            ready = self._ready[worker] = threading.Condition(self._lock)
        return ready

    def _wake_all(self) -> None:
        self._cond.notify_all()
        for ready in self._ready.values():
            ready.notify_all()

    def _wait(self, condition: threading.Condition, timeout: float) -> None:
        condition.wait(min(timeout, 0.2))
        if self._stop.is_set():
            raise Stopped


class Opener:
    """An epoch's opening for each worker: ``chunk(worker)`` is what it is sent, ``opened(worker,
    answer)`` is given its answer."""

    def __init__(
        self, chunk: Callable[[int], Mapping[str, Any]], opened: Callable[[int, Mapping[str, Any]], None]
    ) -> None:
        self.chunk = chunk
        self.opened = opened


class LoaderPoolRun(ProcessPoolRun):
    """The fetch stage's workers for one epoch: each sends its own queue's batches to its child process.

    ``replaceable``: a child that dies (or hangs past the timeout) is replaced and its batches sent
    again; without it (an iterable dataset's worker, whose position in its iterator is lost with it)
    the epoch fails, naming the worker, as torch's does."""

    def __init__(
        self,
        name: str,
        target: Callable[[], int],
        worker_for: Callable[[int], Any],
        handling: ChunkHandling,
        dispatch: Dispatch,
        out: Channel,
        stats: StageStats,
        fail: Callable[[BaseException], None],
        stop: threading.Event,
        *,
        exhausted_key: str,
        replaceable: bool,
        dataset_name: str,
        opener: Opener | None = None,
    ) -> None:
        super().__init__(name, target, worker_for, handling, out, out, stats, fail, stop)
        self._dispatch = dispatch
        self._opener = opener
        self._opened: set[int] = set()  # the workers that were sent the epoch's opening
        self._exhausted_key = exhausted_key
        self._replaceable = replaceable
        self._dataset_name = dataset_name

    def resize(self) -> None:
        self._dispatch.rebalance()
        super().resize()

    def wake(self) -> None:
        super().wake()
        self._dispatch.wake()

    def _park(self, index: int) -> bool:
        """Wait while this worker is retired; True once the epoch has nothing more for anyone."""
        with self._cond:
            while index >= self._target() and not self._stop.is_set() and not self._dispatch.finished():
                self._cond.wait(0.2)
            return self._dispatch.finished()

    def _loop(self, index: int, stats: WorkerStats, child: ChildSlot) -> None:
        """Take this worker's own queued batches while fewer than ``SLOTS`` are in flight, then collect
        the oldest (``ProcessPoolRun._collect_oldest``); park while retired; end with the dispatch."""
        pending: deque[Queued] = deque()
        dispatch = self._dispatch
        clock = time.perf_counter
        child.worker = self._worker_for(index)
        child.worker.ensure_started()
        self.open({index: child.worker})
        while not self._stop.is_set():
            retired = index >= self._target()
            ended = False
            t0 = clock()
            while not retired and len(pending) < SLOTS:
                got = dispatch.take(index, 0.0 if pending else 0.2)
                if got is None:
                    break
                if got is END:
                    ended = True
                    break
                self._submit(index, child, got, pending, stats)
            if not pending:
                stats.starved_s += clock() - t0
                if ended or (retired and self._park(index)):
                    return
                continue
            self._collect_oldest(index, child.worker, pending, stats)

    def open(self, workers: dict[int, Any]) -> None:
        """Send each of ``workers`` (index -> worker) the epoch's opening, then hand each answer to the
        opener, once per epoch and worker (before its first batch: on the caller's thread at ``iter()``,
        all at once, or on its own thread for a worker added later)."""
        if self._opener is None:
            return
        sent = {index: worker for index, worker in workers.items() if index not in self._opened}
        for index, worker in sent.items():
            worker.ensure_started()
            worker.submit(self._opener.chunk(index))
        for index, worker in sent.items():
            self._opener.opened(index, self._answer(index, worker))
            self._opened.add(index)

    def _answer(self, index: int, worker: Any) -> dict:
        for attempt in range(self._handling.max_attempts):
            try:
                return worker.collect(self._stop, self._handling.timeout_s)[0]
            except RemoteError as exc:
                raise StageError(
                    self.name, f"worker {index}'s opening of the epoch", str(exc), exc.remote_traceback
                ) from exc
            except WorkerDied:
                if attempt + 1 == self._handling.max_attempts:
                    raise
                worker.restart()  # sends the opening again
        raise AssertionError("unreachable")

    def _outcome(self, index: int, seq: int, item: Item, result: dict, stats: WorkerStats) -> list[Item]:
        if self._exhausted_key in result:
            self._dispatch.exhausted(index, seq)
            return []
        return super()._outcome(index, seq, item, result, stats)

    def _lost(self, index: int, worker: Any, item: Item, exc: WorkerDied) -> None:
        if not self._replaceable:
            raise WorkerLostError(
                f"DataLoader worker {index} exited unexpectedly ({exc}) while reading its part of "
                f"iterable dataset {self._dataset_name}: where its iterator was is lost with it, "
                "so the epoch cannot go on without losing or repeating rows"
            ) from None
        super()._lost(index, worker, item, exc)

    def _collected(self, index: int) -> None:
        self._dispatch.delivered(index)
