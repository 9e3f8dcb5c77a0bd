"""``autotune``: tf.data's AUTOTUNE, reimplemented faithfully on our knobs (the paper's baselines 2 and 3).

Sources read (not copied): TensorFlow's ``tensorflow/core/framework/model.cc`` (latency model, hill
climbing, optimisation loop; see ``autotune_model``), ``tensorflow/core/kernels/data/prefetch_autotuner.cc``
(the legacy prefetch autotuner) and the RAM budget manager of ``tensorflow/core/framework/model.h``.

What tf.data does, and how it maps onto a pipeline of stages with ``<stage>.workers`` and
``<stage>.buffer_mb`` knobs:

- Measurements: a node's self time is the wall time its workers spend per output element (so GIL
  waits, I/O waits and descheduling count as work): the stage's ``wall_s_per_item``, averaged over
  every element since launch. A node that has produced nothing is not tuned. The ratio of a node is
  the elements its input produced per element it produced (cumulative counts).
- Nodes: every stage with a ``workers`` knob is a parallel node (``num_parallel_calls=AUTOTUNE``)
  whose buffer holds ``parallelism / ratio`` elements; its ``buffer_mb`` knob, if any, is set to hold
  that many elements of its measured size. A prefetch stage (name starting with ``prefetch``, or as
  given) is a PrefetchDataset whose buffer belongs to the legacy prefetch autotuner and counts as 0
  in the model (a prefetch stage with workers is a parallel map feeding that prefetch). A shuffle
  stage's buffer (name starting with ``shuffle``) is the user's shuffle window: tf.data never tunes
  it and its RAM accounting does not see it.
- Optimisation: ``hill_climb`` from the minimums, parallelism capped by the thread-pool size fixed
  when the iterator was created (the cores at launch; here the runner's CPU budget, ``cpu_budget``,
  which is the CPUs in the simulator and adds what waiting workers leave unused live), stopping at all-maximum or when the
  maximum buffered bytes exceed the RAM budget; the CPU budget is not used (``AutotuneAlgorithm::DEFAULT``
  = MAX_PARALLELISM). It runs on ``Model::OptimizeLoop``'s schedule: at launch, then after 20 ms, 40 ms,
  ... doubling to once a minute, never reset; observation time is ``tick * dt_s``.
- Execution: tf.data runs every parallel node's calls on one shared thread pool of that fixed size;
  parallelism caps in-flight calls, it does not add threads. Our engine gives each stage dedicated
  workers, so the pool's threads are shared out as a saturated pool would: stage ``i`` holds threads in
  proportion to its thread demand (elements per root element times wall time per element), each stage
  capped at its parallelism (``share_pool``). ``pool="dedicated"`` instead maps parallelism to workers
  one to one (a stage may then ask for the whole pool).
- Legacy prefetch autotuner: the buffer limit starts at 1 element; "upswing" until the consumer finds
  the buffer at its limit, then "downswing" until it finds it empty, which doubles the limit (+2048
  past 2048 elements) if the RAM budget grants the bytes; it never shrinks. Per tick the consumer's
  view is the prefetch stage's fill (elements = queue_fill x capacity); it found the buffer empty if
  that is under half an element or if it was starved (throughput under 90% of a known demand, a
  margin well above measurement noise). A tick without consumption records nothing, and the first
  take after it sees the buffer as the pause left it: so a trainer that pauses (evaluation,
  checkpoints) in front of a slower pipeline makes the limit double at every pause.
- RAM budget: 0.5 x the host's free memory at launch (``obs.host_memory_free_bytes``), blind to the
  cgroup limit, to shuffle buffers and to worker memory; the legacy prefetch grants come out of it and
  the model gets what the grants leave. When the host's free memory is unknown (0), the memory the
  observation says is free is used instead.
- ``adaptive=True`` (autotune-adaptive, the paper's checkpoint and re-launch on machine resizing)
  re-launches everything (new pool size, RAM budget, schedule, statistics, prefetch autotuner) when
  ``obs.cpus`` changes. Either variant re-launches when the job comes back from an OOM kill, as a
  restarted process would.

- Remote workers (a stage's ``remote_workers`` knob, ``Knob.remote``): more parallelism for the same
  node, as a tf.data service's workers are more parallel calls. The node's self time counts the remote
  workers' time per element as the local ones' (a remote worker holds its call for compute and
  transfer: its worker-seconds over the elements it delivered); its parallelism may go past the local
  pool by the cluster's CPUs (``Observation.remote_cpus``, re-read every tick), and the calls in flight
  beyond the pool threads the stage holds (``share_pool``) run on remote workers. The hill climb has no
  cost for them: like the pool, it takes every one its model says lowers the output time.

It must not use anything tf.data would not know: no CPU budget, no cgroup memory limit, no
simulator internals. Its weaknesses (CPUs added after launch stay unused; buffers grow into an OOM
when the cgroup limit is below half the host's free memory) follow from the algorithm alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from intune.knobs import Knob
from intune.monitor.observation import Observation, StageObservation
from intune.policies.autotune_model import (
    BUFFER_SIZE,
    PARALLELISM,
    Node,
    Parameter,
    ReplanSchedule,
    hill_climb,
    maximum_buffered_bytes,
    output_time,
    with_values,
)
from intune.policies.base import cpu_budget
from intune.policies.static import changes
from intune.units import MB

RAM_BUDGET_SHARE = 0.5  # kRamBudgetShare
BUFFER_LIMIT_THRESHOLD = 2048  # prefetch_autotuner.cc: doubling below, +2048 at or above
STARVED_SHARE = 0.9  # the consumer took less than this share of its known demand: it found the buffer empty


class RamBudget:
    """tf.data's RAM budget manager: one budget shared by the legacy prefetch grants and the model."""

    def __init__(self, total_bytes: float) -> None:
        self.total = max(0.0, float(total_bytes))
        self.legacy_prefetch = 0.0
        self.model = 0.0

    def request_legacy_prefetch(self, delta_bytes: float) -> bool:
        """Grant ``delta_bytes`` more to a legacy prefetch buffer if the budget has room."""
        if delta_bytes > self.total - self.legacy_prefetch - self.model:
            return False
        self.legacy_prefetch += delta_bytes
        return True

    def available_to_model(self) -> float:
        return self.total - self.legacy_prefetch


