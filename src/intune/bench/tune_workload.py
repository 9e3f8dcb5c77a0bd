"""The workload of ``intune bench tune`` and the measurements its three benchmarks share.

Owns the live benchmark pipeline (an id source, an I/O-waiting reader, a shuffle, a CPU-heavy
pure-Python UDF in process workers, batching and prefetch), the exactly-once row counter, the
consumer loop that records when rows arrived, the rate timeline computed from those arrivals, the
"first time a rate was sustained" rule, the exhaustive search over worker allocations, one live
run of a policy from the even split (with CPU changes at given times), and the pipeline's copy as a
simulator spec (``simulated_spec``). It must not decide targets or print tables (``tune_live`` does) nor
change the machine itself (``machine_control`` does).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from intune.bench.machine_control import CpuRestriction
from intune.pipeline import Pipeline

ROW_ID = "row_id"
PAYLOAD = "payload"


@dataclass(frozen=True)
class Workload:
    """The live pipeline's shape: per-chunk I/O wait, per-row CPU work, buffers."""

    chunk_rows: int = 512
    """Rows per source chunk (one storage read)."""
    io_ms: float = 40.0
    """Storage latency per chunk: the reader sleeps this long (no CPU), so more reader threads help."""
    udf_loops: int = 600
    """Pure-Python loop iterations per row in the UDF (holds the GIL: only process workers scale)."""
    payload_floats: int = 16
    """float32 values per row carried through the pipeline (sets row bytes, hence buffer memory)."""
    shuffle_rows: int = 4096
    """Shuffle window in rows; the ``shuffle.buffer_mb`` knob caps it by memory."""
    shuffle_mb: int = 64
    shuffle_min_mb: int = 1
    """The shuffle window's floor (``shuffle(min_buffer_mb=...)``): no policy may cut it below."""
    max_mb: int | None = None
    """The buffers' ceiling the user states (``Pipeline(max_mb=...)``); None: the engine's default,
    half the cgroup's limit."""
    prefetch_depth: int = 8
    prefetch_mb: int = 64
    batch_rows: int = 1024


READ_CPU_US_PER_ROW = 0.35
"""CPU microseconds a row of the reader's own work (the payload it builds around the wait), as
``intune bench fidelity`` reads it live (0.3-0.5 us a row on two machines)."""
READ_WORKER_MB = 0.0
"""A reader thread's memory beyond the chunk in its hands, which the simulator adds itself
(``bench fidelity`` reads 0.07 MB live, the chunk)."""
UDF_WORKER_MB = 20.0
"""A UDF process worker's private memory (``bench fidelity``: 19.5-22 MB live on two machines)."""
UDF_US_PER_LOOP = 0.135
"""CPU microseconds per loop of ``hash_features`` on the development machine: the live search's
one-UDF-worker allocations run at 12.3-13.3k rows/s with that worker busy (``benchmarks/tune.md``:
read 4 / udf 1 on 2 CPUs, read 2 / udf 1 on 1 CPU), ~80 us a row at the default 600 loops."""


