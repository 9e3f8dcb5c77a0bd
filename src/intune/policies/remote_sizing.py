"""Remote workers: the shared arithmetic of how many a pipeline needs, and the shared sizing rule.

A map stage may run workers on a cluster beside its local ones (knob ``<stage>.remote_workers``,
``Knob.remote``). The objective is the trainer's need, at the least cluster cost (remote CPU-ticks):

- **Local CPUs first.** They are paid for already: a remote worker is added only where the local CPUs,
  used as well as they can be, fall short.
- **Known demand** (``Observation.demand > 0``, the consumer's rows/s): reach it with the fewest remote
  CPUs. Demand counts as met at ``DEMAND_MET`` of it (above the measurement noise).
- **Unknown demand**: add a remote worker only while each one raises the pipeline's rows/s by at least
  ``REMOTE_MIN_GAIN`` of what one local worker of that stage delivers (a remote CPU must buy at least a
  quarter of a local CPU's worth of that stage's work, transfer included, where it ends up as rows
  delivered; behind another bottleneck it buys nothing and is not added).
- With a known demand the same pay test stops the additions where the demand cannot be reached (a
  bottleneck a remote worker cannot relieve).

The arithmetic (``RemoteReading``, ``remote_rows_needed``, ``remote_pays``, ``demand_gap``) is shared by
every policy that sizes remote workers; ``RemoteSizer`` is the rule that ``steer``, ``intune`` and
``intune+steer`` use (``with_remote_placement`` gives a policy that tunes local knobs a remote placement
step); ``heuristic``, ``autotune``, ``plumber`` and the ``oracle`` size them in their own way (see each).

The need, from one tick's measurements: the other stages cost ``s`` local CPU seconds per delivered row,
the remote stage ``c`` per row its local workers process, and remote workers take rows before local
ones. At demand ``D`` the local CPUs ``C`` (``LOCAL_USE`` of them: whole workers and oversubscription
lose some) carry ``D * s + c * (D - x)`` when remote workers take ``x`` rows/s, so
``x >= (D * (s + c) - LOCAL_USE * C) / c``; where the stage's busy local workers wait rather than
compute (``WAITING_SHARE``: a GIL), they top at ``L`` rows/s however many there are, so also
``x >= D - LOCAL_USE * L``. ``ceil(x / rho)`` workers deliver ``x``, ``rho`` being one remote worker's
measured rows/s (before any ran: one local CPU's rows/s of that stage, which ignores the transfer and so
starts low). It must not touch knobs: it returns requests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from intune.knobs import Knob
from intune.monitor.observation import Observation

REMOTE_MIN_GAIN = 0.25
"""Without a known demand, a remote worker pays if it raises the pipeline's rows/s by at least this share
of one busy local worker of its stage's rows/s; with a known demand, additions that do not stop."""

DEMAND_MET = 0.98
"""A known demand is met at this share of it: the 2% below it covers the simulator's 2% measurement noise on
the mean of two ticks (1.4%)."""

LOCAL_USE = 0.95
"""Share of the local CPUs the need counts on the local workers using (whole workers, oversubscription)."""

SHED_MARGIN = 0.15
"""With the demand met, remote workers are shed once they exceed the need by this share (hysteresis)."""

SETTLE_TICKS = 3
"""Ticks after a change of remote workers before the sizing reads the pipeline again."""

PATIENCE_TICKS = 8
"""Ticks a shortfall (or a met demand) must last before workers are added beyond the need's estimate
(or shed): the local policy moves its workers in that time."""

JUDGE_TICKS = 20
"""Ticks an addition has to pay (or the demand to be met) before it is undone: the remote workers free
local CPUs that the local policy must move to the stage that now binds."""

BLOCK_TICKS = 30
"""Ticks without additions after one did not pay; doubled at each failure in a row (at most 8 times)."""

STEP_SHARE = 0.10
"""Without a known demand, a step adds the workers expected to raise the rows/s by this share: a single
worker's gain at 64 nodes is below the noise; a tenth of the throughput is well above it."""

MAX_STEP_SHARE = 0.4
"""The most a step's share grows to: a step that raised the rows/s by at least half its aim doubles the next
one, so a pipeline far below what the cluster can give climbs in a few steps, not tens; past two doublings a
step outruns what the local policy re-balances the other stages for within ``JUDGE_TICKS`` (0.8 overshot the
pool and was undone whole)."""

PROBE_EVERY = 60
"""Without a known demand, settled ticks between probes that shed a step (do the workers still pay?)."""

SATURATED = 0.9
"""The local CPUs count as saturated when the workers use this share of them."""

