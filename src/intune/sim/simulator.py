"""The simulator: a pipeline on a machine, stepped one tick at a time, seen through Observations.

Owns the state that changes over ticks (knob values, buffered bytes, the OOM/restart clock, drift and
noise streams) and turns the pure model of ``intune.sim.model`` into the same
``intune.monitor.observation.Observation`` the live tuner produces, with measurement noise. Knobs are real
``intune.knobs.Knob`` objects: setting one changes the simulated allocation from the next tick on.
It must not choose allocations (policies do) nor search for the optimum beyond delegating to
``intune.sim.oracle``.

A busy worker's wall time is its CPU time, its wait for a CPU (``cpu_wait_s_per_item``, what the engine
reads as the run-queue delay: where the runnable workers outnumber the CPUs each gets a share of one)
and its own wait (I/O, and a lock its stage's workers share: ``contention``).

Irregular stages (a spec stage with ``cost_tail`` or ``size_cv``) are sampled item by item: each tick,
every such stage works through its own sequence of items (a tail stage: per-item cost multipliers of
mean 1 and cv ``cpu_cv``; a size stage: the sizes of one stream that every size stage shares, so the
rows that are big in one are big in all) with the time its model rate gives it this tick plus what it
carried over; the rows that reach the consumer are the fewest any stage finished, so the realised
throughput is bursty, and each stage's observed per-item costs are the mean over the items it actually
finished this tick. The model, the oracle and ``last_model_throughput`` keep the mean costs.

A stage with a remote pool (spec field ``remote``, ``intune.sim.remote``) gets the knob
``<stage>.remote_workers`` (unit ``cpu``, min 0): its remote workers add to the stage's capacity and
take rows before the local workers do; the Observation carries ``remote_cpus`` (the live nodes' CPUs)
and the stage's ``remote_workers``, ``remote_items_per_s``, ``transfer_s_per_item`` and
``transfer_bytes_per_item``. The stage's ``cpu_s_per_item`` and ``wall_s_per_item`` are its local
workers' CPU and busy time per emitted chunk (remote chunks included, as the live counters divide),
``busy`` its local workers' share. Node losses happen at the ticks the spec gives (or through
``lose_nodes``). Without a remote pool nothing of this runs, and every number is what it was.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from intune.knobs import Knob
from intune.monitor.observation import Observation, StageObservation, cpu_slack, observed_kind
from intune.sim import model
from intune.sim.remote import RemotePool, remote_pool_of
from intune.sim.schedule import CpuSchedule, constant_schedule
from intune.sim.spec import WorkloadSpec, load_workload, workload_variant

_BLOCK = 512  # ticks of drift and noise drawn at once
_FILL_EVERY = 4  # ticks between recomputations of the queues' steady fill (drift moves it slowly)
_ITEM_BLOCK = 4096  # items of an irregular stage's sequence drawn at once


def item_cost_multipliers(rng: np.random.Generator, kind: str, cv: float, n: int) -> np.ndarray:
    """``n`` per-item cost multipliers of mean 1 and coefficient of variation ``cv`` (a ``cost_tail``).

    ``lognormal``: ``exp(sigma * Z - sigma^2 / 2)`` with ``sigma^2 = ln(1 + cv^2)`` (median
    ``1 / sqrt(1 + cv^2)``); ``pareto``: type I with ``alpha = 1 + sqrt(1 + 1 / cv^2)`` (so
    ``cv^2 = 1 / (alpha (alpha - 2))``) and scale ``(alpha - 1) / alpha`` (the smallest item).
    """
    if cv <= 0:
        return np.ones(n)
    if kind == "lognormal":
        s2 = math.log1p(cv * cv)
        return np.exp(math.sqrt(s2) * rng.standard_normal(n) - 0.5 * s2)
    if kind == "pareto":
        alpha = 1.0 + math.sqrt(1.0 + 1.0 / (cv * cv))
        return (alpha - 1.0) / alpha * (1.0 + rng.pareto(alpha, n))
    raise ValueError(f"unknown cost tail {kind!r}; kinds are lognormal, pareto")


class _IrregularItems:
    """The item-level sampling of a spec's irregular stages (``cost_tail`` and ``size_cv``), tick by tick.

    Stage ``i`` works in units of ``unit_rows[i]`` rows (its items for a tail stage; chunks of
    ``chunk_rows`` rows for a size stage, whose stream all size stages share). A tick gives it
    ``rate_i * dt / unit_rows`` mean-cost units of time plus its credit: the partial progress on the
    item in hand, or, when it was not the slowest, the work it got ahead of the flow, at most what its
    output queue holds and one tick of its rate (so a bursty stage's own buffer smooths its bursts, and
    slow drift does not bank work for minutes). It can finish the items whose time multipliers fit; the
    flow is the fewest rows any stage (or the regular bound) allows; each stage then takes that many
    rows of items off its sequence, and their mean multipliers are what the tick observes.
    """

    def __init__(self, spec: WorkloadSpec, params: model.ModelParams, seed: int) -> None:
        n = params.n_stages
        self.tail = [i for i, s in enumerate(spec.stages) if s.cost_tail is not None]
        self.size = [i for i, s in enumerate(spec.stages) if s.size_cv > 0]
        self.regular = np.array([i not in self.tail and i not in self.size for i in range(n)])
        self.kinds = {i: spec.stages[i].cost_tail.kind for i in self.tail}
        self.cvs = {i: spec.stages[i].cpu_cv for i in self.tail}
        self.sigma2 = {i: math.log1p(spec.stages[i].size_cv ** 2) for i in self.size}
        self.unit_rows = params.rows_per_item.copy()
        self.unit_rows[self.size] = float(spec.chunk_rows)
        self.reset(seed, restart_streams=True)

    def reset(self, seed: int | None, restart_streams: bool = False) -> None:
        """Empty pipeline; with ``seed``, the item streams restart from it (a stream of their own, so the
        noise streams draw what they drew without irregular stages)."""
        if seed is not None or restart_streams:
            self._rng = np.random.default_rng(None if seed is None else [int(seed), 16])
            self._seq: dict[int, np.ndarray] = {}  # stage (or -1: the shared size stream) -> items ahead
            self._pos: dict[int, int] = {}
        self.lost()

    def lost(self) -> None:
        """The job restarted: no partial progress, no work ahead."""
        self.credit = np.zeros(len(self.unit_rows))
        self.acc = np.zeros(len(self.unit_rows))

    def _window(self, key: int, k: int) -> np.ndarray:
        """The next ``k`` raw draws of stream ``key`` (multipliers of a tail stage; normals for sizes)."""
        seq, pos = self._seq.get(key), self._pos.get(key, 0)
        if seq is None or pos + k > len(seq):
            m = max(_ITEM_BLOCK, k)
            new = (
                self._rng.standard_normal(m)
                if key < 0
                else item_cost_multipliers(self._rng, self.kinds[key], self.cvs[key], m)
            )
            seq = new if seq is None else np.concatenate((seq[pos:], new))
            self._seq[key], self._pos[key] = seq, 0
            pos = 0
        return seq[pos : pos + k]

    def _multipliers(self, i: int, k: int, cpu_frac: float) -> tuple[np.ndarray, np.ndarray]:
        """Time and CPU multipliers of stage ``i``'s next ``k`` items (a tail scales CPU, not I/O)."""
        if i in self.sigma2:
            s2 = self.sigma2[i]
            size = np.exp(math.sqrt(s2) * self._window(-1, k) - 0.5 * s2)
            return size, size
        x = self._window(i, k)
        return 1.0 + cpu_frac * (x - 1.0), x

    def tick(
        self, bound_rows: float, rates: np.ndarray, dt: float, cpu_frac: np.ndarray, hold_rows: np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """One tick: rows delivered (at most ``bound_rows``, what the regular stages, the CPUs and the
        consumer allow), and per stage the mean time, CPU and bytes multipliers of the items finished.

        ``cpu_frac``: the CPU share of each stage's time per row (a tail scales only that part);
        ``hold_rows``: rows of work each stage may bank ahead of the flow."""
        n = len(rates)
        ones = np.ones(n)
        m_time, m_cpu, m_bytes = ones.copy(), ones.copy(), ones.copy()
        flow = bound_rows
        fit: dict[int, tuple[float, int, np.ndarray, np.ndarray]] = {}
        for i in self.tail + self.size:
            budget = float(rates[i]) * dt / self.unit_rows[i] + self.credit[i]
            k = int(2.0 * budget) + 16
            while True:
                t_mult, c_mult = self._multipliers(i, k, float(cpu_frac[i]))
                done = np.cumsum(t_mult)
                if done[-1] > budget:
                    break
                k *= 2
            ncap = int(np.searchsorted(done, budget, side="right"))
            fit[i] = (budget, ncap, done, c_mult)
            flow = min(flow, ncap * self.unit_rows[i])
        shared: int | None = None
        for i in self.tail + self.size:
            budget, ncap, done, c_mult = fit[i]
            if i in self.sigma2 and shared is not None:  # the shared stream: the first size stage took
                taken = shared
            else:
                self.acc[i] += flow / self.unit_rows[i]
                most = min(fit[j][1] for j in self.size) if i in self.sigma2 else ncap
                taken = min(int(self.acc[i]), most)
                self.acc[i] -= taken
                shared = taken if i in self.sigma2 else shared
            used = float(done[taken - 1]) if taken > 0 else 0.0
            left = budget - used
            self.credit[i] = left if taken >= ncap else min(left, hold_rows[i] / self.unit_rows[i])
            if taken > 0:
                m_time[i] = used / taken
                m_cpu[i] = float(c_mult[:taken].mean())
            else:  # nothing finished: the item in hand is what the stage spends its time on
                m_time[i] = float(done[0])
                m_cpu[i] = float(c_mult[0])
            if i in self.sigma2:
                m_bytes[i] = m_cpu[i]
            if i not in self.sigma2 or i == self.size[-1]:
                key = i if i not in self.sigma2 else -1
                self._pos[key] += taken
        return flow, m_time, m_cpu, m_bytes


WORKER_READING_NOISE = 0.05
"""Relative standard deviation of a reading of one worker's memory (live: a child's private pages move
as it allocates and frees between chunks)."""


class Simulator:
    """A simulated pipeline. ``reset()`` then ``step()`` every tick; knobs in ``self.knobs``.

    - ``cpus``: an int, a ``CpuSchedule`` (e.g. ``paper_schedule(...)``) or None for the spec's CPUs.
    - ``memory_limit_gb`` / ``model_latency_s``: override the spec's (None keeps the spec's).
    - ``noise``: relative standard deviation of the measurement noise on observed rates and costs
      (and of the realised throughput around the model's).
    - ``buffer_fill_rate``: share of the gap to its steady fill that a buffer closes per second; a
      buffer never fills or drains faster than the pipeline's rows/s times its bytes per row.
    """

    def __init__(
        self,
        spec: WorkloadSpec | str | Path,
        cpus: int | CpuSchedule | None = None,
        memory_limit_gb: float | None = None,
        seed: int = 0,
        dt_s: float = 1.0,
        model_latency_s: float | None = None,
        noise: float = 0.02,
        buffer_fill_rate: float = 0.3,
    ) -> None:
        if not isinstance(spec, WorkloadSpec):
            spec = load_workload(spec)
        if memory_limit_gb is not None or model_latency_s is not None:
            spec = workload_variant(
                spec, name=spec.name, memory_limit_gb=memory_limit_gb, model_latency_s=model_latency_s
            )
        if dt_s <= 0:
            raise ValueError(f"dt_s must be > 0, got {dt_s}")
        self.spec = spec
        self.params = model.params_from_spec(spec)
        if cpus is None:
            cpus = spec.machine.cpus
        self.schedule = cpus if isinstance(cpus, CpuSchedule) else constant_schedule(int(cpus))
        self.dt_s = float(dt_s)
        self.noise = float(noise)
        self.seed = seed
        self._alpha = 1.0 - math.exp(-buffer_fill_rate * self.dt_s)
        self._restart_ticks = int(math.ceil(spec.machine.restart_delay_s / self.dt_s))
        stall = spec.consumer
        self._stall_every = int(round(stall.stall_every_s / self.dt_s)) if stall.stall_every_s > 0 else 0
        self._stall_ticks = int(math.ceil(stall.stall_s / self.dt_s)) if self._stall_every else 0
        self._bytes_per_row = self.params.bytes_per_item / self.params.rows_per_item
        self._rng = np.random.default_rng(seed)
        self._remote_rng = np.random.default_rng([int(seed), 17])
        self._reading_rng = np.random.default_rng([int(seed), 18])
        n = self.params.n_stages
        self._workers = np.ones(n)
        self._buffer_mb = np.array([s.buffer.default if s.buffer else 0 for s in spec.stages], dtype=float)
        self.knobs: dict[str, Knob] = {}
        self.remote_pool: RemotePool | None = remote_pool_of(spec, self.params.rows_per_item, self.params.bytes_per_item)
        pool = self.remote_pool
        for i, s in enumerate(spec.stages):
            self.knobs[f"{s.name}.workers"] = Knob(
                f"{s.name}.workers",
                "cpu",
                1,
                s.max_workers,
                get=lambda i=i: int(self._workers[i]),
                set=lambda v, i=i: self._set_workers(i, v),
            )
            if pool is not None and pool.stage == i:
                self.knobs[f"{s.name}.remote_workers"] = Knob(
                    f"{s.name}.remote_workers",
                    "cpu",
                    0,
                    pool.spec.cpus,
                    get=lambda: int(pool.workers),
                    set=self._set_remote_workers,
                )
            if s.buffer is not None:
                self.knobs[f"{s.name}.buffer_mb"] = Knob(
                    f"{s.name}.buffer_mb",
                    "mb",
                    s.buffer.min,
                    s.buffer.max,
                    get=lambda i=i: int(self._buffer_mb[i]),
                    set=lambda v, i=i: self._set_buffer(i, v),
                )
        self._stage_names = [s.name for s in spec.stages]
        self._kinds = [observed_kind(s.kind) for s in spec.stages]
        self._modes = [s.mode for s in spec.stages]
        self._demand = self.params.demand
        self._ghz = spec.machine.cpu_ghz
        self._bw = spec.machine.mem_bandwidth_gbs
        self._phases = np.zeros(n)
        self._gil_stages = bool((self.params.gil_fraction > 0).any())
        gil = self.params.gil_fraction
        self._inv_gil = np.where(gil > 0, 1.0 / np.where(gil > 0, gil, 1.0), np.inf)
        irregular = any(s.cost_tail is not None or s.size_cv > 0 for s in spec.stages)
        self._irregular = _IrregularItems(spec, self.params, seed) if irregular else None
        self.reset()

    def _busy_caps(self, rows: np.ndarray, c: np.ndarray, io: np.ndarray) -> tuple[np.ndarray, float]:
        """Each stage's rows/s if its workers were busy all the time, on saturated CPUs where each
        stage's local workers process ``rows`` rows/s (a remote pool's rows are not theirs).

        A busy worker (in its function, as the engine counts it) either runs, waits for I/O or waits for
        a CPU; every runnable worker gets the same share ``s`` of a CPU. The share is the one at which
        the stage that needs the most CPU for its workers is busy all the time (rows (c/s + io) = its
        effective workers), so its workers read busy 1.0 as the engine's do, and the others less.
        Returns the caps and the share."""
        room = np.maximum(self._eff - rows * io, 1e-12)
        share = min(1.0, float(np.max(rows * c / room)))
        if share <= 0.0:  # nothing flows (or nothing costs CPU): no worker is busy, at any share
            share = 1.0
        caps = self._eff / (c / share + io)
        return (self._gil_cap(caps, c, share) if self._gil_stages else caps), share

    def _gil_cap(self, caps: np.ndarray, c: np.ndarray, share: float) -> np.ndarray:
        """A GIL-bound thread stage makes at most ``share / (gil * c)`` rows/s (model.stage_capacity)."""
        return np.minimum(caps, share * self._inv_gil / c)

    # ---------------------------------------------------------------------------------------- knobs
    def _set_workers(self, i: int, v: int) -> None:
        self._workers[i] = v
        self._alloc_changed = True

    def _set_remote_workers(self, v: int) -> None:
        """As many remote workers as asked, or as the live nodes hold: the knob reads what runs."""
        assert self.remote_pool is not None
        self.remote_pool.set_workers(v)

    def _set_buffer(self, i: int, v: int) -> None:
        self._buffer_mb[i] = v
        self._alloc_changed = True

    def allocation(self) -> dict[str, int]:
        """Current knob values by knob name."""
        return {name: k.value for name, k in self.knobs.items()}

    def _arrays(self, alloc: dict[str, int] | None) -> tuple[np.ndarray, np.ndarray]:
        w, b = self._workers.copy(), self._buffer_mb.copy()
        for name, value in (alloc or {}).items():
            if name not in self.knobs:
                raise ValueError(f"unknown knob {name!r}; knobs are {sorted(self.knobs)}")
            if self.knobs[name].remote:
                continue  # ``_remote_rows``
            stage, setting = name.rsplit(".", 1)
            (w if setting == "workers" else b)[self._stage_names.index(stage)] = value
        return w, b

    def _remote_rows(self, alloc: dict[str, int] | None, mult: np.ndarray) -> np.ndarray | None:
        """Each stage's remote capacity in rows/s with ``alloc``'s remote workers (missing: those
        running), at the drift multipliers ``mult``; None without a remote pool."""
        pool = self.remote_pool
        if pool is None:
            return None
        workers = pool.workers
        for name, value in (alloc or {}).items():
            if name in self.knobs and self.knobs[name].remote:
                workers = min(int(value), pool.cpus)
        return self.remote_capacity(workers, mult)

    def remote_capacity(self, workers: int, mult: np.ndarray | None = None) -> np.ndarray:
        """Each stage's remote capacity in rows/s with ``workers`` remote workers on the live nodes, at
        the drift multipliers ``mult`` (default: now). Needs a remote pool."""
        pool = self.remote_pool
        if pool is None:
            raise ValueError(f"{self.spec.name}: no stage has a remote pool")
        mult = self.cpu_multipliers() if mult is None else mult
        i = pool.stage
        out = np.zeros(self.params.n_stages)
        out[i] = pool.capacity_rows(workers, float(self.params.cpu_s_per_row[i] * mult[i]), float(self.params.io_s_per_row[i]))
        return out

    def lose_nodes(self, nodes: int) -> int:
        """Lose ``nodes`` live nodes of the remote pool now (the first ones, with their workers); returns
        the workers lost. The spec's ``node_loss`` does this at its ticks."""
        if self.remote_pool is None:
            raise ValueError(f"{self.spec.name}: no stage has a remote pool")
        return self.remote_pool.lose_nodes(nodes)

    def set_model_latency(self, seconds: float) -> None:
        """The trainer's step time from the next tick on (its demand is ``batch_size / seconds`` rows/s;
        0: unbounded): a trainer that speeds up or slows down mid-run."""
        if seconds < 0:
            raise ValueError(f"model latency must be >= 0 s, got {seconds}")
        self.spec = workload_variant(self.spec, name=self.spec.name, model_latency_s=float(seconds))
        self.params = dataclasses.replace(self.params, model_latency_s=float(seconds))
        self._demand = self.params.demand
        self._fill_due = 0

    # ---------------------------------------------------------------------------------------- state
    @property
    def tick(self) -> int:
        return self._tick

    @property
    def cpus(self) -> int:
        return self.schedule.cpus_at(self._tick)

    @property
    def memory_limit_bytes(self) -> float:
        return self.params.limit_bytes

    def reset(self, seed: int | None = None) -> Observation:
        """Back to tick 0 with the spec's default knob values and empty buffers; returns tick 0's observation.

        With ``seed``, the random streams restart from it; without, they continue (a new episode).
        """
        if seed is not None:
            self.seed = seed
            self._rng = np.random.default_rng(seed)
            self._remote_rng = np.random.default_rng([int(seed), 17])
            self._reading_rng = np.random.default_rng([int(seed), 18])
        if self._irregular is not None:
            self._irregular.reset(seed)
        if self.remote_pool is not None:
            self.remote_pool.reset()
        self._workers[:] = 1
        self._buffer_mb[:] = [s.buffer.default if s.buffer else 0 for s in self.spec.stages]
        self._buffered = np.zeros(self.params.n_stages)
        self._phases = self._rng.uniform(0.0, 2.0 * np.pi, self.params.n_stages)
        self._tick = 0
        self._down_until = 0
        self._alloc_changed = True
        self._fill_due, self._fill_cpus = 0, -1
        self.ooms = 0
        self._block_start = -_BLOCK  # forces a draw
        return self._advance(0)

    def step(self) -> Observation:
        """Advance one tick with the current knob values."""
        self._tick += 1
        return self._advance(self._tick)

    def cpu_multipliers(self, tick: int | None = None) -> np.ndarray:
        """Each stage's drift multiplier of its CPU cost at ``tick`` (default: now)."""
        t = self._tick if tick is None else tick
        p = self.params
        return 1.0 + p.drift_amplitude * np.sin(2.0 * np.pi * t * self.dt_s / p.drift_period_s + self._phases)

    def _draw(self, tick: int) -> None:
        self._block_start = tick
        ticks = np.arange(tick, tick + _BLOCK)[:, None]
        p = self.params
        self._mult_block = 1.0 + p.drift_amplitude * np.sin(
            2.0 * np.pi * ticks * self.dt_s / p.drift_period_s + self._phases
        )
        self._noise_block = 1.0 + self.noise * self._rng.standard_normal((_BLOCK, 2 + 3 * p.n_stages))
        np.maximum(self._noise_block, 0.0, out=self._noise_block)

    # ------------------------------------------------------------------------------------ the model
    def true_throughput(self, alloc: dict[str, int] | None = None, cpus: int | None = None) -> float:
        """Noise-free steady-state rows/s of ``alloc`` (knob name -> value; missing knobs keep their
        current values) on ``cpus`` (default: now), at the current drift."""
        w, b = self._arrays(alloc)
        mult = self.cpu_multipliers()
        return model.throughput(
            self.params, w, b, self.cpus if cpus is None else cpus, mult, self._remote_rows(alloc, mult)
        )

    def held_cpus(self, alloc: dict[str, int] | None = None) -> float:
        """CPUs the local workers of ``alloc`` (missing knobs: current values) want when busy
        (``model.compute_workers``): a worker waiting on I/O wants little, one that computes a whole CPU,
        whether or not its stage gains from it."""
        w, _ = self._arrays(alloc)
        return model.compute_workers(self.params, w)

    def worst_case_memory(self, alloc: dict[str, int] | None = None) -> float:
        w, b = self._arrays(alloc)
        return model.worst_case_memory(self.params, w, b)

    def optimum(self, cpus: int | None = None, objective: str = "reward") -> tuple[dict[str, int], float]:
        """The oracle's best allocation on ``cpus`` (default: now) at the current drift, and its rows/s;
        ``objective`` as in ``intune.sim.oracle.search_optimum`` (the reward's, or the most rows/s)."""
        from intune.sim.oracle import search_optimum

        return search_optimum(self, self.cpus if cpus is None else cpus, objective)

    # ------------------------------------------------------------------------------------------ tick
    def _advance(self, t: int) -> Observation:
        if t - self._block_start >= _BLOCK or t < self._block_start:
            self._draw(t)
        row = t - self._block_start
        cpus = self.schedule.cpus_at(t)
        p = self.params
        pool = self.remote_pool
        if pool is not None and pool.losses_at(t):
            pool.lose_nodes(pool.losses_at(t))
        if t < self._down_until:
            return self._down_observation(t, cpus)
        mult = self._mult_block[row]
        z = self._noise_block[row]
        w = self._workers
        if self._alloc_changed:  # what depends only on the knobs: once per change, not per tick
            self._factor = model.buffer_factor(p, self._buffer_mb)
            self._cap_bytes = np.maximum(model.buffer_capacity_bytes(p, self._buffer_mb), 1.0)  # 0 MB allowed
            self._cap_items = (self._cap_bytes / p.bytes_per_item).tolist()
            self._fill_due = 0  # recompute the queues' steady fill now
            self._eff = model.effective_workers(w, p.contention)
            self._switching_w = model.switching_workers(p, w)
            self._static_mem = p.base_bytes + float(p.fixed_bytes.sum()) + float(np.dot(w, p.worker_bytes))
            self._w_list = w.astype(int).tolist()
            self._b_list = self._buffer_mb.astype(int).tolist()
            self._alloc_changed = False
        c = p.cpu_s_per_row * mult
        cpu_share = 1.0  # of a CPU, what a runnable worker gets (the rest of its CPU part it waits in the run queue)
        caps = self._eff / (c + p.io_s_per_row)
        if self._gil_stages:
            caps = self._gil_cap(caps, c, 1.0)
        rates = caps * self._factor
        if pool is not None:  # remote capacity beside the local workers (module docstring)
            r_i = pool.stage
            compute_s = pool.chunk_compute_s(float(c[r_i]), float(p.io_s_per_row[r_i]))
            remote = np.zeros(p.n_stages)
            remote[r_i] = pool.capacity_items(pool.workers, compute_s) * pool.rows_per_item
            rates = rates + remote
        t_stage = float(rates.min())
        eta = model.cpu_efficiency(self._switching_w, cpus, p.oversubscription_cost)
        cpu_per_row = float(c.sum())
        if pool is None:
            t_cpu = eta * cpus / cpu_per_row
        else:
            t_cpu = model.cpu_limited_rate(c, eta * cpus, remote)
        T = min(t_stage, t_cpu)
        if self._demand > 0:
            T = min(T, self._demand)
        if t_cpu < t_stage:  # CPU-bound: every worker gets a fair share of the CPUs
            share = cpu_share = t_cpu / t_stage
            caps = self._eff / (c / share + p.io_s_per_row)
            if self._gil_stages:
                caps = self._gil_cap(caps, c, share)
            rates = caps * self._factor
            if pool is not None:
                rates = rates + remote
        stalled = self._stall_every and t % self._stall_every >= self._stall_every - self._stall_ticks
        if stalled:  # the trainer takes nothing: the pipeline fills its buffers at its own rate
            room = self._cap_bytes - self._buffered
            self._buffered += np.minimum(room, T * self.dt_s * self._bytes_per_row)
        else:  # toward the steady fill, but no faster than the pipeline moves bytes
            if self._fill_due <= t or cpus != self._fill_cpus:  # targets move slowly: every few ticks
                self._fill = model.queue_fill_target(rates, self._demand, self._cap_items)
                self._fill_due, self._fill_cpus = t + _FILL_EVERY, cpus
            fill = self._fill
            step = self._alpha * (fill * self._cap_bytes - self._buffered)
            limit = T * self.dt_s * self._bytes_per_row
            self._buffered += np.clip(step, -limit, limit)
        mem = self._static_mem + float(self._buffered.sum())
        if stalled:
            T = 0.0
        self.last_model_throughput = T = float(T)
        if pool is None:
            self.last_cpu_used = min(float(cpus), T * cpu_per_row / eta)
        else:
            self.last_cpu_used = min(float(cpus), model.local_cpu_need(c, T, remote) / eta)
        if mem > p.limit_bytes:
            return self._oom(t, cpus, mem)
        self.last_memory_bytes = mem
        irregular = self._irregular is not None and T > 0
        if irregular:  # what the items in hand this tick allow, and what they cost
            share = t_cpu / t_stage if t_cpu < t_stage else 1.0
            regular = self._irregular.regular
            bound = min(t_cpu, self._demand if self._demand > 0 else math.inf)
            if regular.any():
                bound = min(bound, float(rates[regular].min()))
            hold = np.minimum(np.asarray(self._cap_items) * p.rows_per_item, rates * self.dt_s)
            flow, m_time, m_cpu, m_bytes = self._irregular.tick(
                bound * self.dt_s, rates, self.dt_s, c / (c + p.io_s_per_row * share), hold
            )
            flow /= self.dt_s
            realised = float(flow * z[0])
            busy = np.minimum(1.0, flow * m_time / caps)
        else:
            realised = float(T * z[0])
            if t_cpu < t_stage and T >= t_cpu:  # as the engine counts it: a worker waiting for a CPU is busy
                rows = np.full(p.n_stages, T)  # (not where the trainer takes less than the CPUs make)
                if pool is not None:
                    rows[pool.stage] = max(0.0, T - float(remote[pool.stage]))
                caps, cpu_share = self._busy_caps(rows, c, p.io_s_per_row)
            busy = np.minimum(1.0, T / caps)
        idle = 1.0 - busy
        queue_fill = np.minimum(self._buffered / self._cap_bytes, 1.0)  # a buffer just shrunk holds more until it drains
        upstream_empty = np.empty_like(queue_fill)
        upstream_empty[0] = 0.0
        upstream_empty[1:] = 1.0 - queue_fill[:-1]
        block_w = queue_fill / np.maximum(queue_fill + upstream_empty, 1e-12)
        n = p.n_stages
        rpi = p.rows_per_item
        items = realised / rpi * z[2 : 2 + n]
        cpu_item = c * rpi / eta * z[2 + n : 2 + 2 * n]
        wall_item = w * rpi / caps * z[2 + 2 * n :]
        # of the wall time, the CPU part's stretch past the CPU time: runnable, no CPU running it
        queued_item = c * rpi * max(0.0, 1.0 / cpu_share - 1.0 / eta) * z[2 + 2 * n :]
        bytes_item = p.bytes_per_item
        if irregular:
            cpu_item = cpu_item * m_cpu
            wall_item = wall_item * m_time
            queued_item = queued_item * m_time
            bytes_item = bytes_item * m_bytes
        cpu_item = np.minimum(cpu_item, wall_item)  # one worker never spends more CPU than its busy time
        queued_item = np.minimum(queued_item, wall_item - cpu_item)
        if pool is not None:  # the stage's local workers take the rows its remote workers leave
            taken = min(T, float(remote[r_i]))
            local = (T - taken) / T if T > 0 else 1.0
            cpu_item[r_i] *= local
            wall_item[r_i] *= local
            queued_item[r_i] *= local
            busy[r_i] = min(1.0, (T - taken) / caps[r_i])
            idle = 1.0 - busy
        readings = self._worker_readings()
        stages = tuple(
            map(
                StageObservation,
                self._stage_names,
                self._w_list,
                self._b_list,
                items.tolist(),
                (items * rpi).tolist(),
                cpu_item.tolist(),
                wall_item.tolist(),
                bytes_item.tolist(),
                busy.tolist(),
                (idle * (1.0 - block_w)).tolist(),
                (idle * block_w).tolist(),
                queue_fill.tolist(),
                self._buffered.tolist(),
                [False] * n,
                self._kinds,
                self._modes,
                [0] * n,
                [0.0] * n,
                [0.0] * n,
                [0.0] * n,
                readings,
                queued_item.tolist(),
            )
        )
        if pool is not None:
            stages = self._with_remote(stages, taken / rpi[r_i], compute_s)
        return Observation(
            tick=t,
            dt_s=self.dt_s,
            throughput=realised,
            step_time_s=p.model_latency_s,
            cpus=float(cpus),
            memory_used_bytes=float(mem * z[1]),
            memory_limit_bytes=p.limit_bytes,
            stages=stages,
            cpu_ghz=self._ghz,
            mem_bandwidth_gbs=self._bw,
            oom=False,
            demand=self._demand,
            host_memory_free_bytes=p.host_bytes - mem,
            cpu_slack=cpu_slack(stages),
            remote_cpus=float(pool.cpus) if pool is not None else 0.0,
        )

    def _worker_readings(self) -> list[float]:
        """What the engine would measure of one worker's memory per stage (``StageObservation.worker_bytes``):
        the model's figure with a reading's noise (``WORKER_READING_NOISE``, a stream of its own so that
        the other streams draw what they drew without it); 0 where the engine measures nothing (an
        inline stage, or no worker)."""
        noise = 1.0 + WORKER_READING_NOISE * self._reading_rng.standard_normal(self.params.n_stages)
        return [float(b * max(z, 0.0)) if w > 0 and mode != "inline" else 0.0
                for b, z, w, mode in zip(self.params.worker_bytes.tolist(), noise.tolist(), self._w_list, self._modes,
                                         strict=True)]

    def _with_remote(
        self, stages: tuple[StageObservation, ...], remote_items: float, compute_s: float | None
    ) -> tuple[StageObservation, ...]:
        """The stages with the remote stage's remote fields filled: its workers, the chunks they
        delivered (with measurement noise from a stream of its own, so the other streams draw what they
        drew without a pool), their transit time and bytes."""
        pool = self.remote_pool
        assert pool is not None
        i = pool.stage
        noise = max(0.0, 1.0 + self.noise * float(self._remote_rng.standard_normal())) if remote_items > 0 else 1.0
        transfer = pool.transfer_s(remote_items, compute_s) if compute_s is not None else 0.0
        out = list(stages)
        out[i] = dataclasses.replace(
            stages[i],
            remote_workers=int(pool.workers),
            remote_items_per_s=remote_items * noise,
            transfer_s_per_item=transfer,
            transfer_bytes_per_item=pool.bytes_per_item if pool.workers > 0 else 0.0,
        )
        return tuple(out)

    def _oom(self, t: int, cpus: int, mem: float) -> Observation:
        """The job is killed: zero throughput now and for the restart delay; buffers are lost."""
        self.ooms += 1
        self._down_until = t + 1 + self._restart_ticks
        self._buffered[:] = 0.0
        if self._irregular is not None:
            self._irregular.lost()
        self.last_model_throughput = 0.0
        self.last_cpu_used = 0.0
        self.last_memory_bytes = mem
        return self._idle_observation(t, cpus, mem, oom=True)

    def _down_observation(self, t: int, cpus: int) -> Observation:
        self.last_model_throughput = 0.0
        self.last_cpu_used = 0.0
        self.last_memory_bytes = self.params.base_bytes
        return self._idle_observation(t, cpus, self.params.base_bytes, oom=False)

    def _idle_observation(self, t: int, cpus: int, mem: float, oom: bool) -> Observation:
        p = self.params
        stages = tuple(
            StageObservation(name, int(w), int(b), 0.0, 0.0, 0.0, 0.0, float(bpi), 0.0, 0.0, 0.0, 0.0, 0.0, kind=kind, mode=mode,
                             cpu_wait_s_per_item=0.0)
            for name, w, b, bpi, kind, mode in zip(
                self._stage_names, self._workers, self._buffer_mb, p.bytes_per_item, self._kinds, self._modes, strict=True
            )
        )
        pool = self.remote_pool
        if pool is not None:
            stages = self._with_remote(stages, 0.0, None)
        return Observation(
            tick=t,
            dt_s=self.dt_s,
            throughput=0.0,
            step_time_s=p.model_latency_s,
            cpus=float(cpus),
            memory_used_bytes=mem,
            memory_limit_bytes=p.limit_bytes,
            stages=stages,
            cpu_ghz=self._ghz,
            mem_bandwidth_gbs=self._bw,
            oom=oom,
            demand=self._demand,
            host_memory_free_bytes=p.host_bytes - mem,
            remote_cpus=float(pool.cpus) if pool is not None else 0.0,
        )
