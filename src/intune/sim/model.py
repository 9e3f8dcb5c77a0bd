"""The throughput and memory model of a pipeline: pure, vectorised numpy functions of an allocation.

Owns the formulas that the simulator steps through and the oracle searches over:

- stage i has CPU seconds per row ``c_i`` (times its drift multiplier), I/O seconds per row ``o_i``;
  ``w`` workers act like ``eff(w) = w / (1 + contention * (w - 1))`` workers, so its capacity is
  ``cap_i = eff(w_i) / (c_i + o_i)`` rows/s (I/O is hidden by more workers and burns no CPU);
- a GIL-bound thread stage holds the GIL ``gil * c_i`` seconds per row, one thread at a time:
  ``cap_i <= 1 / (gil * c_i)`` (a pure-Python thread stage gains nothing past one CPU);
- its output buffer of ``n_i`` items absorbs the variance of its per-item cost:
  ``rate_i = cap_i * (1 - v_i / (1 + n_i))`` with ``v_i = min(0.9, cv_i**2 / 2)`` (a deeper buffer
  absorbs more, and a steady stage loses nothing);
- the CPUs bound the pipeline: ``T <= eta * C / sum_i c_i`` with the oversubscription efficiency
  ``eta = 1 / (1 + k * max(0, W / C - 1))`` when the switching workers ``W = sum_i s_i * a_i(w_i)``
  outnumber the ``C`` CPUs: ``a_i(w) = w * c_i / (c_i + o_i)`` are the workers that want a CPU (a worker
  waiting on I/O wants none, nor a thread waiting for the GIL: a GIL-bound stage's ``g_i`` share counts
  at most one worker, ``stage_compute_workers``; the drift-free costs are used, so ``W`` is a property of
  the allocation), each weighing ``s_i``: 1 for a process worker, the machine's ``thread_switch_share``
  for a thread (a switch between threads of one process keeps its address space and caches; live, 32
  threads of a stage on 2 CPUs deliver 0.92-1.04x what 2 do, ``bench fidelity``'s surplus threads);
- ``T = min(min_i rate_i, eta * C / sum_i c_i, demand)`` where demand is the consumer's rows/s
  (``batch_size / model_latency``; unbounded when the model latency is 0).

A stage with a remote pool (``intune.sim.remote``) has remote capacity ``R_i`` rows/s beside its local
workers: its rate is ``cap_i * (1 - v_i / (1 + n_i)) + R_i`` (remote results wait in the cluster's
object store, not in the stage's output buffer, so that buffer's variance loss is the local workers').
Remote workers are served first (their CPUs are not this machine's), so they take ``min(T, R_i)`` of the
stage's rows and the local CPUs need
``T * sum_j c_j - sum_i c_i * min(T, R_i)`` CPU seconds a second; the CPU bound is the ``T`` at which
that need is ``eta * C`` (``cpu_limited_rate``). Remote workers are not in ``W``. Without a remote pool
every formula above is computed as written there, to the last bit.

Memory: ``base + sum fixed_i + sum w_i * (worker_mb_i + inflight_i * bytes_per_item_i) + buffered``,
where buffered bytes are at most each stage's buffer capacity (all full: the worst case).

Every function is monotone in the way the oracle's proof needs: stage rates grow with workers and
buffer MB, memory grows with both, and the CPU bound does not depend on the allocation while the
workers fit in the CPUs. It must not hold state, draw noise or know about ticks: that is the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from intune.sim.spec import WorkloadSpec
from intune.units import GB, MB

DEFAULT_WORKER_MB = {"thread": 8.0, "process": 120.0}


@dataclass(frozen=True)
class ModelParams:
    """The spec as arrays (one entry per stage), at the machine's GHz, before drift."""

    names: tuple[str, ...]
    cpu_s_per_row: np.ndarray
    io_s_per_row: np.ndarray
    contention: np.ndarray
    gil_fraction: np.ndarray  # 0 for process stages
    variance_loss: np.ndarray  # v_i
    rows_per_item: np.ndarray
    bytes_per_item: np.ndarray
    worker_bytes: np.ndarray  # per worker: its own memory plus the items it holds
    fixed_bytes: np.ndarray
    queue_items: np.ndarray  # depth of a stage's output queue when it has no buffer knob
    has_buffer: np.ndarray  # bool
    drift_amplitude: np.ndarray
    drift_period_s: np.ndarray
    base_bytes: float
    limit_bytes: float
    host_bytes: float
    oversubscription_cost: float
    switch_weight: np.ndarray  # per worker in the oversubscription count: 1 a process, ``thread_switch_share`` a thread
    batch_size: int
    model_latency_s: float

    @property
    def n_stages(self) -> int:
        return len(self.names)

    @property
    def demand(self) -> float:
        """Rows/s the consumer takes; 0 means unbounded (model latency 0)."""
        return self.batch_size / self.model_latency_s if self.model_latency_s > 0 else 0.0


