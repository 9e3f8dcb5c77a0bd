"""Stages: the base every stage shares, and the pooled ones (read, map).

Owns ``Stage`` (name, kind, knobs, counters, metrics snapshot, and its part in a pipeline's state:
``resume_role``, ``fingerprint``, ``state_dict`` / ``load_state_dict``), the one-thread loop that
serial stages use (``sequential_loop``), and ``ReadStage`` / ``MapStage``: a resizable set of thread or
process workers behind a ``<stage>.workers`` knob, with UDF failures turned into ``StageError`` or
skips and dead process workers restarted a bounded number of times; a map stage with ``remote="ray"``
also runs remote workers behind ``<stage>.remote_workers`` (``remote_pool``, ``remote_ray``). The read
stage stamps each chunk with its read address and, in a resumed epoch, follows the ``ReadRequest`` its
``load_state_dict`` checked against its source: the refill first, then the chunks after the
checkpoint's (``resume``). A stage object lives as long as the pipeline (knobs, counters, parked
process workers, a loaded state until the next epoch); ``start`` builds its threads and output channel
for one epoch. The serial stages (shuffle, batch, prefetch) live in ``serial_stages``. It must not know
about the stages around it beyond its input channel.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from intune.checkpoint import CheckpointError
from intune.knobs import Knob
from intune.pipeline import cpu_wait
from intune.pipeline.channel import END, TIMEOUT, Channel, Item, Stopped
from intune.pipeline.chunks import Chunk, Origin, RowTable, nbytes
from intune.pipeline.errors import SchemaError, SourceError, StageError, StageTimeoutError, WorkerLostError
from intune.pipeline.metrics import StageMetrics
from intune.pipeline.pool import ChunkHandling, PoolRun, ProcessPoolRun, Rescue
from intune.pipeline.procworker import SLOTS, ProcessWorker, RemoteError
from intune.pipeline.remote_pool import RemotePoolRun
from intune.pipeline.remote_ray import MAX_REMOTE_WORKERS, RemoteWorkers, check_address, require_ray
from intune.pipeline.resume import (
    NO_RULE,
    REPLAY_BYTES_PER_ROW,
    ROW_WISE,
    SOURCE,
    Position,
    ReadRequest,
    ResumeError,
    SourceBounds,
)
from intune.pipeline.schema import Schema
from intune.pipeline.sources import Source
from intune.pipeline.stats import StageStats, WorkerStats

if TYPE_CHECKING:
    from intune.pipeline.resume import ShuffleLog

STALL_AFTER_S = 30.0
"""A stage whose oldest work in hand has made no progress for this long is reported as stalled
(``Pipeline(stall_after_s=...)``); a tuner gives such a stage no more workers (it is hung, not slow)."""


class EpochContext(Protocol):
    """What a stage needs from the running epoch."""

    index: int
    label: str  # unique per pipeline: names process workers and their shared memory
    deterministic: bool
    pools: list[PoolRun]
    stop: threading.Event
    table: RowTable
    # the epoch's input log (``resume.ShuffleLog``), kept by the first stage that re-orders or re-cuts
    # rows (a shuffle, else a batch stage); what that stage's ``state_dict`` snapshots
    shuffle_log: ShuffleLog | None

    def fail(self, exc: BaseException) -> None: ...
    def spawn(self, target: Callable[[], None], name: str) -> None: ...
    def channel(self, name: str, **kwargs: Any) -> Channel: ...


class Stage:
    """Base: name, kind, mode, knobs, counters; subclasses add ``start`` and their own gauges.

    Resume (docs/resume.md): ``resume_role`` says how the stage's output after a checkpoint is found
    again (``resume``'s roles; a custom stage has none, so its pipeline's ``state_dict()`` is refused),
    ``fingerprint`` what a state of it is only valid for, ``state_dict`` its part of a pipeline's state
    and ``load_state_dict`` takes that part back, checked against the stage before anything is
    allocated, and keeps what its next ``start`` follows.
    """

    kind = "stage"
    mode = "inline"
    resume_role: ClassVar[str] = NO_RULE

    def __init__(self, name: str) -> None:
        self.name = name
        self.stats = StageStats()
        self.knobs: list[Knob] = []
        self._out: Channel | None = None
        self.stall_after_s = STALL_AFTER_S  # the pipeline sets its own when the stage is added

    def start(self, epoch: EpochContext, inp: Channel | None) -> Channel:
        raise NotImplementedError

    # ---- resume ------------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        """The facts a state of this stage is only valid for (a subclass adds its own settings)."""
        return {"name": self.name, "kind": self.kind, "type": type(self).__name__}

    def state_dict(self, epoch: EpochContext, delivered: int) -> dict[str, Any] | None:
        """This stage's part of a pipeline's state in ``epoch`` after ``delivered`` rows (None: it keeps
        none, its output after the position is found again from its input)."""
        return None

    def load_state_dict(self, state: Mapping[str, Any] | None, position: Position) -> None:
        """Take back this stage's part of a state (None: start the epoch afresh), for the next ``start``.

        ``Pipeline.load_state_dict`` calls every stage, from the consumer's end back to the source, with
        the ``Position`` the state resumes at: a stage that needs rows read again leaves its request in
        ``position.read``. A malformed or out-of-bounds part raises ``CheckpointError`` naming the field,
        before anything is allocated."""
        if state is not None:
            raise ResumeError(f"{position.where}: stage {self.name!r} of kind {self.kind!r} keeps no state")

    def workers(self) -> int:
        return 1

    def internal_bytes(self) -> int:
        return 0

    def queue_capacity(self) -> int:
        return 0

    def held_out(self) -> Channel | None:
        """The output channel whose items this stage holds: not one the next stage adopted as its buffer
        (that stage counts it; this one only sees whether it is full)."""
        out = self._out
        return out if out is not None and not out.adopted else None

    def queue_fill(self) -> float:
        out = self._out
        if out is not None and out.adopted:
            return 1.0 if out.full() else 0.0
        cap = self.queue_capacity()
        return min(1.0, out.items / cap) if out is not None and cap else 0.0

    def snapshot(self) -> StageMetrics:
        t = self.stats.totals()
        out = self.held_out()
        since, _ = self.stats.oldest_work()
        now = time.perf_counter()
        stalled_s = now - since if since else 0.0
        # work in hand counts as busy while it runs, so that a hung function does not read as idle
        t["busy_s"] += self.stats.in_hand_s(now)
        return StageMetrics(
            name=self.name,
            kind=self.kind,
            mode=self.mode,
            workers=self.workers(),
            items=int(t["items"]),
            rows=int(t["rows"]),
            cpu_s=float(t["cpu_s"]),
            busy_s=float(t["busy_s"]),
            cpu_wait_s=float(t["cpu_wait_s"]),
            cpu_wait_measured=cpu_wait.measured(),
            starved_s=float(t["starved_s"]),
            blocked_s=float(t["blocked_s"]),
            queue_len=out.items if out is not None else 0,
            queue_capacity=self.queue_capacity(),
            queue_fill=self.queue_fill(),
            buffered_bytes=(out.bytes if out is not None else 0)
            + self.internal_bytes()
            + int(t["held_bytes"]),
            skipped=int(t["skipped"]),
            restarts=int(t["restarts"]),
            bytes_out=int(t["bytes_out"]),
            stalled_s=stalled_s,
            stalled=stalled_s > self.stall_after_s,
            worker_bytes=self.worker_bytes(t),
        )

    def worker_bytes(self, totals: dict[str, float]) -> float:
        """Memory one worker holds (``StageMetrics.worker_bytes``): for thread workers the chunks in
        their hands, an input and an output of the mean emitted size; 0 (not measured) for an inline
        stage or before anything was emitted. Process stages measure their children instead."""
        if self.mode != "thread" or totals["items"] <= 0:
            return 0.0
        return 2.0 * totals["bytes_out"] / totals["items"]

    def detach(self) -> None:
        """Forget the ended epoch's output channel (so its memory goes, and metrics say 0); a stage
        that holds more of an epoch (a pool's run, a buffer) forgets that too, in its own override."""
        self._out = None

    def close(self) -> None:
        """Release what outlives an epoch (process workers)."""


def check_int(what: str, value: Any, lo: int, hi: int | None = None) -> int:
    """Validate an integer argument; the ``ValueError`` names the valid range."""
    valid = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer {valid}, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{what} = {value} is out of range, valid range is {valid}")
    return int(value)


def origin_words(item: Item | None) -> str:
    """Which source rows ``item`` holds, in words for an error message (only then: it costs)."""
    return item.origin.describe() if item is not None and item.origin else "a chunk"


def check_seconds(what: str, value: Any) -> float:
    """Validate a positive, finite number of seconds; the ``ValueError`` names the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number of seconds > 0, got {value!r}")
    if not 0 < float(value) < float("inf"):
        raise ValueError(f"{what} = {value} is out of range, it must be > 0 and finite")
    return float(value)


def check_map_arguments(
    method: str, fn: Any, mode: str, on_error: str, workers: Any, timeout_s: Any, max_workers: int
) -> tuple[int, float | None]:
    """The arguments ``map`` and ``map_rows`` share, checked: ``(workers, timeout_s)``; the
    ``ValueError`` names the method and the argument."""
    if not callable(fn):
        raise ValueError(f"{method}: fn must be callable, got {fn!r}")
    if mode not in ("thread", "process"):
        raise ValueError(f"{method}: mode must be 'thread' or 'process', got {mode!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"{method}: on_error must be 'raise' or 'skip', got {on_error!r}")
    workers = check_int("workers", workers, 1, max_workers)
    return workers, (check_seconds("timeout_s", timeout_s) if timeout_s is not None else None)


def check_remote_arguments(method: str, mode: str, remote: Any, address: Any, remote_workers: Any) -> int:
    """The remote-worker arguments of ``map`` / ``map_rows``, checked: the initial ``remote_workers``
    (0 without ``remote``). The ``ValueError`` names the method and the argument; ``remote="ray"``
    without Ray installed raises ``ImportError`` naming the extra."""
    if remote is None:
        if address is not None:
            raise ValueError(f"{method}: address={address!r} is where remote workers run; pass remote='ray' too")
        if remote_workers is not None:
            raise ValueError(f"{method}: remote_workers={remote_workers!r} needs remote='ray'")
        return 0
    if remote != "ray":
        raise ValueError(f"{method}: remote must be None or 'ray', got {remote!r}")
    if mode != "process":
        raise ValueError(
            f"{method}: remote='ray' needs mode='process' (remote workers run the function as process "
            f"workers do), got mode={mode!r}"
        )
    if address is not None:
        check_address(method, address)
    n = check_int(f"{method}: remote_workers", 1 if remote_workers is None else remote_workers, 0, MAX_REMOTE_WORKERS)
    require_ray(method)
    return n


def sequential_loop(
    stats: WorkerStats,
    inp: Channel,
    out: Channel,
    on_item: Callable[[Item], list[Item]],
    on_end: Callable[[], Iterable[Item]],
    on_idle: Callable[[], list[Item]] | None = None,
) -> None:
    """The loop of a one-thread stage, timing starved / busy / blocked.

    A list of results is handed over at once (fewer wake-ups); any other iterable (the end of a
    shuffle: its drain) one item at a time, each handed over before the next is made, so that what
    it makes is held downstream only as fast as it is taken.
    """
    clock = time.perf_counter
    t = clock()
    while True:
        got = inp.get(timeout=0.2 if on_idle is not None else None)
        t1 = clock()
        stats.starved_s += t1 - t
        c0, q0 = time.thread_time(), cpu_wait.thread_wait_s()
        if got is TIMEOUT:
            results: Iterable[Item] = on_idle() if on_idle is not None else []
        elif got is END:
            results = on_end()
        else:
            results = on_item(got[1])
        if isinstance(results, list):
            t2 = clock()
            stats.busy_s += t2 - t1
            stats.cpu_s += time.thread_time() - c0
            stats.cpu_wait_s += cpu_wait.thread_wait_s() - q0
            if results:
                out.put(results)  # one hand-over for all the items one input gave (fewer wake-ups)
                _count_out(stats, results)
            stats.blocked_s += clock() - t2
        else:
            for r in results:
                t2 = clock()
                stats.busy_s += t2 - t1
                stats.cpu_s += time.thread_time() - c0
                stats.cpu_wait_s += cpu_wait.thread_wait_s() - q0
                out.put([r])
                _count_out(stats, [r])
                t1 = clock()
                stats.blocked_s += t1 - t2
                c0, q0 = time.thread_time(), cpu_wait.thread_wait_s()
            stats.busy_s += clock() - t1
            stats.cpu_s += time.thread_time() - c0
            stats.cpu_wait_s += cpu_wait.thread_wait_s() - q0
        if got is END:
            out.finish()
            return
        t = clock()


def _count_out(stats: WorkerStats, items: list[Item]) -> None:
    stats.items += len(items)
    for r in items:
        stats.rows += r.rows
        stats.bytes_out += r.nbytes


class PooledStage(Stage):
    """A stage served by a resizable pool; ``workers`` is its knob."""

    def __init__(self, name: str, max_workers: int, workers: int = 1) -> None:
        super().__init__(name)
        self._target = workers
        self._run: PoolRun | None = None
        self.knobs.append(
            Knob(f"{name}.workers", "cpu", 1, max_workers, self._get_workers, self._set_workers)
        )

    def detach(self) -> None:
        super().detach()
        self._run = None

    def _get_workers(self) -> int:
        return self._target

    def _set_workers(self, value: int) -> None:
        self._target = value
        run = self._run
        if run is not None:
            run.resize()

    def workers(self) -> int:
        return self._target

    def window(self) -> int:
        return 2 * self._target + 2

    def queue_capacity(self) -> int:
        return self.window()

    def _start_pool(self, epoch: EpochContext, inp: Channel, process: Any) -> Channel:
        out = epoch.channel(f"{self.name}.out", ordered=epoch.deterministic, window=self.window)
        self._out = out
        run = PoolRun(self.name, self._get_workers, process, inp, out, self.stats, epoch.fail, epoch.stop)
        self._run = run
        epoch.pools.append(run)
        run.start()
        return out


class ReadStage(PooledStage):
    """Reads a source: parallel units (row groups) in a thread pool, or one sequential stream."""

    kind = "read"
    mode = "thread"
    resume_role = SOURCE

    def __init__(self, source: Source, name: str, max_workers: int) -> None:
        self.source = source
        super().__init__(name, max_workers if source.parallel else 1)
        self._resume: ReadRequest | None = None  # loaded (``load_state_dict``), taken by the next start

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "source": self.source.fingerprint()}

    def bounds(self) -> SourceBounds:
        """What a state's read addresses and chunk sizes may be: its units (a parallel source's; planning
        them reads the files' metadata) and the most rows a chunk holds. A source that does not fix its
        chunk size is bounded by memory: a replay of a chunk must fit in the memory this process may use
        now (``resume.REPLAY_BYTES_PER_ROW`` a row)."""
        units = self.source.units() if self.source.parallel else None
        rows = self.source.max_chunk_rows()
        if rows is None:
            from intune.monitor import memory_usage

            used, limit = memory_usage()
            rows = max(1, (limit - used) // REPLAY_BYTES_PER_ROW)
        return SourceBounds(units, rows)

    def load_state_dict(self, state: Mapping[str, Any] | None, position: Position) -> None:
        """Follow ``position.read`` (left by the stage that keeps the epoch's input log) at the next
        start, its addresses checked against the source: a unit it does not have, or a chunk other than
        #0 of a stream's item, raises ``CheckpointError``."""
        super().load_state_dict(state, position)
        request = position.read
        if request is not None:
            units = position.source.units
            addresses = [(u, i) for u, chunks in request.refill.items() for i in chunks]
            addresses += [request.after] if request.after is not None else []
            for unit, item in addresses:
                if unit < 0 or (units is not None and unit >= units) or item < 0 or (units is None and item):
                    have = f"{units} read units" if units is not None else "one stream (item 0 of each chunk)"
                    raise CheckpointError(
                        f"{position.where}: shuffle.units / shuffle.items name read unit {unit} chunk {item}, "
                        f"but stage {self.name!r} reads {have}"
                    )
        self._resume = request

    def queue_capacity(self) -> int:
        return self.window() if self.source.parallel else 2

    def snapshot(self) -> StageMetrics:
        """As every stage, with malformed lines a reader skipped counted in ``skipped``."""
        base = super().snapshot()
        lines = int(getattr(self.source, "skipped_lines", 0))
        return dataclasses.replace(base, skipped=base.skipped + lines) if lines else base

    def start(self, epoch: EpochContext, inp: Channel | None) -> Channel:
        """Read the source for an epoch; every chunk's origin carries its read address ``read_at``.

        A resumed epoch (the ``ReadRequest`` loaded, see ``resume``) first sends the refill (the rows
        the checkpoint's shuffle buffer held, read again, marked ``refill``), then the chunks after the
        last one the checkpointed shuffle had added. A stream is read from its start again: the chunks
        before that point are read only to take their refill rows (the documented cost of a source
        without random access).
        """
        request, self._resume = self._resume, None
        refill = request.refill if request is not None else {}
        after = request.after if request is not None else None
        if not self.source.parallel:
            out = epoch.channel(f"{self.name}.out", max_items=lambda: 2)
            self._out = out
            stats = self.stats.worker(0)

            def pull() -> None:
                # the source's work happens inside next(): its wall and thread CPU time are the
                # stage's busy_s / cpu_s; the wait in put() for room downstream is blocked_s
                clock, cpu, queued = time.perf_counter, time.thread_time, cpu_wait.thread_wait_s
                stream = iter(self.source.stream())
                index = -1
                while True:
                    t, c0, q0 = clock(), cpu(), queued()
                    item = next(stream, None)
                    index += 1
                    stats.cpu_s += cpu() - c0
                    stats.cpu_wait_s += queued() - q0
                    t1 = clock()
                    stats.busy_s += t1 - t
                    if item is None:
                        missing = [u for u in refill if u >= index]
                        if missing:
                            raise SourceError(
                                f"resume: stream {self.name!r} ended after {index} chunks, the checkpoint "
                                f"needs rows of its chunk #{missing[0]} (the data changed since the checkpoint)"
                            )
                        break
                    items = []
                    if index in refill:
                        items.append(refill_item(item, refill[index].get(0), index, 0))
                    if after is None or index > after[0]:
                        items.append(stamped(item, index, 0))
                    if not items:
                        continue
                    out.put(items)
                    stats.items += len(items)
                    stats.rows += sum(i.rows for i in items)
                    stats.bytes_out += sum(i.nbytes for i in items)
                    stats.blocked_s += clock() - t1
                out.finish()

            epoch.spawn(pull, f"{self.name}-stream")
            return out
        units = self.source.units()
        feed = epoch.channel(f"{self.name}.units")
        for unit in sorted(refill):  # a unit holding refill rows, and its chunks after ``after`` if it is its unit
            keep_from = after[1] + 1 if after is not None and after[0] == unit else None
            feed.put([Item(ReadTask(unit, keep_from, refill[unit]), None, 0, 0)])
        first = 0 if after is None else after[0]
        for unit in range(first, units):
            if after is not None and unit == after[0]:
                if unit not in refill:  # else its refill task sends its chunks after after[1]
                    feed.put([Item(ReadTask(unit, after[1] + 1), None, 0, 0)])
                continue
            feed.put([Item(ReadTask(unit), None, 0, 0)])
        feed.finish()
        source = self.source

        def read(index: int, item: Item, stats: WorkerStats) -> list[Item]:
            task: ReadTask = item.chunk
            got = source.read_unit(task.unit)
            out = []
            for i, wanted in sorted(task.refill.items()):
                if i >= len(got):
                    raise SourceError(
                        f"resume: {source.describe(task.unit, 0, 0)} gave {len(got)} chunks, the checkpoint needs "
                        f"rows of chunk {i} (the data changed since the checkpoint)"
                    )
                out.append(refill_item(got[i], wanted, task.unit, i))
            if task.keep_from is not None:
                out.extend(stamped(it, task.unit, i) for i, it in enumerate(got) if i >= task.keep_from)
            return out

        return self._start_pool(epoch, feed, read)


@dataclasses.dataclass(frozen=True)
class ReadTask:
    """One unit for a read worker: its chunks from ``keep_from`` on, whole (None: none of them), and
    first the rows ``refill`` names of some of its chunks (``{chunk: (rows read then, local indices)}``)."""

    unit: int
    keep_from: int | None = 0
    refill: Mapping[int, tuple[int, np.ndarray]] = dataclasses.field(default_factory=dict)


def stamped(item: Item, unit: int, index: int) -> Item:
    """``item`` with its read address in its origin (``Origin.read_at``)."""
    origin = item.origin if item.origin is not None else Origin()
    item.origin = dataclasses.replace(origin, read_at=(unit, index))
    return item


def refill_item(item: Item, wanted: tuple[int, np.ndarray] | None, unit: int, index: int) -> Item:
    """The rows ``wanted = (rows read at the checkpoint, local indices)`` of ``item``, marked as refill;
    a chunk whose row count changed since the checkpoint is an error (its rows have other ids now)."""
    if wanted is None:
        raise SourceError(f"resume: no refill rows planned for chunk {index} of unit {unit}")
    rows, local = wanted
    if item.rows != rows:
        where = item.origin.describe() if item.origin is not None else f"unit {unit} chunk {index}"
        raise SourceError(
            f"resume: {where} has {item.rows} rows, the checkpoint recorded {rows} (the data changed since the checkpoint)"
        )
    chunk = {k: v[local] for k, v in item.chunk.items()}
    origin = item.origin if item.origin is not None else Origin()
    return Item(chunk, dataclasses.replace(origin, read_at=(unit, index), refill=True), len(local), nbytes(chunk))


class MapStage(PooledStage):
    """Applies a chunk -> chunk function in thread or process workers."""

    kind = "map"
    resume_role = ROW_WISE

    def __init__(
        self,
        fn: Callable[[dict], dict],
        name: str,
        mode: str,
        on_error: str,
        max_workers: int,
        workers: int = 1,
        timeout_s: float | None = None,
        remote: str | None = None,
        address: str | None = None,
        remote_workers: int = 0,
    ) -> None:
        super().__init__(name, max_workers, workers)
        self.fn = fn
        self.mode = mode
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.after_batch = False  # set when added after a batch stage: output lengths may differ then
        self._schema: Schema | None = None
        self._schema_lock = threading.Lock()
        self.max_attempts = 3  # a chunk that kills its worker this many times is an error
        self._procs: list[ProcessWorker] = []
        self._procs_lock = threading.Lock()
        self._closed = False
        self._blob = b""
        if mode == "process":
            import cloudpickle

            try:
                self._blob = cloudpickle.dumps(fn)
            except Exception as exc:
                raise ValueError(
                    f"map stage {name!r}: the function cannot be pickled for process mode: {exc}"
                ) from exc
        # remote workers (``remote="ray"``): Ray actors beside the local ones, their own knob and counters
        self.remote: RemoteWorkers | None = None
        self._remote_target = 0
        self._remote_stats = StageStats()
        self._remote_run: RemotePoolRun | None = None
        if remote is not None:
            self.remote = RemoteWorkers(name, self._blob, address)
            self._remote_target = remote_workers
            self.knobs.append(
                Knob(
                    f"{name}.remote_workers",
                    "cpu",
                    0,
                    MAX_REMOTE_WORKERS,
                    self._get_remote_workers,
                    self._set_remote_workers,
                )
            )

    def fingerprint(self) -> dict[str, Any]:
        fn = self.fn
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
        return {**super().fingerprint(), "mode": self.mode, "on_error": self.on_error, "fn": name}

    def _get_remote_workers(self) -> int:
        return self._remote_target

    def _set_remote_workers(self, value: int) -> None:
        self._remote_target = value
        run = self._remote_run
        if run is not None:
            run.resize()

    def remote_cpus_held(self) -> int:
        """CPUs of the cluster this stage's remote workers hold now (0 without remote workers)."""
        return self.remote.held_cpus() if self.remote is not None else 0

    def detach(self) -> None:
        super().detach()
        self._remote_run = None

    def snapshot(self) -> StageMetrics:
        """As every stage; with remote workers, their output counted in items, rows and bytes, and their
        own counters (time, CPU, transfers) in the ``remote_*`` fields."""
        base = super().snapshot()
        if self.remote is None:
            return base
        r = self._remote_stats.totals()
        since, _ = self._remote_stats.oldest_work()
        stalled_s = max(base.stalled_s, time.perf_counter() - since if since else 0.0)
        return dataclasses.replace(
            base,
            items=base.items + int(r["items"]),
            rows=base.rows + int(r["rows"]),
            bytes_out=base.bytes_out + int(r["bytes_out"]),
            skipped=base.skipped + int(r["skipped"]),
            buffered_bytes=base.buffered_bytes + int(r["held_bytes"]),
            stalled_s=stalled_s,
            stalled=stalled_s > self.stall_after_s,
            remote_workers=self._remote_target,
            remote_items=int(r["items"]),
            remote_rows=int(r["rows"]),
            remote_cpu_s=float(r["cpu_s"]),
            remote_busy_s=float(r["busy_s"]) + self._remote_stats.in_hand_s(time.perf_counter()),
            transfer_s=float(r["transfer_s"]),
            transfer_bytes=int(r["transfer_bytes"]),
            remote_restarts=int(r["restarts"]),
        )

    def _failed(self, item: Item, stats: WorkerStats, exc: BaseException, text: str) -> list[Item]:
        if self.on_error == "skip":
            stats.skipped += 1
            return []
        cause = str(exc) if isinstance(exc, RemoteError) else f"{type(exc).__name__}: {exc}"
        error = StageError(self.name, origin_words(item), cause, text)
        raise error from exc

    def _result(self, out: Any, item: Item) -> list[Item]:
        """The function's output as an item, after the checks every map output passes: a dict of
        arrays (no scalar), of equal lengths unless the stage comes after ``batch`` (deduplication
        changes lengths there), and of the stage's schema, fixed by its first output."""
        if not isinstance(out, dict):
            raise TypeError(f"the map function must return a dict of arrays, got {type(out).__name__}")
        chunk: Chunk = {}
        for name, column in out.items():
            array = column if isinstance(column, np.ndarray) else np.asarray(column)
            if array.ndim == 0:
                raise ValueError(f"the map function returned column {name!r} as a scalar ({array!r}), not an array")
            chunk[name] = array
        if not self.after_batch and len({len(c) for c in chunk.values()}) > 1:
            lengths = {n: len(c) for n, c in chunk.items()}
            raise ValueError(f"the map function returned columns of unequal lengths {lengths}")
        return [Item(self._conform(chunk, item), item.origin, item.rows, nbytes(chunk))]

    def _conform(self, chunk: Chunk, item: Item) -> Chunk:
        def where() -> str:  # words only for an error: describing an origin costs more than the check
            return f"the output of stage {self.name!r} on {origin_words(item)}"

        schema = self._schema
        if schema is None:
            with self._schema_lock:
                if self._schema is None:
                    self._schema = Schema.of(chunk, f"fixed by {where()}")
                schema = self._schema
        return schema.conform(chunk, where)

    def _deliver(self, out: dict, item: Item, stats: WorkerStats) -> list[Item]:
        """A process worker's result through the same checks; a bad one fails as the function would."""
        try:
            return self._result(out, item)
        except SchemaError:
            raise
        except Exception as exc:
            return self._failed(item, stats, exc, traceback.format_exc())

    def process_worker(self, index: int, label: str) -> ProcessWorker:
        with self._procs_lock:
            if self._closed:
                raise Stopped  # the pipeline was closed while this chunk was on its way
            while len(self._procs) <= index:
                self._procs.append(self.new_process_worker(len(self._procs), label))
            return self._procs[index]

    def new_process_worker(self, index: int, label: str) -> ProcessWorker:
        """Process worker ``index``: a child that loads the pickled function (a subclass may start it
        otherwise, or give each worker its own function)."""
        return ProcessWorker(self._blob, f"{label}-w{index}")

    def internal_bytes(self) -> int:
        """The process workers' shared-memory segments (they grow to the largest chunk seen)."""
        with self._procs_lock:
            return sum(p.shm_bytes for p in self._procs)

    def pickled_columns(self) -> int:
        """Object-dtype columns that crossed to or from process workers pickled (the slow path)."""
        with self._procs_lock:
            return sum(p.pickled_columns for p in self._procs)

    def worker_pids(self) -> list[int]:
        with self._procs_lock:
            return [p.pid for p in self._procs if p.pid is not None]

    def worker_bytes(self, totals: dict[str, float]) -> float:
        """Process workers: the mean of what each running child holds alone
        (``ProcessWorker.memory_bytes``, a read of ``/proc`` each: about 0.2 ms); threads as every stage."""
        if self.mode != "process":
            return super().worker_bytes(totals)
        with self._procs_lock:
            procs = list(self._procs)
        readings = [b for p in procs if (b := p.memory_bytes()) is not None]
        return sum(readings) / len(readings) if readings else 0.0

    def start(self, epoch: EpochContext, inp: Channel | None) -> Channel:
        assert inp is not None
        fn = self.fn

        def in_thread(index: int, item: Item, stats: WorkerStats) -> list[Item]:
            try:
                out = fn(item.chunk)
                return self._result(out, item)
            except SchemaError:
                raise  # the pipeline's contract, not this chunk's data: never skipped
            except (Exception, SystemExit) as exc:  # SystemExit: as process mode reports a sys.exit()
                return self._failed(item, stats, exc, traceback.format_exc())

        if self.mode != "process":
            if self.timeout_s is not None:
                epoch.spawn(lambda: self._watch(epoch), f"{self.name}-watchdog")
            return self._start_pool(epoch, inp, in_thread)
        if self.remote is not None:
            self.remote.connect()  # the first epoch connects; a cluster that cannot be reached fails it here
        out = epoch.channel(f"{self.name}.out", ordered=epoch.deterministic, window=self.window)
        self._out = out
        label = f"{epoch.label}-{self.name}"
        rescue = Rescue() if self.remote is not None else None

        def lost(item: Item, exc: BaseException) -> BaseException:
            where = origin_words(item)
            return WorkerLostError(
                f"stage {self.name!r}: a process worker died {self.max_attempts} times on {where} ({exc})"
            )

        run = ProcessPoolRun(
            self.name,
            self._get_workers,
            lambda index: self.process_worker(index, label),
            self._chunk_handling(lost),
            inp,
            out,
            self.stats,
            epoch.fail,
            epoch.stop,
            rescue,
        )
        self._run = run
        epoch.pools.append(run)
        run.start()
        if self.remote is not None and rescue is not None:
            self._start_remote(epoch, inp, out, rescue)
        return out

    def _chunk_handling(self, lost: Callable[[Item, BaseException], BaseException]) -> ChunkHandling:
        """This stage's handling of a process or remote worker's outcomes; ``lost`` words the error of a
        chunk whose workers kept dying."""
        return ChunkHandling(
            deliver=self._deliver,
            failed=lambda item, stats, exc: self._failed(item, stats, exc, getattr(exc, "remote_traceback", "")),
            timed_out=self._timed_out,
            lost=lost,
            timeout_s=self.timeout_s,
            max_attempts=self.max_attempts,
        )

    def _start_remote(self, epoch: EpochContext, inp: Channel, out: Channel, rescue: Rescue) -> None:
        """The remote workers' threads on the same channels as the local workers (``remote_pool``)."""
        assert self.remote is not None

        def lost(item: Item, exc: BaseException) -> BaseException:
            return WorkerLostError(
                f"stage {self.name!r}: {self.max_attempts} remote workers in a row were lost while holding "
                f"{origin_words(item)} (last: {exc})"
            )

        run = RemotePoolRun(
            self.name,
            self._get_remote_workers,
            self.remote,
            self._chunk_handling(lost),
            inp,
            out,
            self._remote_stats,
            epoch.fail,
            epoch.stop,
            rescue,
        )
        self._remote_run = run
        epoch.pools.append(run)
        run.start()

    def _timed_out(self, item: Item, stats: WorkerStats) -> list[Item]:
        """A process worker's chunk past ``timeout_s`` (its child was killed): skipped and counted
        under ``on_error="skip"``, else ``StageTimeoutError``."""
        if self.on_error == "skip":
            stats.skipped += 1
            return []
        assert self.timeout_s is not None
        raise StageTimeoutError(self.name, origin_words(item), self.timeout_s)

    def _watch(self, epoch: EpochContext) -> None:
        """Thread mode: fail the epoch with ``StageTimeoutError`` once a chunk has been in a worker's
        hands for ``timeout_s``. A thread cannot be killed, so a hung function keeps its thread (a
        daemon, whose result is dropped) after the error, whatever ``on_error`` says."""
        assert self.timeout_s is not None
        period = min(0.25, self.timeout_s / 4)
        while not epoch.stop.wait(period):
            since, item = self.stats.oldest_work()
            if since and time.perf_counter() - since > self.timeout_s:
                epoch.fail(StageTimeoutError(self.name, origin_words(item), self.timeout_s))
                return

    def window(self) -> int:
        """Chunks taken but not yet delivered: room for every worker's chunks in flight, plus slack."""
        if self.mode == "process":
            return (SLOTS + 1) * (self._target + self._remote_target) + 2
        return 2 * self._target + 2

    def close(self) -> None:
        with self._procs_lock:
            self._closed = True
            procs, self._procs = self._procs, []
        if self.remote is not None:
            self.remote.close()
        for p in procs:
            p.close()
