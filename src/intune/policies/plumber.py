"""``plumber``: Plumber's resource allocation (Kuchnik et al., MLSys 2022), the paper's baseline 4.

Method:

1. Profile: for ``profile_ticks`` ticks at the start the pipeline runs as it is, and Plumber records
   each stage's elements, CPU seconds and busy wall seconds (``cpu_s_per_item``, ``wall_s_per_item``:
   one worker's time per element). Visit ratios (elements of stage ``i`` per element leaving the
   pipeline) turn them into seconds per delivered element: ``cpu_i`` (CPU) and ``wall_i`` (worker time).
2. Source I/O: a stage whose CPU share ``cpu_i / wall_i`` is at most ``IO_BOUND_SHARE`` of the largest
   stage's share spends most of its busy time waiting (on storage, as Plumber's traced sources do; a
   re-solve also sees a UDF that waits on a shared service), so CPU time would overstate its rate. Its rate per worker is its measured I/O rate,
   ``1 / wall_i`` (an I/O-bound source's throughput grows with its parallelism), and each worker costs
   only ``cpu_i / wall_i`` of a core. Every other stage runs at ``1 / cpu_i`` per core (Plumber's CPU-time
   rate: waits on the GIL or descheduling cost nothing). Call that per-worker time ``t_i``. The share is
   relative because a profile on saturated CPUs lowers every stage's share alike.
3. LP (``scipy.optimize.linprog``): maximise ``theta`` (elements/s delivered) subject to
   ``theta * t_i <= workers_i`` (parallelism), ``sum_i theta * cpu_i <= C`` (Plumber's CPU constraint,
   ``C = obs.cpus``), ``sum_i workers_i <= W`` (the runner's budget, ``cpu_budget``: the CPUs plus
   the CPU that waiting workers measurably leave unused, what ``clamp_request`` grants every policy;
   ``W = C`` in the simulator) and
   ``min_i <= workers_i <= max_i``; a sequential stage has ``max_i = 1``. That maximises the slowest
   stage's rate; an I/O-bound source gets the parallelism that matches the rate the CPU-bound stages
   sustain. Where ``W = C`` the worker budget implies the CPU constraint (``t_i >= cpu_i``).
4. Rounding: workers are floored, then the spare ones go one at a time to the current slowest stage
   (the greedy step is exact for max-min with linear rates), never exceeding ``W``; a stage that cannot
   grow ends the hand-out.
5. Prefetch: the buffer of the prefetch stage (name starting with ``prefetch``, or as given) is sized
   from the measured rate gap between the planned pipeline rate ``theta`` and the consumer's demand
   ``D`` (elements/s, from ``obs.demand`` or the step time): ``rho = D / theta``, buffer
   ``1 + ceil(rho / (1 - rho))`` elements (an M/M/1 queue's mean backlog: the closer the rates, the
   deeper the buffer) when ``rho < 1``, one element when the consumer outruns the pipeline or its demand
   is unknown (no depth helps then), capped at ``MAX_PREFETCH_ELEMENTS`` and at half the memory the
   observation says is free.

What the port cannot model: Plumber bounds the source by the disk's peak bandwidth, measured by a
storage benchmark; the observation carries no such figure, so the linear I/O rate is extrapolated from
the profiled parallelism. Readers sharing a bandwidth (per-worker rate falling as readers are added)
are seen only when a re-solve profiles the planned parallelism (``adaptive``).

Sequential rule (which stages get at most one core): a stage whose ``workers`` knob has ``max <= 1``,
or one that the profile shows does not scale: on average at least 1.5 busy workers, yet only
0.85-1.15 cores of CPU used, with wall time per element at least 0.8 x busy workers x its CPU time
(its workers take turns, as GIL-bound threads do). Its rate is ``1 / cpu_i`` (one core). An I/O-bound
stage uses well under one core and so is not taken for sequential.

``adaptive=True`` (plumber-adaptive, the paper's checkpoint and re-launch) re-solves with the latest
``profile_ticks`` ticks whenever ``obs.cpus`` changes; the non-adaptive policy keeps its first plan.

Remote workers (a map stage's ``remote_workers`` knob, ``Knob.remote``): the cluster is a second
resource in the LP (``solve_remote_lp``). ``r`` remote workers deliver at most ``r / work_r`` elements
a second of the stage's work, ``work_r`` being a remote worker's seconds per delivered element (its
call: compute and transfer); what they deliver costs no local CPU (``x`` elements/s:
``theta * sum cpu - x * cpu_s <= C``) and leaves ``(theta - x) * work_s`` to the local workers;
``r <= remote_cpus``. The objective prices a remote CPU: with a known demand, the most ``theta`` up to
the demand, then the fewest ``r`` that keep it; without one, ``theta - lambda * r`` with ``lambda`` =
``REMOTE_MIN_GAIN`` times one local worker's elements/s of that stage (``1 / work_s``): a remote CPU is
bought only while it adds that much (the shared rule, ``intune.policies.remote_sizing``). Plumber prices
what it profiled: before any remote worker ran, ``work_r = work_s`` (a local worker's; the transfer is
unknown), and once remote workers have run ``profile_ticks`` ticks it re-solves once with their
measured ``work_r`` (a remote worker held its call for the whole tick). ``plumber-adaptive`` also
re-solves when ``obs.remote_cpus`` changes (a node lost). The plan is re-asserted every tick, so the
runner's clamp after a node loss is undone wherever the live nodes have room.

It must not use anything the observation does not carry.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog

from intune.knobs import Knob
from intune.monitor.observation import Observation
from intune.policies.base import cpu_budget
from intune.policies.remote_sizing import REMOTE_MIN_GAIN
from intune.policies.stage_costs import StageProfile, io_bound, is_sequential, prefetch_elements, profile_of
from intune.policies.static import changes
from intune.units import MB

# ------------------------------------------------------------------------------- the LP and rounding


def solve_lp(
    work: Sequence[float],
    workers: float,
    lo: Sequence[float],
    hi: Sequence[float],
    cpu_work: Sequence[float] | None = None,
    cpus: float | None = None,
) -> tuple[list[float], float]:
    """The LP relaxation: fractional workers per stage and the rate ``theta`` they reach.

    ``work[i]``: worker seconds per delivered element (``theta * work[i] <= workers_i``), ``workers``: the
    budget of all ``workers_i``. With ``cpu_work`` (CPU seconds per delivered element) and ``cpus``, also
    ``theta * sum(cpu_work) <= cpus``. Returns the cheapest workers that reach the optimal ``theta``
    (``max(lo_i, theta * work_i)``), so that stages that are not bottlenecks do not soak up workers.
    Infeasible minimums (``sum(lo) > workers``) or no measured work return ``lo`` and the rate ``lo`` gives.
    """
    n = len(work)
    if sum(lo) > workers + 1e-9 or not any(w > 0 for w in work):
        return list(map(float, lo)), rate_of(lo, work)
    # variables: workers_0 .. workers_{n-1}, theta; minimise -theta
    c = np.zeros(n + 1)
    c[-1] = -1.0
    a_ub = np.zeros((n + 2, n + 1))
    for i, w in enumerate(work):
        a_ub[i, i] = -1.0
        a_ub[i, -1] = w
    a_ub[n, :n] = 1.0
    b_ub = np.zeros(n + 2)
    b_ub[n] = workers
    if cpu_work is not None and cpus is not None:
        a_ub[n + 1, -1] = float(sum(cpu_work))
        b_ub[n + 1] = cpus
    bounds = [(float(lo[i]), float(hi[i])) for i in range(n)] + [(0.0, None)]
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if not res.success:
        raise RuntimeError(
            f"plumber: the allocation LP failed ({res.message}); work={list(work)}, workers={workers}"
        )
    theta = float(res.x[-1])
    return [max(float(lo[i]), theta * work[i]) for i in range(n)], theta


@dataclass(frozen=True)
class RemotePlan:
    """The LP's remote part: fractional remote workers, the elements/s they deliver, the rate."""

    remote_workers: float
    remote_theta: float
    theta: float