def params_from_spec(spec: WorkloadSpec) -> ModelParams:
    m = spec.machine
    ghz_scale = (spec.reference_ghz or m.cpu_ghz) / m.cpu_ghz
    rpi = np.array(spec.rows_per_item(), dtype=float)
    bpr = np.array(
        [s.bytes_per_row if s.bytes_per_row is not None else spec.bytes_per_row for s in spec.stages]
    )
    copy_us = np.array([s.copies for s in spec.stages]) * bpr / (m.mem_bandwidth_gbs * 1e3)  # us per row
    cpu_us = (
        np.array([s.cpu_us_per_row for s in spec.stages])
        + np.array([s.item_overhead_us for s in spec.stages]) / rpi
    )
    worker_mb = np.array(
        [s.worker_mb if s.worker_mb is not None else DEFAULT_WORKER_MB[s.mode] for s in spec.stages]
    )
    bpi = bpr * rpi
    return ModelParams(
        names=spec.stage_names,
        cpu_s_per_row=(cpu_us * ghz_scale + copy_us) * 1e-6,
        io_s_per_row=np.array([s.io_us_per_row for s in spec.stages]) * 1e-6,
        contention=np.array([s.contention for s in spec.stages], dtype=float),
        gil_fraction=np.array(
            [s.gil_fraction if s.mode == "thread" else 0.0 for s in spec.stages], dtype=float
        ),
        variance_loss=np.minimum(0.9, 0.5 * np.array([s.cpu_cv for s in spec.stages], dtype=float) ** 2),
        rows_per_item=rpi,
        bytes_per_item=bpi,
        worker_bytes=worker_mb * MB + np.array([s.inflight_items for s in spec.stages]) * bpi,
        fixed_bytes=np.array([s.fixed_mb for s in spec.stages], dtype=float) * MB,
        queue_items=np.array([s.queue_items for s in spec.stages], dtype=float),
        has_buffer=np.array([s.buffer is not None for s in spec.stages]),
        drift_amplitude=np.array([s.drift.amplitude for s in spec.stages], dtype=float),
        drift_period_s=np.array([s.drift.period_s for s in spec.stages], dtype=float),
        base_bytes=float(m.base_memory_gb * GB),
        limit_bytes=float(m.memory_limit_gb * GB),
        host_bytes=float(m.host_memory_gb * GB),
        oversubscription_cost=m.oversubscription_cost,
        switch_weight=np.array([1.0 if s.mode == "process" else m.thread_switch_share for s in spec.stages]),
        batch_size=spec.batch_size,
        model_latency_s=spec.consumer.model_latency_s,
    )


# ------------------------------------------------------------------------------------------ throughput


def effective_workers(workers: np.ndarray, contention: np.ndarray) -> np.ndarray:
    """The scaling curve: ``w / (1 + contention * (w - 1))`` (1 worker is 1; the limit is 1/contention)."""
    w = np.asarray(workers, dtype=float)
    return w / (1.0 + contention * np.maximum(w - 1.0, 0.0))


def stage_capacity(
    p: ModelParams, workers: np.ndarray, cpu_mult: np.ndarray | float = 1.0, cpu_share: float = 1.0
) -> np.ndarray:
    """Rows/s each stage can process with ``workers``, each worker getting ``cpu_share`` of a CPU."""
    c = p.cpu_s_per_row * cpu_mult
    cap = effective_workers(workers, p.contention) / (c / cpu_share + p.io_s_per_row)
    gil = p.gil_fraction * c
    return np.where(gil > 0, np.minimum(cap, cpu_share / np.where(gil > 0, gil, 1.0)), cap)


def buffer_items(p: ModelParams, buffer_mb: np.ndarray) -> np.ndarray:
    """Items each stage's output buffer holds: its knob's MB / item bytes, else its fixed queue depth."""
    return np.where(p.has_buffer, np.asarray(buffer_mb, dtype=float) * MB / p.bytes_per_item, p.queue_items)


def buffer_factor(p: ModelParams, buffer_mb: np.ndarray) -> np.ndarray:
    """Share of capacity kept despite cost variance: ``1 - v / (1 + n)``."""
    return 1.0 - p.variance_loss / (1.0 + buffer_items(p, buffer_mb))


def stage_rates(
    p: ModelParams, workers: np.ndarray, buffer_mb: np.ndarray, cpu_mult: np.ndarray | float = 1.0
) -> np.ndarray:
    """Rows/s each stage sustains: capacity times the buffer factor."""
    return stage_capacity(p, workers, cpu_mult) * buffer_factor(p, buffer_mb)