class LegacyPrefetchAutotuner:
    """``PrefetchAutotuner``: grows a prefetch buffer (in elements) when the consumer finds it empty."""

    def __init__(self, ram: RamBudget, buffer_size_min: int = 0) -> None:
        self.ram = ram
        self.buffer_limit = max(1, int(buffer_size_min))
        self.mode = "upswing"
        self.element_bytes: float | None = None

    def set_element_size(self, element_bytes: float) -> None:
        """The first element's size: claim the initial limit's bytes (tf.data only warns if refused)."""
        self.ram.request_legacy_prefetch(element_bytes * self.buffer_limit)
        self.element_bytes = element_bytes

    def record_consumption(self, buffered_elements: float) -> None:
        """What the consumer saw: the buffer's element count when it took an element."""
        if self.mode == "upswing":
            if buffered_elements >= self.buffer_limit - 0.5:
                self.mode = "downswing"
            return
        if buffered_elements >= 0.5 or self.element_bytes is None:
            return
        if self.buffer_limit >= BUFFER_LIMIT_THRESHOLD:
            attempt = self.buffer_limit + BUFFER_LIMIT_THRESHOLD
        else:
            attempt = self.buffer_limit * 2
        if self.ram.request_legacy_prefetch((attempt - self.buffer_limit) * self.element_bytes):
            self.buffer_limit = attempt
        self.mode = "upswing"


def share_pool(pool_size: int, demand: Sequence[float], caps: Sequence[int], mins: Sequence[int]) -> list[int]:
    """How a saturated shared pool of ``pool_size`` threads ends up divided among stages.

    A pool thread serves whichever stage has work waiting, so in steady state the slowest stage (least
    threads per unit of thread demand, ``demand[i]`` = thread-seconds per delivered element) is the one
    that keeps collecting threads, until the pool is exhausted or that stage reaches its cap (its
    parallelism: more calls than that are never in flight), which then limits the pipeline and leaves
    the other threads idle. Integer threads, handed out one at a time from the minimums.
    """
    alloc = [int(m) for m in mins]
    caps = [max(a, int(c)) for a, c in zip(alloc, caps, strict=True)]
    growable = [i for i, d in enumerate(demand) if d > 0]
    while growable and sum(alloc) < pool_size:
        slowest = min(growable, key=lambda i: alloc[i] / demand[i])
        if alloc[slowest] >= caps[slowest]:
            break
        alloc[slowest] += 1
    return alloc