def solve_remote_lp(
    work: Sequence[float],
    workers: float,
    lo: Sequence[float],
    hi: Sequence[float],
    cpu_work: Sequence[float],
    cpus: float,
    stage: int,
    work_remote: float,
    remote_cpus: float,
    demand: float = 0.0,
) -> tuple[list[float], RemotePlan]:
    """Plumber's LP with remote workers at stage ``stage`` (module docstring): fractional local workers and
    the remote plan. ``work_remote``: a remote worker's seconds per delivered element; ``demand``: the
    consumer's elements/s (0: unknown, then a remote CPU must add ``REMOTE_MIN_GAIN / work[stage]``).

    Variables ``w_0..w_{n-1}, theta, r, x``; constraints ``theta * work_j <= w_j`` (``j != stage``),
    ``(theta - x) * work_s <= w_s``, ``x * work_remote <= r``, ``x <= theta``, ``sum w <= workers``,
    ``theta * sum cpu_work - x * cpu_work[stage] <= cpus``, ``r <= remote_cpus``."""
    n = len(work)
    if sum(lo) > workers + 1e-9 or not any(w > 0 for w in work) or work[stage] <= 0:
        fractional, theta = solve_lp(work, workers, lo, hi, cpu_work, cpus)
        return fractional, RemotePlan(0.0, 0.0, theta)
    t, r, x = n, n + 1, n + 2
    a_ub = np.zeros((n + 5, n + 3))
    b_ub = np.zeros(n + 5)
    for i, w in enumerate(work):
        a_ub[i, i] = -1.0
        a_ub[i, t] = w
    a_ub[stage, x] = -work[stage]
    a_ub[n, :n] = 1.0
    b_ub[n] = workers
    a_ub[n + 1, t] = float(sum(cpu_work))
    a_ub[n + 1, x] = -float(cpu_work[stage])
    b_ub[n + 1] = cpus
    a_ub[n + 2, x] = work_remote
    a_ub[n + 2, r] = -1.0
    a_ub[n + 3, x] = 1.0
    a_ub[n + 3, t] = -1.0
    bounds = [(float(lo[i]), float(hi[i])) for i in range(n)]
    bounds += [(0.0, demand if demand > 0 else None), (0.0, max(0.0, remote_cpus)), (0.0, None)]
    a_ub, b_ub = a_ub[: n + 4], b_ub[: n + 4]

    def solve(c: np.ndarray, extra: tuple[np.ndarray, float] | None = None):
        a, b = (a_ub, b_ub) if extra is None else (np.vstack([a_ub, extra[0]]), np.append(b_ub, extra[1]))
        res = linprog(c, A_ub=a, b_ub=b, bounds=bounds, method="highs")
        if not res.success:
            raise RuntimeError(f"plumber: the remote LP failed ({res.message}); work={list(work)}, workers={workers}")
        return res.x

    c = np.zeros(n + 3)
    if demand > 0:  # the most theta up to the demand, then the fewest remote workers that keep it
        c[t] = -1.0
        best = float(solve(c)[t])
        keep = np.zeros(n + 3)
        keep[t] = -1.0
        c = np.zeros(n + 3)
        c[r] = 1.0
        c[:n] = 1e-9  # and, among those, the fewest local workers
        sol = solve(c, (keep, -best * (1.0 - 1e-9)))
    else:  # a remote CPU must add REMOTE_MIN_GAIN of one local worker's elements/s of that stage
        c[t] = -1.0
        c[r] = REMOTE_MIN_GAIN / work[stage]
        sol = solve(c)
    theta, remote_theta = float(sol[t]), float(sol[x])
    local = [max(float(lo[i]), theta * work[i]) for i in range(n)]
    local[stage] = max(float(lo[stage]), (theta - remote_theta) * work[stage])
    return local, RemotePlan(float(sol[r]), remote_theta, theta)