WAITING_SHARE = 0.5
"""A stage's busy local workers that use less than this share of a CPU each wait (on the GIL, a lock,
I/O): more of them would not use the free CPUs, so its rows are worth a remote worker even with local
CPUs free."""

LOCAL_SHARE_READ = 0.2
"""The stage's local CPU per row is read only on ticks where its local workers process this share of its
rows or more."""

LOCAL_FLAT_GAIN = 0.25
"""A binding stage's local workers count as flat when a relative change of them moved the pipeline's rows/s
by less than this share of it (a tenth more workers, under 2.5% more rows): the same share as
``REMOTE_MIN_GAIN``, one worker buying less than a quarter of its share of the rows."""

LOCAL_FLAT_MOVE = 0.1
"""Worker counts compared for the local gain differ by at least this share: a smaller change moves the rows
by less than the measurement noise of a two-tick mean (1.4%) over ``LOCAL_FLAT_GAIN``."""

LOCAL_FLAT_SAMPLES = 2
"""Ticks a worker count must be seen at (the stage binding) before its mean rows/s is compared."""


def demand_gap(obs: Observation) -> float:
    """Rows/s short of a known demand (0 when met within ``DEMAND_MET`` or unknown)."""
    if obs.demand <= 0 or obs.throughput >= DEMAND_MET * obs.demand:
        return 0.0
    return obs.demand - obs.throughput


def remote_rows_needed(demand: float, other_cpu_per_row: float, stage_cpu_per_row: float, local_cpus: float) -> float:
    """Rows/s the remote workers must take for the local CPUs to carry ``demand`` (module docstring):
    ``(D * (s + c) - C) / c``, within ``[0, D]``; ``D`` when the other stages alone exceed ``C``."""
    if demand <= 0:
        return 0.0
    if stage_cpu_per_row <= 0:
        return 0.0 if demand * other_cpu_per_row <= local_cpus else demand
    need = (demand * (other_cpu_per_row + stage_cpu_per_row) - local_cpus) / stage_cpu_per_row
    return min(demand, max(0.0, need))


def remote_pays(gain_rows_per_s: float, added_workers: int, local_worker_rate: float) -> bool:
    """Whether ``added_workers`` remote workers that raised the pipeline's rows/s by ``gain_rows_per_s``
    pay: at least ``REMOTE_MIN_GAIN`` of one local worker's rows/s each."""
    if added_workers <= 0:
        return True
    return gain_rows_per_s >= REMOTE_MIN_GAIN * local_worker_rate * added_workers


@dataclass(frozen=True)
class RemoteReading:
    """What one tick says about a stage with remote workers (rows/s, CPU seconds)."""

    stage: str
    remote_workers: int
    remote_rows: float  # rows/s its remote workers delivered
    local_rows: float  # rows/s its local workers delivered
    local_cpu: float  # CPU seconds a second its local workers used
    local_worker_rate: float | None  # rows/s of one busy local worker (None without local rows)
    remote_worker_rate: float | None  # rows/s of one remote worker (None without remote rows)
    other_cpu_per_row: float  # local CPU seconds per delivered row of every other stage
    local_cpus_used: float  # CPU seconds a second all local workers used
    local_busy: float  # busy share of its local workers
    local_workers: int  # its local workers

    @property
    def local_workers_wait(self) -> bool:
        """Whether its busy local workers each use less than ``WAITING_SHARE`` of a CPU (they wait)."""
        return workers_wait(self.local_cpu, self.local_busy, self.local_workers)

    @property
    def remote_busy(self) -> bool:
        """Whether its remote workers were all busy: its local workers processed rows too (remote
        workers are served first, so local ones get rows only when none is free): a share of the rows,
        or, however few they are beside the remote ones, most of their time."""
        if self.local_busy < 0.05 or self.local_rows <= 0:
            return False
        return self.local_busy >= 0.5 or self.local_rows >= 0.05 * (self.local_rows + self.remote_rows)

    @property
    def stage_cpu_per_row(self) -> float | None:
        """Local CPU seconds per row its local workers process; None unless they process at least
        ``LOCAL_SHARE_READ`` of the stage's rows (the local rows are the stage's minus the remote ones,
        both measured: a small difference of two noisy rates is mostly noise)."""
        if self.local_rows < LOCAL_SHARE_READ * (self.local_rows + self.remote_rows) or self.local_cpu <= 0:
            return None
        return self.local_cpu / self.local_rows