def cpu_efficiency(total_workers: float, cpus: float, cost: float) -> float:
    """``1 / (1 + cost * max(0, W / C - 1))``: context switches when the switching workers ``W``
    (``switching_workers``) outnumber the CPUs."""
    return 1.0 / (1.0 + cost * max(0.0, total_workers / cpus - 1.0))


def _wanting_cpu(workers, c, o, g):
    """Elementwise: of ``workers`` with CPU ``c`` and I/O ``o`` seconds a row and GIL share ``g``, those
    that want a CPU when busy: ``w a (1 - g) + min(w a g, 1)`` with ``a = c / (c + o)`` (``w a`` where
    ``g`` is 0)."""
    busy = workers * (c / np.maximum(c + o, 1e-300))
    return busy * (1.0 - g) + np.minimum(busy * g, 1.0)


def stage_compute_workers(p: ModelParams, i: int, workers) -> np.ndarray:
    """Workers of stage ``i`` (a count or an array of counts) that want a CPU when busy: ``w * a_i`` with
    ``a_i = c_i / (c_i + o_i)`` (a worker waiting on I/O wants none). Of a GIL-bound thread stage's, those
    computing outside the GIL and at most one holding it, ``w a_i (1 - g_i) + min(w a_i g_i, 1)``: a
    thread waiting for the GIL sleeps on a lock, out of the run queue (live, eight pure-Python threads on
    one CPU deliver within a tenth of one thread's rate). The GIL is the stage's own, as in
    ``stage_capacity``."""
    return _wanting_cpu(np.asarray(workers, dtype=float), p.cpu_s_per_row[i], p.io_s_per_row[i], p.gil_fraction[i])


def compute_workers(p: ModelParams, workers) -> float:
    """Workers that want a CPU when busy, over the stages (``stage_compute_workers``): the CPUs they hold."""
    w = np.asarray(workers, dtype=float)
    return float(np.sum(_wanting_cpu(w, p.cpu_s_per_row, p.io_s_per_row, p.gil_fraction)))


def stage_switching_workers(p: ModelParams, i: int, workers) -> np.ndarray:
    """Stage ``i``'s weight in the oversubscription count at ``workers`` (a count or an array of counts):
    its compute-wanting workers (``stage_compute_workers``) times its mode's ``switch_weight``."""
    return stage_compute_workers(p, i, workers) * p.switch_weight[i]


def switching_workers(p: ModelParams, workers) -> float:
    """The oversubscription count ``W`` over the stages (``stage_switching_workers``)."""
    w = np.asarray(workers, dtype=float)
    return float(np.sum(_wanting_cpu(w, p.cpu_s_per_row, p.io_s_per_row, p.gil_fraction) * p.switch_weight))


def cpu_bound(p: ModelParams, workers, cpus: float, cpu_mult: np.ndarray | float = 1.0) -> float:
    """Rows/s the CPUs allow: ``eta * C / sum_i c_i``."""
    per_row = float(np.sum(p.cpu_s_per_row * cpu_mult))
    eta = cpu_efficiency(switching_workers(p, workers), cpus, p.oversubscription_cost)
    return eta * cpus / per_row if per_row > 0 else float("inf")


def throughput(
    p: ModelParams,
    workers,
    buffer_mb,
    cpus: float,
    cpu_mult: np.ndarray | float = 1.0,
    remote_rows: np.ndarray | None = None,
) -> float:
    """Steady-state rows/s delivered to the consumer: ``min(min_i rate_i, CPU bound, demand)``;
    ``remote_rows``: each stage's remote capacity in rows/s (None: no remote pool)."""
    w = np.asarray(workers, dtype=float)
    if remote_rows is None:
        t = min(float(np.min(stage_rates(p, w, buffer_mb, cpu_mult))), cpu_bound(p, w, cpus, cpu_mult))
    else:
        rates = stage_rates(p, w, buffer_mb, cpu_mult) + remote_rows
        eta = cpu_efficiency(switching_workers(p, w), cpus, p.oversubscription_cost)
        c = np.broadcast_to(p.cpu_s_per_row * cpu_mult, (p.n_stages,))
        t = min(float(np.min(rates)), cpu_limited_rate(c, eta * cpus, remote_rows))
    return min(t, p.demand) if p.demand > 0 else t