@dataclass
class _Totals:
    """A stage's counters since launch (what a tf.data node accumulates)."""

    items: float = 0.0
    wall_s: float = 0.0  # the local workers' busy seconds
    remote_s: float = 0.0  # the remote workers' seconds holding a call
    bytes: float = 0.0
    sized_items: float = 0.0

    def add(self, s: StageObservation, dt_s: float) -> None:
        n = max(0.0, s.items_per_s) * dt_s
        self.items += n
        self.wall_s += max(0.0, s.wall_s_per_item) * n
        if s.remote_items_per_s > 0:  # a remote worker holds its call for the whole tick it delivers in
            self.remote_s += s.remote_workers * dt_s
        if s.bytes_per_item > 0:
            self.bytes += s.bytes_per_item * n
            self.sized_items += n

    @property
    def self_time(self) -> float:
        """Seconds a call is held per element, by local and remote workers alike."""
        return (self.wall_s + self.remote_s) / self.items if self.items > 0 else 0.0

    @property
    def local_time(self) -> float:
        """Local threads' busy seconds per element (what the shared pool's threads are asked for)."""
        return self.wall_s / self.items if self.items > 0 else 0.0

    @property
    def element_bytes(self) -> float:
        return self.bytes / self.sized_items if self.sized_items > 0 else 0.0


@dataclass
class AutotunePlan:
    """The outcome of one optimisation, for inspection and reports."""

    time_s: float
    parallelism: dict[str, float] = field(default_factory=dict)  # tf.data's parallelism per stage
    buffer_elements: dict[str, float] = field(default_factory=dict)
    workers: dict[str, int] = field(default_factory=dict)
    remote_workers: dict[str, int] = field(default_factory=dict)  # calls in flight past the pool's threads
    buffer_mb: dict[str, int] = field(default_factory=dict)
    output_time_s: float = 0.0
    max_buffered_bytes: float = 0.0


