"""Allocation memory: the throughput recently measured at each worker vector, so the agent does not
move back into an allocation it has just seen to be worse.

A Q network trained in the simulator can be confidently wrong in a live state (live: it flipped
``udf.workers`` 2 -> 1 -> 2 every tick although 1 worker was measured ~35% slower). This module keeps,
per vector of CPU-knob values (buffers are second-order and would make keys never repeat), a smoothed
throughput and the tick it was last measured. ``is_worse`` tells the policy whether a move leads to a
vector measured, within ``ticks``, clearly below the current one; the policy then holds its CPU knobs.

What it remembers is only valid for one CPU count and one phase of the workload: everything is
forgotten when the CPU count changes, and an entry expires ``ticks`` after its last measurement, so a
drifting workload gets re-explored. It must not choose moves, nor know about knobs or the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Workers = tuple[int, ...]
DRIFT_AFTER = 3  # readings in a row of one vector before a change in its rate counts as drift


@dataclass
class Reading:
    """A worker vector's smoothed throughput, when it was last measured, and whether any measurement
    covered a whole tick under that vector (``settled``) or only the tick right after a change."""

    value: float
    tick: int
    settled: bool


class AllocationMemory:
    """Throughput per worker vector at the current CPU count; ``observe`` once per tick.

    - ``ticks``: how long a measurement stays usable (0 turns the memory off).
    - ``tolerance``: a vector is "clearly worse" below ``(1 - tolerance)`` x the current one's value;
      doubled when either value comes only from a tick right after a change (partly transitional:
      process workers start, queues refill).
    - ``smoothing``: weight of a new reading in the exponential average of readings of the same kind.
    - ``drift``: a settled reading further than this (relative) from the current vector's average means
      the workload changed: every reading is dropped (0: only expiry forgets). Only once the vector has
      been in place for ``DRIFT_AFTER`` readings: live, the dip after adding a process worker lasts two or
      three ticks, and forgetting on it let the network flip a worker back and forth (1 s ticks).
    """

    def __init__(
        self, ticks: int = 30, tolerance: float = 0.05, smoothing: float = 0.5, drift: float = 0.0
    ) -> None:
        if ticks < 0 or not 0.0 <= tolerance < 1.0 or not 0.0 < smoothing <= 1.0:
            raise ValueError(f"AllocationMemory: bad ticks={ticks} tolerance={tolerance} smoothing={smoothing}")
        self.ticks = ticks
        self.tolerance = tolerance
        self.smoothing = smoothing
        self.drift = drift
        self.tick = 0
        self._cpus: float | None = None
        self._previous: Workers | None = None
        self._run = 0  # readings in a row of the vector now in place
        self._best: tuple[tuple[int, int | None], tuple[Workers, Reading] | None] | None = None  # ((tick, limit), best())
        self._readings: dict[Workers, Reading] = {}

    @property
    def enabled(self) -> bool:
        return self.ticks > 0

    def forget(self) -> None:
        """Drop every reading (a resize: what was measured on other CPUs says nothing now)."""
        self._readings.clear()
        self._previous = None
        self._best = None

    def observe(self, cpus: float, workers: Workers, throughput: float, valid: bool = True) -> None:
        """The throughput measured over the last tick, during which ``workers`` were in place.

        ``valid=False`` (an OOM, a restart, nothing delivered) advances the clock without recording,
        and marks the next reading as transitional.
        """
        self.tick += 1
        if cpus != self._cpus:
            self._cpus = cpus
            self.forget()
        if not self.enabled:
            return
        if not valid or throughput <= 0:
            self._previous = None
            return
        settled = workers == self._previous  # the vector was already in place during the tick before
        self._run = self._run + 1 if settled else 1
        self._previous = workers
        old = self.recall(workers)
        steady = self._run >= DRIFT_AFTER
        if steady and old is not None and old.settled and self.drift > 0 and abs(throughput - old.value) > self.drift * old.value:
            # the same workers now run at a clearly different rate: the workload changed, and what the
            # other vectors showed no longer holds
            self._readings.clear()
            old = None
        if old is None or (settled and not old.settled):
            self._readings[workers] = Reading(float(throughput), self.tick, settled)
        elif settled == old.settled:
            old.value += self.smoothing * (float(throughput) - old.value)
            old.tick = self.tick
        # else: a transitional reading never overrides a settled one
        if len(self._readings) > 4 * max(self.ticks, 1):
            self._expire()

    def state_dict(self) -> dict[str, Any]:
        """The readings, the clock and the CPU count they hold for, as plain values (for a checkpoint)."""
        return {
            "tick": self.tick,
            "cpus": self._cpus,
            "run": self._run,
            "previous": None if self._previous is None else list(self._previous),
            "readings": [
                {"workers": list(w), "value": r.value, "tick": r.tick, "settled": r.settled}
                for w, r in self._readings.items()
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``: the same readings at the same ages. A restarted job reads a
        new CPU count as a resize and forgets them, as it would live."""
        self.tick = int(state["tick"])
        self._cpus = None if state["cpus"] is None else float(state["cpus"])
        self._run = int(state["run"])
        self._previous = None if state["previous"] is None else tuple(int(w) for w in state["previous"])
        self._readings = {
            tuple(int(w) for w in r["workers"]): Reading(float(r["value"]), int(r["tick"]), bool(r["settled"]))
            for r in state["readings"]
        }
        self._best = None

    def recall(self, workers: Workers) -> Reading | None:
        """The reading of ``workers`` if it was measured within ``ticks``, else None."""
        r = self._readings.get(workers)
        if r is None or self.tick - r.tick >= self.ticks:
            return None
        return r

    def is_worse(self, candidate: Workers, current: Workers) -> bool:
        """Whether ``candidate`` was recently measured clearly below ``current`` (False if either is unknown)."""
        if candidate == current:
            return False
        new, now = self.recall(candidate), self.recall(current)
        if new is None or now is None:
            return False
        tolerance = self.tolerance if new.settled and now.settled else min(2.0 * self.tolerance, 0.5)
        return new.value < (1.0 - tolerance) * now.value

    def best(self, most_workers: int | None = None) -> tuple[Workers, Reading] | None:
        """The remembered vector with the highest settled reading among those of at most ``most_workers``
        workers in all (None: any; the result is None if none is settled); computed once per tick and
        limit (the policy asks more than once).

        The limit keeps out what cannot be reached again: over-allocated after a shrink, the runner lets
        the workers in place run but grants no increase past the CPUs, so a vector read then (more
        workers than the CPUs now allow, above anything the allowed count does) would stay "best" and
        block every other move until it expired."""
        key = (self.tick, most_workers)
        if self._best is not None and self._best[0] == key:
            return self._best[1]
        live = [(w, r) for w, r in self._readings.items()
                if r.settled and self.tick - r.tick < self.ticks and (most_workers is None or sum(w) <= most_workers)]
        found = max(live, key=lambda wr: wr[1].value) if live else None
        self._best = (key, found)
        return found

    def is_better(self, candidate: Workers, current: Workers) -> bool:
        """Whether ``candidate`` was recently measured, settled, clearly above ``current`` (also settled)."""
        if candidate == current:
            return False
        new, now = self.recall(candidate), self.recall(current)
        if new is None or now is None or not (new.settled and now.settled):
            return False
        return new.value * (1.0 - self.tolerance) > now.value

    def _expire(self) -> None:
        self._readings = {w: r for w, r in self._readings.items() if self.tick - r.tick < self.ticks}
