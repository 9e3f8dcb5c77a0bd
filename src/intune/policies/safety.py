"""The safety layer: which moves are allowed, and how simultaneous moves share the CPUs and memory.

Exploration must never crash the job, so every action (greedy or random, pretraining or live) passes
through here. ``mask`` forbids, per knob, moves out of bounds, worker increases beyond the free CPUs
or whose workers' memory would push projected memory past ``margin`` of the limit, buffer increases
past that margin, and anything but shrinking buffers while memory is already past it (workers may
still grow under ``WORKER_CEILING`` when the job's own base memory, not its buffers, put it there:
``worker_budget``). ``select``
then resolves the knobs jointly (decreases first, then increases in order of preference while the
CPUs and memory last). ``trim`` goes further than masking: when memory, or what the buffers may hold
once full, is past the margin, it gives every buffer knob a smaller value that fits, in one tick,
whatever the network chose (a buffer of 1.5 GB under a 1 GB limit must not shrink a few MB a tick
while it fills); ``hard_limits`` applies it with the user's shuffle window as a floor. Also the start:
``start_allocation`` (the even split or Plumber's estimate, fitted to the memory). It must not learn or
score actions itself.

Memory is projected pessimistically: every buffer full to its knob's size, and each added worker
costing an upper confidence bound of what workers were seen to cost (see ``worker_memory_bytes``);
until a change has been seen, the memory outside buffers divided by the workers (an upper bound, since
it includes the base), or the bound fitted on recent levels of memory over workers if lower. In
``mask`` and ``select`` each added worker is priced at its own stage's bound (``stage_worker_bytes``):
the fit of its memory changes, never less than that pooled one, or the fit of its own memory levels
where lower; until that stage's workers have moved, its probe (``PROBE_WORKER_BYTES``, or
``PROBE_THREAD_WORKER_BYTES`` for a stage that declares thread workers). Whatever the estimate, one +1
worker per tick may be priced at its probe: each such probe sharpens the estimate, so a tight start
never deadlocks. After an OOM nothing grows until rows flow again (``worker_budget``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from intune.knobs import Knob
from intune.monitor.observation import MEMORY_SAFE_FRACTION, Observation
from intune.policies.base import even_split, light_worker_room
from intune.units import MB

log = logging.getLogger(__name__)

PROBE_WORKER_BYTES = 512 * MB  # the most one added worker is assumed to cost (a process worker: ~100-400 MB)
# ... a thread worker: it shares the process's memory; its own is its stack and the chunks in its hands
PROBE_THREAD_WORKER_BYTES = 64 * MB
# where workers may still grow when memory that no buffer cut can free is already past the margin: a
# limit on an upper confidence bound of memory (``settled_memory`` plus each added worker's upper bound),
# so the 3% left below the OOM covers only what the projection cannot see (memory that comes once data flows)
WORKER_CEILING = 0.97
LEVEL_TICKS = 32  # recent ticks whose (workers, memory) levels fit what a worker costs
LEVEL_MIN_POINTS = 6  # ... and the fewest that may
# recent ticks whose per-stage (workers, memory) levels fit what each stage's worker costs: longer than
# LEVEL_TICKS, so that a ramp still prices a stage's workers long after the workers stopped moving
STAGE_LEVEL_TICKS = 128
# a measured worker's price: its reading (``StageObservation.worker_bytes``) times this, for the reading's
# noise and for a worker that grows once it holds a larger chunk than those seen
READING_MARGIN = 1.25
# share of the limit that the buffers, if full, plus what is used outside them may take before ``trim`` cuts
# buffers in one tick: below the margin, because that projection misses memory that only comes once data
# flows (a process worker's first chunks, allocator slack)
TRIM_MARGIN = 0.65


class SafetyLayer:
    def __init__(
        self,
        knobs: Sequence[Knob],
        deltas: Sequence[int],
        margin: float = MEMORY_SAFE_FRACTION,
        trim_margin: float | None = None,
    ) -> None:
        self.knobs = list(knobs)
        self.deltas = np.asarray(deltas, dtype=np.int64)
        self.zero = int(np.flatnonzero(self.deltas == 0)[0])
        self.margin = margin
        # what ``trim`` fits the buffers under: lower than ``margin``, because the projection (what is
        # used outside the buffers now + each buffer full) misses memory that only comes once data
        # flows (a process worker's first chunks, allocator slack)
        self.trim_margin = margin if trim_margin is None else min(margin, trim_margin)
        self._is_cpu = np.array([k.unit == "cpu" for k in self.knobs])
        self._stages = [k.stage for k in self.knobs]
        self._lo = np.array([k.min for k in self.knobs])[:, None]
        self._changes: list[tuple[int, float]] = []  # (change of workers, change of memory outside buffers)
        self._still: list[float] = []  # change of memory outside buffers on ticks the workers held
        self._levels: list[tuple[int, float]] = []  # (workers, memory outside buffers) on recent ticks
        self._cpu = np.flatnonzero(self._is_cpu)
        self._mb = np.flatnonzero(~self._is_cpu)
        self._order = np.argsort(np.abs(self.deltas), kind="stable")  # on ties, prefer holding, then small moves
        self._order_list = self._order.tolist()
        # the same as plain values, for the per-cell arithmetic of ``mask``
        self._delta_list = [int(d) for d in self.deltas]
        self._largest_cut = -min(self._delta_list)
        self._largest_cut_action = int(np.argmin(self.deltas))
        self._is_cpu_list = [bool(c) for c in self._is_cpu]
        self._lo_list = [int(k.min) for k in self.knobs]
        self._hi_list = [int(k.max) for k in self.knobs]
        # last tick: workers per CPU knob's stage, and memory outside buffers
        self._last_point: tuple[np.ndarray, float] | None = None
        # (change of workers per CPU knob, change of memory outside buffers) on ticks any of them moved
        self._stage_changes: list[tuple[np.ndarray, float]] = []
        # workers per CPU knob (rows) and memory outside buffers on recent ticks, as arrays: the fit reads
        # all of them every tick
        self._stage_level_x = np.zeros((0, len(self._cpu)))
        self._stage_level_y = np.zeros(0)
        # one tick asks for the step units and a worker's cost several times: computed once per observation
        self._units: tuple[Observation, np.ndarray] | None = None
        self._worker_bytes: tuple[Observation, float] | None = None
        self._stage_bytes: tuple[Observation, np.ndarray] | None = None
        self._coarse_bytes: tuple[Observation, np.ndarray] | None = None
        self._noise_of: tuple[Observation, float] | None = None
        self._probe: tuple[Observation, np.ndarray] | None = None
        self._fit_of: tuple[Observation, tuple[int, float, float, float, float, float] | None] | None = None
        self._stage_bounds: tuple[Observation, np.ndarray] | None = None
        self._settled_fit: tuple[Observation, float | None] | None = None
        self._worst: tuple[Observation, tuple[int, ...], float] | None = None
        self._worker_room: tuple[Observation, tuple[tuple[int, ...], float], float] | None = None
        # the ridge fit of the per-stage changes, kept while ``_stage_changes`` is the same list: it changes
        # only on ticks a worker moved, and only the noise term of its error depends on the tick
        self._change_fit: tuple[list, np.ndarray, np.ndarray, np.ndarray] | None = None
        # from an OOM until rows flow again: the job restarts, and its memory reads as the base alone
        self._restarting = False
        self._unmeasured: set[str] = set()  # stages already named in the log for lacking a memory reading

    # -- projections ---------------------------------------------------------------------------
    def track(self, obs: Observation) -> None:
        """Learn what a worker costs from how memory outside buffers moved with the worker count,
        and how noisy the memory reading is from how it moved while the workers did not."""
        self._worker_bytes = None
        self._stage_bytes = self._coarse_bytes = None
        self._fit_of = self._stage_bounds = self._settled_fit = self._worst = self._worker_room = None
        self._restarting = obs.oom or (self._restarting and obs.throughput <= 0)
        if obs.oom or obs.throughput <= 0:
            self._last_point = None
            if obs.oom:
                self._levels = []  # a restarted job's base may differ
                self._stage_level_x, self._stage_level_y = self._stage_level_x[:0], self._stage_level_y[:0]
            return
        outside = obs.memory_used_bytes - sum(s.buffered_bytes for s in obs.stages)
        self._levels = [*self._levels[-(LEVEL_TICKS - 1):], (sum(s.workers for s in obs.stages), outside)]
        by_stage = {s.name: s.workers for s in obs.stages}
        vector = np.array([by_stage.get(self._stages[k], 0) for k in self._cpu], dtype=float)
        keep = STAGE_LEVEL_TICKS - 1
        self._stage_level_x = np.concatenate((self._stage_level_x[-keep:], vector[None, :]))
        self._stage_level_y = np.concatenate((self._stage_level_y[-keep:], (outside,)))
        if self._last_point is not None:
            moved, dm = vector - self._last_point[0], outside - self._last_point[1]
            dw = int(moved.sum())
            if dw:
                self._changes = [*self._changes[-31:], (dw, dm)]
            else:
                self._still = [*self._still[-31:], dm]
            if moved.any():
                self._stage_changes = [*self._stage_changes[-31:], (moved, dm)]
        self._last_point = (vector, outside)

    def state_dict(self) -> dict[str, Any]:
        """What ``track`` has measured (worker-count and memory changes, memory levels, the reading's
        noise on still ticks), as plain values: without it a restarted job prices every worker at the
        pessimistic probe cost again until it has re-measured."""
        return {
            "changes": [[int(dw), float(dm)] for dw, dm in self._changes],
            "still": [float(d) for d in self._still],
            "levels": [[int(w), float(m)] for w, m in self._levels],
            "stage_changes": [[np.asarray(moved, dtype=float), float(dm)] for moved, dm in self._stage_changes],
            "stage_levels": [[w.copy(), float(m)] for w, m in zip(self._stage_level_x, self._stage_level_y, strict=True)],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()`` of a layer over the same knobs. The last tick's point is not
        carried: the first tick after a restart starts a new difference."""
        self._changes = [(int(dw), float(dm)) for dw, dm in state["changes"]]
        self._still = [float(d) for d in state["still"]]
        self._levels = [(int(w), float(m)) for w, m in state["levels"]]
        self._stage_changes = [(np.asarray(moved, dtype=float), float(dm)) for moved, dm in state["stage_changes"]]
        # a state saved before the per-stage levels were kept has none: they are measured again
        stage_levels = [(np.asarray(w, dtype=float), float(m)) for w, m in state.get("stage_levels", [])]
        for moved, _ in [*self._stage_changes, *stage_levels]:
            if moved.shape != (len(self._cpu),):
                raise ValueError(
                    f"safety layer state: a worker change over {moved.shape[0]} CPU knobs, this layer has {len(self._cpu)}"
                )
        self._stage_level_x = np.array([w for w, _ in stage_levels]).reshape(len(stage_levels), len(self._cpu))
        self._stage_level_y = np.array([m for _, m in stage_levels], dtype=float)
        self._last_point = None
        self._worker_bytes = self._stage_bytes = self._coarse_bytes = self._noise_of = self._units = None
        self._fit_of = self._stage_bounds = self._settled_fit = self._worst = self._worker_room = self._change_fit = None

    @property
    def knows_worker_cost(self) -> bool:
        return bool(self._changes)

    def worker_memory_bytes(self, obs: Observation) -> float:
        """What one more worker may cost: an upper confidence bound on the slope of memory over workers.

        The slope is the least-squares fit through the origin of the recent (change of workers, change
        of memory outside buffers) pairs; two standard errors are added (the error from the memory
        reading's noise, measured on ticks where the workers did not change, at least 2% of the use),
        and the result is capped by the plain upper bound (memory outside buffers / workers) and by the
        bound fitted on levels (``_level_slope``). A slope not clearly above zero (slope - 2 errors <= 0)
        is not trusted: then the lower of those two bounds.
        """
        if self._worker_bytes is not None and self._worker_bytes[0] is obs:
            return self._worker_bytes[1]
        value = self._worker_memory_bytes(obs)
        self._worker_bytes = (obs, value)
        return value

    def _worker_memory_bytes(self, obs: Observation) -> float:
        workers = sum(s.workers for s in obs.stages)
        outside = obs.memory_used_bytes - sum(s.buffered_bytes for s in obs.stages)
        upper = max(0.0, outside) / max(workers, 1)
        level = self._level_slope(obs)
        if level is not None:
            upper = min(upper, level)
        if not self._changes:
            return upper
        dw = np.array([c[0] for c in self._changes], dtype=float)
        dm = np.array([c[1] for c in self._changes])
        slope = float(np.dot(dw, dm) / np.dot(dw, dw))
        error = 2.0 * self._noise(obs) / np.sqrt(np.dot(dw, dw))
        if slope - error <= 0:  # not measured well enough to be trusted: the bounds above
            return upper
        return float(min(upper, slope + error))

    def _level_slope(self, obs: Observation) -> float | None:
        """Upper confidence bound of the slope of memory outside buffers over the worker count, fitted
        (with an intercept, the base) on the levels of the last ``LEVEL_TICKS`` ticks; None unless
        clearly above zero.

        The change-based fit uses each reading twice and, with one +1 a tick, only the first and last
        readings carry the slope: behind a large base whose reading's noise exceeds a worker's cost, a
        worker stays unmeasured for dozens of ticks. Fitted on levels, the ramp itself measures it.
        The error uses the fit's residuals, never less than the memory reading's noise.
        """
        fit = self._level_fit(obs)
        if fit is None or fit[0] < LEVEL_MIN_POINTS or fit[3] <= 0:
            return None
        _, _, _, sxx, slope, sigma = fit
        error = 2.0 * sigma / math.sqrt(sxx)
        return slope + error if slope - error > 0 else None

    def _level_fit(self, obs: Observation) -> tuple[int, float, float, float, float, float] | None:
        """Least squares of memory outside buffers on the worker count over the recent levels:
        ``(points, mean workers, mean memory, sum of squared worker deviations, slope, sigma)``, with
        the slope 0 while the workers did not vary and sigma the residuals' standard deviation, never
        less than one reading's noise (that noise alone below three points); None without levels."""
        if self._fit_of is not None and self._fit_of[0] is obs:
            return self._fit_of[1]
        fit = self._fit_levels(obs)
        self._fit_of = (obs, fit)
        return fit

    def _fit_levels(self, obs: Observation) -> tuple[int, float, float, float, float, float] | None:
        levels = self._levels
        n = len(levels)
        if not n:
            return None
        # plain sums, each in the points' order: 32 points a tick, where numpy's per-call cost would dominate
        w_sum = m_sum = 0
        for w, m in levels:
            w_sum += w
            m_sum += m
        w_mean, m_mean = w_sum / n, m_sum / n
        sxx = sxy = 0
        for w, m in levels:
            sxx += (w - w_mean) ** 2
            sxy += (w - w_mean) * (m - m_mean)
        slope = sxy / sxx if sxx > 0 else 0.0
        reading = self._noise(obs) / math.sqrt(2.0)  # one reading's standard deviation
        if n > 2:
            rss = 0
            for w, m in levels:
                rss += (m - m_mean - slope * (w - w_mean)) ** 2
            sigma = max(math.sqrt(rss / (n - 2)), reading)
        else:
            sigma = reading
        return n, w_mean, m_mean, sxx, slope, sigma

    def _noise(self, obs: Observation) -> float:
        """The memory reading's noise on a tick-to-tick change: measured on ticks the workers held, at
        least 2% of the use."""
        if self._noise_of is not None and self._noise_of[0] is obs:
            return self._noise_of[1]
        still = math.sqrt(sum(d * d for d in self._still) / len(self._still)) if len(self._still) >= 5 else 0.0
        value = max(0.02 * obs.memory_used_bytes * math.sqrt(2.0), still)
        self._noise_of = (obs, value)
        return value

    def stage_worker_bytes(self, obs: Observation, refined: bool = True) -> np.ndarray:
        """Per knob, what one more worker of that knob's stage may cost: its measured memory
        (``StageObservation.worker_bytes``) times ``READING_MARGIN`` where the stage reports one, whatever
        a fit says: a fit of memory over worker counts that moved together can price a heavy worker far
        below its reading, and a jump of many workers priced so is an OOM. A stage without a reading: while its workers
        have not moved, the larger of its probe (``probe_bytes``) and ``worker_memory_bytes``; after,
        never less than ``worker_memory_bytes`` unless the stage's own levels bound it lower. (Buffer
        knobs: 1 MB.)

        One slope for every stage under-prices the expensive ones: a slope learned mostly from light
        thread workers prices heavy process workers far too low. Here each stage's slope is a least-squares fit of
        the memory changes on the per-stage worker changes (ridge-regularised, so stages that always
        moved together share a wide error), plus two standard errors; where lower, the bound fitted on
        each stage's levels (``_stage_level_bounds``). ``refined=False`` leaves that bound out: never
        lower, and cheaper to compute, so a caller whose limit holds at that price need not refine it.
        """
        if refined:
            if self._stage_bytes is None or self._stage_bytes[0] is not obs:
                out = self.stage_worker_bytes(obs, refined=False).copy()
                unmeasured = self._readings(obs) <= 0  # a reading is the price as it stands
                if unmeasured.any():
                    bounds = np.where(unmeasured, self._stage_level_bounds(obs), np.inf)
                    out[self._cpu] = np.minimum(out[self._cpu], bounds)
                out.flags.writeable = False
                self._stage_bytes = (obs, out)
            return self._stage_bytes[1]
        if self._coarse_bytes is not None and self._coarse_bytes[0] is obs:
            return self._coarse_bytes[1]
        pooled = self.worker_memory_bytes(obs)
        out = np.full(len(self.knobs), float(MB))
        price = np.maximum(pooled, self.probe_bytes(obs)[self._cpu])
        if self._stage_changes:
            if self._change_fit is None or self._change_fit[0] is not self._stage_changes:
                x = np.array([c[0] for c in self._stage_changes])
                y = np.array([c[1] for c in self._stage_changes])
                moved = np.flatnonzero((x != 0).any(axis=0))
                xm = x[:, moved]
                inverse = np.linalg.inv(xm.T @ xm + 1e-3 * np.eye(len(moved)))
                self._change_fit = (self._stage_changes, moved, inverse @ (xm.T @ y), np.sqrt(np.diag(inverse)))
            _, moved, slope, spread = self._change_fit
            error = 2.0 * self._noise(obs) * spread
            price[moved] = np.maximum(pooled, slope + error)
        reading = self._readings(obs)
        measured = reading > 0
        price[measured] = reading[measured] * READING_MARGIN
        out[self._cpu] = price
        out.flags.writeable = False
        self._coarse_bytes = (obs, out)
        return out

    def _readings(self, obs: Observation) -> np.ndarray:
        """Per CPU knob, its stage's measured memory of one worker (``StageObservation.worker_bytes``;
        0 where the stage measures none). A stage whose workers run without a reading is named once in
        the log: its workers are priced by probing and fitting instead."""
        by_stage = {s.name: s for s in obs.stages}
        out = np.zeros(len(self._cpu))
        for row, k in enumerate(self._cpu.tolist()):
            stage = by_stage.get(self._stages[k])
            if stage is None:
                continue
            out[row] = stage.worker_bytes
            if stage.worker_bytes <= 0 and stage.items_per_s > 0 and stage.name not in self._unmeasured:
                self._unmeasured.add(stage.name)
                log.info("stage %r reports no measured memory per worker (%s workers): its added workers are "
                         "priced by probing and by fitting memory over the worker count", stage.name, stage.mode)
        return out

    def probe_bytes(self, obs: Observation) -> np.ndarray:
        """Per knob, what one added worker of its stage is assumed to cost at most before it is measured:
        ``PROBE_THREAD_WORKER_BYTES`` where the stage declares thread workers (they share the process's
        memory), else ``PROBE_WORKER_BYTES`` (a process worker, or a stage that does not say)."""
        if self._probe is not None and self._probe[0] is obs:
            return self._probe[1]
        modes = {s.name: s.mode for s in obs.stages}
        out = np.array([PROBE_THREAD_WORKER_BYTES if modes.get(stage) == "thread" else PROBE_WORKER_BYTES
                        for stage in self._stages], dtype=float)
        out.flags.writeable = False
        self._probe = (obs, out)
        return out

    def _stage_level_bounds(self, obs: Observation) -> np.ndarray:
        """Per CPU knob, an upper confidence bound of what one of its stage's workers costs, fitted by
        least squares (an intercept, the base, and a slope per stage) on the levels of memory outside
        buffers over the last ``STAGE_LEVEL_TICKS`` ticks: the slope plus two standard errors, the error
        from the residuals, never less than one reading's noise. Infinite (no bound) for a stage whose
        workers did not vary there, and for every stage with too few points.

        Behind a large base with a noisy reading, tick-to-tick changes give a light stage's worker an
        error of hundreds of MB, and the bound fitted on all stages' levels forgets a ramp once the
        workers stop; each stage's own ramp, kept longer, still measures it.
        """
        if self._stage_bounds is None or self._stage_bounds[0] is not obs:
            self._stage_bounds = (obs, self._fit_stage_levels(obs))
        return self._stage_bounds[1]

    def _fit_stage_levels(self, obs: Observation) -> np.ndarray:
        bounds = np.full(len(self._cpu), np.inf)
        fit = self._stage_level_fit(obs, self._stage_level_x, self._stage_level_y)
        if fit is not None:
            varied, _, _, inverse, slope, sigma = fit
            bounds[varied] = np.maximum(slope, 0.0) + 2.0 * sigma * np.sqrt(np.diag(inverse))
        return bounds

    def _stage_level_fit(
        self, obs: Observation, x: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray, float] | None:
        """Least squares of memory outside buffers ``y`` on each stage's workers ``x`` (rows: levels), an
        intercept and a slope per stage whose workers varied: ``(varied columns, their mean workers, mean
        memory, inverse of the centred normal matrix, slopes, sigma)``, sigma the residuals' standard
        deviation and never less than one reading's noise; None where no stage's workers varied or too
        few levels remain beside the slopes (``LEVEL_MIN_POINTS``)."""
        n = len(y)
        if not n:
            return None
        varied = np.flatnonzero((x != x[0]).any(axis=0))  # worker counts: exact, unlike a spread above 0
        if not len(varied) or n - len(varied) - 1 < LEVEL_MIN_POINTS:
            return None
        xv = x[:, varied]
        x_mean, y_mean = xv.sum(axis=0) / n, y.sum() / n  # a sum over n, as numpy's mean computes it, without its overhead
        xc, yc = xv - x_mean, y - y_mean
        inverse = np.linalg.inv(xc.T @ xc + 1e-9 * np.eye(len(varied)))
        slope = inverse @ (xc.T @ yc)
        rss = float(np.sum((yc - xc @ slope) ** 2))
        sigma = max(math.sqrt(rss / (n - len(varied) - 1)), self._noise(obs) / math.sqrt(2.0))
        return varied, x_mean, y_mean, inverse, slope, sigma

    def worst_case_memory(self, obs: Observation, values: Sequence[int]) -> float:
        """Memory if every buffer filled to its knob's size (never less than what is used now)."""
        key = tuple(int(v) for v in values)
        if self._worst is not None and self._worst[0] is obs and self._worst[1] == key:
            return self._worst[2]
        buffered = {s.name: s.buffered_bytes for s in obs.stages}
        room = sum(max(0.0, v * MB - buffered.get(stage, 0.0))
                   for stage, v, is_cpu in zip(self._stages, key, self._is_cpu, strict=True) if not is_cpu)
        worst = obs.memory_used_bytes + room
        self._worst = (obs, key, worst)
        return worst

    def memory_budget(self, obs: Observation, values: Sequence[int]) -> float:
        """Bytes that may still be added before projected memory reaches the margin."""
        if obs.memory_limit_bytes <= 0:
            return float("inf")
        return self.margin * obs.memory_limit_bytes - self.worst_case_memory(obs, values)

    def buffer_budget(self, obs: Observation, values: Sequence[int]) -> float:
        """Bytes that buffers may still grow by: up to ``trim_margin``, where ``trim`` would cut them
        back. A buffer is the first memory cut, so growth the next tick's trim takes away is refused
        here: granted and cut by turns, it would only take the room the workers were priced against.
        Never more than ``memory_budget``: ``trim_margin`` is at most the margin."""
        if obs.memory_limit_bytes <= 0:
            return float("inf")
        return self.trim_margin * obs.memory_limit_bytes - self.worst_case_memory(obs, values)

    def worker_budget(self, obs: Observation, values: Sequence[int], budget: float | None = None) -> float:
        """Bytes that added workers may take: ``memory_budget``, unless memory that no buffer cut can free
        (what is used outside the buffers, plus each buffer at its minimum) is itself past the margin.

        Then the margin cannot be reached whatever the agent does, and holding every stage at its
        minimum would forfeit the job's throughput to keep a promise already broken by the job's own
        base memory (a 16 GB model state under an 18 GB limit): workers may then grow, a step at a
        time as their measured cost allows, while the projection stays under ``WORKER_CEILING``.
        After an OOM nothing may grow until rows flow again: while the job restarts its memory reads
        as the base alone, and workers grown on that reading would OOM it again once it runs.
        """
        if budget is None:
            budget = self.memory_budget(obs, values)
        key = (tuple(int(v) for v in values), budget)
        if self._worker_room is not None and self._worker_room[0] is obs and self._worker_room[1] == key:
            return self._worker_room[2]
        room = self._worker_budget(obs, values, budget)
        self._worker_room = (obs, key, room)
        return room

    def _worker_budget(self, obs: Observation, values: Sequence[int], budget: float) -> float:
        if obs.oom or self._restarting:
            return -np.inf
        if obs.memory_limit_bytes <= 0 or budget >= 0:
            return budget
        if not self._under_ceiling(obs, values):
            return budget
        settled = self.worst_case_memory(obs, values) + max(0.0, self.settled_memory(obs) - obs.memory_used_bytes)
        return WORKER_CEILING * obs.memory_limit_bytes - settled

    def _under_ceiling(self, obs: Observation, values: Sequence[int]) -> bool:
        """Whether workers may grow only under ``WORKER_CEILING`` (``worker_budget``): memory that no buffer
        cut can free is past the margin."""
        if obs.memory_limit_bytes <= 0 or self.memory_budget(obs, values) >= 0:
            return False
        mb = self._mb
        buffered = {s.name: s.buffered_bytes for s in obs.stages}
        held = np.array([buffered.get(self._stages[k], 0.0) for k in mb])
        floor = obs.memory_used_bytes - float(np.maximum(held - self._lo[mb, 0] * float(MB), 0.0).sum())
        return floor > self.margin * obs.memory_limit_bytes

    def settled_memory(self, obs: Observation) -> float:
        """An upper confidence bound of the memory used now, less noisy than one reading.

        Near the limit one reading is not enough: a reading 2% low (one standard deviation of the
        simulator's noise, of cgroup readings between allocator frees) would let workers grow into an
        OOM. Memory outside buffers is fitted on the recent levels over each stage's workers (an
        intercept and a slope per stage that moved: a climb of cheap thread workers then of heavy process
        workers has no single slope) and the fit's prediction at today's workers, plus two standard
        errors of that prediction (from the residuals, never less than one reading's noise over the
        points), is added to what the buffers hold now. Where too few levels determine every stage's
        slope, the fit is over the worker count (with the workers unchanged, their mean).
        """
        by_stage = self._stage_level_prediction(obs)
        if by_stage is not None:
            return by_stage + sum(s.buffered_bytes for s in obs.stages)
        fit = self._level_fit(obs)
        if fit is None:
            return obs.memory_used_bytes + 2.0 * self._noise(obs) / math.sqrt(2.0)
        n, w_mean, m_mean, sxx, slope, sigma = fit
        buffered = sum(s.buffered_bytes for s in obs.stages)
        workers = sum(s.workers for s in obs.stages)
        spread = 1.0 / n + ((workers - w_mean) ** 2 / sxx if sxx > 0 else 0.0)
        return m_mean + slope * (workers - w_mean) + 2.0 * sigma * math.sqrt(spread) + buffered

    def _stage_level_prediction(self, obs: Observation) -> float | None:
        """Memory outside buffers at today's workers (the level just tracked), fitted over each stage's
        workers on the last ``LEVEL_TICKS`` levels (``_stage_level_fit``), plus two standard errors of
        the prediction; None where that fit is not determined. Computed once per observation: a tick
        asks for the worker budget of several allocations."""
        if self._settled_fit is None or self._settled_fit[0] is not obs:
            self._settled_fit = (obs, self._predict_stage_levels(obs))
        return self._settled_fit[1]

    def _predict_stage_levels(self, obs: Observation) -> float | None:
        x = self._stage_level_x[-LEVEL_TICKS:]
        fit = self._stage_level_fit(obs, x, self._stage_level_y[-LEVEL_TICKS:])
        if fit is None:
            return None
        varied, x_mean, y_mean, inverse, slope, sigma = fit
        d = x[-1, varied] - x_mean
        spread = 1.0 / len(x) + float(d @ inverse @ d)
        return float(y_mean + slope @ d + 2.0 * sigma * math.sqrt(spread))

    def trim(self, obs: Observation, values: Sequence[int]) -> np.ndarray:
        """Knob values with every buffer cut, if need be, so that memory fits under the margin.

        Projected use = memory outside the buffers now + each buffer full to its knob's size (or what
        it holds, if more). When that, or the memory used now, is past ``trim_margin`` of the limit, the
        buffer knobs lose the excess between them in proportion to what each has above its minimum
        (so the largest loses the most MB), never below a knob's minimum. CPU knobs and buffers that
        fit are returned unchanged; no value ever grows.
        """
        out = np.asarray(values, dtype=np.int64).copy()
        if obs.memory_limit_bytes <= 0:
            return out
        mb = self._mb
        if not len(mb):
            return out
        buffered = {s.name: s.buffered_bytes for s in obs.stages}
        held = np.array([buffered.get(self._stages[k], 0.0) for k in mb])
        outside = obs.memory_used_bytes - held.sum()
        projected = outside + np.maximum(out[mb] * float(MB), held).sum()
        excess = max(obs.memory_used_bytes, projected) - self.trim_margin * obs.memory_limit_bytes
        if excess <= 0:
            return out
        lo = self._lo[mb, 0]
        spare = np.maximum(out[mb] - lo, 0)
        if spare.sum() <= 0:
            return out
        cut = int(np.ceil(excess / MB))
        keep = max(0, int(spare.sum()) - cut)  # MB above the minimums that may stay
        kept = np.floor(spare * (keep / spare.sum())).astype(np.int64)
        out[mb] = np.minimum(out[mb], lo + kept)
        return out

    # -- step units ---------------------------------------------------------------------------------
    def units(self, obs: Observation) -> np.ndarray:
        """Knob-value change of one action step, per knob: 1 worker, or for a buffer the largest of
        1 MB, one item's bytes and a sixteenth of the buffer's size.

        A buffer is worth what it holds in items, and a 9 MB batch needs 9 MB steps to matter within
        a few ticks; the paper's 1 MB unit would need hundreds of ticks to reach a useful depth. The
        sixteenth lets a 1.5 GB shuffle buffer move by ~96 MB (+-5: ~30%) a tick instead of 1 MB.
        """
        if self._units is not None and self._units[0] is obs:
            return self._units[1]
        item_mb = {s.name: s.bytes_per_item / MB for s in obs.stages}
        size_mb = {s.name: s.buffer_mb for s in obs.stages}
        units = np.array([1 if is_cpu else max(1, int(round(item_mb.get(stage, 0.0))), int(size_mb.get(stage, 0)) // 16)
                          for stage, is_cpu in zip(self._stages, self._is_cpu, strict=True)])
        units.flags.writeable = False  # shared by every caller this tick
        self._units = (obs, units)
        return units

    def moves(self, choice: np.ndarray, obs: Observation) -> np.ndarray:
        """Knob-value changes of the chosen action indices."""
        return self.deltas[choice] * self.units(obs)

    # -- the mask --------------------------------------------------------------------------------
    def mask(self, obs: Observation, values: Sequence[int] | None = None) -> np.ndarray:
        """``[n_knobs, n_actions]`` bool: the moves each knob may make on its own this tick.

        Call it once per tick: it also updates the estimate of a worker's memory.

        A move is allowed when it stays within the knob's bounds (holding always is), and, if it adds:
        for a worker, when the free CPUs plus what the other stages could give up this tick cover it
        and its cost (its stage's price, ``stage_worker_bytes``; a lone +1 at most its probe) fits
        ``worker_budget``; for a buffer, when its MB fit ``memory_budget``. Past the margin
        (``_past_margin``) buffers may only shrink, or hold where they cannot.
        The cells are few (knobs x moves): plain Python, where each numpy call would cost more than
        the arithmetic it does.
        """
        self.track(obs)
        values = [k.value for k in self.knobs] if values is None else list(values)
        units = self.units(obs).tolist()
        deltas, zero, is_cpu = self._delta_list, self.zero, self._is_cpu_list
        budget = self.memory_budget(obs, values)
        worker_room = self.worker_budget(obs, values, budget)
        buffer_room = self.buffer_budget(obs, values)
        free_cpus = max(int(math.floor(obs.free_cpus + 1e-9)), 0)
        # workers each CPU knob could give up this tick: the other stages' sum is what a +d may also use
        movable = [min(int(v) - lo, self._largest_cut) if cpu else 0
                   for v, lo, cpu in zip(values, self._lo_list, is_cpu, strict=True)]
        total_movable = sum(movable)
        light_knobs = {int(self._cpu[row]) for row in self._light_rows(obs)}
        light_room = light_worker_room(light_knobs, obs.free_cpus)

        allowed: list[list[bool]] = []
        adds: list[tuple[int, int, int]] = []  # (knob, action, step): workers added within the bounds and CPUs
        for k, (v, u, lo, hi, cpu) in enumerate(zip(values, units, self._lo_list, self._hi_list, is_cpu, strict=True)):
            row = []
            for a, d in enumerate(deltas):
                step = d * u
                ok = a == zero or lo <= v + step <= hi
                if ok and step > 0:
                    if cpu:
                        ok = step <= free_cpus + total_movable - movable[k] + (light_room if k in light_knobs else 0)
                        if ok:
                            adds.append((k, a, step))
                    else:
                        ok = step * float(MB) <= buffer_room
                row.append(ok)
            allowed.append(row)
        if adds:  # each added worker at its own stage's price; the refined one only where the coarse one refuses
            probe = self.probe_bytes(obs).tolist()
            for refined in (False, True):
                price = self.stage_worker_bytes(obs, refined).tolist()
                over = [(k, a) for k, a, step in adds
                        if not (min(step * price[k], probe[k]) if step == 1 else step * price[k]) <= worker_room]
                if not over:
                    break
            for k, a in over:
                allowed[k][a] = False

        if self._past_margin(obs, budget):  # only shrinking buffers (or holding), and what the room let workers do
            for k in self._mb.tolist():
                row = allowed[k]
                for a, d in enumerate(deltas):
                    if d > 0:
                        row[a] = False
                if any(row[a] for a, d in enumerate(deltas) if d < 0):
                    for a, d in enumerate(deltas):
                        if d >= 0:
                            row[a] = False
        return np.array(allowed, dtype=bool).reshape(len(values), len(deltas))

    def memory_comfortable(self, obs: Observation, values: Sequence[int]) -> bool:
        """Every buffer full would still leave a quarter of the margin free (or there is no limit)."""
        if obs.memory_limit_bytes <= 0:
            return True
        return self.worst_case_memory(obs, values) <= 0.75 * self.margin * obs.memory_limit_bytes

    def hard_limits(self, choice: np.ndarray, obs: Observation, values: Sequence[int],
                    floor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(wanted values, choice)`` after the two limits that act on a whole choice, not one move:

        - a knob does not go below ``floor`` (``shuffle_floor``: the user's shuffle window) while memory
          is comfortable; when the buffers full would take memory near the limit, it may (the projection
          misses what starts later, such as a process worker's first chunk);
        - buffers that cannot fit when full are cut now (``trim``), whatever was chosen (recorded as the
          largest decrease).
        """
        units = self.units(obs).tolist()
        picks = choice.tolist()
        comfortable = self.memory_comfortable(obs, values)
        trimmed = self.trim(obs, values).tolist()  # never above the current values
        largest_cut = self._largest_cut_action
        wanted = []
        for k, (v, lowest, cut, cpu) in enumerate(zip(values, np.asarray(floor).tolist(), trimmed, self._is_cpu_list, strict=True)):
            now = int(v)
            w = now + self._delta_list[picks[k]] * units[k]
            if comfortable and w < lowest and w < now:
                w, picks[k] = now, self.zero
            if not cpu and cut < now and cut < w:
                w, picks[k] = cut, largest_cut
            wanted.append(w)
        return np.array(wanted, dtype=np.int64), np.array(picks, dtype=np.int64)

    def _past_margin(self, obs: Observation, budget: float) -> bool:
        """An OOM (or the restart after it), memory used past the margin, or buffers that would take
        it there when full."""
        used = obs.memory_limit_bytes > 0 and obs.memory_used_bytes > self.margin * obs.memory_limit_bytes
        return obs.oom or self._restarting or used or budget < 0

    def memory_allows_worker(self, obs: Observation, values: Sequence[int], k: int) -> bool:
        """Whether CPU knob ``k`` may gain one worker as far as its bound and the memory go, leaving the
        CPUs aside: for a light stage's worker, which the runner grants past the CPUs. Priced as
        ``mask`` prices a lone +1: at its stage's bound, the probe at most."""
        if not self._is_cpu[k] or values[k] + 1 > self.knobs[k].max:
            return False
        budget = self.worker_budget(obs, values)
        return any(min(float(self.stage_worker_bytes(obs, refined)[k]), float(self.probe_bytes(obs)[k])) <= budget
                   for refined in (False, True))

    # -- a whole allocation at once ---------------------------------------------------------------
    def admit(self, obs: Observation, values: Sequence[int], target: Sequence[int], priority: Sequence[int],
              floor: Sequence[int] | None = None) -> np.ndarray:
        """The part of a jump from ``values`` to ``target`` that is safe this tick, for planners that
        move every knob at once: the same limits ``mask`` and ``select`` put on a step.

        - Buffers: cuts pass, and a buffer that cannot fit when full is cut (``trim``) whatever the
          target, though not below ``floor`` while memory is comfortable (the user's shuffle window);
          growth comes after the workers', in what they leave of ``buffer_budget`` (what ``trim``
          would not cut back the next tick).
        - Workers: cuts pass. Added workers are granted one at a time, knobs in ``priority`` order
          (indices, most wanted first; round-robin so that co-bottlenecks grow together), each priced
          at its stage's bound (``stage_worker_bytes``) against ``worker_budget``; where nothing fits,
          one worker may be priced at its probe, which sharpens the estimate. The first knob whose
          worker does not fit ends the grant: a stage behind it in the order does not lift the rate
          while the stage before it holds the pipeline back, and the memory its workers would take is
          the bottleneck's once some is freed. After an OOM none until rows flow again.
        - The CPUs are the runner's (``clamp_request``): a planner plans within ``cpu_budget``.

        Call ``track`` (or ``mask``) once per tick before this."""
        now = np.asarray(values, dtype=np.int64)
        out = np.array([k.clamp(int(t)) for k, t in zip(self.knobs, target, strict=True)], dtype=np.int64)
        mb, cpu = self._mb, self._cpu
        if len(mb):
            comfortable = self.memory_comfortable(obs, now.tolist())
            cut = self.trim(obs, now.tolist())
            for k in mb.tolist():
                if cut[k] < now[k] and cut[k] < out[k] and not (comfortable and floor is not None and out[k] <= floor[k]):
                    out[k] = cut[k]
        grow = {k: int(out[k]) for k in mb.tolist() if out[k] > now[k]}
        out = np.minimum(out, now)  # growth is granted below: the workers', then the buffers' in what is left
        spent = self._admit_workers(obs, now, out, target, priority) if len(cpu) else 0.0
        if grow:
            budget = self.buffer_budget(obs, out.tolist()) - spent
            for k, want in grow.items():
                grant = int(min(want - now[k], max(0.0, budget) // MB))
                out[k] = now[k] + grant
                budget -= grant * MB
        return out

    def _admit_workers(self, obs: Observation, now: np.ndarray, out: np.ndarray, target: Sequence[int],
                       priority: Sequence[int]) -> float:
        """Grant ``admit``'s added workers into ``out``, in place; the bytes they are priced at."""
        cpu = self._cpu
        want = {k: int(self.knobs[k].clamp(int(target[k]))) - int(now[k]) for k in cpu.tolist()}
        want = {k: w for k, w in want.items() if w > 0}
        if not want:
            return 0.0
        room = self.worker_budget(obs, out.tolist())
        price = self.stage_worker_bytes(obs).tolist()
        probe = self.probe_bytes(obs).tolist()
        order = [k for k in priority if k in want] + [k for k in want if k not in priority]
        probing, spent = True, 0.0
        while any(want.values()):
            for k in order:
                if not want.get(k):
                    continue
                cost = price[k]
                if probing and cost > room and out[k] == now[k]:
                    cost, probing = min(cost, probe[k]), False
                if cost > room:
                    return spent
                room -= cost
                spent += cost
                out[k] += 1
                want[k] -= 1
        return spent

    # -- joint resolution ----------------------------------------------------------------------
    def select(self, scores: np.ndarray, allowed: np.ndarray, obs: Observation, values: Sequence[int] | None = None) -> np.ndarray:
        """Action index per knob maximising the summed scores of all knobs under the joint limits.

        CPUs: the workers added this tick, net of those removed, may not exceed the free CPUs (or zero
        when the CPUs shrank below the allocation): solved exactly by a dynamic programme over the
        knobs, so a worker can move from a stage with slack to the bottleneck within one tick.
        Memory: then, increases whose memory does not fit the budget are dropped, least preferred
        first. Each added worker is priced at its own stage's slope (``stage_worker_bytes``): a slope
        pooled over all stages, learned mostly on light thread workers, under-prices a process worker
        (one +1 per tick may be priced at its probe at most, ``probe_bytes``).
        """
        values = [k.value for k in self.knobs] if values is None else list(values)
        masked = np.where(allowed, scores, -np.inf)
        choice = masked.argmax(axis=1)
        cpu = self._cpu
        if len(cpu):
            free = int(np.floor(obs.free_cpus + 1e-9))
            choice[cpu] = self._best_under_cpu_budget(masked[cpu], max(free, 0), self._light_rows(obs), free)

        # the memory: few knobs, so plain Python (the sums of costs keep numpy's order, as the limit compares them)
        picks = choice.tolist()
        moves = [self._delta_list[a] * u for a, u in zip(picks, self.units(obs).tolist(), strict=True)]
        is_cpu = self._is_cpu_list
        mem_budget = self.worker_budget(obs, values)  # buffers past the margin may only shrink (the mask)
        mem_budget -= float(sum(m for m, c in zip(moves, is_cpu, strict=True) if not c and m < 0)) * MB  # shrinking buffers frees memory

        def costs(refined: bool) -> list[float]:
            price = self.stage_worker_bytes(obs, refined).tolist()
            return [(p if c else float(MB)) * max(m, 0) for p, c, m in zip(price, is_cpu, moves, strict=True)]

        cost = costs(False)
        if float(np.sum(cost)) > mem_budget:  # the refined price (never higher) only where the coarse one binds
            cost = costs(True)
        rising_workers = [k for k, m in enumerate(moves) if m > 0 and is_cpu[k]]
        if (len(rising_workers) > 1 or any(moves[k] > 1 for k in rising_workers)) and self._under_ceiling(obs, values):
            # near the limit behind a base past the margin, workers grow one at a time: the memory reading's
            # noise there is larger than a measured worker, so each step is checked on memory before the next
            rows = masked.tolist()
            keep = max(rising_workers, key=lambda k: rows[k][picks[k]] - rows[k][self.zero])
            for k in rising_workers:
                picks[k], cost[k], moves[k] = self.zero, 0.0, 0
            one = self._delta_list.index(1)
            if rows[keep][one] > -np.inf:  # the +1 is allowed (the mask): that one step
                picks[keep], moves[keep] = one, 1
                cost[keep] = self.stage_worker_bytes(obs).tolist()[keep]
        if float(np.sum(cost)) > mem_budget:
            rising = [k for k, m in enumerate(moves) if m > 0]
            rows = masked.tolist()
            advantage = {k: rows[k][picks[k]] - rows[k][self.zero] for k in rising}
            probe = self.probe_bytes(obs).tolist()
            probing = True
            for k in sorted(rising, key=lambda k: -advantage[k]):  # stable: on ties, the knobs' order
                c = cost[k]
                if is_cpu[k] and moves[k] == 1 and probing and c > mem_budget:
                    c, probing = min(c, probe[k]), False
                if c <= mem_budget:
                    mem_budget -= c
                else:
                    picks[k] = self.zero
        return np.array(picks, dtype=np.int64)

    def _light_rows(self, obs: Observation) -> list[int]:
        """Rows of the CPU knobs (in ``self._cpu``'s order) whose stage is light this tick."""
        light = set(obs.light_stages())
        return [row for row, k in enumerate(self._cpu.tolist()) if self._stages[k] in light]

    def _best_under_cpu_budget(self, scores: np.ndarray, budget: int, light: Sequence[int] = (),
                               free: int = 0) -> np.ndarray:
        """argmax of sum_k scores[k, a_k] subject to sum_k deltas[a_k] <= budget, where the rows in
        ``light`` may add ``light_worker_room`` workers past it between them: the runner's joint grant
        (``intune.policies.base._grant_cpus``), so that what is planned here is what is applied.

        Most ticks each knob's own best action already fits the budget together; that is then the answer
        and the programme is skipped (with both CPUs busy: 0.70 -> 0.44 ms per decision)."""
        extra = light_worker_room(light, free)
        own_best = [max(self._order_list, key=row.__getitem__) for row in scores.tolist()]  # the first of equals, as argmax
        total = sum(self._delta_list[a] for a in own_best)
        if total <= budget or (total <= budget + extra and any(self._delta_list[own_best[r]] > 0 for r in light)):
            return np.array(own_best, dtype=np.int64)
        best = self._programme(scores, budget)
        if not extra:
            return best
        # one worker past the budget, where a light stage is among the increases that use it
        wider = self._programme(scores, budget + extra)
        if any(self._delta_list[int(wider[r])] > 0 for r in light):
            rows = np.arange(len(scores))
            if scores[rows, wider].sum() > scores[rows, best].sum():
                return wider
        return best

    def _programme(self, scores: np.ndarray, budget: int) -> np.ndarray:
        """The dynamic programme of ``_best_under_cpu_budget`` at one budget."""
        order = self._order
        n, reach = len(scores), int(np.abs(self.deltas).max())
        offset = n * reach
        width = 2 * offset + 1
        best = np.full(width, -np.inf)
        best[offset] = 0.0
        picks = np.zeros((n, width), dtype=np.int64)
        shifts = self.deltas[order]
        shifted = np.empty((len(order), width))
        for k in range(n):
            # row i: the best total reachable if knob k takes action order[i] (argmax keeps the first on ties)
            shifted.fill(-np.inf)
            for i, d in enumerate(shifts.tolist()):
                if d >= 0:
                    shifted[i, d:] = best[: width - d]
                else:
                    shifted[i, :d] = best[-d:]
            cand = shifted + scores[k, order][:, None]
            first = cand.argmax(axis=0)
            best = cand[first, np.arange(width)]
            picks[k] = order[first]
        limit = min(offset + budget, width - 1)
        total = int(np.argmax(best[: limit + 1]))
        out = np.empty(n, dtype=np.int64)
        for k in range(n - 1, -1, -1):
            out[k] = picks[k, total]
            total -= int(self.deltas[out[k]])
        return out


def shuffle_floor(safety: SafetyLayer, obs: Observation) -> np.ndarray:
    """Per knob, the least value the policy asks for while memory is comfortable: a shuffle buffer's
    size as the user set it (it sets how random the order is), every other knob's minimum."""
    kinds = obs.kinds()
    return np.array([k.value if k.unit == "mb" and kinds.get(k.stage) == "shuffle" else k.min for k in safety.knobs])


def start_allocation(knobs: Mapping[str, Knob], safety: SafetyLayer, obs: Observation, warm_start: str) -> dict[str, int]:
    """Even split or Plumber's estimate, with buffers cut to fit the memory (``SafetyLayer.trim``) and
    worker growth scaled down, every knob alike, to the memory budget that leaves, each added worker
    priced at its stage's price (``stage_worker_bytes``: its measured memory where the first tick has a
    reading)."""
    if warm_start == "plumber":
        from intune.policies import make

        plumber = make("plumber", profile_ticks=1)  # plan from the first observation
        plumber.reset(knobs, obs)
        wanted: dict[str, Any] = {**even_split(knobs, obs.cpus), **plumber.step(obs)}
    else:
        wanted = even_split(knobs, obs.cpus)
    values = {n: k.value for n, k in knobs.items()}
    # buffers the memory cannot hold when full are cut before anything else (the runner applies
    # decreases first); the workers then grow only into what is left
    trimmed = dict(zip(values, safety.trim(obs, list(values.values())).tolist(), strict=True))
    for n, v in trimmed.items():
        if v < values[n]:
            wanted[n] = min(int(wanted.get(n, v)), v)
    after = {n: int(wanted.get(n, v)) if knobs[n].unit == "mb" else v for n, v in values.items()}
    budget = safety.worker_budget(obs, list(after.values()))
    price = dict(zip((k.name for k in safety.knobs), safety.stage_worker_bytes(obs).tolist(), strict=True))
    cost = sum(max(0, int(v) - values[n]) * price[n] for n, v in wanted.items() if knobs[n].unit == "cpu")
    if cost > 0 and cost > budget:
        scale = max(0.0, budget) / cost
        wanted = {
            n: (values[n] + int((int(v) - values[n]) * scale) if knobs[n].unit == "cpu" and int(v) > values[n] else int(v))
            for n, v in wanted.items()
        }
    return {n: int(v) for n, v in wanted.items() if int(v) != values[n]}