def rate_of(alloc: Sequence[float], work: Sequence[float]) -> float:
    """Elements/s the allocation delivers: the slowest stage's ``workers / work`` (inf if none works)."""
    rates = [a / w for a, w in zip(alloc, work, strict=True) if w > 0]
    return min(rates) if rates else math.inf


def round_allocation(
    fractional: Sequence[float], work: Sequence[float], cores: int, lo: Sequence[int], hi: Sequence[int]
) -> list[int]:
    """Integer workers: floors, then spare ones one by one to the slowest stage while it can grow."""
    alloc = [max(int(lo[i]), min(int(hi[i]), math.floor(f + 1e-9))) for i, f in enumerate(fractional)]
    while sum(alloc) < cores:
        growable = [i for i in range(len(alloc)) if work[i] > 0]
        if not growable:
            break
        slowest = min(growable, key=lambda i: alloc[i] / work[i])
        if alloc[slowest] >= hi[slowest]:
            break
        alloc[slowest] += 1
    return alloc


@dataclass
class PlumberPlan:
    """One solved plan, for inspection and reports."""

    cpus: float
    workers: dict[str, int] = field(default_factory=dict)
    fractional: dict[str, float] = field(default_factory=dict)
    sequential: list[str] = field(default_factory=list)
    io_bound: list[str] = field(default_factory=list)  # stages rated by wall time (module docstring, 2.)
    theta: float = 0.0  # planned elements/s delivered by the last stage
    remote_workers: dict[str, int] = field(default_factory=dict)
    remote_priced: str = ""  # "profiled" or "local" (a remote worker priced like a local one: none ran yet)
    prefetch_elements: int = 0
    buffer_mb: dict[str, int] = field(default_factory=dict)


