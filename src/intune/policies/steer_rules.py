"""The rules of the ``steer`` policy, in the order they act on one tick's choice of worker moves.

A choice is one action index per knob (into ``SafetyLayer.deltas``): the proposal first (hold, or what
``propose`` asked for), then each rule in ``RULES`` may replace it. A rule returns the new choice, or
None when it does not apply. Once a ``final`` rule acts, the rules after it are skipped, except the
``always`` one (idle CPUs). The rules move workers only; buffer moves are the proposal's, and the hard
limits (``SafetyLayer.hard_limits``: the shuffle floor, buffers cut to fit the memory) act after them.
Every worker move a rule makes is one the safety mask allows on its own, and at most one worker is
added past the free CPUs, only to a light stage (which the runner grants), so the safety limits still
hold. The rules read the allocation memory (``AllocationMemory``: throughput per worker vector,
recently measured) and the stages' busy shares. It must not hold the policy's bookkeeping
(``intune.policies.steer``) nor touch a knob.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from intune.monitor.observation import Observation
from intune.policies.allocation_memory import Workers

if TYPE_CHECKING:
    from intune.policies.steer import SteerConfig, SteerPolicy


class Tick:
    """What the rules read on one tick, the choice so far, and the moves they build from it."""

    def __init__(self, policy: SteerPolicy, obs: Observation, values: list[int], mask: np.ndarray, choice: np.ndarray) -> None:
        self.safety = policy.safety
        self.obs, self.values, self.mask, self.choice = obs, values, mask, choice
        self.now = np.asarray(values, dtype=np.int64)
        self.cpu = np.flatnonzero(policy.is_cpu)  # indices of the CPU knobs
        self.position = {k: i for i, k in enumerate(self.cpu.tolist())}  # knob index -> index among them
        self.current: Workers = tuple(self.now[self.cpu].tolist())
        self.free = int(np.floor(obs.free_cpus + 1e-9))  # negative when over-allocated after a shrink
        self.light = set(obs.light_stages())
        self.busy = {s.name: s.busy for s in obs.stages}
        deltas = self.safety.deltas
        self.up, self.down = int(np.flatnonzero(deltas == 1)[0]), int(np.flatnonzero(deltas == -1)[0])
        self.zero = self.safety.zero
        self.steering = policy.memory.enabled and policy.config.probe_after > 0 and len(self.cpu) > 0

    def stage(self, k: int) -> str:
        return self.safety.knobs[k].stage

    def busy_of(self, k: int) -> float:
        return self.busy.get(self.stage(k), 0.0)

    def worker_moves(self, choice: np.ndarray | None = None) -> np.ndarray:
        """The change of each CPU knob under ``choice`` (default: the choice so far)."""
        return self.safety.moves(self.choice if choice is None else choice, self.obs)[self.cpu]

    def after(self, choice: np.ndarray | None = None) -> Workers:
        """The worker vector after ``choice``."""
        return tuple((self.now[self.cpu] + self.worker_moves(choice)).tolist())

    def held(self) -> np.ndarray:
        """The choice so far with every CPU knob held (its buffer moves stay)."""
        out = self.choice.copy()
        out[self.cpu] = self.zero
        return out

    def vector(self, moves: dict[int, int]) -> Workers:
        """The worker vector after ``moves`` (knob index -> change)."""
        after = self.now.copy()
        for k, d in moves.items():
            after[k] += d
        return tuple(after[self.cpu].tolist())

    def unfunded(self, choice: np.ndarray) -> np.ndarray:
        """``choice`` with its worker increases held if, some decreases held, they no longer fit the free
        CPUs (the runner would refuse them)."""
        if self.worker_moves(choice).sum() > self.free:
            choice = choice.copy()
            choice[self.cpu[self.worker_moves(choice) > 0]] = self.zero
        return choice

    def try_moves(self, moves: dict[int, int]) -> np.ndarray | None:
        """The held choice with these +-1 worker moves, if each is allowed and the runner would grant
        them together: an increase only while the workers fit the CPUs (over-allocated, only decreases
        pass); a lone +1 on a light stage needs no free CPU, only memory. Else None."""
        lone_light = len(moves) == 1 and list(moves.values()) == [1] and self.stage(next(iter(moves))) in self.light
        rising = any(d > 0 for d in moves.values())
        if not moves or (rising and sum(moves.values()) > self.free and not lone_light):
            return None
        out = self.held()
        for k, d in moves.items():
            allowed = self.mask[k, self.up if d > 0 else self.down] or (
                lone_light and self.safety.memory_allows_worker(self.obs, self.values, k))
            if not allowed:
                return None
            out[k] = self.up if d > 0 else self.down
        return out

    def step_towards(self, target: Workers) -> np.ndarray | None:
        """One worker back where ``target`` has more (paid by the free CPUs or the workers given back),
        with every worker ``target`` has fewer given back; else only those given back; else None."""
        diff = np.asarray(target, dtype=np.int64) - self.now[self.cpu]
        falling = {int(self.cpu[i]): -1 for i in np.flatnonzero(diff < 0)}
        rising = [int(self.cpu[i]) for i in np.flatnonzero(diff > 0)]
        for moves in ([{**falling, rising[0]: 1}] if rising else []) + [falling]:
            out = self.try_moves(moves)
            if out is not None:
                return out
        return None

    def most_workers(self) -> int:
        """The most workers the CPU knobs can have again: those in place now (over-allocated after a
        shrink, the runner lets them run), or as many as the runner grants: the CPUs (or the knobs'
        minimums), plus the one worker it grants a light stage past them."""
        least = sum(self.safety.knobs[k].min for k in self.cpu.tolist())
        granted = max(int(np.floor(self.obs.cpus + 1e-9)), least) + (1 if self.light else 0)
        return max(granted, int(self.now[self.cpu].sum()))

    def busiest(self) -> int:
        """The CPU knob of the stage busy the largest share of the tick."""
        return int(max(self.cpu.tolist(), key=self.busy_of))

    def busy_neck(self, config: SteerConfig) -> int | None:
        """The busiest stage's CPU knob if busy at least ``swap_busy`` of the tick and not light, else None."""
        neck = self.busiest()
        return None if self.busy_of(neck) < config.swap_busy or self.stage(neck) in self.light else neck

    def idle_donor(self, config: SteerConfig, neck: int | None) -> tuple[int, float] | None:
        """(donor, its idle workers) for a worker to the busy bottleneck: the stage with the most idle
        workers (workers x share of the tick not busy), if at least ``swap_idle``; else None."""
        if neck is None:
            return None
        idle = {k: self.now[k] * (1.0 - self.busy.get(self.stage(k), 1.0))
                for k in self.cpu.tolist() if k != neck and self.now[k] > self.safety.knobs[k].min}
        donor = max(idle, key=idle.__getitem__, default=None)
        if donor is None or idle[donor] < config.swap_idle:
            return None
        return donor, float(idle[donor])