def read_remote_stage(obs: Observation, stage: str) -> RemoteReading:
    """The remote stage's reading from the Observation (its ``cpu_s_per_item`` and ``wall_s_per_item``
    are its local workers' per emitted chunk, remote chunks included)."""
    st = obs.stage(stage)
    rows_per_item = st.rows_per_s / st.items_per_s if st.items_per_s > 0 else 0.0
    remote_rows = max(0.0, min(st.remote_items_per_s * rows_per_item, st.rows_per_s))
    local_rows = max(0.0, st.rows_per_s - remote_rows)
    local_cpu = st.cpu_s_per_item * st.items_per_s
    busy_workers = st.busy * st.workers
    local_rate = local_rows / busy_workers if busy_workers > 0 and local_rows > 0 else None
    remote_rate = remote_rows / st.remote_workers if st.remote_workers > 0 and remote_rows > 0 else None
    used = sum(s.cpu_s_per_item * s.items_per_s for s in obs.stages)
    other = used - local_cpu
    return RemoteReading(
        stage=stage,
        remote_workers=st.remote_workers,
        remote_rows=remote_rows,
        local_rows=local_rows,
        local_cpu=local_cpu,
        local_worker_rate=local_rate,
        remote_worker_rate=remote_rate,
        other_cpu_per_row=other / obs.throughput if obs.throughput > 0 else 0.0,
        local_cpus_used=used,
        local_busy=st.busy,
        local_workers=st.workers,
    )


def binds_on_waiting_stage(obs: Observation, stage: str) -> str | None:
    """The stage that binds the pipeline elsewhere while its workers wait, if there is one: the busiest
    stage, busy at least ``SATURATED``, not ``stage`` (which is itself less busy), whose busy workers
    use less than ``WAITING_SHARE`` of a CPU each (a GIL, a lock, I/O).

    Such a stage may be capped (a GIL, a lock: no worker count raises it, and the CPUs a remote worker
    frees buy no row) or only short of workers that each need some CPU (I/O: on a saturated machine its
    growth needs the CPUs a remote worker frees). Its waiting alone does not tell which;
    ``RemoteSizer`` asks its measured gain (``LocalGain``)."""
    own = obs.stage(stage)
    busiest = max(obs.stages, key=lambda s: s.busy)
    if busiest.name == stage or busiest.busy < SATURATED or own.busy >= busiest.busy:
        return None
    if not workers_wait(busiest.cpu_s_per_item * busiest.items_per_s, busiest.busy, busiest.workers):
        return None
    return busiest.name


def binds(obs: Observation, stage: str) -> bool:
    """Whether ``stage`` binds the pipeline: busy at least ``SATURATED`` and the busiest stage."""
    busy = obs.stage(stage).busy
    return busy >= SATURATED and busy >= max(s.busy for s in obs.stages)


def workers_wait(cpu_s_per_s: float, busy: float, workers: int) -> bool:
    """Whether a stage's busy workers (``busy`` share of ``workers``, using ``cpu_s_per_s`` CPU seconds
    a second between them) each use less than ``WAITING_SHARE`` of a CPU: they wait on something else."""
    busy_workers = busy * workers
    return busy_workers > 0 and cpu_s_per_s / busy_workers < WAITING_SHARE


def remote_knobs(knobs: Mapping[str, Knob]) -> dict[str, Knob]:
    """The remote knobs (``Knob.remote``) by name."""
    return {n: k for n, k in knobs.items() if k.remote}


def local_knobs(knobs: Mapping[str, Knob]) -> Mapping[str, Knob]:
    """The knobs that are not remote (``knobs`` itself when none is)."""
    if not any(k.remote for k in knobs.values()):
        return knobs
    return {n: k for n, k in knobs.items() if not k.remote}


def _ewma(old: float | None, new: float, weight: float = 0.5) -> float:
    return new if old is None else old + weight * (new - old)


