"""Per-stage rate models fitted online, and the allocation they predict best: the planner's model
(``intune.policies.planner``).

The model (``fit_costs``). Over a window of settled ticks at one allocation, each stage's cost per
delivered element is read from what it did (``intune.policies.stage_costs``, the profile Plumber solves on):
its CPU seconds, and a worker's seconds on a CPU of its own, the CPU time plus the stage's own wait: its
busy wall time less the CPU time and the time it waited for a CPU (measured,
``StageObservation.cpu_wait_s_per_item``; where the machine does not measure it, the CPU time stretched
as much as the stage that waits least shows, ``contention``, said once in the log). Each stage's cost is then
fitted over the worker counts it was seen at (``with_scaling``): a stage whose workers take turns or
share a resource shows a cost that grows with its workers, and is planned at its ceiling. An
allocation ``a`` delivers ``min(min_i a_i / (work_i + slope_i a_i), cpus / sum_i cpu_i)`` elements a
second: the slowest stage, or the CPUs shared by every stage's work.

The plan (``plan_workers``). Workers are added one at a time to the slowest stage within the runner's
budget (``cpu_budget`` workers, and the one past it that ``light_worker_room`` grants a waiting stage),
each stage up to its reach (the planner's: how far a measurement lets a stage go). Then each stage
keeps the fewest workers that carry ``NEAR_BEST`` of that rate (or the consumer's demand with
``DEMAND_HEADROOM``, if lower) with ``STAGE_MARGIN`` to spare. A stage with remote workers (``fill``)
then takes the workers the other stages leave, as many as the CPUs they leave at the planned rate run:
local CPUs first, the remote ones are what a job pays for; they take the CPUs the others leave at the
rate before the sizer's step. While the cluster has room such a stage is planned one sizing step ahead
of what it carries (``elastic_costs``): the sizer adds remote workers only where their stage binds, so
the other stages are planned to carry that step, or neither would move.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from intune.knobs import Knob
from intune.monitor.observation import Observation
from intune.policies.remote_sizing import STEP_SHARE
from intune.policies.stage_costs import StageProfile, profile_of

NEAR_BEST = 0.98  # allocations predicted within this share of the best rate compete on workers and memory
DEMAND_HEADROOM = 1.1  # rate planned above a known consumer demand, for its jitter
STAGE_MARGIN = 1.1  # a stage left with fewer workers keeps this much capacity above the goal: rates are measured within ~10%
SATURATED = 0.9  # share of the CPUs the stages must use for their workers to be descheduled
CONTENTION_MIN_CORES = 0.1  # CPU a stage must use for its wall/CPU ratio to measure the contention
LOCAL_MIN_SHARE = 0.05  # share of a stage's elements its local workers must process for their cost to be read


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


__all__ = ["NEAR_BEST", "STAGE_MARGIN", "Plan", "StageCosts", "contention", "elastic_costs", "fit_costs",
           "local_items", "plan_workers", "with_scaling"]