# ---------------------------------------------------------------------------------------- the rules


def hold_to_settle(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """After the workers move, hold them ``dwell_ticks`` ticks: a vector's reading is only settled once
    it covers a whole tick, and every later rule judges moves by settled readings."""
    if not p.memory.enabled or not t.worker_moves().any():
        return None
    return t.held() if p.moved_once and p.held_ticks < p.config.dwell_ticks else None


def hold_off_worse(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """Hold the workers where the proposed moves lead to a vector recently measured clearly worse than
    the current one: a proposer can be confidently wrong, a measurement is not. Buffer moves go through."""
    if not p.memory.enabled or not t.worker_moves().any():
        return None
    return t.held() if p.memory.is_worse(t.after(), t.current) else None


def undo_unpaid_trial(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """Step back from a probe or swap once its vector has a settled reading, if it did not pay: a swap
    must not be clearly worse than where it started; a light stage's worker must be clearly better (it
    leaves its CPU unused, so the free CPUs never run out and each probe would otherwise add one more)."""
    if not t.steering or p.trial is None:
        return None
    origin, tried, must_gain = p.trial
    reading = p.memory.recall(tried)
    if t.current != tried:
        p.trial = None  # moved on (the proposal, or a resize)
        return None
    if reading is None or not reading.settled:
        return None
    p.trial = None
    failed = not p.memory.is_better(tried, origin) if must_gain else p.memory.is_worse(tried, origin)
    return t.step_towards(origin) if failed else None


def swap_idle_to_neck(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """Move one worker to the busy bottleneck from the stage with the most idle workers, over the
    proposal, unless the proposal already adds there: a stage busy all the tick while another idles
    whole workers is clear evidence. Judged like a probe (``undo_unpaid_trial``); needs the mask to allow
    the donor a worker back, so that it can be undone, and a swap not measured recently."""
    if not t.steering or p.held_ticks < p.config.dwell_ticks:
        return None
    neck = t.busy_neck(p.config)
    found = t.idle_donor(p.config, neck)
    if neck is None or found is None:
        return None
    donor = found[0]
    swap = {neck: 1, donor: -1}
    if p.memory.recall(t.vector(swap)) is not None:
        return None
    out = t.try_moves(swap)
    if out is None or t.worker_moves()[t.position[neck]] > 0 or not t.mask[donor, t.up]:
        return None
    p.trial = (t.current, t.vector(swap), False)
    return out


def shed_idle_workers(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """Over-allocated (after a shrink the runner grants no worker until the workers fit the CPUs), take
    idle workers off the stage with the most of them (5 at a time while more than 5 idle), so that the
    busy bottleneck can grow again."""
    if not t.steering or t.free >= 0:
        return None
    found = t.idle_donor(p.config, t.busy_neck(p.config))
    if found is None:
        return None
    donor, idle = found
    for d in (-5, -1):
        a = np.flatnonzero(t.safety.deltas == d)
        if len(a) and idle >= -d + 0.5 and t.mask[donor, int(a[0])]:
            out = t.held()
            out[donor] = int(a[0])
            return out
    return None


def keep_neck_workers(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """Hold a proposed move of a worker off the busy bottleneck, or off another stage as busy unless it
    goes to the bottleneck (a co-bottleneck loses as much from one worker less), and what that worker
    would have paid for; unless the memory knows the result to be clearly better. Over-allocated, the
    workers must go: no hold."""
    if not t.steering or t.free < 0:
        return None
    neck = t.busy_neck(p.config)
    if neck is None:
        return None
    moves = t.worker_moves()
    feeds_neck = moves[t.position[neck]] > 0
    saturated = [k for i, k in enumerate(t.cpu.tolist()) if moves[i] < 0 and (
        k == neck or (not feeds_neck and t.busy_of(k) >= p.config.swap_busy and t.stage(k) not in t.light))]
    if not saturated or p.memory.is_better(t.after(), t.current):
        return None
    choice = t.choice.copy()
    choice[saturated] = t.zero
    return t.unfunded(choice)


def hold_toward_best(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """Hold the proposed worker moves away from the remembered vector clearly better than the current
    one (and the increases they paid for): they could only lose more, and over-allocated the runner
    would apply the decreases and refuse the increases."""
    best = p.memory.best() if t.steering else None
    moves = t.worker_moves()
    if best is None or not p.memory.is_better(best[0], t.current) or not moves.any():
        return None
    diff = np.asarray(best[0], dtype=np.int64) - t.now[t.cpu]
    away = (moves * diff < 0) | ((diff == 0) & (moves != 0))
    if not away.any():
        return None
    choice = t.choice.copy()
    choice[t.cpu[away]] = t.zero
    return t.unfunded(choice)


def let_proposal_explore(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """A proposal that moves the workers to a vector not measured recently goes through as it is, and no
    step back or probe replaces it this tick: it brings a new measurement, as a probe would."""
    if t.steering and t.worker_moves().any() and p.memory.recall(t.after()) is None:
        return t.choice
    return None


def step_back_to_best(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """When the proposal holds or moves among vectors measured recently, step towards the best vector the
    runner can grant again (``Tick.most_workers``), if it is clearly better than the current one:
    a hill climber keeps the best point it found."""
    best = p.memory.best() if t.steering else None
    if best is None or not p.memory.is_better(best[0], t.current):
        return None
    target = p.memory.best(t.most_workers())
    if target is None or not p.memory.is_better(target[0], t.current):
        return None
    return t.step_towards(target[0])


def probe_neck(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """After ``probe_after`` ticks without a new vector, try one not measured recently, most promising
    first (``probe_moves``): the only way to learn whether the bottleneck gains from a worker. A worker
    is not taken where the mask would not give it back. A light stage's worker is judged by
    ``undo_unpaid_trial``."""
    if not t.steering or p.fresh_ticks < p.config.probe_after:
        return None
    for moves in probe_moves(p, t):
        probed = t.vector(moves)
        if p.memory.recall(probed) is not None or any(d < 0 and not t.mask[k, t.up] for k, d in moves.items()):
            continue
        out = t.try_moves(moves)
        if out is not None:
            if any(d > 0 and t.stage(k) in t.light for k, d in moves.items()):
                p.trial = (t.current, probed, True)
            return out
    return None


def probe_moves(p: SteerPolicy, t: Tick) -> list[dict[int, int]]:
    """Probe moves, most promising first: one worker more on the busiest stage (from a free CPU, or past
    the CPUs if the stage is light), one moved there from the stage with the most idle workers (or the
    next one), then one more on any other light stage busy at least ``light_busy``."""
    starved = {s.name: s.starved for s in t.obs.stages}
    order = sorted(t.cpu.tolist(), key=lambda k: (-t.busy_of(k), starved.get(t.stage(k), 0.0)))
    neck = order[0]
    # a stage with 2 workers half idle has 1 idle worker: it gives it up only by becoming the next bottleneck
    idle = {k: t.now[k] * (1.0 - t.busy_of(k)) for k in order}
    donors = sorted((k for k in order if k != neck and t.now[k] > t.safety.knobs[k].min), key=lambda k: -idle[k])
    out: list[dict[int, int]] = [{neck: 1}] if t.free >= 1 or t.stage(neck) in t.light else []
    out += [{neck: 1, d: -1} for d in donors[:2]]
    out += [{k: 1} for k in order[1:] if t.stage(k) in t.light and t.busy_of(k) >= p.config.light_busy]
    return out


def fill_idle_cpus(p: SteerPolicy, t: Tick) -> np.ndarray | None:
    """CPUs left free after the moves so far (at least ``fill_free_cpus``) go to the busiest stage, +5
    when 5 are free (behind a proposer, only if it is saturated: ``fill_saturated``), else +1, if its
    workers are busy at least ``fill_busy`` and not light (those wait on something else than the
    CPUs): an idle CPU earns nothing. Not when the moves already add there, a step back to a better
    vector is due, or the memory knows the result to be worse."""
    if p.config.fill_free_cpus <= 0 or not len(t.cpu):
        return None
    free = t.free - int(t.worker_moves().sum())
    neck = t.busiest()
    if (free < p.config.fill_free_cpus or t.worker_moves()[t.position[neck]] > 0
            or t.busy_of(neck) < p.config.fill_busy or t.stage(neck) in t.light):
        return None
    best = p.memory.best()
    if best is not None and p.memory.is_better(best[0], t.current):
        return None
    saturated = p.propose is None or t.busy_of(neck) >= p.config.fill_saturated
    steps = (5, 1) if free >= 5 and saturated else (1,)
    for delta in (d for d in steps if d in t.safety.deltas):
        out = t.choice.copy()
        out[neck] = int(np.flatnonzero(t.safety.deltas == delta)[0])
        if t.mask[neck, out[neck]] and not p.memory.is_worse(t.after(out), t.current):
            return out
    return None


@dataclass(frozen=True)
class Rule:
    """One rule and how it ends a tick: once a ``final`` rule acts, the rules after it are skipped, except
    the ``always`` ones."""

    fn: Callable[[SteerPolicy, Tick], np.ndarray | None]
    final: bool = False
    always: bool = False

    @property
    def name(self) -> str:
        return self.fn.__name__


RULES: tuple[Rule, ...] = (
    Rule(hold_to_settle),  # guards on the proposal
    Rule(hold_off_worse),
    Rule(undo_unpaid_trial, final=True),  # judge the last trial
    Rule(swap_idle_to_neck, final=True),  # clear evidence of a bottleneck, over the proposal
    Rule(shed_idle_workers, final=True),
    Rule(keep_neck_workers),  # holds on the proposal's moves
    Rule(hold_toward_best),
    Rule(let_proposal_explore, final=True),  # the proposal holds or revisits: climb
    Rule(step_back_to_best, final=True),
    Rule(probe_neck, final=True),
    Rule(fill_idle_cpus, always=True),  # whatever decided, no CPU left idle
)
"""The rules in the order they act on a tick's choice."""