class LocalGain:
    """Whether a binding stage's local workers still raise the pipeline's rows/s, from the local policy's
    own moves: the mean rows/s seen at each (local workers, remote workers) while the stage binds (the
    busiest, busy at least ``SATURATED``). The current count, seen ``LOCAL_FLAT_SAMPLES`` ticks, is compared
    with the nearest other count seen as often at the same remote workers and at least ``LOCAL_FLAT_MOVE``
    away; the stage is flat when the rows/s moved by less than ``LOCAL_FLAT_GAIN`` of the relative change of
    its workers.

    Why: local workers of a stage that wait part of each row (a GIL held for a share of it) stop adding
    rows with CPUs free and each one still using more than ``WAITING_SHARE`` of a CPU; their busy share
    and CPU use look like those of workers that compute. Their measured gain tells the two apart, and
    where they are flat only remote workers can raise the rows/s. Once flat, the verdict holds until
    ``reset`` (a new context): a stage's waiting is a property of its code, not of the moment."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.rows: dict[tuple[int, int], tuple[float, int]] = {}  # (local, remote) -> (mean rows/s, ticks)
        self.flat = False

    def update(self, workers: int, remote: int, rows: float, binds: bool) -> None:
        if not binds or workers <= 0 or rows <= 0:
            return
        key = (workers, remote)
        mean, n = self.rows.get(key, (0.0, 0))
        self.rows[key] = (mean + (rows - mean) / (n + 1), n + 1)
        if self.flat or n + 1 < LOCAL_FLAT_SAMPLES:
            return
        seen = [(w, m) for (w, r), (m, k) in self.rows.items()
                if r == remote and k >= LOCAL_FLAT_SAMPLES and abs(w / workers - 1.0) >= LOCAL_FLAT_MOVE]
        if not seen:
            return
        other, other_rows = min(seen, key=lambda wm: abs(math.log(wm[0] / workers)))
        now = self.rows[key][0]
        rows_fewer, rows_more = (other_rows, now) if other < workers else (now, other_rows)
        more_workers = max(other, workers) / min(other, workers) - 1.0
        self.flat = rows_more / rows_fewer - 1.0 < LOCAL_FLAT_GAIN * more_workers


class RemoteSizer:
    """The shared sizing rule for remote knobs (module docstring); ``reset`` then ``step`` every tick.

    Each tick it reads the remote stage (``read_remote_stage``) and keeps two measurements: one remote
    worker's rows/s (while local workers also take rows, the remote ones are busy: their rate is
    measured, else it is only a floor) and the stage's local CPU per row. After ``SETTLE_TICKS`` since
    the last change of its remote workers (its own, a node loss, the runner's clamp) it decides, on the
    mean rows/s of the last two ticks:

    - known demand, short of it: up to the need's estimate at once (``remote_rows_needed``); if the need
      is already covered and the shortfall lasts ``PATIENCE_TICKS`` while the local CPUs are saturated
      (or the stage is the busy bottleneck with no free CPU, or with busy local workers that use less
      than ``WAITING_SHARE`` of a CPU each: a GIL-bound stage), the workers the gap needs, on a mean of
      ticks of one local allocation (a mean that straddles the local policy's move is of neither): never while
      the stage's remote workers idle (its local workers get no rows: the pipeline binds elsewhere), and
      never while the local CPUs have room the local policy leaves unused. An addition that has not
      paid (``remote_pays``) nor met the demand within ``JUDGE_TICKS`` is undone (at once if one
      remote worker delivers less than the pay threshold) and additions wait ``BLOCK_TICKS`` (doubled
      at each failure in a row, at most 8 times); remote workers idle for ``JUDGE_TICKS`` short of the
      demand are cut to what the rows delivered need;
    - known demand, met for ``PATIENCE_TICKS``: once the workers exceed the need by ``SHED_MARGIN``,
      shed half the excess; a shortfall ``PATIENCE_TICKS`` after a shed undoes it, and sheds wait
      ``4 * PATIENCE_TICKS`` (doubled at each undone shed in a row, at most 8 times);
    - unknown demand, the local CPUs saturated or the stage the bottleneck (busy, with no free CPU, with
      waiting local workers, or with local workers whose measured gain is flat, ``LocalGain``): add a step of workers
      expected to raise the rows/s by ``step_share`` (``STEP_SHARE`` at first, doubled after a step that
      raised them by half its aim or more, up to ``MAX_STEP_SHARE``, and back to ``STEP_SHARE`` after one
      that raised them by less) and keep it if it pays (``remote_pays``),
      else undo it, wait and aim at ``STEP_SHARE`` again; every ``PROBE_EVERY`` settled ticks shed a step,
      and restore it if it was paying.

    Saturated local CPUs do not count where another stage binds whose workers wait rather than compute
    (``binds_on_waiting_stage``) and whose own workers were measured flat (``LocalGain``, kept for every
    stage from the local policy's moves): the stage is capped, and the CPUs a remote worker frees would
    buy nothing there. A waiting stage not measured flat may only be short of workers that need CPUs
    (I/O on a saturated machine): the addition is tried, and undone if it does not pay.

    Several remote stages: the one whose local rows cost the most CPU is sized, the others hold.
    """

    def __init__(self, knobs: Mapping[str, Knob]) -> None:
        self.knobs = {n: k for n, k in knobs.items() if k.remote}
        if not self.knobs:
            raise ValueError("RemoteSizer needs at least one remote knob (<stage>.remote_workers)")

    def reset(self, observation: Observation) -> None:
        self.tick = 0
        self.rate: dict[str, float | None] = {n: None for n in self.knobs}  # rows/s of one busy remote worker
        self.rate_floor: dict[str, float] = {n: 0.0 for n in self.knobs}  # rows/s one delivered, not busy
        self.cpu_per_row: dict[str, float | None] = {n: None for n in self.knobs}
        self.local_rate: dict[str, float | None] = {n: None for n in self.knobs}
        self.local_cap: dict[str, float | None] = {n: None for n in self.knobs}  # rows/s waiting local workers top at
        self.local_gain: dict[str, LocalGain] = {}  # by stage, made at its first reading (``_measure_gains``)
        self.expected: dict[str, int] = {n: k.value for n, k in self.knobs.items()}
        self.changed_at = 0
        self.history: deque[float] = deque(maxlen=2)
        self.local_workers: tuple[int, ...] = ()
        self.local_steady = 0  # ticks since the local workers changed: from 1, the two-tick history is of one allocation
        self.trial: Trial | None = None
        self.shed_from: tuple[int, int] | None = None  # (workers before a demand shed, tick)
        self.shed_blocked_until = 0
        self.shed_failures = 0
        self.blocked_until = 0
        self.failures = 0
        self.short_ticks = 0
        self.met_ticks = 0
        self.idle_ticks = 0
        self.context: tuple[float, float, float] | None = None
        self.last_action = ""
        self.step_share = STEP_SHARE  # the share of the rows/s the next step without a known demand aims at

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What it measured (a remote worker's rows/s, the stage's local CPU per row and worker rate);
        not the trial in flight nor its waits (a restart ends them), nor the waiting local workers' top
        (kept per context: a restarted job measures it again)."""
        return {
            "rate": dict(self.rate),
            "rate_floor": dict(self.rate_floor),
            "cpu_per_row": dict(self.cpu_per_row),
            "local_rate": dict(self.local_rate),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("rate", "cpu_per_row", "local_rate"):
            saved = state[key]
            unknown = sorted(set(saved) - set(self.knobs))
            if unknown:
                raise ValueError(f"remote sizing state: knobs {unknown} are not this pipeline's remote knobs {sorted(self.knobs)}")
            getattr(self, key).update({n: None if v is None else float(v) for n, v in saved.items()})
        self.rate_floor.update({n: float(v) for n, v in state["rate_floor"].items() if n in self.knobs})

    # -- the rule ----------------------------------------------------------------------------------
    def step(self, obs: Observation) -> dict[str, int]:
        self.tick += 1
        self.last_action = ""
        context = (obs.cpus, obs.remote_cpus, obs.demand)
        if context != self.context:  # a resize, a node loss, a new demand: what was learned may not hold
            self.context = context
            self.failures, self.blocked_until, self.shed_from = 0, 0, None
            self.step_share = STEP_SHARE
            self.shed_failures, self.shed_blocked_until = 0, 0
            self.local_cap = {n: None for n in self.knobs}
            for gain in self.local_gain.values():
                gain.reset()
        local = tuple(s.workers for s in obs.stages)
        self.local_steady = self.local_steady + 1 if local == self.local_workers else 0
        self.local_workers = local
        running = {n: k.value for n, k in self.knobs.items()}
        if running != self.expected:  # not our change: a node lost its workers, or the runner clamped
            self.expected = running
            self.changed_at, self.trial = self.tick, None
            self.history.clear()
        if obs.oom or obs.throughput <= 0 or obs.remote_cpus <= 0:
            return {}
        name = self._lead(obs)
        stage = self.knobs[name].stage
        reading = read_remote_stage(obs, stage)
        self._measure(name, reading, reading.local_cpus_used >= SATURATED * obs.cpus)
        self._measure_gains(obs)
        if self.tick - self.changed_at >= 1:
            self.history.append(obs.throughput)
        if self.tick - self.changed_at < SETTLE_TICKS or len(self.history) < 2:
            return {}
        rows = sum(self.history) / len(self.history)
        r = running[name]
        target = self._decide(obs, name, reading, rows, r)
        if target is None or target == r:
            return {}
        target = self.knobs[name].clamp(target)
        self.expected = {**running, name: target}
        self.changed_at = self.tick
        self.history.clear()
        return {name: target}

    def _lead(self, obs: Observation) -> str:
        if len(self.knobs) == 1:
            return next(iter(self.knobs))
        cost = {n: read_remote_stage(obs, k.stage).local_cpu for n, k in self.knobs.items()}
        return max(cost, key=cost.__getitem__)

    def _measure_gains(self, obs: Observation) -> None:
        """Each stage's ``LocalGain`` at this tick, its rows compared at the same remote workers (all of the
        pipeline's: a remote worker anywhere changes what the same local workers deliver)."""
        remote = obs.allocated_remote_cpus
        for s in obs.stages:
            gain = self.local_gain.setdefault(s.name, LocalGain())
            gain.update(s.workers, remote, obs.throughput, binds(obs, s.name))

    def _measure(self, name: str, reading: RemoteReading, saturated: bool) -> None:
        per_row = reading.stage_cpu_per_row
        if per_row is not None:
            self.cpu_per_row[name] = _ewma(self.cpu_per_row[name], per_row, 0.3)
            if reading.local_worker_rate is not None:
                self.local_rate[name] = _ewma(self.local_rate[name], reading.local_worker_rate, 0.3)
        if reading.local_busy >= 0.3 and reading.local_rows > 0 and reading.local_workers_wait and not saturated:
            # local workers that wait with CPUs free (not oversubscribed: a GIL, a lock) top at their rows
            # over their busy share, however many: a property of the stage, kept until the context changes
            top = reading.local_rows / reading.local_busy
            self.local_cap[name] = _ewma(self.local_cap[name], top, 0.3)
        measured = reading.remote_worker_rate
        if measured is None:
            return
        if reading.remote_busy:  # its local workers worked too: the remote ones had all the rows they could take
            self.rate[name] = _ewma(self.rate[name], measured)
        else:  # the remote workers took every row: only a floor on what one can do
            self.rate_floor[name] = max(self.rate_floor[name], measured)

    def _rates(self, name: str) -> tuple[float, float, float] | None:
        """(one remote worker's rows/s, the stage's local CPU per row, one local worker's rows/s)."""
        c = self.cpu_per_row[name]
        if c is None or c <= 0:
            return None
        local = self.local_rate[name] or 1.0 / c
        rho = self.rate[name]
        if rho is None:  # not measured busy yet: one local CPU's rows/s (no transfer: starts low), or more
            rho = max(1.0 / c, self.rate_floor[name])
        return rho, c, local

    def _decide(self, obs: Observation, name: str, reading: RemoteReading, rows: float, r: int) -> int | None:
        rates = self._rates(name)
        if rates is None:
            return None
        rho, c, local = rates
        if self.trial is not None:
            verdict = self._judge(obs, rows, local, self.rate[name])
            if verdict is not None:
                return verdict
        if self.rate[name] is not None and self.rate[name] < REMOTE_MIN_GAIN * local:
            # a remote worker delivers less than the pay threshold: no addition can raise the rows/s by it
            return None if r == 0 else self._no_pay(r)
        busy = r == 0 or reading.remote_busy  # with none idle, more would take rows
        self.idle_ticks = 0 if busy else self.idle_ticks + 1
        short = obs.demand <= 0 or rows < DEMAND_MET * obs.demand
        if not busy and short and self.idle_ticks >= JUDGE_TICKS and self.trial is None:
            # the stage's remote workers have taken every row for a while, short of the demand: the pipeline
            # binds elsewhere. Keep those the rows delivered now need (the model at ``rows``), and wait
            # before adding again
            self.idle_ticks = 0
            keep = min(r, self._need(rows, reading, rho, c, obs.cpus))
            if keep < r:
                self._fail()
                self.last_action = "shed_idle"
                return keep
        stage = self.knobs[name].stage
        # saturated local CPUs call for remote workers unless the stage that binds elsewhere is capped: its
        # workers wait and more of them measurably added no rows (the CPUs a remote worker frees buy none)
        waiting = binds_on_waiting_stage(obs, stage)
        capped = waiting is not None and self.local_gain[waiting].flat
        saturated = reading.local_cpus_used >= SATURATED * obs.cpus and not capped
        # the stage binds and its local workers cannot grow into free CPUs: there are none, its busy workers
        # wait rather than compute (more of them would not use the CPUs), or more of them measurably added
        # no rows (``LocalGain``)
        bottleneck = binds(obs, stage) and (obs.free_cpus < 1 or reading.local_workers_wait
                                            or self.local_gain[stage].flat)
        if obs.demand > 0:
            return self._for_demand(obs, reading, rows, r, rho, c, busy, saturated or bottleneck)
        return self._for_gain(rows, r, rho, c, reading, busy, saturated, bottleneck)

    def _no_pay(self, r: int) -> int | None:
        """Remote workers measured below the pay threshold each: none is kept (and none added)."""
        if self.trial is not None or r == 0:
            return None
        self._fail()
        self.last_action = "shed_unpaid"
        return 0

    def _fail(self) -> None:
        """An addition that did not pay: additions wait ``BLOCK_TICKS``, doubled at each failure in a row, and
        the next step is of ``STEP_SHARE`` again."""
        self.step_share = STEP_SHARE
        self.failures = min(self.failures + 1, 4)
        self.blocked_until = self.tick + BLOCK_TICKS * 2 ** (self.failures - 1)

    def _judge(self, obs: Observation, rows: float, local: float, rho: float | None) -> int | None:
        """The verdict on the trial in flight: kept (None, the trial ends), undone (the workers before it),
        or still open (None, the trial stays) while the local policy has ``JUDGE_TICKS`` to move the CPUs
        an addition freed. An addition whose remote workers each deliver less than the pay threshold is
        undone at once: the rows/s cannot rise by more than they deliver."""
        assert self.trial is not None
        t = self.trial
        if t.kind == "add":
            met = obs.demand > 0 and rows >= DEMAND_MET * obs.demand
            hopeless = rho is not None and rho < REMOTE_MIN_GAIN * local
            if not hopeless and (met or remote_pays(rows - t.rows_before, t.moved, local)):
                self.trial, self.failures = None, 0
                if t.share > 0:  # half its aim or more: the next step twice as large; less: the first size
                    full = rows - t.rows_before >= 0.5 * t.share * t.rows_before
                    self.step_share = min(MAX_STEP_SHARE, 2.0 * t.share) if full else STEP_SHARE
                return None
            if not hopeless and self.tick - t.start < JUDGE_TICKS:
                return None
            self.trial = None
            self._fail()
            self.last_action = "undo_unpaid_add"
            return t.before
        if self.tick - t.start < PATIENCE_TICKS:  # a shed probe: the local workers take the rows back
            return None
        self.trial = None
        if remote_pays(t.rows_before - rows, t.moved, local):
            self.last_action = "undo_paying_shed"
            return t.before
        return None

    def _start(self, kind: str, r: int, rows: float, moved: int, action: str, share: float = 0.0) -> None:
        self.trial = Trial(kind, r, rows, moved, self.tick, share)
        self.last_action = action

    def _need(self, demand: float, reading: RemoteReading, rho: float, c: float, cpus: float) -> int:
        x = remote_rows_needed(demand, reading.other_cpu_per_row, c, LOCAL_USE * cpus)
        cap = self.local_cap[self._name_of(reading)]
        if cap is not None:  # and what waiting local workers cannot deliver, however many
            x = min(demand, max(x, demand - LOCAL_USE * cap))
        return math.ceil(x / rho - 1e-9) if x > 0 else 0

    def _name_of(self, reading: RemoteReading) -> str:
        return next(n for n, k in self.knobs.items() if k.stage == reading.stage)

    def _for_demand(
        self, obs: Observation, reading: RemoteReading, rows: float, r: int, rho: float, c: float, busy: bool,
        pressed: bool,
    ) -> int | None:
        demand = obs.demand
        need = self._need(demand, reading, rho, c, obs.cpus)  # CPU seconds a second: not the runner's slack
        if self.shed_from is not None:  # a shed: the local workers have a patience to take its rows back
            before, at = self.shed_from
            if self.tick - at < PATIENCE_TICKS:
                return None
            self.shed_from = None
            if rows < DEMAND_MET * demand:  # they could not: back, and no shed for a while (doubling)
                self.shed_blocked_until = self.tick + 4 * PATIENCE_TICKS * 2 ** self.shed_failures
                self.shed_failures = min(self.shed_failures + 1, 3)
                self.last_action = "undo_shed"
                return before
            self.shed_failures = 0
        if rows < DEMAND_MET * demand:
            self.met_ticks = 0
            self.short_ticks += 1
            if self.tick < self.blocked_until or not busy:
                return None
            if need > r:  # the model: the local CPUs cannot carry the demand with fewer
                self.last_action = "to_need"
                return need
            # the local CPUs first: beyond the need, only once the local workers use them (or the stage
            # binds with none free)
            if self.trial is None and self.short_ticks >= PATIENCE_TICKS and pressed and self.local_steady >= 1:
                share = (reading.other_cpu_per_row + c) / c if reading.local_cpus_used >= SATURATED * obs.cpus else 1.0
                more = max(1, math.ceil((demand - rows) * share / rho))
                self._start("add", r, rows, more, "close_gap")
                self.short_ticks = 0
                return r + more
            return None
        self.short_ticks = 0
        self.met_ticks += 1
        if (self.trial is None and self.met_ticks >= PATIENCE_TICKS and self.tick >= self.shed_blocked_until
                and r > math.ceil(need * (1.0 + SHED_MARGIN))):
            self.shed_from = (r, self.tick)
            self.met_ticks = 0
            self.last_action = "shed_toward_need"
            return r - math.ceil((r - need) / 2)  # half the excess: the local workers absorb what is shed
        return None

    def _for_gain(
        self, rows: float, r: int, rho: float, c: float, reading: RemoteReading, busy: bool, saturated: bool,
        bottleneck: bool,
    ) -> int | None:
        if self.trial is not None:
            return None
        # the rows/s one remote worker is expected to add: all of its rows behind a bottleneck of its
        # stage, the share of the CPU it frees when the local CPUs bind
        gain = rho * (c / (reading.other_cpu_per_row + c) if saturated and not bottleneck else 1.0)

        def step(share: float) -> int:
            return max(1, math.ceil(share * rows / max(gain, 1e-12)))

        if busy and self.tick >= self.blocked_until and (saturated or bottleneck):
            more = step(self.step_share)
            self._start("add", r, rows, more, "add_step", self.step_share)
            return r + more
        if r > 0 and self.tick - self.changed_at >= PROBE_EVERY:  # a probe sheds a first-size step
            moved = min(r, step(STEP_SHARE))
            self._start("shed", r, rows, moved, "probe_shed")
            return r - moved
        return None


@dataclass(frozen=True)
class Trial:
    """A change of remote workers being judged: ``add`` (kept if it pays) or ``shed`` (undone if what was
    shed paid); the workers and rows/s before it, the workers it moved, the tick it started."""

    kind: str
    before: int
    rows_before: float
    moved: int
    start: int
    share: float = 0.0  # the share of the rows/s a step without a known demand aimed at


P = TypeVar("P")


def with_remote_placement(cls: type[P]) -> type[P]:
    """Give a policy class that tunes local knobs a remote placement step (class decorator).

    ``reset`` hands the policy the local knobs only and a ``RemoteSizer`` the remote ones (none: the
    policy runs exactly as before); ``step`` returns the policy's request with the sizer's; a
    ``state_dict`` carries the sizer's state under ``"remote"`` (only where there are remote knobs).
    The placement is the shared rule, not the policy's: a network pretrained without remote knobs keeps
    its own inputs and outputs.
    """
    reset: Callable[..., None] = cls.reset  # type: ignore[attr-defined]
    step: Callable[..., dict[str, int]] = cls.step  # type: ignore[attr-defined]
    state_dict = getattr(cls, "state_dict", None)
    load_state_dict = getattr(cls, "load_state_dict", None)

    def _reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        remote = remote_knobs(knobs)
        self.remote_sizer = RemoteSizer(remote) if remote else None
        reset(self, local_knobs(knobs), observation)
        if self.remote_sizer is not None:
            self.remote_sizer.reset(observation)

    def _step(self, observation: Observation) -> dict[str, int]:
        out = step(self, observation)
        sizer = getattr(self, "remote_sizer", None)
        return out if sizer is None else {**out, **sizer.step(observation)}

    cls.reset = _reset  # type: ignore[attr-defined]
    cls.step = _step  # type: ignore[attr-defined]
    if state_dict is not None and load_state_dict is not None:

        def _state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            state = state_dict(self, *args, **kwargs)
            sizer = getattr(self, "remote_sizer", None)
            return state if sizer is None else {**state, "remote": sizer.state_dict()}

        def _load_state_dict(self, state: Mapping[str, Any]) -> None:
            load_state_dict(self, state)
            sizer = getattr(self, "remote_sizer", None)
            if sizer is not None and state.get("remote") is not None:
                sizer.load_state_dict(state["remote"])

        _state_dict.__doc__, _load_state_dict.__doc__ = state_dict.__doc__, load_state_dict.__doc__
        cls.state_dict = _state_dict  # type: ignore[attr-defined]
        cls.load_state_dict = _load_state_dict  # type: ignore[attr-defined]
    _reset.__doc__, _step.__doc__ = reset.__doc__, step.__doc__
    return cls


__all__ = [
    "BLOCK_TICKS",
    "DEMAND_MET",
    "LOCAL_USE",
    "PATIENCE_TICKS",
    "REMOTE_MIN_GAIN",
    "RemoteReading",
    "RemoteSizer",
    "SETTLE_TICKS",
    "demand_gap",
    "local_knobs",
    "read_remote_stage",
    "remote_knobs",
    "remote_pays",
    "remote_rows_needed",
    "with_remote_placement",
]
