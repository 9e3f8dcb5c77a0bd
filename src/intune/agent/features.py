"""Observation + knobs -> one feature row per knob, each carrying the pipeline-level context.

Owns the agent's view of the world: which signals it sees and how they are normalised. Rows are
padded to ``MAX_KNOBS`` so that pipelines of 2 to 8 stages share one network and one replay buffer.
It must not choose actions or touch the knobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from intune.knobs import Knob
from intune.monitor.observation import Observation, StageObservation
from intune.units import MB

MAX_STAGES = 8
MAX_KNOBS = 2 * MAX_STAGES  # workers and buffer per stage
KINDS: tuple[str, ...] = ("read", "shuffle", "map", "batch", "prefetch")

KNOB_FEATURES: tuple[str, ...] = (
    "is_cpu",  # the knob moves workers
    "is_mb",  # the knob moves buffer memory
    "value_share",  # workers / CPUs, or buffer bytes / memory limit
    "log_value",  # log1p(value) / 5
    "at_min",
    "at_max",
    "last_delta",  # the move applied to this knob last tick, / 5
    "busy",  # stage signals ...
    "starved",
    "blocked",
    "queue_fill",
    "work_share",  # busy*workers / sum over stages: where the pipeline's work is
    "cpu_per_wall",  # CPU s / wall s per item: low for I/O waits and GIL contention
    "buffered_share",  # stage's buffered bytes / memory limit
    "rate_change",  # relative change of the stage's items/s since last tick
    "worker_share",  # workers / all workers
    "position",  # stage index / (stages - 1)
    "is_first",
    "is_last",
    "cost_share",  # the stage's busy wall seconds per row / the sum over stages: its share of the work per row
    "headroom",  # log2(the stage's rows/s if its workers were always busy / throughput) / 4, in [0, 1]
    "light",  # its workers wait on something other than the CPUs (``Observation.light_stages``)
    "gain",  # at the stage's last worker move made alone while it bound (GAIN_BUSY): relative change of its
    # rate / relative change of its workers, in [-1, 2]
    "gain_known",  # 1 once such a move was measured
    *(f"kind_{kind}" for kind in KINDS),  # what the stage does, as it declares it
)
CONTEXT_FEATURES: tuple[str, ...] = (
    "free_cpu_share",  # free CPUs / CPUs
    "log_cpus",  # log2(CPUs) / 7
    "memory_fraction",  # used / limit
    "throughput_vs_best",  # throughput / best seen since the last resize
    "throughput_change",  # (throughput - last) / best
    "n_stages",  # stages / 8
    "demand_ratio",  # throughput / consumer demand (0 when unknown)
    "resized",  # the CPU count changed at this tick
    "ticks_since_resize",  # / 30, capped at 1
    "max_busy",  # stage signals
    "mean_starved",
    "over_allocated",  # workers past the CPU budget / CPUs (after a shrink), capped at 1
)
GAIN_BUSY = 0.9
"""A stage's gain is measured only at a move made while it was busy at least this share (it bound), and
only where no other stage's workers moved in the same tick: the rate of a stage that does not bind
follows the pipeline's whatever its workers, and a second stage's move shares the change of rate."""

N_FEATURES = len(KNOB_FEATURES) + len(CONTEXT_FEATURES)


class FeatureBuilder:
    """Turns each tick's Observation into rows; remembers the little history the rows need.

    One builder per pipeline run: ``reset`` at the start, then ``rows(observation)`` every tick and
    ``applied(deltas)`` after the knobs moved.
    """

    def __init__(self, knobs: Mapping[str, Knob]) -> None:
        self.knob_names: list[str] = list(knobs)
        if len(self.knob_names) > MAX_KNOBS:
            raise ValueError(f"the agent handles at most {MAX_KNOBS} knobs, got {len(self.knob_names)}")
        self.knobs = dict(knobs)
        self._layout = [(knobs[n].stage, knobs[n].unit == "cpu", knobs[n].min, knobs[n].max) for n in self.knob_names]
        self.reset()

    def reset(self) -> None:
        self.best_throughput = 0.0
        self.last_throughput = 0.0
        self.last_cpus = -1.0
        self.ticks_since_resize = 0
        self.last_deltas = np.zeros(len(self.knob_names), dtype=np.float32)
        self.last_stage_rate: dict[str, float] = {}
        self.last_stage_workers: dict[str, int] = {}
        self.stage_gain: dict[str, float] = {}
        self.last_stage_busy: dict[str, float] = {}

    def state_dict(self) -> dict[str, Any]:
        """What the features remember across ticks (best and last throughput, the CPU count and ticks
        since it changed, each stage's last rate, workers, busy share and measured gain), as plain values for a
        checkpoint."""
        return {
            "best_throughput": float(self.best_throughput),
            "last_throughput": float(self.last_throughput),
            "last_cpus": float(self.last_cpus),
            "ticks_since_resize": int(self.ticks_since_resize),
            "last_stage_rate": {name: float(v) for name, v in self.last_stage_rate.items()},
            "last_stage_workers": {name: int(v) for name, v in self.last_stage_workers.items()},
            "stage_gain": {name: float(v) for name, v in self.stage_gain.items()},
            "last_stage_busy": {name: float(v) for name, v in self.last_stage_busy.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``. The last tick's moves are not carried: a restarted job made
        none since, so they read as zero. A checkpoint written before the gain was kept resumes with
        no gain measured, as a fresh run starts."""
        self.best_throughput = float(state["best_throughput"])
        self.last_throughput = float(state["last_throughput"])
        self.last_cpus = float(state["last_cpus"])
        self.ticks_since_resize = int(state["ticks_since_resize"])
        self.last_stage_rate = {str(n): float(v) for n, v in state["last_stage_rate"].items()}
        self.last_stage_workers = {str(n): int(v) for n, v in state.get("last_stage_workers", {}).items()}
        self.stage_gain = {str(n): float(v) for n, v in state.get("stage_gain", {}).items()}
        self.last_stage_busy = {str(n): float(v) for n, v in state.get("last_stage_busy", {}).items()}
        self.last_deltas = np.zeros(len(self.knob_names), dtype=np.float32)

    def applied(self, deltas: Sequence[int]) -> None:
        """Record the moves the knobs actually made this tick (after the safety layer)."""
        self.last_deltas = np.asarray(deltas, dtype=np.float32) / 5.0

    def rows(self, obs: Observation) -> np.ndarray:
        """``[n_knobs, N_FEATURES]`` float32 rows for this tick (not padded)."""
        resized = obs.cpus != self.last_cpus
        if resized:
            self.ticks_since_resize = 0
            self.best_throughput = 0.0
        else:
            self.ticks_since_resize += 1
        self.last_cpus = obs.cpus
        thr = max(0.0, obs.throughput)
        self.best_throughput = max(thr, self.best_throughput * 0.998)
        best = max(self.best_throughput, 1e-9)

        stages = obs.stages
        n = len(stages)
        cpus = max(obs.cpus, 1.0)
        limit = obs.memory_limit_bytes if obs.memory_limit_bytes > 0 else float("inf")
        work = [s.busy * max(s.workers, 1) for s in stages]
        total_work = sum(work) or 1.0
        total_workers = sum(s.workers for s in stages) or 1
        by_name: dict[str, tuple[int, StageObservation, float]] = {
            s.name: (i, s, work[i] / total_work) for i, s in enumerate(stages)
        }
        context = [
            max(-1.0, min(1.0, obs.free_cpus / cpus)),
            math.log2(cpus) / 7.0,
            min(1.5, obs.memory_fraction),
            thr / best,
            max(-1.0, min(1.0, (thr - self.last_throughput) / best)),
            n / MAX_STAGES,
            min(2.0, thr / obs.demand) if obs.demand > 0 else 0.0,
            1.0 if resized else 0.0,
            min(1.0, self.ticks_since_resize / 30.0),
            max((s.busy for s in stages), default=0.0),
            sum(s.starved for s in stages) / max(n, 1),
            min(1.0, max(0.0, -obs.free_cpus) / cpus),
        ]
        self.last_throughput = thr

        rate_change: dict[str, float] = {}
        moved = [s.name for s in stages if s.workers != self.last_stage_workers.get(s.name, s.workers)]
        for s in stages:
            last = self.last_stage_rate.get(s.name, s.items_per_s)
            last_workers = self.last_stage_workers.get(s.name, s.workers)
            bound = self.last_stage_busy.get(s.name, 0.0) >= GAIN_BUSY
            if moved == [s.name] and last_workers > 0 and last > 0 and bound:
                relative = (s.items_per_s - last) / last / ((s.workers - last_workers) / last_workers)
                self.stage_gain[s.name] = max(-1.0, min(2.0, relative))
            rate_change[s.name] = max(-1.0, min(1.0, (s.items_per_s - last) / max(last, s.items_per_s, 1e-9)))
            self.last_stage_rate[s.name] = s.items_per_s
            self.last_stage_workers[s.name] = s.workers
            self.last_stage_busy[s.name] = s.busy

        cost = {s.name: _wall_s_per_row(s) for s in stages}
        total_cost = sum(cost.values()) or 1.0
        light = set(obs.light_stages())

        table = []  # one conversion to float32 for the whole table: each row's own costs more than its arithmetic
        for k, (stage, is_cpu, lo, hi) in enumerate(self._layout):
            i, s, work_share = by_name[stage]
            value = s.workers if is_cpu else s.buffer_mb
            share = value / cpus if is_cpu else min(2.0, value * MB / limit)
            cpu_per_wall = min(1.0, s.cpu_s_per_item / s.wall_s_per_item) if s.wall_s_per_item > 0 else 0.0
            table.append((
                1.0 if is_cpu else 0.0,
                0.0 if is_cpu else 1.0,
                share,
                math.log1p(max(value, 0)) / 5.0,
                1.0 if value <= lo else 0.0,
                1.0 if value >= hi else 0.0,
                self.last_deltas[k],
                s.busy,
                s.starved,
                s.blocked,
                s.queue_fill,
                work_share,
                cpu_per_wall,
                min(2.0, s.buffered_bytes / limit),
                rate_change[s.name],
                s.workers / total_workers,
                i / (n - 1) if n > 1 else 0.0,
                1.0 if i == 0 else 0.0,
                1.0 if i == n - 1 else 0.0,
                cost[stage] / total_cost,
                _headroom(s, thr),
                1.0 if stage in light else 0.0,
                self.stage_gain.get(stage, 0.0),
                1.0 if stage in self.stage_gain else 0.0,
                *(1.0 if s.kind == kind else 0.0 for kind in KINDS),
                *context,
            ))
        return np.array(table, dtype=np.float32).reshape(len(self.knob_names), N_FEATURES)


def _wall_s_per_row(s: StageObservation) -> float:
    """Busy wall seconds per row of a stage's workers (0 without evidence)."""
    return s.wall_s_per_item * s.items_per_s / s.rows_per_s if s.rows_per_s > 0 else 0.0


def _headroom(s: StageObservation, throughput: float) -> float:
    """How far a stage is from being the bottleneck: log2 of the rows/s its workers would make if always
    busy over the pipeline's throughput, / 4, in [0, 1] (0: busy all the time, the bottleneck)."""
    if throughput <= 0 or s.rows_per_s <= 0:
        return 0.0
    capacity = s.rows_per_s / max(s.busy, 1e-3)
    return min(1.0, max(0.0, math.log2(max(capacity / throughput, 1.0)) / 4.0))


def pad(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows padded to ``MAX_KNOBS`` and the mask of real knobs."""
    padded = np.zeros((MAX_KNOBS, N_FEATURES), dtype=np.float32)
    padded[: len(rows)] = rows
    valid = np.zeros(MAX_KNOBS, dtype=bool)
    valid[: len(rows)] = True
    return padded, valid
