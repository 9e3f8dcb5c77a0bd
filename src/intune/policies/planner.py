"""``planner``: moves every knob at once to the allocation that per-stage rate models, fitted online,
predict best within the safe set.

The model and the plan of workers are ``intune.policies.rate_model``'s: each stage's cost per
delivered element read from what it did, fitted over the worker counts it was seen at, and workers added
to the slowest stage within the runner's budget. A model is fitted after ``PROFILE_TICKS`` settled ticks
at one allocation (``MIN_PROFILE_TICKS`` where the machine's tick noise, pooled over the fits so far,
already puts their mean rate within ``PROFILE_PRECISION``: ``TickSpread``).

The first plan comes from the pipeline's first tick (``_plan_first``): the allocation the job started
at is a guess, so nothing is protected by waiting for a window; that tick filled the buffers, so its
costs are read per row each stage processed.

The reach. A stage whose scaling only a measurement shows, thread workers (they share the GIL) or
workers that wait (on storage, a lock), reaches at most twice (+1) the most workers it was measured at;
process workers that compute scale with the CPUs, which the model holds, and reach what the budget
gives.

Buffers. The prefetch holds what the rate gap between the plan and the consumer calls for
(``prefetch_elements``, at least ``MIN_PREFETCH_ELEMENTS`` for jitter); the shuffle buffer stays at
the user's window (its size sets how random the order is); others hold. The slowest stage's own buffer
deepens where that stage idles starved (``_deepen_for_jitter``): on the stage that sets the rate,
waiting for input is rate lost to the stages' varying costs, which a deeper buffer absorbs.

Stability. A re-fitted model replaces the plan in force only where it predicts ``GAIN`` more than the
allocation in force under the same model, or, with fewer workers, at least ``NEAR_BEST`` of it where each
stage it takes workers from still carries the rate measured at the allocation in force with
``STAGE_MARGIN``: a model re-fitted on a noisy window must not walk the allocation down; such a plan then
stays unless it measures below the allocation before (the model misses a stage's loss to its
neighbours' jitter, which the measurement shows). What is measured outranks what is predicted: an
allocation already measured at these CPUs is judged by its measurement, and a plan that gives any
stage a worker is kept only where it measures above the allocation before it by more than the noise
(``intune.policies.measured_rate``; another fit while neither shown nor ruled out, ``MEASURED_TICKS``
at most), else the allocation before comes back and the better of the two rates is a ceiling the model
plans under for ``CEILING_TICKS`` (a limit outside the stages' costs: the consumer's process, a lock
the workers share).
A change of CPUs re-plans at once on the last costs (a CPU's work per element does not change with the
CPU count), each stage moving the way the CPUs did or holding (``_resize_plan``), and the model is then
re-fitted at the new allocation. A change of CPUs or of the remote workers beside the pipeline (a node
lost, workers placed) makes another machine: what was measured before is forgotten
(``_forget_measured``).

Beside remote workers (a stage's ``remote_workers``, sized by the shared rule of
``intune.policies.remote_sizing``): the stage's cost is its local workers' over the elements they
processed, and the elements its remote workers carried are a rate of their own beside its local
workers' (``StageCosts.remote``), costing no local CPU. Such a stage then takes the workers the other
stages leave in the budget (``plan_workers``'s ``fill``), and the sizer sheds the remote workers the
local ones replace. Those added local workers are judged as fewer workers are (kept unless they measure below): at the
trainer's demand the rate cannot show what they save. While the cluster has room, such a stage is planned
one sizing step ahead of what it carries (``elastic_costs``, at the sizer's ``step_share``). A stage
whose remote workers carried almost every element (its local workers under
``rate_model.LOCAL_MIN_SHARE``) keeps its last measured cost, or before any its workers.

Safety is not the planner's: every jump goes through ``SafetyLayer.admit`` (memory priced from measured
worker memory, buffers trimmed to the limit; where it admits part of a jump, the stage slowest now goes
first), and the runner's clamp applies the CPUs.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from intune.knobs import Knob
from intune.monitor.observation import MEMORY_SAFE_FRACTION, Observation
from intune.policies.base import cpu_budget, light_worker_room
from intune.policies.measured_rate import MEASURED_TICKS, Measured, TickSpread
from intune.policies.rate_model import (
    NEAR_BEST,
    STAGE_MARGIN,
    Plan,
    StageCosts,
    elastic_costs,
    fit_costs,
    plan_workers,
    with_scaling,
)
from intune.policies.remote_sizing import STEP_SHARE, with_remote_placement
from intune.policies.safety import TRIM_MARGIN, SafetyLayer, shuffle_floor, start_allocation
from intune.policies.stage_costs import jitter_elements, prefetch_elements
from intune.units import MB

PROFILE_TICKS = 4  # the most settled ticks at one allocation that one fit of the costs reads
MIN_PROFILE_TICKS = 2  # the fewest: where the delivered rate is known within ``PROFILE_PRECISION``
PROFILE_PRECISION = 0.02  # the standard error, as a share of the mean, at which a fit need not wait longer
SETTLE_TICKS = 1  # ticks left out of the fit after the first tick at a new allocation, itself left out (workers start, queues refill)
GAIN = 0.05  # what a new plan must predict above the allocation in force to replace it
MIN_PREFETCH_ELEMENTS = 2
JITTER_LOSS = 1.0 - NEAR_BEST  # the slowest stage's starved share past which its buffer deepens ...
JITTER_TARGET = JITTER_LOSS / 2  # ... to hold what lowers the share to this
MAX_JITTER_GROWTH = 8  # the most one fit multiplies a buffer by: one noisy window must not ask for gigabytes
SCALING_FITS = 8  # recent fits per stage that its scaling (cost per element over its workers) is fitted on
CEILING_TICKS = 120  # ticks a measured ceiling holds before the model may try past it again

log = logging.getLogger(__name__)


def _remote_placement(obs: Observation) -> tuple[float, ...]:
    """The remote cluster's CPUs and each stage's remote workers: what a measured rate depends on
    beside the local allocation and the CPUs."""
    return (obs.remote_cpus, *(float(s.remote_workers) for s in obs.stages))




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


__all__ = ["GAIN", "MIN_PROFILE_TICKS", "PROFILE_TICKS", "PlannerPolicy"]