def simulated_spec(workload: Workload = Workload(), name: str = "tune-live"):
    """This pipeline as a simulator spec (``intune.sim.WorkloadSpec``), with the knobs the engine gives
    it: the source and the shuffle and prefetch stages keep one worker (their worker knobs are capped
    at 1, as the engine's source is and the others have none), the reader waits ``io_ms`` a chunk in
    thread workers, the UDF computes in process workers, shuffle and prefetch have buffer knobs.

    Why: ``intune bench agent`` runs policies on it on small machines, the live benchmark's regime, so
    that a loss seen live (the agent holding read 1 / udf 1 on 2 CPUs) is also seen where every policy
    is scored against the exact optimum. A copy of the shape with the reader's CPU and the workers'
    memory as ``intune bench fidelity`` reads them live: its optimum on 2 CPUs is read 2 / udf 2 at
    20.7k rows/s, where the live search's best was 21-25k rows/s at read 2-4 / udf 2-3."""
    from intune.sim import spec_from_dict

    row_bytes = 4 * workload.payload_floats + 16  # payload, row id, hash
    mb_default = {"shuffle": workload.shuffle_mb, "prefetch": workload.prefetch_mb}
    mb_min = {"shuffle": workload.shuffle_min_mb, "prefetch": 1}

    def buffered(stage: str) -> dict[str, Any]:
        return {"buffer": {"min": mb_min[stage], "max": 65536, "default": mb_default[stage]}}

    return spec_from_dict(
        {
            "name": name,
            "description": "intune bench tune's pipeline: ids -> read (I/O) -> shuffle -> udf (CPU) -> prefetch",
            "batch_size": workload.batch_rows,
            "chunk_rows": workload.chunk_rows,
            "bytes_per_row": row_bytes,
            "machine": {"cpus": 2, "memory_limit_gb": 24, "host_memory_gb": 24, "base_memory_gb": 0.5,
                        "cpu_ghz": 2.5, "mem_bandwidth_gbs": 20, "restart_delay_s": 30,
                        "oversubscription_cost": 0.1},
            "consumer": {"model_latency_s": 0.0},
            "stages": [
                {"name": "ids", "kind": "read", "mode": "thread", "cpu_us_per_row": 0.5, "max_workers": 1,
                 "worker_mb": 1},
                {"name": "read", "kind": "map", "mode": "thread", "cpu_us_per_row": READ_CPU_US_PER_ROW,
                 "io_us_per_row": workload.io_ms * 1e3 / workload.chunk_rows, "cpu_cv": 0.2, "worker_mb": READ_WORKER_MB},
                {"name": "shuffle", "kind": "shuffle", "mode": "thread", "cpu_us_per_row": 1.0,
                 "max_workers": 1, "worker_mb": 1, **buffered("shuffle")},
                {"name": "udf", "kind": "udf", "mode": "process", "cpu_us_per_row": UDF_US_PER_LOOP * workload.udf_loops,
                 "cpu_cv": 0.1, "worker_mb": UDF_WORKER_MB},
                {"name": "prefetch", "kind": "prefetch", "mode": "thread", "cpu_us_per_row": 1.0,
                 "max_workers": 1, "worker_mb": 1, **buffered("prefetch")},
            ],
        },
        source=f"intune.bench.tune_workload.simulated_spec({name!r})",
    )


class RowSource:
    """Callable source of ``row_id`` chunks (cheap to make) that stops cleanly on request.

    ``stop()`` ends the epoch after the chunk in hand, so everything produced can then be drained
    and counted: ``produced`` is the number of rows handed to the pipeline.
    """

    def __init__(self, chunk_rows: int, max_chunks: int = 1 << 40) -> None:
        self.chunk_rows = chunk_rows
        self.max_chunks = max_chunks
        self.produced = 0
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def __call__(self) -> Iterator[dict[str, np.ndarray]]:
        for index in range(self.max_chunks):
            if self._stop.is_set():
                return
            lo = index * self.chunk_rows
            self.produced = lo + self.chunk_rows
            yield {ROW_ID: np.arange(lo, lo + self.chunk_rows, dtype=np.int64)}


def read_from_storage(
    chunk: dict[str, np.ndarray], io_ms: float, payload_floats: int
) -> dict[str, np.ndarray]:
    """The I/O-waiting reader: wait ``io_ms`` as a storage read would (releasing the GIL), add the payload."""
    time.sleep(io_ms / 1e3)
    ids = chunk[ROW_ID]
    payload = np.empty((len(ids), payload_floats), dtype=np.float32)
    payload[:] = (ids % 1000).astype(np.float32)[:, None]
    return {ROW_ID: ids, PAYLOAD: payload}


