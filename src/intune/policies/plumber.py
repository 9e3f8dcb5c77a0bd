"""``plumber``: Plumber's resource allocation (Kuchnik et al., MLSys 2022), the paper's baseline 4.

Method, as the issue specifies it:

1. Profile: for ``profile_ticks`` ticks at the start the pipeline runs as it is, and Plumber records
   each stage's CPU seconds and elements. A stage's rate with one core is ``1 / cpu_s_per_item``
   (CPU time, not wall time: waits on I/O or the GIL cost nothing). Visit ratios (elements of stage
   ``i`` per element leaving the pipeline) turn that into CPU seconds per delivered element, ``work_i``.
2. LP (``scipy.optimize.linprog``): maximise ``theta`` (elements/s delivered) subject to
   ``theta * work_i <= cores_i``, ``sum(cores_i) <= C`` (``obs.cpus``), ``min_i <= cores_i <= max_i``;
   a sequential stage has ``max_i = 1``. That maximises the slowest stage's rate.
3. Rounding: cores are floored, then the spare cores go one at a time to the current slowest stage
   (the greedy step is exact for max-min with linear rates), never exceeding ``C``; a stage that cannot
   grow ends the hand-out.
4. Prefetch: the buffer of the prefetch stage (name starting with ``prefetch``, or as given) is sized
   from the measured rate gap between the planned pipeline rate ``theta`` and the consumer's demand
   ``D`` (elements/s, from ``obs.demand`` or the step time): ``rho = D / theta``, buffer
   ``1 + ceil(rho / (1 - rho))`` elements (an M/M/1 queue's mean backlog: the closer the rates, the
   deeper the buffer) when ``rho < 1``, one element when the consumer outruns the pipeline or its demand
   is unknown (no depth helps then), capped at ``MAX_PREFETCH_ELEMENTS`` and at half the memory the
   observation says is free.

Sequential rule (which stages get at most one core): a stage whose ``workers`` knob has ``max <= 1``,
or one that the profile shows does not scale: on average at least 1.5 busy workers, yet only
0.85-1.15 cores of CPU used, with wall time per element at least 0.8 x busy workers x its CPU time
(its workers take turns, as GIL-bound threads do). An I/O-bound stage uses well under one core and so
is not taken for sequential.

``adaptive=True`` (plumber-adaptive, the paper's checkpoint and re-launch) re-solves with the latest
``profile_ticks`` ticks whenever ``obs.cpus`` changes; the non-adaptive policy keeps its first plan.
It must not use wall time for rates, nor anything the observation does not carry.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog

from intune.knobs import Knob
from intune.observation import Observation
from intune.policies.base import MB
from intune.policies.static import changes, stage_role

MAX_PREFETCH_ELEMENTS = 256


# ------------------------------------------------------------------------------- the LP and rounding

def solve_lp(work: Sequence[float], cores: float, lo: Sequence[float], hi: Sequence[float]) -> tuple[list[float], float]:
    """The LP relaxation: fractional cores per stage and the rate ``theta`` they reach.

    Returns the cheapest cores that reach the optimal ``theta`` (``max(lo_i, theta * work_i)``), so that
    stages that are not bottlenecks do not soak up cores. Infeasible minimums (``sum(lo) > cores``) or no
    measured work return ``lo`` and the rate ``lo`` gives.
    """
    n = len(work)
    if sum(lo) > cores + 1e-9 or not any(w > 0 for w in work):
        return list(map(float, lo)), rate_of(lo, work)
    # variables: cores_0 .. cores_{n-1}, theta; minimise -theta
    c = np.zeros(n + 1)
    c[-1] = -1.0
    a_ub = np.zeros((n + 1, n + 1))
    for i, w in enumerate(work):
        a_ub[i, i] = -1.0
        a_ub[i, -1] = w
    a_ub[n, :n] = 1.0
    b_ub = np.zeros(n + 1)
    b_ub[n] = cores
    bounds = [(float(lo[i]), float(hi[i])) for i in range(n)] + [(0.0, None)]
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if not res.success:
        raise RuntimeError(f"plumber: the allocation LP failed ({res.message}); work={list(work)}, cores={cores}")
    theta = float(res.x[-1])
    return [max(float(lo[i]), theta * work[i]) for i in range(n)], theta


def rate_of(alloc: Sequence[float], work: Sequence[float]) -> float:
    """Elements/s the allocation delivers: the slowest stage's ``cores / work`` (inf if none works)."""
    rates = [a / w for a, w in zip(alloc, work, strict=True) if w > 0]
    return min(rates) if rates else math.inf


def round_allocation(
    fractional: Sequence[float], work: Sequence[float], cores: int, lo: Sequence[int], hi: Sequence[int]
) -> list[int]:
    """Integer cores: floors, then spare cores one by one to the slowest stage while it can grow."""
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


