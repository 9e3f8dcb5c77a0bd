"""``planner``: moves every knob at once to the allocation that per-stage rate models, fitted online,
predict best within the safe set.

The model. After ``PROFILE_TICKS`` settled ticks at one allocation (``MIN_PROFILE_TICKS`` where the
machine's tick noise, pooled over the fits so far, already puts their mean rate within
``PROFILE_PRECISION``: ``TickSpread``), each stage's cost per delivered
element is read from what it did (``intune.policies.stage_costs``, the profile Plumber solves on):
its CPU seconds, and a worker's seconds on a CPU of its own, the CPU time plus the stage's own wait: its
busy wall time less the CPU time and the time it waited for a CPU (measured,
``StageObservation.cpu_wait_s_per_item``; where the machine does not measure it, the CPU time stretched
as much as the stage that waits least shows, ``contention``, said once in the log). Each stage's cost is then
fitted over the worker counts it was seen at (``with_scaling``): a stage whose workers take turns or
share a resource shows a cost that grows with its workers, and is planned at its ceiling. An
allocation ``a`` delivers ``min(min_i a_i / (work_i + slope_i a_i), cpus / sum_i cpu_i)`` elements a
second: the slowest stage, or the CPUs shared by every stage's work.

The first plan comes from the pipeline's first tick (``_plan_first``): the allocation the job started
at is a guess, so nothing is protected by waiting for a window; that tick filled the buffers, so its
costs are read per row each stage processed.

The plan. Workers are added one at a time to the slowest stage within the runner's budget
(``cpu_budget`` workers, and the one past it that ``light_worker_room`` grants a waiting stage). A stage
whose scaling only a measurement shows, thread workers (they share the GIL) or workers that wait (on
storage, a lock), reaches at most twice (+1) the most workers it was measured at; process workers that
compute scale with the CPUs, which the model holds, and reach what the budget gives. Then each stage
keeps the fewest workers that carry ``NEAR_BEST`` of that rate (or the consumer's demand with
``DEMAND_HEADROOM``, if lower) with ``STAGE_MARGIN`` to spare. Buffers: the prefetch holds what the rate
gap between the plan and the consumer calls for (``prefetch_elements``, at least
``MIN_PREFETCH_ELEMENTS`` for jitter); the shuffle buffer stays at the user's window (its size sets how
random the order is); others hold. The slowest stage's own buffer deepens where that stage idles
starved (``_deepen_for_jitter``): on the stage that sets the rate, waiting for input is rate lost to
the stages' varying costs, which a deeper buffer absorbs.

Stability. A re-fitted model replaces the plan in force only where it predicts ``GAIN`` more than the
allocation in force under the same model, or, with fewer workers, at least ``NEAR_BEST`` of it where each
stage it takes workers from still carries the rate measured at the allocation in force with
``STAGE_MARGIN``: a model re-fitted on a noisy window must not walk the allocation down; such a plan then
stays unless it measures below the allocation before (the model misses a stage's loss to its
neighbours' jitter, which the measurement shows). What is
measured outranks what is predicted: an allocation already measured at these CPUs is judged by its
measurement, and a plan that gives any stage a worker is kept only where it measures above the
allocation before it by more than ``CONFIDENCE_Z`` standard errors of the difference (``Measured``;
another fit while neither shown nor ruled out, ``MEASURED_TICKS`` at most), else the allocation before
comes back and the better of the two rates is a ceiling the model plans under for ``CEILING_TICKS`` (a
limit outside the stages' costs: the consumer's process, a lock the workers share). The standard error
comes from the tick-to-tick spread, so on a shared machine, where ticks vary by a third, a worker must
show a larger gain to stay: measurement noise alone never adds one.
A change of CPUs re-plans at once on the last costs (a CPU's work per element does not change with the
CPU count), each stage moving the way the CPUs did or holding (``_resize_plan``), and the model is then
re-fitted at the new allocation. A change of CPUs or of the remote workers beside the pipeline (a node
lost, workers placed) makes another machine: what was measured before is forgotten
(``_forget_measured``).

Beside remote workers (a stage's ``remote_workers``, sized by the shared rule of
``intune.policies.remote_sizing``): the stage's cost is its local workers' over the elements they
processed, and the elements its remote workers carried are a rate of their own beside its local
workers' (``StageCosts.remote``), costing no local CPU. Such a stage then takes the workers the other
stages leave in the budget, as many as the CPUs the others leave at the planned rate run: local CPUs
first, the remote ones are what a job pays for, and the sizer sheds those the local workers replace.
Those added local workers are judged as fewer workers are (kept unless they measure below): at the
trainer's demand the rate cannot show what they save. While the cluster has room, such a stage is planned
one sizing step ahead of what it carries (``elastic_costs``, the sizer's ``step_share``): the sizer adds
remote workers only where their stage binds, so the other stages are planned to carry that step, or
neither would move; its local workers take the CPUs the others leave at the rate before the step.
A stage whose remote workers carried almost every element (its local workers under
``LOCAL_MIN_SHARE``) keeps its last measured cost, or before any its workers.

Safety is not the planner's: every jump goes through ``SafetyLayer.admit`` (memory priced from measured
worker memory, buffers trimmed to the limit; where it admits part of a jump, the stage slowest now goes
first), and the runner's clamp applies the CPUs.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from intune.knobs import Knob
from intune.monitor.observation import MEMORY_SAFE_FRACTION, Observation
from intune.policies.base import cpu_budget, light_worker_room
from intune.policies.remote_sizing import STEP_SHARE, with_remote_placement
from intune.policies.safety import TRIM_MARGIN, SafetyLayer, shuffle_floor, start_allocation
from intune.policies.stage_costs import StageProfile, jitter_elements, prefetch_elements, profile_of
from intune.units import MB

PROFILE_TICKS = 4  # the most settled ticks at one allocation that one fit of the costs reads
MIN_PROFILE_TICKS = 2  # the fewest: where the delivered rate is known within ``PROFILE_PRECISION``
PROFILE_PRECISION = 0.02  # the standard error, as a share of the mean, at which a fit need not wait longer
SETTLE_TICKS = 1  # ticks left out of the fit after the first tick at a new allocation, itself left out (workers start, queues refill)
NEAR_BEST = 0.98  # allocations predicted within this share of the best rate compete on workers and memory
GAIN = 0.05  # what a new plan must predict above the allocation in force to replace it
DEMAND_HEADROOM = 1.1  # rate planned above a known consumer demand, for its jitter
MIN_PREFETCH_ELEMENTS = 2
JITTER_LOSS = 1.0 - NEAR_BEST  # the slowest stage's starved share past which its buffer deepens ...
JITTER_TARGET = JITTER_LOSS / 2  # ... to hold what lowers the share to this
MAX_JITTER_GROWTH = 8  # the most one fit multiplies a buffer by: one noisy window must not ask for gigabytes
STAGE_MARGIN = 1.1  # a stage left with fewer workers keeps this much capacity above the goal: rates are measured within ~10%
SATURATED = 0.9  # share of the CPUs the stages must use for their workers to be descheduled
CONTENTION_MIN_CORES = 0.1  # CPU a stage must use for its wall/CPU ratio to measure the contention
SCALING_FITS = 8  # recent fits per stage that its scaling (cost per element over its workers) is fitted on
CEILING_TICKS = 120  # ticks a measured ceiling holds before the model may try past it again
CONFIDENCE_Z = 2.0  # standard errors by which one measured rate must beat another for the difference to count
MEASURED_TICKS = 16  # the most recent ticks at an allocation that its measured rate is read from
LOCAL_MIN_SHARE = 0.05  # share of a stage's elements its local workers must process for their cost to be read

log = logging.getLogger(__name__)


class Measured:
    """Elements/s of the last ``MEASURED_TICKS`` settled ticks at one allocation: a mean and its
    standard error, so that two allocations are compared by more than their noise."""

    def __init__(self) -> None:
        self.ticks: deque[float] = deque(maxlen=MEASURED_TICKS)

    def add(self, rates: Iterable[float]) -> Measured:
        self.ticks.extend(rates)
        return self

    @property
    def mean(self) -> float:
        return float(np.mean(self.ticks)) if self.ticks else 0.0

    @property
    def stderr(self) -> float:
        n = len(self.ticks)
        return float(np.std(self.ticks, ddof=1) / math.sqrt(n)) if n > 1 else 0.0

    @property
    def spread(self) -> float:
        """The tick-to-tick standard deviation as a share of the mean (0 below two ticks)."""
        n = len(self.ticks)
        return float(np.std(self.ticks, ddof=1) / self.mean) if n > 1 and self.mean > 0 else 0.0

    def noise(self, other: Measured) -> float:
        """``CONFIDENCE_Z`` standard errors of the difference between this rate and ``other``. A rate
        measured on one tick shows no spread of its own: it carries the other's, relative to its level
        (the same machine's tick noise)."""
        mine = self.stderr if len(self.ticks) > 1 else other.spread * self.mean
        theirs = other.stderr if len(other.ticks) > 1 else self.spread * other.mean
        return CONFIDENCE_Z * math.hypot(mine, theirs)

    def beats(self, other: Measured, gain: float) -> bool:
        """Above ``other`` by ``gain`` of its rate, and by more than the noise of the difference."""
        diff = self.mean - other.mean
        return diff >= gain * other.mean and diff > self.noise(other)

    def may_beat(self, other: Measured, gain: float) -> bool:
        """Within the noise of the difference of being above ``other`` by ``gain``: not yet ruled out."""
        return self.mean - other.mean + self.noise(other) >= gain * other.mean

    def not_below(self, other: Measured) -> bool:
        """Not below ``other`` by more than the noise of the difference."""
        return other.mean - self.mean <= self.noise(other)


class TickSpread:
    """The machine's tick-to-tick noise on the delivered rate, relative to its level, pooled over every
    window fitted so far (squared deviations from each window's mean over their degrees of freedom): a
    spell of ticks that agree by chance on a noisy machine does not make it quiet."""

    def __init__(self) -> None:
        self.squares, self.dof = 0.0, 0

    @staticmethod
    def _of(rates: Sequence[float]) -> tuple[float, int]:
        mean = sum(rates) / len(rates)
        if mean <= 0 or len(rates) < 2:
            return 0.0, 0
        return sum((r / mean - 1.0) ** 2 for r in rates), len(rates) - 1

    def add(self, rates: Sequence[float]) -> None:
        squares, dof = self._of(rates)
        self.squares += squares
        self.dof += dof

    def stderr(self, rates: Sequence[float]) -> float:
        """The standard error of the mean of ``rates``, as a share of it, at the noise pooled with theirs
        (infinite where nothing measures it)."""
        squares, dof = self._of(rates)
        dof += self.dof
        return math.sqrt((squares + self.squares) / dof / len(rates)) if dof else math.inf


@dataclass(frozen=True)
class StageCosts:
    """A fitted model: per stage with a ``workers`` knob, seconds per delivered element."""

    names: tuple[str, ...]
    work: tuple[float, ...]  # a worker's seconds per delivered element on a CPU of its own: CPU plus its own wait
    cpu_work: tuple[float, ...]  # CPU seconds per delivered element
    sequential: tuple[bool, ...]  # one worker at most (the knob's bound); a stage whose workers take turns shows in ``slope``
    waiting: tuple[bool, ...]  # waits more than it computes: may take the light worker past the CPUs
    rows_per_item: float
    item_bytes: dict[str, float] = field(default_factory=dict)  # mean bytes of a stage's element
    # how much each added worker lengthens every worker's seconds per element (shared storage, memory
    # bandwidth, a lock): ``work`` is then the cost at no workers, ``work + slope * w`` at ``w``
    slope: tuple[float, ...] = ()
    # a limit the stages' costs do not explain (the consumer's process, a lock the stages share): the
    # rate measured where workers were added on the model's word and nothing came of them
    ceiling: float = math.inf
    # delivered elements/s a stage's remote workers carried (their rows took no local CPU): ``work`` and
    # ``cpu_work`` are then its local workers' costs per element they processed
    remote: tuple[float, ...] = ()
    # the stages' waits for a CPU were measured (else estimated: ``contention``)
    cpu_wait_measured: bool = True

    def remote_rate(self, i: int) -> float:
        """Delivered elements/s stage ``i``'s remote workers carried (0 without a pool)."""
        return self.remote[i] if self.remote else 0.0

    def stage_rate(self, i: int, workers: int) -> float:
        """Elements/s that ``workers`` local workers of stage ``i`` deliver, ``w / (work + slope * w)``,
        beside what its remote workers carry."""
        b = self.slope[i] if self.slope else 0.0
        cost = self.work[i] + b * workers
        return (workers / cost if cost > 0 else math.inf) + self.remote_rate(i)

    def workers_for(self, i: int, rate: float) -> float:
        """The fewest (fractional) local workers of stage ``i`` that deliver ``rate`` beside its remote
        ones; inf past its ceiling."""
        rate = max(0.0, rate - self.remote_rate(i))
        b = self.slope[i] if self.slope else 0.0
        if rate * b >= 1.0:
            return math.inf
        return rate * self.work[i] / (1.0 - rate * b)

    def rate(self, alloc: Sequence[int], cpus: float) -> float:
        """Elements/s delivered by ``alloc``: the slowest stage, or the CPUs over all the local work (the
        elements remote workers carry cost their stage no local CPU)."""
        rates = [self.stage_rate(i, a) for i, a in enumerate(alloc) if self.work[i] > 0]
        cpu_total = sum(self.cpu_work)
        spared = sum(c * self.remote_rate(i) for i, c in enumerate(self.cpu_work))
        cap = (cpus + spared) / cpu_total if cpu_total > 0 else math.inf
        return min(min(rates, default=math.inf), cap, self.ceiling)


@dataclass(frozen=True)
class Plan:
    """The allocation the planner drives to, with the rate its model predicts (elements/s)."""

    workers: dict[str, int]
    theta: float
    cpus: float

    @classmethod
    def at(cls, costs: StageCosts, alloc: Sequence[int], cpus: float) -> Plan:
        """``alloc`` (workers in ``costs.names``' order) with the rate ``costs`` predicts for it on ``cpus``."""
        return cls(dict(zip(costs.names, alloc, strict=True)), costs.rate(alloc, cpus), cpus)


def contention(profiles: Iterable[StageProfile], cpus: float) -> float:
    """How much longer than its CPU time a computing worker's busy time is now, because it waits for a
    CPU: 1 unless the CPUs are saturated, then the smallest ratio of busy wall time to CPU time over the
    computing stages (the stage that waits least is all CPU), at least 1. What is left of a stage's
    wall time is its own wait.

    Computing stages are those that use at least ``CONTENTION_MIN_CORES``: a stage that barely runs has
    a few microseconds of CPU and wall time, timer noise, and a ratio of 1 read there would turn every
    other stage's descheduled time into a wait that more workers could fill. The CPUs are saturated
    when the stages use at least ``SATURATED`` of them, or when more busy workers want a CPU than there
    are CPUs (another tenant's load, the consumer's process): a busy worker wants one for the share of
    its busy time that the squeeze would leave to its CPU time, ``ratio * cpu / wall``; the rest it waits
    on its own (I/O), runnable by no CPU. Otherwise nothing is descheduled: a wall time longer than the
    CPU time is the stage's own (storage, a lock, memory bandwidth)."""
    profiles = [p for p in profiles if p.time_s > 0]
    computing = [p for p in profiles if p.cpu_s > 0 and p.wall_s > 0 and p.cpu_s / p.time_s >= CONTENTION_MIN_CORES]
    used = sum(p.cpu_s / p.time_s for p in profiles)
    squeeze = max(1.0, min((p.wall_s / p.cpu_s for p in computing), default=1.0))
    runnable = sum(p.busy_workers_s / p.time_s * min(1.0, squeeze * p.cpu_s / p.wall_s) for p in computing)
    if cpus <= 0 or (used < SATURATED * cpus and runnable <= cpus):
        return 1.0
    return squeeze


def fit_costs(window: Sequence[Observation], knobs: Mapping[str, Knob], per_row: bool = False) -> StageCosts | None:
    """The model fitted on ``window`` (ticks at one allocation); None when nothing was delivered.

    A stage's cost per delivered element is its seconds over the elements delivered: the work of
    elements still in the buffers counts, which is right once they are as full at the window's end as
    at its start. ``per_row`` reads it instead per row the stage processed, times the rows of a
    delivered element (rows pass every stage once): right while buffers fill, as in a pipeline's
    first tick."""
    prof = profile_of(window)
    last = window[-1].stages[-1].name
    root_items = prof[last].items if last in prof else 0.0
    if root_items <= 0 or (per_row and prof[last].rows <= 0):
        return None
    names = [s.name for s in window[-1].stages if f"{s.name}.workers" in knobs]
    profiles = {n: prof[n] for n in names if n in prof}
    queue_measured = all(p.cpu_wait_s is not None for p in profiles.values())
    squeeze = 1.0 if queue_measured else contention(profiles.values(), window[-1].cpus)
    work, cpu_work, seq, waiting, remote = [], [], [], [], []
    seconds = sum(o.dt_s for o in window)
    for n in names:
        p = profiles.get(n)
        knob = knobs[f"{n}.workers"]
        # a worker's cost per element of the stage's own: remote workers' elements took no local time
        done = root_items * (p.rows / prof[last].rows if per_row and p and p.rows > 0 else 1.0)  # delivered-element work
        per = local_items(p) / p.items * done if p and p.items > 0 else done
        if per <= 0.0:
            per = math.nan  # remote workers took every element: the local workers' cost is not measured
        cpu = p.cpu_s / per if p else 0.0
        wait = max(0.0, p.wall_s - p.cpu_s - _cpu_wait(p, squeeze)) / per if p else 0.0
        cpu_work.append(cpu)
        work.append(cpu + wait)
        seq.append(knob.max <= 1)
        waiting.append(wait > cpu)
        remote.append(p.remote_items / p.items * root_items / seconds if p and p.items > 0 and seconds > 0 else 0.0)
    rows = sum(o.stages[-1].rows_per_s * o.dt_s for o in window)
    item_bytes = {n: p.bytes / p.items for n, p in prof.items() if p.items > 0}
    return StageCosts(tuple(names), tuple(work), tuple(cpu_work), tuple(seq), tuple(waiting), rows / root_items, item_bytes,
                      remote=tuple(remote) if any(remote) else (), cpu_wait_measured=queue_measured)


def _cpu_wait(p: StageProfile, squeeze: float) -> float:
    """The stage's seconds waiting for a CPU over the window: measured, or its CPU time stretched by
    ``squeeze`` (``contention``) where a tick did not measure it."""
    return p.cpu_wait_s if p.cpu_wait_s is not None else (squeeze - 1.0) * p.cpu_s


def _remote_placement(obs: Observation) -> tuple[float, ...]:
    """The remote cluster's CPUs and each stage's remote workers: what a measured rate depends on
    beside the local allocation and the CPUs."""
    return (obs.remote_cpus, *(float(s.remote_workers) for s in obs.stages))


def local_items(p: StageProfile) -> float:
    """Elements the stage's local workers processed: ``items`` less those its remote workers did, none
    below ``LOCAL_MIN_SHARE`` of them (a share that small measures no cost)."""
    local = p.items - p.remote_items
    return local if local >= LOCAL_MIN_SHARE * p.items else 0.0


def with_scaling(costs: StageCosts, seen: Mapping[str, Sequence[tuple[int, float]]]) -> StageCosts:
    """``costs`` with each stage's cost per element fitted over the worker counts it was measured at
    (``seen``: stage -> (workers, seconds per element) of recent fits): a least-squares line
    ``work + slope * w``, slope at least 0; a stage seen at one worker count keeps its cost (slope 0).
    A stage that stops scaling is then planned at its ceiling instead of being given workers that add
    nothing."""
    work, slope = list(costs.work), [0.0] * len(costs.work)
    for i, name in enumerate(costs.names):
        points = seen.get(name, ())
        ws = np.array([p[0] for p in points], dtype=float)
        if len(points) < 3 or np.ptp(ws) == 0:
            continue
        ys = np.array([p[1] for p in points], dtype=float)
        b = float(np.polyfit(ws, ys, 1)[0])
        if b <= 0:
            continue
        now = float(np.mean([y for w, y in points if w == points[-1][0]]))
        # a noisy slope may not take a stage's cost at no workers below half the least it was seen at
        b = min(b, (now - 0.5 * float(ys.min())) / points[-1][0])
        if b <= 0:
            continue
        slope[i] = b
        work[i] = now - b * points[-1][0]
    return replace(costs, work=tuple(work), slope=tuple(slope))


def elastic_costs(costs: StageCosts, elastic: Mapping[str, int], share: float = STEP_SHARE) -> StageCosts:
    """``costs`` with each stage in ``elastic`` (name -> the local workers it runs) carrying one sizing step
    more than it does now (``share`` of its rate, on its remote workers: the sizer's next step): while the
    stage binds and the cluster has room, the sizer adds the remote workers of that step, so the other
    stages are planned to carry it, and the sizer, which adds only where the stage binds, sees it bind."""
    if not elastic or not costs.remote:
        return costs
    remote = tuple(r + share * costs.stage_rate(i, elastic[n]) if n in elastic else r
                   for i, (n, r) in enumerate(zip(costs.names, costs.remote, strict=True)))
    return replace(costs, remote=remote)


def plan_workers(costs: StageCosts, knobs: Mapping[str, Knob], budget: int, extra: int, cpus: float,
                 demand_items: float = 0.0, reach: Mapping[str, int] | None = None,
                 fill: Iterable[str] = (), elastic: Mapping[str, int] | None = None, share: float = STEP_SHARE) -> Plan:
    """The fewest workers per stage within ``NEAR_BEST`` of the best rate that ``budget`` workers (and
    ``extra`` past it for waiting stages) allow (module docstring); a stage in ``fill`` (it has remote
    workers) then takes the budget the others leave: local CPUs first, the remote ones are the cost. The
    rate is the model's with the stages in ``elastic`` (name -> the local workers it runs) a sizing step
    ahead (``elastic_costs``)."""
    real, costs = costs, elastic_costs(costs, elastic or {}, share)
    ks = [knobs[f"{n}.workers"] for n in costs.names]
    lo = [k.min for k in ks]
    hi = [max(k.min, 1 if s else k.max) for k, s in zip(ks, costs.sequential, strict=True)]
    if reach is not None:
        hi = [max(lo[i], min(hi[i], reach.get(n, hi[i]))) for i, n in enumerate(costs.names)]
    alloc = list(lo)
    while True:
        growable = [i for i in range(len(alloc)) if costs.work[i] > 0]
        if not growable:
            break
        i = min(growable, key=lambda j: costs.stage_rate(j, alloc[j]))
        if alloc[i] >= hi[i] or costs.stage_rate(i, alloc[i] + 1) <= costs.stage_rate(i, alloc[i]) * (1.0 + 1e-6):
            break
        if sum(alloc) < budget:
            alloc[i] += 1
        elif extra > 0 and costs.waiting[i]:
            alloc[i] += 1
            extra -= 1
        else:
            break
    best = costs.rate(alloc, cpus)
    goal = NEAR_BEST * best
    if demand_items > 0:
        goal = min(goal, DEMAND_HEADROOM * demand_items)
    lean = []
    for i in range(len(alloc)):
        need = costs.workers_for(i, goal * STAGE_MARGIN) if costs.work[i] > 0 else 0.0
        if not math.isfinite(need):  # the margin is past the stage's ceiling: the fewest that carry the goal
            need = costs.workers_for(i, goal)
        lean.append(max(lo[i], min(alloc[i], math.ceil(need - 1e-9) if math.isfinite(need) else alloc[i])))
    theta = costs.rate(lean, cpus)
    for i, name in enumerate(costs.names):
        if name in fill:  # the CPUs the other stages leave at the planned rate, and the workers they run
            # at the rate the plan carries before the sizer's step: local CPUs go to local workers first
            room = cpus - sum(c * min(theta, real.rate(lean, cpus)) for j, c in enumerate(real.cpu_work) if j != i)
            per_cpu = real.work[i] / real.cpu_work[i] if real.cpu_work[i] > 0 else 1.0
            most = min(hi[i], budget - (sum(lean) - lean[i]), math.floor(max(0.0, room) * per_cpu + 1e-9))
            lean[i] = max(lean[i], most)
    return Plan.at(costs, lean, cpus)


class Probe(NamedTuple):
    """An allocation on trial until its measurement decides it against the one before (``_judge_probe``)."""

    before: tuple[int, ...]
    tried: tuple[int, ...]
    restore: Plan  # the plan in force again if the tried allocation does not pay
    move: bool  # a move tried on top of the plan (``try_move``), not a plan of the planner's own
    down: bool = False  # fewer workers (a shed, or one fewer than a jump reached): kept unless it measures below
    check_down: int | None = None  # the stage to try at one fewer after this probe if it goes back


@with_remote_placement  # remote knobs: the shared sizing rule (docs/remote_tuning.md)
class PlannerPolicy:
    """Plans every knob from online per-stage rate models (module docstring)."""

    name = "planner"

    def __init__(self) -> None:
        self.plans = 0  # plans adopted, the start excluded
        self.plan: Plan | None = None

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self.knobs = dict(knobs)
        self.safety = SafetyLayer(list(self.knobs.values()), (-1, 0, 1), MEMORY_SAFE_FRACTION, TRIM_MARGIN)
        self.floor = shuffle_floor(self.safety, observation)
        self._start: dict[str, int] | None = start_allocation(self.knobs, self.safety, observation, "even")
        self._window: deque[Observation] = deque(maxlen=PROFILE_TICKS)
        self._settle = SETTLE_TICKS
        self._spread = TickSpread()
        self._last_values: list[int] | None = None
        self.costs: StageCosts | None = None
        self._seen: dict[str, deque[tuple[int, float]]] = {}  # stage -> (workers, cost per element) of recent fits
        self._tried: dict[tuple[int, ...], Measured] = {}  # allocation -> elements/s measured there, at these CPUs
        self._probe: Probe | None = None
        self._unmeasured: set[str] = set()  # stages whose local workers' cost was never measured (``_with_last_costs``)
        self._held_at_last_gap: set[str] = set()  # ... as of the last fit that missed a stage's cost
        self._check_down: int | None = None  # the stage a kept jump gave several workers: tried at one fewer
        self.probes_kept = 0
        self._ceiling, self._ceiling_until = math.inf, 0  # ``StageCosts.ceiling`` and the tick it ends
        self.plan = None
        self.plans = 0
        self._target = {n: k.value for n, k in self.knobs.items()}
        self._remote = _remote_placement(observation)  # the remote cluster the measurements were taken with
        self._said_cpu_wait = False  # the log said the waits for a CPU are not measured
        self._jitter_mb: dict[str, int] = {}  # buffer knob -> the depth its stage's jitter called for
        self._jitter_last: dict[str, tuple[float, float]] = {}  # ... -> (elements held, starved) when it did
        self._jitter_spent: set[str] = set()  # buffer knobs whose deepening took no loss away or was cut

    def step(self, observation: Observation) -> dict[str, int]:
        obs = observation
        values = [k.value for k in self.safety.knobs]
        workers = [k.value for k in self.safety.knobs if k.unit == "cpu"]
        self.safety.track(obs)
        if self._start is not None:
            start, self._start = self._start, None
            self._last_values = workers
            if self._plan_first(obs, start):
                return self.request(obs, values)
            self._target.update(start)
            return start
        remote = _remote_placement(obs)
        moved = remote != self._remote  # remote workers placed or lost, nodes gained or lost: another machine
        if moved:
            self._forget_measured()
            self._remote = remote
        self._profile(obs, workers, moved)
        if self.plan is not None and obs.cpus != self.plan.cpus and self.costs is not None:
            self._forget_measured()
            self._adopt(self._resize_plan(obs, self.costs, self.plan.cpus), obs)
        elif self._profiled():
            costs = fit_costs(list(self._window), self.knobs)
            rates = self._window_rates()
            idle = self._slowest_idle()
            self._window.clear()
            self._spread.add(rates)
            if costs is not None and not costs.cpu_wait_measured and not self._said_cpu_wait:
                self._said_cpu_wait = True
                log.info("the workers' waits for a CPU are not measured here (no /proc/thread-self/schedstat): "
                         "each stage's own wait is estimated from the stage that waits least")
            if costs is not None:
                for name, work in zip(costs.names, costs.work, strict=True):
                    if not math.isnan(work):  # a cost not measured is no point of the stage's scaling
                        w = self.knobs[f"{name}.workers"].value
                        self._seen.setdefault(name, deque(maxlen=SCALING_FITS)).append((w, work))
                costs = self._with_last_costs(costs)
                if obs.tick >= self._ceiling_until:
                    self._ceiling = math.inf
                costs = self.costs = replace(with_scaling(costs, self._seen), ceiling=self._ceiling)
                self._tried.setdefault(self._allocation(costs.names), Measured()).add(rates)
                self._review(obs, costs)
                self._deepen_for_jitter(obs, idle)
        return self.request(obs, values)

    def _forget_measured(self) -> None:
        """Measurements belong to the machine they were taken on: after a change of its CPUs or of the
        remote workers beside it, no allocation is judged by them, no trial goes on and no measured
        ceiling holds (a rate measured while a node loss left no remote worker would outrank, once the
        workers are back, the model's plan to return to the allocation before)."""
        self._tried.clear()
        self._probe = None
        self._ceiling = math.inf
        if self.costs is not None:
            self.costs = replace(self.costs, ceiling=math.inf)

    # -- the model and the plan -------------------------------------------------------------------
    def _plan_first(self, obs: Observation, start: Mapping[str, int]) -> bool:
        """The first plan, from the pipeline's first tick where it delivered elements: the allocation it
        ran at is a guess no measurement chose, so a plan need not wait for the precision a re-plan
        waits for. That tick filled the buffers, so each stage's cost is read per row it processed
        (``fit_costs``'s ``per_row``). A stage may reach as many workers as the even start gives it
        (what would be taken unmeasured) where that is more than ``_new_plan``'s reach. The plan is
        tried as every plan that adds workers is, against the allocation of that tick (its one tick
        the measurement), and the tick is no point of a stage's scaling. False where nothing was
        delivered or a stage's cost is not measured: the even start then."""
        if obs.oom or obs.throughput <= 0:
            return False
        costs = fit_costs([obs], self.knobs, per_row=True)
        if costs is None or any(math.isnan(w) for w in costs.work):
            return False
        self.costs = costs
        before = self._allocation(costs.names)
        self._tried[before] = Measured().add([obs.stages[-1].items_per_s])
        in_force = Plan.at(costs, before, float(obs.cpus))
        plan = self._new_plan(obs, costs, {n: start.get(f"{n}.workers", 0) for n in costs.names})
        self._adopt(plan, obs)
        planned = tuple(plan.workers[n] for n in costs.names)
        if any(p > b for p, b in zip(planned, before, strict=True)):
            self._probe = Probe(before, planned, in_force, move=False)
        return True

    def _profile(self, obs: Observation, workers: list[int], remote_moved: bool) -> None:
        """Keep the settled ticks of the allocation in force; a change of workers, local or remote, starts over."""
        if remote_moved or workers != self._last_values or obs.oom or obs.throughput <= 0:
            self._window.clear()
            self._settle = SETTLE_TICKS
        elif self._settle > 0:
            self._settle -= 1
        else:
            self._window.append(obs)
        self._last_values = workers

    def _profiled(self) -> bool:
        """The window holds enough ticks for a fit: ``PROFILE_TICKS``, or ``MIN_PROFILE_TICKS`` whose mean
        delivered rate the machine's noise (``TickSpread``) already puts within ``PROFILE_PRECISION``: a
        quiet machine need not wait as long as a noisy one for the same certainty."""
        n = len(self._window)
        if n >= PROFILE_TICKS:
            return True
        if n < MIN_PROFILE_TICKS:
            return False
        return self._spread.stderr(self._window_rates()) <= PROFILE_PRECISION

    def _window_rates(self) -> list[float]:
        """Elements/s delivered on each tick of the window."""
        return [o.stages[-1].items_per_s for o in self._window]

    def _with_last_costs(self, costs: StageCosts) -> StageCosts:
        """``costs`` with a stage whose local workers' cost was not measured (its remote workers took
        almost every element) at its last fitted cost; before any, the stage is held at the workers it
        has (``_unmeasured``): nothing measured says it needs fewer or more."""
        self._unmeasured = set()
        if not any(math.isnan(w) for w in costs.work):
            return costs
        last = self.costs if self.costs is not None and self.costs.names == costs.names else None
        work, cpu = list(costs.work), list(costs.cpu_work)
        for i, name in enumerate(costs.names):
            if not math.isnan(work[i]):
                continue
            if last is None or name in self._held_at_last_gap:
                self._unmeasured.add(name)
                work[i] = cpu[i] = 0.0  # not planned: held (``_new_plan``)
            else:
                work[i], cpu[i] = last.work[i], last.cpu_work[i]
        self._held_at_last_gap = set(self._unmeasured)
        return replace(costs, work=tuple(work), cpu_work=tuple(cpu))

    def _new_plan(self, obs: Observation, costs: StageCosts, reach_at_least: Mapping[str, int] | None = None) -> Plan:
        budget = max(int(cpu_budget(obs, self.knobs) + 1e-9), 0)
        extra = light_worker_room(obs.light_stages(), 0.0)
        demand = obs.demand / costs.rows_per_item if obs.demand > 0 and costs.rows_per_item > 0 else 0.0
        low = reach_at_least or {}
        modes = {s.name: s.mode for s in obs.stages}
        reach = {n: self.knobs[f"{n}.workers"].max if modes.get(n) == "process" and not waits else
                 max(low.get(n, 0), 2 * max((w for w, _ in self._seen.get(n, ())), default=self.knobs[f"{n}.workers"].value) + 1)
                 for n, waits in zip(costs.names, costs.waiting, strict=True)}
        fill = self._filled(obs)
        held = {n: self.knobs[f"{n}.workers"].value for n in self._unmeasured - fill}
        plan = plan_workers(costs, self.knobs, budget - sum(held.values()), extra, float(obs.cpus), demand, reach, fill,
                            self._elastic(obs), self._step_share())
        return replace(plan, workers={**plan.workers, **held}) if held else plan

    def _step_share(self) -> float:
        """The share of the rows/s the remote sizer's next step aims at (``RemoteSizer.step_share``)."""
        sizer = getattr(self, "remote_sizer", None)
        return sizer.step_share if sizer is not None else STEP_SHARE

    def _elastic(self, obs: Observation) -> dict[str, int]:
        """Stages with remote workers while the cluster has room for more, with the local workers they run:
        the sizer grows them a step at a time while they bind (``elastic_costs``)."""
        if obs.remote_cpus <= obs.allocated_remote_cpus:
            return {}
        return {n: self.knobs[f"{n}.workers"].value for n in self._filled(obs)}

    def _resize_plan(self, obs: Observation, costs: StageCosts, before: float) -> Plan:
        """The plan at a change of CPUs: each stage moves the way the CPUs did or holds. A CPU's work per
        element does not change with their count, so on the costs in force a higher rate needs no stage
        to shed workers and a lower one none to gain them; a plan that says otherwise reads a re-fitted
        model no measurement has judged yet, and that is for the next fit's review to try."""
        plan = self._new_plan(obs, costs)
        bound = max if float(obs.cpus) > before else min
        alloc = [bound(plan.workers[n], w) for n, w in zip(costs.names, self._allocation(costs.names), strict=True)]
        return Plan.at(costs, alloc, float(obs.cpus))

    def _filled(self, obs: Observation) -> set[str]:
        """Stages with remote workers: their local workers take the CPUs the others leave."""
        return {s.name for s in obs.stages if s.remote_workers > 0 and f"{s.name}.workers" in self.knobs}

    def _allocation(self, names: Sequence[str]) -> tuple[int, ...]:
        return tuple(self.knobs[f"{n}.workers"].value for n in names)

    def _review(self, obs: Observation, costs: StageCosts) -> None:
        """Re-plan on the re-fitted model; adopt the plan only where it pays (module docstring). An
        allocation already measured at these CPUs is judged by what was measured there, not predicted:
        a model re-fitted on noise may favour a neighbour that was just measured no better."""
        current = self._allocation(costs.names)
        if self._probe is not None and self._judge_probe(current, costs.names, obs.tick):
            return
        new = self._new_plan(obs, costs)
        model = elastic_costs(costs, self._elastic(obs), self._step_share())
        now = model.rate(current, float(obs.cpus))
        fewer = sum(new.workers.values()) < sum(current) and new.theta >= NEAR_BEST * now
        planned = tuple(new.workers[n] for n in costs.names)
        if fewer and current in self._tried:
            delivered = STAGE_MARGIN * self._tried[current].mean
            fewer = all(model.stage_rate(i, p) >= delivered for i, (p, c) in enumerate(zip(planned, current, strict=True)) if p < c)
        if planned in self._tried and current in self._tried:
            pays = self._tried[planned].beats(self._tried[current], GAIN)
            fewer = fewer and self._tried[planned].not_below(self._tried[current])
        else:
            pays = new.theta >= (1.0 + GAIN) * now
        in_force = Plan.at(model, current, float(obs.cpus))
        self._check_down, check_down = None, self._check_down
        if self.plan is None or pays or fewer:
            self._adopt(new, obs)
            grown = {n for n, p, c in zip(costs.names, planned, current, strict=True) if p > c}
            if current in self._tried and planned != current:
                # a worker added stays only where it pays; a plan of fewer workers, unless it measures below;
                # local workers beside remote ones, unless it measures below (they pay in remote workers shed)
                down = not pays or grown <= self._filled(obs)
                self._probe = Probe(current, planned, in_force, move=False, down=down, check_down=check_down)
        else:
            self.plan = in_force
            if check_down is not None and current[check_down] > self.knobs[f"{costs.names[check_down]}.workers"].min:
                # a jump of several workers skipped counts never measured: one fewer must measure below to lose
                fewer_one = tuple(w - (i == check_down) for i, w in enumerate(current))
                self._probe = Probe(current, fewer_one, in_force, move=False, down=True)
                self._target[f"{costs.names[check_down]}.workers"] = fewer_one[check_down]

    # -- moves tried on top of the plan (a learning part's proposals) --------------------------------
    def settled(self) -> bool:
        """A plan is in force, its workers are in place and no move is being tried: a move may be tried."""
        return (self.plan is not None and self._probe is None and self.costs is not None
                and all(self.knobs[f"{n}.workers"].value == w for n, w in self.plan.workers.items()))

    def try_move(self, knob: str, value: int) -> None:
        """Drive ``knob`` (a ``workers`` knob) to ``value`` for one fit; the next fit keeps it only where
        its measured rate beats the allocation before by ``GAIN``, else the plan comes back."""
        assert self.costs is not None
        assert self.plan is not None
        before = self._allocation(self.costs.names)
        self._target[knob] = value
        tried = tuple(value if f"{n}.workers" == knob else w for n, w in zip(self.costs.names, before, strict=True))
        self._probe = Probe(before, tried, self.plan, move=True)

    def _judge_probe(self, current: tuple[int, ...], names: Sequence[str], tick: int) -> bool:
        """After a fit of a tried move or of a plan that adds a worker: keep a move where it measures ``GAIN``
        above the allocation before, a plan where it measures above it at all (``Measured.beats``: by more
        than the noise), one worker fewer unless it measures below (``Measured.not_below``); go back where
        that is ruled out, or still not shown after ``MEASURED_TICKS``; in between, measure another fit. A
        plan whose workers bring nothing shows a limit the model does not hold: the better of the two
        measured rates is its ``ceiling`` for ``CEILING_TICKS``. A plan that paid after a jump of several
        workers on a stage has that stage tried at one fewer once the model plans no further. True when it
        decided the allocation (a plan that paid leaves the re-plan to the re-fitted model)."""
        assert self._probe is not None
        probe, self._probe = self._probe, None
        if current != probe.tried:  # not reached (memory held it back) or the machine changed: not judged
            return False
        # a move on top of the plan must earn ``GAIN``; a plan of the model's, that its workers bring something
        gain = GAIN if probe.move else 0.0
        if probe.before not in self._tried:
            paid = False
        elif probe.down:
            paid = self._tried[current].not_below(self._tried[probe.before])
        else:
            tried, before = self._tried[current], self._tried[probe.before]
            paid = tried.beats(before, gain)
            if not paid and tried.may_beat(before, GAIN) and len(tried.ticks) < MEASURED_TICKS:
                self._probe = probe  # neither shown nor ruled out: measured for another fit
                return True
        if not paid:
            self.plan = probe.restore
            self._check_down = probe.check_down
            if not probe.move and not probe.down and probe.before in self._tried:
                self._ceiling = max(self._tried[current].mean, self._tried[probe.before].mean)
                self._ceiling_until = tick + CEILING_TICKS
            for n, w in zip(names, probe.before, strict=True):
                self._target[f"{n}.workers"] = w
            return True
        if probe.down or probe.move:
            self.probes_kept += probe.move
            self.plan = Plan(dict(zip(names, current, strict=True)), probe.restore.theta, probe.restore.cpus)
            return True
        grown = [t - b for t, b in zip(probe.tried, probe.before, strict=True)]
        if max(grown) >= 2:
            self._check_down = grown.index(max(grown))
        return False  # the plan paid: the model, re-fitted there, may plan further at once

    def _adopt(self, plan: Plan, obs: Observation) -> None:
        self.plan = plan
        self.plans += 1
        for stage, workers in plan.workers.items():
            self._target[f"{stage}.workers"] = workers
        self._plan_buffers(obs)

    def _slowest_idle(self) -> tuple[str, float, float] | None:
        """The window's slowest stage (the busiest) and the shares of its time it idled starved and
        blocked: on the slowest stage, waiting for input is rate lost to the stages' varying costs;
        waiting on a full output is the consumer's limit, which no buffer lifts."""
        if not self._window:
            return None
        n = len(self._window)
        names = [s.name for s in self._window[0].stages]
        busy = [sum(o.stages[i].busy for o in self._window) / n for i in range(len(names))]
        i = max(range(len(names)), key=busy.__getitem__)
        return (names[i], sum(o.stages[i].starved for o in self._window) / n,
                sum(o.stages[i].blocked for o in self._window) / n)

    def _deepen_for_jitter(self, obs: Observation, idle: tuple[str, float, float] | None) -> None:
        """Deepen the slowest stage's own buffer (not a shuffle's: its size sets how random the order
        is) where that stage idled starved more than ``JITTER_LOSS`` and more than it idled blocked: to
        the depth ``jitter_elements`` gives for ``JITTER_TARGET``, at most
        ``MAX_JITTER_GROWTH`` times what it holds. A depth that did not take at least half the predicted
        loss away says the stage starves for another reason, and a depth the memory cut says the memory
        cannot afford it: either way that buffer deepens no more (deepened and cut by turns, it would
        take the memory the workers' growth needs). The depth is kept as the buffer's floor in later
        plans; the safety layer grants it only within the memory margin. ``idle``: the fit's window's
        ``_slowest_idle``."""
        if idle is None or self.costs is None:
            return
        stage, starved, blocked = idle
        knob = self.knobs.get(f"{stage}.buffer_mb")
        size = self.costs.item_bytes.get(stage, 0.0)
        if (knob is None or knob.name in self._jitter_spent or starved <= JITTER_LOSS or blocked > starved
                or size <= 0 or obs.kinds().get(stage) == "shuffle"):
            return
        held = knob.value * MB / size
        last = self._jitter_last.get(knob.name)
        if last is not None and held > last[0]:
            predicted = last[1] * (1.0 + last[0]) / (1.0 + held)
            if starved > (last[1] + predicted) / 2:
                self._jitter_spent.add(knob.name)
                log.debug("%s still starved %.1f%% at %d MB: its buffer deepens no more", stage, 100 * starved, knob.value)
                return
        depth = min(jitter_elements(starved, held, JITTER_TARGET), MAX_JITTER_GROWTH * max(held, 1.0))
        want = knob.clamp(math.ceil(depth * size / MB))
        if want > max(knob.value, self._jitter_mb.get(knob.name, 0)):
            log.debug("%s starved %.1f%% as the slowest stage: %s to %d MB", stage, 100 * starved, knob.name, want)
            self._jitter_mb[knob.name] = want
            self._jitter_last[knob.name] = (held, starved)
            self._target[knob.name] = max(self._target[knob.name], want)

    def _plan_buffers(self, obs: Observation) -> None:
        """Prefetch from the rate gap; the shuffle window as the user set it; other buffers hold; none
        below the depth its stage's jitter called for (``_deepen_for_jitter``)."""
        assert self.plan is not None and self.costs is not None
        if obs.demand > 0 and self.costs.rows_per_item > 0:
            demand = obs.demand / self.costs.rows_per_item
        elif obs.step_time_s > 0:
            demand = 1.0 / obs.step_time_s
        else:
            demand = 0.0
        depth = max(MIN_PREFETCH_ELEMENTS, prefetch_elements(self.plan.theta, demand))
        kinds = obs.kinds()
        for k, lowest in zip(self.safety.knobs, self.floor.tolist(), strict=True):
            if k.unit != "mb":
                continue
            if kinds.get(k.stage) == "prefetch":
                size = self.costs.item_bytes.get(k.stage) or self.costs.item_bytes.get(self.costs.names[-1], 0.0)
                if size > 0:
                    self._target[k.name] = k.clamp(math.ceil(depth * size / MB))
            elif kinds.get(k.stage) == "shuffle":
                self._target[k.name] = k.clamp(max(int(lowest), self._target[k.name]))
            if k.name in self._jitter_mb:
                self._target[k.name] = max(self._target[k.name], self._jitter_mb[k.name])

    def request(self, obs: Observation, values: list[int]) -> dict[str, int]:
        """The target, as far as the safety layer admits it this tick. Where the memory admits fewer
        workers than the plan adds, they go first to the stage slowest now under the model: the
        bottleneck, where a worker pays at once (and where its worker does not fit, no other stage's
        does: ``SafetyLayer.admit``)."""
        target = [self._target[k.name] for k in self.safety.knobs]
        need = {}
        if self.plan is not None and self.costs is not None:
            for n in self.plan.workers:
                i = self.costs.names.index(n)
                w = self.knobs[f"{n}.workers"].value
                need[f"{n}.workers"] = self.costs.stage_rate(i, w) if self.costs.work[i] > 0 else math.inf
        index = {k.name: i for i, k in enumerate(self.safety.knobs)}
        priority = [index[n] for n in sorted(need, key=need.__getitem__)]
        admitted = self.safety.admit(obs, values, target, priority, self.floor)
        for k, v, w in zip(self.safety.knobs, values, admitted.tolist(), strict=True):
            if k.unit == "mb" and w < v:  # a buffer the memory cut stays cut: the plan follows the limit
                self._target[k.name] = min(self._target[k.name], int(w))
                if k.name in self._jitter_mb:  # the memory cannot afford the depth: it deepens no more
                    self._jitter_mb[k.name] = min(self._jitter_mb[k.name], int(w))
                    self._jitter_spent.add(k.name)
        return {k.name: int(w) for k, v, w in zip(self.safety.knobs, values, admitted.tolist(), strict=True) if w != v}

    # -- resume -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The plan in force and the memory estimates: a restart resumes driving to the same plan, with
        the buffer depths its stages' jitter called for and the deepenings that ended (a depth the memory
        cut is not asked for again after a restart either)."""
        out: dict[str, Any] = {"safety": self.safety.state_dict(), "plans": self.plans}
        if self.plan is not None:
            out["plan"] = {"workers": dict(self.plan.workers), "theta": self.plan.theta, "cpus": self.plan.cpus}
        out["target"] = dict(self._target)
        out["jitter_mb"] = dict(self._jitter_mb)
        out["jitter_last"] = {k: [held, starved] for k, (held, starved) in self._jitter_last.items()}
        out["jitter_spent"] = sorted(self._jitter_spent)
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.safety.load_state_dict(state["safety"])
        self.plans = int(state.get("plans", 0))
        plan = state.get("plan")
        if plan is not None:
            self.plan = Plan({str(k): int(v) for k, v in plan["workers"].items()}, float(plan["theta"]), float(plan["cpus"]))
        self._target.update({str(k): int(v) for k, v in state.get("target", {}).items() if k in self._target})
        self._jitter_mb = {str(k): int(v) for k, v in state.get("jitter_mb", {}).items() if k in self._target}
        self._jitter_last = {str(k): (float(v[0]), float(v[1])) for k, v in state.get("jitter_last", {}).items()
                             if k in self._target}
        self._jitter_spent = {str(k) for k in state.get("jitter_spent", ()) if k in self._target}
        self._start = None


__all__ = ["PROFILE_TICKS", "Plan", "PlannerPolicy", "StageCosts", "TickSpread", "fit_costs", "plan_workers"]