def hash_features(chunk: dict[str, np.ndarray], loops: int) -> dict[str, np.ndarray]:
    """The CPU-heavy UDF: a pure-Python hash of every row id, ``loops`` rounds per row (GIL-bound)."""
    out = []
    for rid in chunk[ROW_ID].tolist():
        h = rid
        for _ in range(loops):
            h = (h * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(h)
    return {**chunk, "hashed": np.asarray(out, dtype=np.int64)}


def build_pipeline(workload: Workload, source: RowSource) -> Pipeline:
    """ids -> read (thread, sleeps) -> shuffle -> udf (process, pure Python) -> batch -> prefetch."""
    reader = functools.partial(
        read_from_storage, io_ms=workload.io_ms, payload_floats=workload.payload_floats
    )
    udf = functools.partial(hash_features, loops=workload.udf_loops)
    return (
        Pipeline.from_iterable(source, name="ids", deterministic=False, max_mb=workload.max_mb)
        .map(reader, name="read", mode="thread")
        .shuffle(
            buffer_rows=workload.shuffle_rows,
            seed=0,
            buffer_mb=workload.shuffle_mb,
            min_buffer_mb=workload.shuffle_min_mb,
        )
        .map(udf, name="udf", mode="process")
        .batch(workload.batch_rows)
        .prefetch(depth=workload.prefetch_depth, buffer_mb=workload.prefetch_mb)
    )


# -- counting what the consumer receives ----------------------------------------------------------


class RowCounter:
    """How many times each row id was delivered; grows as ids grow."""

    def __init__(self) -> None:
        self.counts = np.zeros(1 << 16, dtype=np.int32)
        self.rows = 0

    def add(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        if ids.min() < 0:
            raise ValueError(f"negative row id {int(ids.min())} delivered")
        top = int(ids.max()) + 1
        if top > len(self.counts):
            grown = np.zeros(max(top, 2 * len(self.counts)), dtype=np.int32)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        np.add.at(self.counts, ids, 1)
        self.rows += int(ids.size)

    def check(self, produced: int) -> dict[str, int]:
        """Against ids ``0..produced-1``: how many were missing, repeated, or never produced."""
        counts = self.counts
        head = (
            counts[:produced]
            if produced <= len(counts)
            else np.concatenate([counts, np.zeros(produced - len(counts), dtype=np.int32)])
        )
        return {
            "produced": int(produced),
            "delivered": int(self.rows),
            "missing": int(np.count_nonzero(head == 0)),
            "repeated": int(np.count_nonzero(head > 1)),
            "unexpected": int(counts[produced:].sum()) if produced < len(counts) else 0,
        }


@dataclass
class Arrivals:
    """When rows reached the consumer: (seconds since start, rows) per batch."""

    start: float = field(default_factory=time.monotonic)
    times: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)

    def record(self, rows: int) -> None:
        self.times.append(time.monotonic() - self.start)
        self.rows.append(rows)

    def rate(self, t0: float, t1: float) -> float:
        """Mean rows/s over ``[t0, t1)``."""
        if t1 <= t0:
            return 0.0
        t = np.asarray(self.times)
        r = np.asarray(self.rows)
        return float(r[(t >= t0) & (t < t1)].sum() / (t1 - t0))

    def timeline(self, end_s: float, bin_s: float = 1.0) -> np.ndarray:
        """Rows/s in consecutive bins of ``bin_s`` from 0 to ``end_s``."""
        bins = max(1, int(np.ceil(end_s / bin_s)))
        hist, _ = np.histogram(self.times, bins=bins, range=(0.0, bins * bin_s), weights=self.rows)
        return hist / bin_s


def consume(
    batches: Iterator[Mapping[str, np.ndarray]],
    seconds: float,
    counter: RowCounter | None,
    arrivals: Arrivals,
    on_tick: Callable[[float], None] | None = None,
) -> None:
    """Pull batches until ``seconds`` after ``arrivals.start`` (or the epoch ends), counting row ids.

    ``on_tick(elapsed)`` runs between batches (a phase change of the CPU-resize benchmark).
    """
    for batch in batches:
        ids = batch[ROW_ID]
        if counter is not None:
            counter.add(ids)
        arrivals.record(len(ids))
        elapsed = time.monotonic() - arrivals.start
        if on_tick is not None:
            on_tick(elapsed)
        if elapsed >= seconds:
            return


def first_sustained(
    rates: Sequence[float], threshold: float, window: int, start: int = 0, bin_s: float = 1.0
) -> float | None:
    """Seconds after bin ``start`` from which the mean rate over the next ``window`` bins is >= ``threshold``.

    ``None`` if it never is (a window must fit wholly after ``start``).
    """
    values = np.asarray(rates, dtype=float)
    window = max(1, window)
    for i in range(start, len(values) - window + 1):
        if values[i : i + window].mean() >= threshold:
            return (i - start) * bin_s
    return None


# -- the exhaustive search ------------------------------------------------------------------------


def allocations(grid: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """Every combination of the grid's values, knob by knob, in grid order."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(grid[n] for n in names))]


@dataclass(frozen=True)
class SearchResult:
    """The best allocation and every measurement (allocation, rows/s) the search made."""

    best: dict[str, int]
    best_rows_per_s: float
    measured: list[tuple[dict[str, int], float]]

    def best_within(self, cpu_cap: int) -> tuple[dict[str, int], float]:
        """The best allocation whose workers sum to at most ``cpu_cap`` (what the runner's clamp allows)."""
        fits = [(a, r) for a, r in self.measured if sum(a.values()) <= cpu_cap]
        if not fits:
            return {}, 0.0
        return max(fits, key=lambda ar: ar[1])


def exhaustive_search(
    grid: Mapping[str, Sequence[int]], measure: Callable[[dict[str, int]], float], rotate: int = 0
) -> SearchResult:
    """Measure every allocation of ``grid`` with ``measure`` (rows/s) and keep the best.

    The allocations are measured in grid order rotated by ``rotate`` places, so that repeated searches
    start at different allocations and a slow or fast spell of a shared machine does not always fall
    on the same ones; ``measured`` lists them in grid order."""
    grid_order = allocations(grid)
    if not grid_order:
        raise ValueError("exhaustive search: the grid is empty")
    shift = rotate % len(grid_order)
    rates = {i: float(measure(grid_order[i])) for i in [*range(shift, len(grid_order)), *range(shift)]}
    measured = [(alloc, rates[i]) for i, alloc in enumerate(grid_order)]
    best, rate = max(measured, key=lambda ar: ar[1])
    return SearchResult(best=best, best_rows_per_s=rate, measured=measured)


def median_search(searches: Sequence[SearchResult]) -> SearchResult:
    """Repeated searches of one grid as one: each allocation at its median rate; the best is the
    highest median.

    Why: on a shared machine one short measurement of an allocation varies by a fifth with the spell it
    ran in, so the highest of many single measurements is the luckiest, not the best: a reference no
    allocation sustains. The median of each allocation over interleaved repeats is what it sustains."""
    if not searches:
        raise ValueError("median_search: no searches")
    first = [alloc for alloc, _ in searches[0].measured]
    for s in searches[1:]:
        if [alloc for alloc, _ in s.measured] != first:
            raise ValueError("median_search: the searches measured different grids")
    measured = [
        (alloc, float(np.median([s.measured[i][1] for s in searches]))) for i, alloc in enumerate(first)
    ]
    best, rate = max(measured, key=lambda ar: ar[1])
    return SearchResult(best=best, best_rows_per_s=rate, measured=measured)


def live_measure(
    pipe: Pipeline, batches: Iterator[Mapping[str, Any]], warmup_s: float, measure_s: float
) -> Callable[[dict[str, int]], float]:
    """A ``measure`` for ``exhaustive_search`` on a running pipeline: set the knobs live, let the
    pipeline settle for ``warmup_s``, then count rows at the consumer for ``measure_s``."""

    def measure(alloc: dict[str, int]) -> float:
        for name, value in alloc.items():
            pipe.knobs[name].set(value)
        consume(batches, warmup_s, None, Arrivals())
        arrivals = Arrivals()
        consume(batches, measure_s, None, arrivals)
        return sum(arrivals.rows) / arrivals.times[-1] if arrivals.times else 0.0

    return measure


def drain(batches: Iterable[Mapping[str, np.ndarray]], counter: RowCounter) -> None:
    """Count every batch left in the epoch (after the source was stopped)."""
    for batch in batches:
        counter.add(batch[ROW_ID])


# -- one policy, live -------------------------------------------------------------------------------


@dataclass
class LiveRun:
    """What one policy's run left: arrivals, the exactly-once check, the tuner's history and costs."""

    policy: str
    arrivals: Arrivals
    check: dict[str, int]
    history: list[dict[str, Any]]
    events: list[dict[str, Any]]
    failures: dict[str, int]
    tuner_stats: dict[str, float] = field(default_factory=dict)  # ``Tuner.overhead()``: decision time, CPU


def run_policy(
    policy: str,
    workload: Workload,
    seconds: float,
    tick_s: float,
    phases: Sequence[tuple[float, int]] = (),
    history_path: str | None = None,
) -> LiveRun:
    """Run ``policy`` from the even split for ``seconds``; ``phases`` = (start_s, cpus) CPU changes.

    ``history_path`` gets the tuner's history rewritten every tick, so a run that gets killed (an
    OOM) still shows what the policy did.
    """
    from intune import monitor
    from intune.policies import even_split
    from intune.tuner import tune

    source = RowSource(workload.chunk_rows)
    pipe = build_pipeline(workload, source)
    for name, value in even_split(pipe.knobs, monitor.available_cpus()).items():
        pipe.knobs[name].set(value)
    counter, arrivals, events = RowCounter(), Arrivals(), []
    restriction = CpuRestriction()
    pending = sorted(phases)

    def on_tick(elapsed: float) -> None:
        while pending and elapsed >= pending[0][0]:
            _, cpus = pending.pop(0)
            restriction.limit(cpus)
            events.append(
                {
                    "time_s": time.monotonic() - arrivals.start,
                    "cpus": cpus,
                    "monitor_cpus": monitor.available_cpus(),
                }
            )

    try:
        tuner = tune(pipe, policy=policy, tick_s=tick_s)
    except BaseException:  # e.g. a policy whose weights are missing: do not leave the pipeline behind
        pipe.close()
        raise
    done = threading.Event()
    if history_path is not None:

        def keep_saving() -> None:
            while not done.wait(tick_s):
                tuner.save(history_path)

        threading.Thread(target=keep_saving, name="intune-bench-history", daemon=True).start()
    try:
        batches = iter(tuner)
        arrivals.start = time.monotonic()
        consume(batches, seconds, counter, arrivals, on_tick)
        source.stop()
        tuner.stop()
        drain(batches, counter)
    finally:
        done.set()
        tuner.close()
        if phases:
            restriction.restore()
    return LiveRun(
        policy, arrivals, counter.check(source.produced), tuner.history(), events, tuner.failures, tuner.overhead()
    )


def search_best(
    workload: Workload,
    grid: Mapping[str, Sequence[int]],
    warmup_s: float,
    measure_s: float,
    cpus: int | None = None,
    rotate: int = 0,
) -> SearchResult:
    """The exhaustive search on a live pipeline, optionally restricted to ``cpus`` CPUs, its order
    rotated by ``rotate`` (``exhaustive_search``)."""
    restriction = CpuRestriction()
    if cpus is not None:
        restriction.limit(cpus)
    source = RowSource(workload.chunk_rows)
    pipe = build_pipeline(workload, source)
    try:
        batches = iter(pipe)
        return exhaustive_search(grid, live_measure(pipe, batches, warmup_s, measure_s), rotate)
    finally:
        source.stop()
        pipe.close()
        if cpus is not None:
            restriction.restore()


def grid_cpu_budget(workload: Workload, grid: Mapping[str, Sequence[int]], cpus: float) -> int:
    """How many workers the grid's knobs may hold together under the runner's clamp
    (``clamp_request``: the ``cpu`` knobs sum to at most ``max(int(cpus), sum of their minimums)``),
    after the ``cpu`` knobs outside the grid (the id source's fixed worker) take their minimum."""
    pipe = build_pipeline(workload, RowSource(workload.chunk_rows))
    try:
        cpu_knobs = [k for k in pipe.knobs.values() if k.unit == "cpu"]
        cap = max(int(cpus), sum(k.min for k in cpu_knobs))
        return cap - sum(k.min for k in cpu_knobs if k.name not in grid)
    finally:
        pipe.close()