class PlumberPolicy:
    """Plumber's LP allocation (see the module docstring); ``adaptive=True`` re-solves on every resize."""

    def __init__(
        self, adaptive: bool = False, profile_ticks: int = 5, prefetch_stages: Sequence[str] | None = None
    ) -> None:
        if profile_ticks < 1:
            raise ValueError(f"plumber: profile_ticks must be >= 1, got {profile_ticks}")
        self.adaptive = adaptive
        self.name = "plumber-adaptive" if adaptive else "plumber"
        self.profile_ticks = int(profile_ticks)
        self._prefetch_names = None if prefetch_stages is None else set(prefetch_stages)
        self._knobs: Mapping[str, Knob] = {}
        self.plan: PlumberPlan | None = None
        self.solves = 0

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self._knobs = knobs
        self._kinds = observation.kinds()
        self._window: deque[Observation] = deque(maxlen=self.profile_ticks)
        self._target: dict[str, int] = {}
        self._remote = [k for k in knobs.values() if k.remote]
        self._remote_cpus = observation.remote_cpus
        self._local_cost: dict[str, tuple[float, float]] = {}  # stage -> (work, cpu work) per local element
        self.plan = None
        self.solves = 0

    def _is_prefetch(self, stage: str) -> bool:
        if self._prefetch_names is not None:
            return stage in self._prefetch_names
        return self._kinds.get(stage) == "prefetch"

    def step(self, observation: Observation) -> dict[str, int]:
        obs = observation
        if not obs.oom and obs.throughput > 0:
            self._window.append(obs)
        if self.plan is None:
            if len(self._window) >= self.profile_ticks:
                self._solve(obs)
        elif self.adaptive and obs.cpus != self.plan.cpus:
            self._solve(obs)
        elif self._remote and self._resolve_remote(obs):
            self._solve(obs)
        self._remote_cpus = obs.remote_cpus
        return changes(self._knobs, self._target)

    def _resolve_remote(self, obs: Observation) -> bool:
        """Re-solve once the remote workers priced like local ones have been profiled, and (adaptive)
        when the cluster's CPUs change."""
        assert self.plan is not None
        if self.adaptive and obs.remote_cpus != self._remote_cpus:
            return True
        if self.plan.remote_priced != "local":
            return False
        return sum(1 for o in self._window if any(s.remote_items_per_s > 0 for s in o.stages)) >= self.profile_ticks

    def _profile(self) -> dict[str, StageProfile]:
        return profile_of(self._window)

    is_sequential = staticmethod(is_sequential)
    io_bound = staticmethod(io_bound)

    def _solve(self, obs: Observation) -> None:
        prof = self._profile()
        last = obs.stages[-1].name
        root_items = prof.get(last, StageProfile()).items
        if root_items <= 0:
            return
        names = [s.name for s in obs.stages if f"{s.name}.workers" in self._knobs]
        knobs = [self._knobs[f"{n}.workers"] for n in names]
        empty = StageProfile()
        cpu_work = [prof.get(n, empty).cpu_s / root_items for n in names]
        seq = [self.is_sequential(k, prof.get(n, empty)) for n, k in zip(names, knobs, strict=True)]
        waiting = self.io_bound({n: prof[n] for n in names if n in prof})
        io = [n in waiting and not s for n, s in zip(names, seq, strict=True)]
        work = [prof[n].wall_s / root_items if w else c for n, w, c in zip(names, io, cpu_work, strict=True)]
        lo = [k.min for k in knobs]
        hi = [max(k.min, 1 if s else k.max) for k, s in zip(knobs, seq, strict=True)]
        budget = max(int(cpu_budget(obs, self._knobs)), 0)  # workers the runner grants; the CPU constraint stays the CPUs
        remote = self._remote_stage(names)
        if remote is not None:  # the stage's costs per element its local workers processed
            work[remote], cpu_work[remote] = self._local_costs(names[remote], prof, work[remote], cpu_work[remote])
        if remote is None:
            fractional, _ = solve_lp(work, budget, lo, hi, cpu_work, float(obs.cpus))
            alloc = round_allocation(fractional, work, budget, lo, hi) if sum(lo) <= budget else list(lo)
            cpu_total = sum(cpu_work)
            theta = min(rate_of(alloc, work), obs.cpus / cpu_total if cpu_total > 0 else math.inf)
        else:
            fractional, alloc, theta, remote_plan = self._solve_remote(obs, prof, root_items, names, remote, work, cpu_work, budget, lo, hi)
        self.solves += 1
        plan = PlumberPlan(
            cpus=obs.cpus,
            theta=theta,
            sequential=[n for n, s in zip(names, seq, strict=True) if s],
            io_bound=[n for n, w in zip(names, io, strict=True) if w],
        )
        if remote is not None:
            plan.remote_workers, plan.remote_priced = remote_plan
            for stage, value in plan.remote_workers.items():
                self._target[f"{stage}.remote_workers"] = value
        for n, k, a, f in zip(names, knobs, alloc, fractional, strict=True):
            plan.workers[n] = k.clamp(a)
            plan.fractional[n] = f
            self._target[k.name] = k.clamp(a)
        self._plan_prefetch(obs, prof, root_items, plan)
        self.plan = plan

    def _local_costs(self, name: str, prof: dict[str, StageProfile], work: float, cpu_work: float) -> tuple[float, float]:
        """``(work, cpu work)`` per delivered element of the remote stage's local workers, from the profile's
        elements they processed (the profile divides their time by every element, remote ones included);
        where remote workers took nearly all of them, the last such profile's."""
        p = prof.get(name)
        if p is not None and p.items > 0:
            local = p.items - min(p.remote_items, p.items)
            if local >= 0.2 * p.items:
                self._local_cost[name] = (work * p.items / local, cpu_work * p.items / local)
        return self._local_cost.get(name, (work, cpu_work))

    def _remote_stage(self, names: list[str]) -> int | None:
        """Index (in ``names``) of the stage with a remote knob (the first, if several), or None."""
        for knob in self._remote:
            if knob.stage in names:
                return names.index(knob.stage)
        return None

    def _solve_remote(
        self, obs: Observation, prof: dict[str, StageProfile], root_items: float, names: list[str], stage: int,
        work: list[float], cpu_work: list[float], budget: int, lo: list[int], hi: list[int],
    ) -> tuple[list[float], list[int], float, tuple[dict[str, int], str]]:
        """The remote LP (module docstring): local workers, rounded; the rate; the remote workers."""
        name = names[stage]
        knob = self._knobs[f"{name}.remote_workers"]
        ran = [o for o in self._window if o.stage(name).remote_items_per_s > 0]
        if ran:  # a remote worker's seconds per element it delivered, times the stage's visit ratio
            held = sum(o.stage(name).remote_workers * o.dt_s for o in ran)
            done = sum(o.stage(name).remote_items_per_s * o.dt_s for o in ran)
            visits = prof[name].items / root_items
            work_remote, priced = held / done * visits, "profiled"
        else:
            work_remote, priced = work[stage], "local"
        root = obs.stages[-1]
        rows_per_item = root.rows_per_s / root.items_per_s if root.items_per_s > 0 else 0.0
        demand = obs.demand / rows_per_item if obs.demand > 0 and rows_per_item > 0 else 0.0
        cluster = float(min(knob.max, obs.remote_cpus))
        fractional, rp = solve_remote_lp(
            work, budget, lo, hi, cpu_work, float(obs.cpus), stage, work_remote, cluster, demand
        )
        local_work = list(work)  # what the local workers carry per delivered element
        if rp.theta > 0:
            local_work[stage] = work[stage] * max(0.0, 1.0 - rp.remote_theta / rp.theta)
        alloc = round_allocation(fractional, local_work, budget, lo, hi) if sum(lo) <= budget else list(lo)
        remote = knob.clamp(min(math.ceil(rp.remote_workers - 1e-6), cluster))
        cpu_total = sum(cpu_work)
        cpu_left = cpu_total - cpu_work[stage] * (rp.remote_theta / rp.theta if rp.theta > 0 else 0.0)
        theta = min(rate_of(alloc, local_work), obs.cpus / cpu_left if cpu_left > 0 else math.inf)
        return fractional, alloc, theta, ({name: remote}, priced)

    def _plan_prefetch(
        self, obs: Observation, prof: dict[str, StageProfile], root_items: float, plan: PlumberPlan
    ) -> None:
        root = obs.stages[-1]
        rows_per_item = root.rows_per_s / root.items_per_s if root.items_per_s > 0 else 0.0
        if obs.demand > 0 and rows_per_item > 0:
            demand = obs.demand / rows_per_item
        elif obs.step_time_s > 0:
            demand = 1.0 / obs.step_time_s  # one element per training step
        else:
            demand = 0.0  # unknown or unbounded: the consumer always waits
        plan.prefetch_elements = prefetch_elements(plan.theta, demand)
        free = (
            max(0.0, obs.memory_limit_bytes - obs.memory_used_bytes)
            if obs.memory_limit_bytes > 0
            else math.inf
        )
        for s in obs.stages:
            knob = self._knobs.get(f"{s.name}.buffer_mb")
            p = prof.get(s.name)
            if knob is None or not self._is_prefetch(s.name) or p is None or p.items <= 0 or p.bytes <= 0:
                continue
            size = p.bytes / p.items
            want = min(plan.prefetch_elements * size, knob.value * MB + free / 2)
            mb = knob.clamp(math.ceil(want / MB))
            plan.buffer_mb[s.name] = mb
            self._target[knob.name] = mb


__all__ = ["PlumberPlan", "PlumberPolicy", "prefetch_elements", "rate_of", "round_allocation", "solve_lp"]