def prefetch_elements(theta: float, demand: float) -> int:
    """Prefetch depth from the rate gap: ``1 + ceil(rho / (1 - rho))`` with ``rho = demand / theta``."""
    if demand <= 0 or theta <= 0 or not math.isfinite(theta) or demand >= theta:
        return 1
    rho = demand / theta
    return int(min(MAX_PREFETCH_ELEMENTS, 1 + math.ceil(rho / (1.0 - rho) - 1e-9)))


# ------------------------------------------------------------------------------------- the profile

@dataclass
class _StageProfile:
    items: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    busy_workers_s: float = 0.0
    bytes: float = 0.0
    time_s: float = 0.0


@dataclass
class PlumberPlan:
    """One solved plan, for inspection and reports."""

    cpus: float
    workers: dict[str, int] = field(default_factory=dict)
    fractional: dict[str, float] = field(default_factory=dict)
    sequential: list[str] = field(default_factory=list)
    theta: float = 0.0  # planned elements/s delivered by the last stage
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
        self._window: deque[Observation] = deque(maxlen=self.profile_ticks)
        self._target: dict[str, int] = {}
        self.plan = None
        self.solves = 0

    def _is_prefetch(self, stage: str) -> bool:
        if self._prefetch_names is not None:
            return stage in self._prefetch_names
        return stage_role(stage) == "prefetch"

    def step(self, observation: Observation) -> dict[str, int]:
        obs = observation
        if not obs.oom and obs.throughput > 0:
            self._window.append(obs)
        if self.plan is None:
            if len(self._window) >= self.profile_ticks:
                self._solve(obs)
        elif self.adaptive and obs.cpus != self.plan.cpus:
            self._solve(obs)
        return changes(self._knobs, self._target)

    def _profile(self) -> dict[str, _StageProfile]:
        prof: dict[str, _StageProfile] = {}
        for o in self._window:
            for s in o.stages:
                p = prof.setdefault(s.name, _StageProfile())
                n = s.items_per_s * o.dt_s
                p.items += n
                p.cpu_s += s.cpu_s_per_item * n
                p.wall_s += s.wall_s_per_item * n
                p.busy_workers_s += s.busy * s.workers * o.dt_s
                p.bytes += s.bytes_per_item * n
                p.time_s += o.dt_s
        return prof

    @staticmethod
    def is_sequential(knob: Knob, p: _StageProfile) -> bool:
        """The rule of the module docstring."""
        if knob.max <= 1:
            return True
        if p.time_s <= 0 or p.cpu_s <= 0:
            return False
        busy_workers = p.busy_workers_s / p.time_s
        cores_used = p.cpu_s / p.time_s
        return busy_workers >= 1.5 and 0.85 <= cores_used <= 1.15 and p.wall_s >= 0.8 * busy_workers * p.cpu_s

    def _solve(self, obs: Observation) -> None:
        prof = self._profile()
        last = obs.stages[-1].name
        root_items = prof.get(last, _StageProfile()).items
        if root_items <= 0:
            return
        names = [s.name for s in obs.stages if f"{s.name}.workers" in self._knobs]
        knobs = [self._knobs[f"{n}.workers"] for n in names]
        work = [prof[n].cpu_s / root_items if n in prof else 0.0 for n in names]
        seq = [self.is_sequential(k, prof.get(n, _StageProfile())) for n, k in zip(names, knobs, strict=True)]
        lo = [k.min for k in knobs]
        hi = [max(k.min, 1 if s else k.max) for k, s in zip(knobs, seq, strict=True)]
        cores = max(int(obs.cpus), 0)
        fractional, _ = solve_lp(work, cores, lo, hi)
        alloc = round_allocation(fractional, work, cores, lo, hi) if sum(lo) <= cores else list(lo)
        theta = rate_of(alloc, work)
        self.solves += 1
        plan = PlumberPlan(cpus=obs.cpus, theta=theta, sequential=[n for n, s in zip(names, seq, strict=True) if s])
        for n, k, a, f in zip(names, knobs, alloc, fractional, strict=True):
            plan.workers[n] = k.clamp(a)
            plan.fractional[n] = f
            self._target[k.name] = k.clamp(a)
        self._plan_prefetch(obs, prof, root_items, plan)
        self.plan = plan

    def _plan_prefetch(self, obs: Observation, prof: dict[str, _StageProfile], root_items: float, plan: PlumberPlan) -> None:
        root = obs.stages[-1]
        rows_per_item = root.rows_per_s / root.items_per_s if root.items_per_s > 0 else 0.0
        if obs.demand > 0 and rows_per_item > 0:
            demand = obs.demand / rows_per_item
        elif obs.step_time_s > 0:
            demand = 1.0 / obs.step_time_s  # one element per training step
        else:
            demand = 0.0  # unknown or unbounded: the consumer always waits
        plan.prefetch_elements = prefetch_elements(plan.theta, demand)
        free = max(0.0, obs.memory_limit_bytes - obs.memory_used_bytes) if obs.memory_limit_bytes > 0 else math.inf
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
