"""``steer``: a bottleneck-driven hill climber over the worker counts (registry name ``steer``).

The kind of runtime tuner cedar (PVLDB 2024) uses: it starts from the even split of the CPUs, then
moves workers towards the stage that is busy the whole tick, keeps a move only where the measured
throughput shows it pays, and goes back to the best allocation it measured. One tick:

1. the throughput of the last tick is recorded against the worker vector that produced it
   (``AllocationMemory``: recent readings per vector at the current CPU count);
2. the safety mask (``SafetyLayer.mask``: knob bounds, free CPUs, projected memory) says which moves
   each knob may make on its own;
3. the proposal: hold every knob, or what ``propose(observation, values, mask)`` asks for (a network,
   another policy), resolved jointly under the CPUs and memory by ``SafetyLayer.select``;
4. the rules (``intune.policies.steer_rules.RULES``) act on that choice in order; which of them acted
   is in ``last_rules``, and how often each acted in ``rule_ticks``;
5. the hard limits (``SafetyLayer.hard_limits``): the user's shuffle window as a floor while memory is
   comfortable, buffers that cannot fit when full cut now;
6. the request: the knobs whose value changes.

Stage kinds come from the observation (``Observation.kinds``). Remote knobs (``Knob.remote``) are
sized by the shared rule (``intune.policies.remote_sizing.RemoteSizer``: remote workers go to the
remote map stage while they pay or until the demand is met, and are shed when it is met with margin);
the rules above move the local workers, and the allocation memory forgets what it measured whenever
the remote workers change (the same local workers then deliver something else). It must not touch
knobs: it returns requests, and the runner (``intune.policies.runner``) applies them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from intune.knobs import Knob
from intune.monitor.observation import MEMORY_SAFE_FRACTION, Observation
from intune.policies.allocation_memory import AllocationMemory
from intune.policies.remote_sizing import with_remote_placement
from intune.policies.safety import SafetyLayer, shuffle_floor, start_allocation
from intune.policies.steer_rules import RULES, Rule, Tick

Propose = Callable[[Observation, list[int], np.ndarray], "np.ndarray | None"]


@dataclass
class SteerConfig:
    """Hyperparameters of the steering rules (defaults: the shipped agent's ``AgentConfig``)."""

    memory_ticks: int = 120
    """Ticks a worker vector's measured throughput is remembered (0: no memory, and no steering)."""

    memory_tolerance: float = 0.05
    """How much worse (relative) a remembered vector must be to count as clearly worse; about the live
    noise. Doubled when a value comes only from the tick right after a change (partly transitional)."""

    memory_drift: float = 0.25
    """A settled reading this far (relative) from the current vector's average means the workload
    changed, and every vector is forgotten (0: only ``memory_ticks`` expiry forgets)."""

    dwell_ticks: int = 1
    """Ticks the workers hold after a move, so that the new vector's throughput is measured settled."""

    probe_after: int = 5
    """Ticks without a new worker vector before a probe (``probe_neck``); 0: no probes, and none of the
    rules that need the memory's judgement (undo, swap, shed, bottleneck holds, step back)."""

    fill_free_cpus: int = 2
    """Free CPUs, left after the other moves, from which the busiest stage gets more workers (+5 when 5
    are free, else +1), unless the memory knows that to be worse (0: never)."""

    trim_margin: float = 0.65
    """Share of the memory limit that the buffers, if full, plus what is used outside them may take
    before buffers are cut in one tick (``SafetyLayer.trim``); below ``memory_margin`` because that
    projection misses memory that only comes once data flows."""

    memory_margin: float = MEMORY_SAFE_FRACTION
    """The safety mask never lets projected memory use exceed this fraction of the limit (where the
    reward starts to fall)."""

    action_deltas: tuple[int, ...] = (-5, -1, 0, 1, 5)
    """Per-knob moves, in steps (``SafetyLayer.units``); must hold -1, 0 and +1."""

    fill_busy: float = 0.8
    """Free CPUs go to the busiest stage only if its workers are busy at least this share of the tick."""

    fill_saturated: float = 0.97
    """Behind a proposer (``intune+steer``), busy share from which the busiest stage takes +5 from 5 free
    CPUs (below it, +1): a proposer cuts a stage to what its measured load needs, and +5 at ``fill_busy``
    gives the cut back, so that the two undo each other every few ticks. A saturated stage's need is
    unknown (it takes every row it can). Without a proposer nothing cuts, and +5 ramps the stage."""

    swap_busy: float = 0.9
    """Busy share from which a stage is a bottleneck whose workers are kept and to which idle workers move."""

    swap_idle: float = 1.5
    """Idle workers (workers x share of the tick not busy) a stage must have to give one to the bottleneck."""

    light_busy: float = 0.5
    """Busy share from which a light stage other than the busiest is probed with one worker more."""


@with_remote_placement
class SteerPolicy:
    """The steering rules on a proposal: ``propose=None`` holds every knob (the ``steer`` baseline).

    ``propose(observation, values, mask)`` returns an action index per knob of ``safety.knobs`` (into
    ``safety.deltas``), or scores per knob and action (Q-values: resolved as such), or None (hold). If it
    has a ``reset(knobs, observation)`` method, ``reset`` calls it. ``rules`` replaces ``RULES`` (an
    ablation). ``warm_start``: ``even`` (the even split) or ``plumber`` (Plumber's plan from the first
    observation), fitted to the memory (``safety.start_allocation``), or ``none`` (the knobs as they are).
    """

    name = "steer"

    def __init__(
        self,
        propose: Propose | None = None,
        config: SteerConfig | None = None,
        rules: Sequence[Rule] | None = None,
        warm_start: str = "even",
    ) -> None:
        if warm_start not in ("even", "plumber", "none"):
            raise ValueError(f"warm_start must be 'even', 'plumber' or 'none', got {warm_start!r}")
        self.propose = propose
        self.config = config or SteerConfig()
        self.rules = tuple(RULES if rules is None else rules)
        self.warm_start = warm_start

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        c = self.config
        self.knobs = dict(knobs)
        self.safety = SafetyLayer(list(self.knobs.values()), c.action_deltas, c.memory_margin, c.trim_margin)
        self.memory = AllocationMemory(c.memory_ticks, c.memory_tolerance, drift=c.memory_drift)
        self.is_cpu = np.array([k.unit == "cpu" for k in self.safety.knobs], dtype=bool)
        self.floor = shuffle_floor(self.safety, observation)  # the user's shuffle window (a hard limit)
        self.held_ticks = 0  # ticks the workers have not moved
        self.fresh_ticks = 0  # ticks since the workers last went to a vector not measured recently
        self.moved_once = False
        self.trial: tuple[tuple[int, ...], tuple[int, ...], bool] | None = None  # (origin, tried, must gain): a probe or swap to judge
        self.rule_ticks: Counter[str] = Counter()
        self.last_rules: tuple[str, ...] = ()
        self.last_choice: np.ndarray | None = None  # the action index per knob requested last tick (None: the start)
        self.remote_seen = observation.allocated_remote_cpus  # remote workers the memory's readings had beside them
        self._start = None if self.warm_start == "none" else start_allocation(self.knobs, self.safety, observation, self.warm_start)
        reset = getattr(self.propose, "reset", None)
        if reset is not None:
            reset(knobs, observation)

    def state_dict(self) -> dict[str, Any]:
        """What the rules have measured and where they are, as plain values: the allocation memory
        (throughput per worker vector), the safety layer's worker costs, the ticks held and since a new
        vector, the trial being judged, the rules' counts, and the proposer's state if it has one.
        Call it on a policy that has been ``reset`` (the tuner does)."""
        trial = None if self.trial is None else [list(self.trial[0]), list(self.trial[1]), bool(self.trial[2])]
        state_of = getattr(self.propose, "state_dict", None)
        return {
            "memory": self.memory.state_dict(),
            "safety": self.safety.state_dict(),
            "held_ticks": self.held_ticks,
            "fresh_ticks": self.fresh_ticks,
            "moved_once": self.moved_once,
            "trial": trial,
            "rule_ticks": dict(self.rule_ticks),
            "proposer": state_of() if callable(state_of) else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``, on a policy ``reset`` on the same knobs. The warm start is
        skipped: the knobs already hold the saved allocation (restored by the tuner)."""
        self.memory.load_state_dict(state["memory"])
        self.safety.load_state_dict(state["safety"])
        self.held_ticks = int(state["held_ticks"])
        self.fresh_ticks = int(state["fresh_ticks"])
        self.moved_once = bool(state["moved_once"])
        trial = state["trial"]
        self.trial = None if trial is None else (tuple(int(w) for w in trial[0]), tuple(int(w) for w in trial[1]), bool(trial[2]))
        self.rule_ticks = Counter({str(k): int(v) for k, v in state["rule_ticks"].items()})
        if state["proposer"] is not None:
            load = getattr(self.propose, "load_state_dict", None)
            if not callable(load):
                raise ValueError("steer policy state: it holds a proposer's state, but this policy's proposer keeps none")
            load(state["proposer"])
        self._start = None
        self.last_rules, self.last_choice = (), None

    def step(self, observation: Observation) -> dict[str, int]:
        if observation.allocated_remote_cpus != self.remote_seen:  # another pipeline around the same local workers
            self.remote_seen = observation.allocated_remote_cpus
            self.memory.forget()
        # the throughput of the last tick belongs to the workers in place now, before this tick's move
        workers = tuple(int(k.value) for k, c in zip(self.safety.knobs, self.is_cpu, strict=True) if c)
        self.memory.observe(observation.cpus, workers, observation.throughput, valid=not observation.oom)
        if self._start is not None:
            start, self._start = self._start, None
            self.safety.track(observation)  # so the start's change of workers teaches what a worker costs
            self.last_rules, self.last_choice = ("start",), None
            return start
        values = [k.value for k in self.safety.knobs]
        mask = self.safety.mask(observation, values)
        tick = Tick(self, observation, values, mask, self._proposal(observation, values, mask))
        acted, decided = [], False
        for rule in self.rules:
            if decided and not rule.always:
                continue
            out = rule.fn(self, tick)
            if out is not None:
                tick.choice = out
                acted.append(rule.name)
                decided = decided or rule.final
        wanted, choice = self.safety.hard_limits(tick.choice, observation, values, self.floor)
        if (wanted != tick.now + self.safety.moves(tick.choice, observation)).any():
            acted.append("hard_limits")
        self.last_rules, self.last_choice = tuple(acted), choice
        self.rule_ticks.update(acted)
        moved = bool((wanted != tick.now)[self.is_cpu].any())
        self.held_ticks = 0 if moved else self.held_ticks + 1
        fresh = moved and self.memory.recall(tuple(wanted[self.is_cpu].tolist())) is None
        self.fresh_ticks = 0 if fresh else self.fresh_ticks + 1
        self.moved_once = self.moved_once or moved
        return {k.name: int(w) for k, v, w in zip(self.safety.knobs, values, wanted, strict=True) if w != v}

    def _proposal(self, obs: Observation, values: list[int], mask: np.ndarray) -> np.ndarray:
        """The proposer's choice resolved under the joint limits; hold everything without one."""
        hold = np.full(len(values), self.safety.zero, dtype=np.int64)
        proposed = None if self.propose is None else self.propose(obs, values, mask)
        if proposed is None:
            return hold
        scores = np.asarray(proposed, dtype=float)
        if scores.ndim == 1:  # action indices: the proposed action first, then holding
            scores = np.zeros(mask.shape)
            scores[:, self.safety.zero] = 0.5
            scores[np.arange(len(values)), np.asarray(proposed, dtype=np.int64)] = 1.0
        return self.safety.select(scores, mask, obs, values)

    # -- auditing: ticks on which a rule acted ------------------------------------------------------
    @property
    def probes(self) -> int:
        return self.rule_ticks["probe_neck"]

    @property
    def swaps(self) -> int:
        return self.rule_ticks["swap_idle_to_neck"]

    @property
    def sheds(self) -> int:
        return self.rule_ticks["shed_idle_workers"]

    @property
    def neck_holds(self) -> int:
        return self.rule_ticks["keep_neck_workers"]

    @property
    def reverts(self) -> int:
        return self.rule_ticks["undo_unpaid_trial"] + self.rule_ticks["step_back_to_best"]

    @property
    def guard_holds(self) -> int:
        return self.rule_ticks["hold_off_worse"]
