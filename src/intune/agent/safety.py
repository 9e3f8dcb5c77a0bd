"""The safety layer: which moves are allowed, and how simultaneous moves share the CPUs and memory.

Exploration must never crash the job, so every action (greedy or random, pretraining or live) passes
through here. ``mask`` forbids, per knob, moves out of bounds, worker increases beyond the free CPUs
or whose workers' memory would push projected memory past ``margin`` of the limit, buffer increases
past that margin, and anything but shrinking buffers while memory is already past it. ``select``
then resolves the knobs jointly (decreases first, then increases in order of preference while the
CPUs and memory last). It must not learn or score actions itself.

Memory is projected pessimistically: every buffer full to its knob's size, and each added worker
costing the most that one worker was seen to cost (the change of memory outside buffers per worker
added or removed, over the recent ticks, with a 25% allowance for noise); until a change has been
seen, the memory outside buffers divided by the workers, an upper bound since it includes the base.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from intune.knobs import Knob
from intune.observation import Observation

MB = 1 << 20
PROBE_WORKER_BYTES = 512 * MB  # what a first added worker may cost while no worker cost was observed


class SafetyLayer:
    def __init__(self, knobs: Sequence[Knob], deltas: Sequence[int], margin: float = 0.8) -> None:
        self.knobs = list(knobs)
        self.deltas = np.asarray(deltas, dtype=np.int64)
        self.zero = int(np.flatnonzero(self.deltas == 0)[0])
        self.margin = margin
        self._is_cpu = np.array([k.unit == "cpu" for k in self.knobs])
        self._stages = [k.stage for k in self.knobs]
        self._lo = np.array([k.min for k in self.knobs])[:, None]
        self._hi = np.array([k.max for k in self.knobs])[:, None]
        self._last_point: tuple[int, float] | None = None
        self._changes: list[tuple[int, float]] = []  # (change of workers, change of memory outside buffers)

    # -- projections ---------------------------------------------------------------------------
    def track(self, obs: Observation) -> None:
        """Learn what a worker costs from how memory outside buffers moved with the worker count."""
        if obs.oom or obs.throughput <= 0:
            return
        workers = sum(s.workers for s in obs.stages)
        outside = obs.memory_used_bytes - sum(s.buffered_bytes for s in obs.stages)
        if self._last_point is not None and workers != self._last_point[0]:
            self._changes = [*self._changes[-15:], (workers - self._last_point[0], outside - self._last_point[1])]
        self._last_point = (workers, outside)

    @property
    def knows_worker_cost(self) -> bool:
        return bool(self._changes)

    def worker_memory_bytes(self, obs: Observation) -> float:
        """What one more worker may cost: the recent slope of memory over workers (least squares
        through the origin, +25%), capped by the upper bound (memory outside buffers / workers)."""
        workers = sum(s.workers for s in obs.stages)
        outside = obs.memory_used_bytes - sum(s.buffered_bytes for s in obs.stages)
        upper = max(0.0, outside) / max(workers, 1)
        if not self._changes:
            return upper
        dw = np.array([c[0] for c in self._changes], dtype=float)
        dm = np.array([c[1] for c in self._changes])
        slope = max(0.0, float(np.dot(dw, dm) / np.dot(dw, dw)))
        return min(upper, 1.25 * slope)

    def worst_case_memory(self, obs: Observation, values: Sequence[int]) -> float:
        """Memory if every buffer filled to its knob's size (never less than what is used now)."""
        buffered = {s.name: s.buffered_bytes for s in obs.stages}
        room = sum(max(0.0, v * MB - buffered.get(stage, 0.0))
                   for stage, v, is_cpu in zip(self._stages, values, self._is_cpu) if not is_cpu)
        return obs.memory_used_bytes + room

    def memory_budget(self, obs: Observation, values: Sequence[int]) -> float:
        """Bytes that may still be added before projected memory reaches the margin."""
        if obs.memory_limit_bytes <= 0:
            return float("inf")
        return self.margin * obs.memory_limit_bytes - self.worst_case_memory(obs, values)

    # -- step units ---------------------------------------------------------------------------------
    def units(self, obs: Observation) -> np.ndarray:
        """Knob-value change of one action step, per knob: 1 worker, or one item's bytes in MB (>= 1).

        A buffer is worth what it holds in items, and a 9 MB batch needs 9 MB steps to matter within
        a few ticks; the paper's 1 MB unit would need hundreds of ticks to reach a useful depth.
        """
        item_mb = {s.name: s.bytes_per_item / MB for s in obs.stages}
        return np.array([1 if is_cpu else max(1, int(round(item_mb.get(stage, 0.0))))
                         for stage, is_cpu in zip(self._stages, self._is_cpu)])

    def moves(self, choice: np.ndarray, obs: Observation) -> np.ndarray:
        """Knob-value changes of the chosen action indices."""
        return self.deltas[choice] * self.units(obs)

    # -- the mask --------------------------------------------------------------------------------
    def mask(self, obs: Observation, values: Sequence[int] | None = None) -> np.ndarray:
        """``[n_knobs, n_actions]`` bool: the moves each knob may make on its own this tick.

        Call it once per tick: it also updates the estimate of a worker's memory.
        """
        self.track(obs)
        values = [k.value for k in self.knobs] if values is None else list(values)
        v = np.asarray(values, dtype=np.int64)[:, None]
        lo, hi = self._lo, self._hi
        step = self.deltas[None, :] * self.units(obs)[:, None]
        new = v + step
        allowed = (new >= lo) & (new <= hi)
        allowed[:, self.zero] = True
        up = step > 0

        free_cpus = int(np.floor(obs.free_cpus + 1e-9))
        budget = self.memory_budget(obs, values)
        per_worker = self.worker_memory_bytes(obs)
        cost = step * np.where(self._is_cpu, per_worker, float(MB))[:, None]
        if not self.knows_worker_cost:  # a single +1 probe is priced at most PROBE_WORKER_BYTES
            probe = self._is_cpu[:, None] & (step == 1)
            cost = np.where(probe, np.minimum(cost, PROBE_WORKER_BYTES), cost)
        cpu_ok = ~self._is_cpu[:, None] | (step <= free_cpus)
        allowed &= ~up | (cpu_ok & (cost <= budget))

        danger = obs.oom or (obs.memory_limit_bytes > 0 and obs.memory_used_bytes > self.margin * obs.memory_limit_bytes)
        if danger or budget < 0:  # past the margin: only shrinking buffers (or holding) is allowed
            allowed &= ~up
            down = self.deltas < 0
            for k in np.flatnonzero(~self._is_cpu):
                if allowed[k, down].any():
                    allowed[k, ~down] = False
        return allowed

    # -- joint resolution ----------------------------------------------------------------------
    def select(self, scores: np.ndarray, allowed: np.ndarray, obs: Observation, values: Sequence[int] | None = None) -> np.ndarray:
        """Action index per knob: each knob's best allowed move, then increases granted jointly.

        Increases are granted in order of their advantage over holding, while the free CPUs and the
        memory budget last; an increase that does not fit falls back to the best smaller increase that
        does, else to holding.
        """
        values = [k.value for k in self.knobs] if values is None else list(values)
        unit = self.units(obs)
        masked = np.where(allowed, scores, -np.inf)
        choice = masked.argmax(axis=1)
        chosen = self.deltas[choice] * unit
        cpu_budget = int(np.floor(obs.free_cpus + 1e-9)) - int(chosen[self._is_cpu & (chosen < 0)].sum())
        mem_budget = self.memory_budget(obs, values)
        per_worker = self.worker_memory_bytes(obs)
        # shrinking buffers frees memory; a removed worker's memory is not counted on
        mem_budget -= float(chosen[~self._is_cpu & (chosen < 0)].sum()) * MB

        probing = not self.knows_worker_cost
        rising = np.flatnonzero(chosen > 0)
        advantage = masked[rising, choice[rising]] - masked[rising, self.zero]
        for k in rising[np.argsort(-advantage, kind="stable")]:
            # the wanted increase, else smaller increases in order of preference; never a decrease
            options = [a for a in np.argsort(-masked[k], kind="stable")
                       if allowed[k, a] and 0 < self.deltas[a] <= self.deltas[choice[k]]]
            choice[k] = self.zero
            for a in options:
                d = int(self.deltas[a] * unit[k])
                cost = d * (per_worker if self._is_cpu[k] else float(MB))
                if self._is_cpu[k]:
                    if d > cpu_budget:
                        continue
                    if cost > mem_budget and probing and d == 1:  # cost unknown: one probe worker per tick
                        cost, probing = min(cost, PROBE_WORKER_BYTES), False
                if cost <= mem_budget:
                    choice[k] = a
                    if self._is_cpu[k]:
                        cpu_budget -= d
                    mem_budget -= cost
                    break
        return choice