class AutotunePolicy:
    """tf.data's AUTOTUNE (see the module docstring); ``adaptive=True`` re-launches it on every resize."""

    def __init__(
        self,
        adaptive: bool = False,
        pool: str = "shared",
        prefetch_stages: Sequence[str] | None = None,
        ram_budget_share: float = RAM_BUDGET_SHARE,
    ) -> None:
        if pool not in ("shared", "dedicated"):
            raise ValueError(f"autotune: pool must be 'shared' or 'dedicated', got {pool!r}")
        self.adaptive = adaptive
        self.name = "autotune-adaptive" if adaptive else "autotune"
        self.pool = pool
        self.ram_budget_share = ram_budget_share
        self._prefetch_names = None if prefetch_stages is None else set(prefetch_stages)
        self._knobs: Mapping[str, Knob] = {}
        self._remote_cpus = 0
        self.launches = 0
        self.optimizations = 0
        self.plan: AutotunePlan | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self._knobs = knobs
        self._kinds = observation.kinds()
        self.launches = 0
        self._launch(observation)

    def _launch(self, obs: Observation) -> None:
        """A new iterator: thread pool, RAM budget, schedule, statistics and prefetch autotuners."""
        self.launches += 1
        self.pool_size = max(1, int(cpu_budget(obs, self._knobs)))  # tf.data's pool: the cores; here the runner's grant
        self.launch_cpus = obs.cpus
        free = obs.host_memory_free_bytes
        if free <= 0:  # unknown host memory: fall back to what the observation says is free
            free = max(0.0, obs.memory_limit_bytes - obs.memory_used_bytes)
        self.ram = RamBudget(self.ram_budget_share * free)
        self.schedule = ReplanSchedule(self._now(obs))
        self._stages = [s.name for s in obs.stages]
        self._totals = {name: _Totals() for name in self._stages}
        self._prefetch = {
            name: LegacyPrefetchAutotuner(self.ram, 0)
            for name in self._stages
            if self._is_prefetch(name) and f"{name}.buffer_mb" in self._knobs
        }
        self._paused_fill: dict[str, float] = {}
        self._parallelism: dict[str, float] = {}
        self._target: dict[str, int] = {}
        self._restart_pending = False
        self.plan = None

    def _is_prefetch(self, stage: str) -> bool:
        if self._prefetch_names is not None:
            return stage in self._prefetch_names
        return self._kinds.get(stage) == "prefetch"

    def _is_shuffle(self, stage: str) -> bool:
        return not self._is_prefetch(stage) and self._kinds.get(stage) == "shuffle"

    @staticmethod
    def _now(obs: Observation) -> float:
        return obs.tick * obs.dt_s

    def step(self, observation: Observation) -> dict[str, int]:
        obs = observation
        if obs.oom:
            self._restart_pending = True
            return {}
        if self._restart_pending and obs.throughput > 0:
            self._launch(obs)  # the job came back: a new process, a new tf.data runtime
        elif self.adaptive and obs.cpus != self.launch_cpus:
            self._launch(obs)
        if [s.name for s in obs.stages] != self._stages:
            raise ValueError(
                f"autotune: the pipeline's stages changed from {self._stages} to {[s.name for s in obs.stages]}"
            )
        for s in obs.stages:
            self._totals[s.name].add(s, obs.dt_s)
        self._remote_cpus = max(0, int(obs.remote_cpus))
        self._run_prefetch_autotuners(obs)
        if self.schedule.due(self._now(obs)):
            self._optimize(self._now(obs))
        return changes(self._knobs, self._target)

    # -- the legacy prefetch autotuner, every tick ----------------------------------------------------

    def _run_prefetch_autotuners(self, obs: Observation) -> None:
        """What the consumer saw this tick, fed to each prefetch stage's legacy autotuner.

        The consumer finds the buffer empty when it holds no element, or when it was starved (took
        less than ``STARVED_SHARE`` of a known demand). A tick without consumption (a trainer pause)
        records nothing; the consumer's first take afterwards sees the buffer as the pause left it.
        """
        starved = obs.demand > 0 and obs.throughput < STARVED_SHARE * obs.demand
        for name, tuner in self._prefetch.items():
            size = self._totals[name].element_bytes
            if size <= 0:
                continue
            if tuner.element_bytes is None:
                tuner.set_element_size(size)
            knob = self._knobs[f"{name}.buffer_mb"]
            buffered = obs.stage(name).queue_fill * knob.value * MB / size
            if obs.throughput <= 0:
                self._paused_fill[name] = buffered
            else:
                if name in self._paused_fill:
                    tuner.record_consumption(self._paused_fill.pop(name))
                tuner.record_consumption(0.0 if starved else buffered)
            self._target[knob.name] = knob.clamp(math.ceil(tuner.buffer_limit * size / MB))

    # -- the model's optimisation, on the schedule ---------------------------------------------------

    def _chain(self) -> tuple[list[Node], list[Parameter]]:
        """The stages as tf.data nodes (source first) and the tunable parameters (sources first)."""
        chain: list[Node] = []
        params: list[Parameter] = []
        for i, name in enumerate(self._stages):
            t = self._totals[name]
            prev = self._totals[self._stages[i - 1]] if i > 0 else None
            ratio = prev.items / t.items if prev is not None and t.items > 0 and prev.items > 0 else 1.0
            workers, buffer = self._knobs.get(f"{name}.workers"), self._knobs.get(f"{name}.buffer_mb")
            remote = self._knobs.get(f"{name}.remote_workers")
            measured = t.items > 0
            if workers is not None:
                p_min = max(1, workers.min)
                p_max = max(p_min, min(workers.max, self.pool_size))
                in_flight = min(max(workers.value, p_min), p_max)
                if remote is not None:  # calls past the local pool run on the cluster's CPUs
                    p_max += min(remote.max, self._remote_cpus)
                    in_flight += remote.value
                current = self._parallelism.get(name, float(min(in_flight, p_max)))
                chain.append(Node(name, t.self_time, ratio, current, None, t.element_bytes))
                if measured:
                    params.append(Parameter(name, PARALLELISM, p_min, p_max))
                if self._is_prefetch(name):  # the prefetch that follows the parallel map: no work of its own
                    chain.append(Node(f"{name}/prefetch", 0.0, 1.0, 1.0, 0.0, t.element_bytes))
            elif self._is_prefetch(name):  # legacy-autotuned buffer: 0 elements in the model
                chain.append(Node(name, t.self_time, ratio, 1.0, 0.0, t.element_bytes))
            elif buffer is None or t.element_bytes <= 0 or self._is_shuffle(name):  # nothing tf.data tunes
                chain.append(Node(name, t.self_time, ratio, 1.0, None, t.element_bytes))
            else:  # a buffer of its own that tf.data would autotune (a non-legacy prefetch)
                size = t.element_bytes
                lo, hi = math.ceil(buffer.min * MB / size), max(0, math.floor(buffer.max * MB / size))
                lo = min(lo, hi)
                current = self._parallelism.get(f"{name}/buffer", float(min(max(buffer.value * MB / size, lo), hi)))
                chain.append(Node(name, t.self_time, ratio, 1.0, current, size))
                if measured:
                    params.append(Parameter(name, BUFFER_SIZE, lo, hi))
        return chain, params

    def _optimize(self, now_s: float) -> None:
        chain, params = self._chain()
        root_items = self._totals[self._stages[-1]].items
        if not params or root_items <= 0:
            return
        self.optimizations += 1
        values = hill_climb(chain, params, self.ram.available_to_model())
        tuned = with_values(chain, values)
        self.ram.model = maximum_buffered_bytes(tuned)
        plan = AutotunePlan(time_s=now_s, output_time_s=output_time(tuned), max_buffered_bytes=self.ram.model)
        by_name = {nd.name: nd for nd in tuned}
        for (node, pname), value in values.items():
            if pname == PARALLELISM:
                self._parallelism[node] = value
                plan.parallelism[node] = value
                plan.buffer_elements[node] = by_name[node].buffer_elements()
            else:
                self._parallelism[f"{node}/buffer"] = value
                plan.buffer_elements[node] = value
        self._plan_workers(plan)
        self._plan_buffers(plan, by_name)
        self.plan = plan

    def _plan_workers(self, plan: AutotunePlan) -> None:
        root_items = self._totals[self._stages[-1]].items
        names = [n for n in self._stages if f"{n}.workers" in self._knobs]
        knobs = [self._knobs[f"{n}.workers"] for n in names]
        caps = [int(self._parallelism.get(n, k.value)) for n, k in zip(names, knobs, strict=True)]
        if self._remote_cpus or any(f"{n}.remote_workers" in self._knobs for n in names):
            # the pool's threads serve the local calls only: a stage holds at most its local bound of them
            caps = [min(c, max(1, k.min, min(k.max, self.pool_size))) if f"{n}.remote_workers" in self._knobs else c
                    for n, k, c in zip(names, knobs, caps, strict=True)]
        if self.pool == "dedicated":
            alloc = caps
        else:
            demand = [self._totals[n].items / root_items * self._totals[n].local_time for n in names]
            alloc = share_pool(self.pool_size, demand, caps, [max(1, k.min) for k in knobs])
        for n, k, a in zip(names, knobs, alloc, strict=True):
            plan.workers[n] = k.clamp(a)
            self._target[k.name] = k.clamp(a)
            remote = self._knobs.get(f"{n}.remote_workers")
            if remote is not None:  # the calls in flight that the pool's threads do not hold
                calls = int(self._parallelism.get(n, k.value + remote.value))
                plan.remote_workers[n] = remote.clamp(min(calls - k.clamp(a), self._remote_cpus))
                self._target[remote.name] = plan.remote_workers[n]

    def _plan_buffers(self, plan: AutotunePlan, nodes: Mapping[str, Node]) -> None:
        for name in self._stages:
            knob = self._knobs.get(f"{name}.buffer_mb")
            if knob is None or name in self._prefetch or self._is_shuffle(name) or name not in plan.buffer_elements:
                continue
            size = nodes[name].element_bytes
            if size > 0:
                mb = knob.clamp(math.ceil(plan.buffer_elements[name] * size / MB))
                plan.buffer_mb[name] = mb
                self._target[knob.name] = mb


__all__ = ["AutotunePlan", "AutotunePolicy", "LegacyPrefetchAutotuner", "RamBudget", "share_pool"]