def local_cpu_need(c: np.ndarray, rows_per_s: float, remote_rows: np.ndarray) -> float:
    """Local CPU seconds a second at ``rows_per_s`` when remote workers take up to ``remote_rows[i]`` of
    stage ``i``'s rows (they are served first): ``T * sum c - sum_i c_i * min(T, R_i)``; ``c``: CPU
    seconds per row per stage (drift included)."""
    return float(rows_per_s * np.sum(c) - np.dot(c, np.minimum(rows_per_s, remote_rows)))


def cpu_limited_rate(c: np.ndarray, cpu_s: float, remote_rows: np.ndarray) -> float:
    """The rows/s whose local CPU need (``local_cpu_need``) is ``cpu_s``: the CPU bound with a remote pool.

    The need is piecewise linear and increasing in ``T``: below a stage's ``R_i`` its rows cost no local
    CPU, above it they do, so the slope grows by ``c_i`` at each ``R_i``. Infinite where every stage's
    rows can go remote at any rate (slope 0)."""
    if cpu_s <= 0:
        return 0.0
    order = sorted((float(r), float(ci)) for r, ci in zip(remote_rows, c, strict=True) if r > 0)
    slope = float(np.sum(c)) - sum(ci for _, ci in order)  # local CPU per row while every pool keeps up
    at, need = 0.0, 0.0
    for r, ci in order:
        reach = need + slope * (r - at)
        if reach >= cpu_s:
            break
        at, need, slope = r, reach, slope + ci
    return at + (cpu_s - need) / slope if slope > 0 else math.inf


def mm1k_occupancy(rho: float, k: float) -> float:
    """Mean items in an M/M/1/K queue with load ``rho`` = arrival rate / service rate and room ``k``.

    ``sum n rho^n / sum rho^n`` over ``n = 0..k``: ``rho / (1 - rho) - (k + 1) rho^(k+1) / (1 - rho^(k+1))``
    for ``rho < 1``, ``k - occupancy(1 / rho)`` for ``rho > 1`` (the same queue seen from the other end),
    ``k / 2`` at ``rho = 1``. Plain floats: it runs per stage per tick, where numpy's call overhead dominates.
    """
    if rho > 1.0:
        return k - mm1k_occupancy(1.0 / rho, k)
    if abs(1.0 - rho) < 1e-9:
        return k / 2.0
    if rho <= 0.0:
        return 0.0
    tail = math.exp((k + 1.0) * math.log(rho))  # rho ** (k + 1), underflowing quietly to 0
    return min(k, max(0.0, rho / (1.0 - rho) - (k + 1.0) * tail / (1.0 - tail)))


def queue_fill_target(
    rates: np.ndarray, demand: float, capacity_items: np.ndarray | float = 2.0
) -> np.ndarray:
    """Steady fill (share of capacity) of each stage's output queue.

    The queue after stage ``i`` is fed at ``up = min(rates[:i+1])`` and drained at
    ``down = min(rates[i+1:], demand)`` (an unbounded consumer drains the last one at once); its mean
    occupancy is the M/M/1/K one with ``rho = up / down`` and ``K = capacity_items``: nearly full when
    everything upstream outpaces everything downstream, half full when they match, a few items when the
    downstream is faster (however big the buffer).
    """
    r = rates.tolist()
    n = len(r)
    if isinstance(capacity_items, (int, float)):
        ks = [float(capacity_items)] * n
    else:
        ks = capacity_items.tolist() if isinstance(capacity_items, np.ndarray) else list(capacity_items)
    down = [0.0] * n
    low = demand if demand > 0 else math.inf
    for i in range(n - 1, -1, -1):
        down[i] = low
        low = min(low, r[i])
    fill = [0.0] * n
    up = math.inf
    for i in range(n):
        up = min(up, r[i])
        k = max(ks[i], 1.0)
        fill[i] = 0.0 if math.isinf(down[i]) else mm1k_occupancy(up / down[i], k) / k
    return np.array(fill)


# ---------------------------------------------------------------------------------------------- memory


def buffer_capacity_bytes(p: ModelParams, buffer_mb: np.ndarray) -> np.ndarray:
    """Bytes each stage's output buffer can hold."""
    return np.where(p.has_buffer, np.asarray(buffer_mb, dtype=float) * MB, p.queue_items * p.bytes_per_item)


def memory_bytes(p: ModelParams, workers, buffered_bytes) -> float:
    """Memory in use: base + fixed + per-worker memory and in-flight items + buffered bytes."""
    w = np.asarray(workers, dtype=float)
    return float(p.base_bytes + p.fixed_bytes.sum() + np.dot(w, p.worker_bytes) + np.sum(buffered_bytes))


def worst_case_memory(p: ModelParams, workers, buffer_mb) -> float:
    """Memory with every buffer full: what an allocation must fit in to never OOM."""
    return memory_bytes(p, workers, buffer_capacity_bytes(p, buffer_mb))
