"""The Observation and the Reward: what every policy sees and what the agent maximises.

One definition shared by the simulator and the live tuner, so a policy runs unchanged on both.
Owns the layout, the helpers both builders use to fill it (``observed_kind``, ``cpu_slack``) and the
reward formula; it must not read the machine or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

OOM_PENALTY = -10.0
"""Reward of a tick that ended in an out-of-memory kill (in units of normalised throughput)."""

MEMORY_SAFE_FRACTION = 0.85
"""Memory use (fraction of the limit) where the reward's memory factor starts to fall; also the memory
margin that the policies' safety mask keeps projected use under by default (``SafetyLayer``,
``AgentConfig.memory_margin``, ``SteerConfig.memory_margin``): past it a move only loses reward."""

STAGE_KINDS: tuple[str, ...] = ("read", "shuffle", "map", "batch", "prefetch", "stage")
"""What a stage does, declared by the stage (engine) or its spec (simulator), so that no policy guesses
it from a name. ``stage`` is any other kind."""

LIGHT_CPU_SHARE = 0.25
"""A stage whose workers, while busy, get at most this share of the CPU time that the most CPU-hungry
stage's workers get is light: its workers wait on something other than the CPUs (storage, a slower
stage), so one more costs little CPU. Relative, because on oversubscribed CPUs every stage's share
falls alike."""


def observed_kind(declared: str) -> str:
    """The Observation's kind (one of ``STAGE_KINDS``) of a stage's declared kind.

    Live stages declare their kind (``Stage.kind``), simulated ones their spec's kind; both pass it
    through here so that one rule holds: a ``udf`` is a map stage, and any kind outside
    ``STAGE_KINDS`` is ``stage``.
    """
    kind = "map" if declared == "udf" else declared
    return kind if kind in STAGE_KINDS else "stage"


@dataclass(frozen=True)
class StageObservation:
    """One stage, over the last tick."""

    name: str
    workers: int  # value of "<name>.workers" (0 if the stage has none)
    buffer_mb: int  # value of "<name>.buffer_mb" (0 if the stage has none)
    items_per_s: float  # chunks emitted per second
    rows_per_s: float  # rows emitted per second
    cpu_s_per_item: float  # CPU seconds per chunk (0 when nothing was emitted)
    wall_s_per_item: float  # worker busy wall seconds per chunk (tf.data's per-element self time)
    bytes_per_item: float  # mean bytes of an emitted chunk
    busy: float  # busy fraction of worker time in [0, 1]
    starved: float  # fraction of worker time waiting for input
    blocked: float  # fraction of worker time waiting for room downstream
    queue_fill: float  # output queue fullness in [0, 1]
    buffered_bytes: float  # bytes held by this stage
    stalled: bool = False  # work in hand without progress past the stall bound: hung, not slow
    kind: str = "stage"  # what the stage does, as it declares it, through observed_kind: one of STAGE_KINDS
    # how its workers run, as the stage declares it: "thread", "process" or "inline" (no pool); where
    # not declared, "process": what an added worker may cost is priced by it (``SafetyLayer``)
    mode: str = "process"
    remote_workers: int = 0  # value of "<name>.remote_workers" (0 if the stage has no remote pool)
    remote_items_per_s: float = 0.0  # of items_per_s, the chunks that remote workers processed
    transfer_s_per_item: float = 0.0  # mean seconds a remote chunk spent in transit (both ways, queueing in the object store included)
    transfer_bytes_per_item: float = 0.0  # mean bytes a remote chunk moved (both ways)
    # memory one local worker holds, measured (live: ``StageMetrics.worker_bytes``; simulated: the model's
    # figure with a reading's noise); 0 = not measured. What one more worker would add (``SafetyLayer``)
    worker_bytes: float = 0.0
    # of wall_s_per_item, the worker seconds per chunk spent ready to run while no CPU ran it (live: the
    # kernel's run-queue delay; simulated: the model's CPU share); None = not measured. The rest of the
    # wall time past the CPU time is the stage's own wait (storage, a lock), which more workers overlap
    cpu_wait_s_per_item: float | None = None

    @property
    def cpu_share(self) -> float | None:
        """CPU seconds per busy wall second of its workers (None without emitted items: no evidence)."""
        if self.workers <= 0 or self.items_per_s <= 0 or self.wall_s_per_item <= 0:
            return None
        return self.cpu_s_per_item / self.wall_s_per_item


@dataclass(frozen=True)
class Observation:
    """The whole pipeline and machine, over the last tick."""

    tick: int
    dt_s: float  # length of the tick
    throughput: float  # rows/s delivered to the consumer
    step_time_s: float  # consumer's step time ("model latency"); 0 when no consumer is attached
    cpus: float  # CPUs this process may use now
    memory_used_bytes: float
    memory_limit_bytes: float
    stages: tuple[StageObservation, ...]
    cpu_ghz: float = 2.5  # static machine factor
    mem_bandwidth_gbs: float = 20.0  # static machine factor
    oom: bool = False  # the job was killed for memory during this tick
    demand: float = 0.0  # rows/s the consumer could take (0 = unknown/unbounded)
    host_memory_free_bytes: float = 0.0  # free memory of the host, blind to cgroups (what tf.data reads)
    cpu_slack: float = 0.0  # workers' worth of CPU the workers leave unused (``cpu_slack``; the runner keeps the recent highest)
    grants_light_workers: bool = False  # the runner adds a light stage's worker past the CPUs (set by ``intune.policies.runner``)
    remote_cpus: float = 0.0  # CPUs a remote cluster offers this pipeline now: its free CPUs plus those its remote workers hold (0 = no cluster)

    @property
    def allocated_remote_cpus(self) -> int:
        return sum(s.remote_workers for s in self.stages)

    @property
    def allocated_cpus(self) -> int:
        return sum(s.workers for s in self.stages)

    @property
    def free_cpus(self) -> float:
        """CPUs not yet given to workers. A worker that mostly waits (an I/O-bound or blocked reader)
        does not hold a whole CPU: ``cpu_slack`` gives back what such workers measurably leave unused."""
        return self.cpus + self.cpu_slack - self.allocated_cpus

    def light_stages(self) -> tuple[str, ...]:
        """Stages whose workers' CPU share (``cpu_share``) is at most ``LIGHT_CPU_SHARE`` of the
        largest one, if the runner grants such a stage one worker past the CPUs
        (``grants_light_workers``; else none).

        Why: on a saturated machine the measured free CPUs are 0 even where a stage waits on storage
        and more of its workers would raise throughput (then the best allocation holds more workers
        than CPUs). Such a worker takes a few percent of a CPU from the others, so granting one past
        the budget is cheap, and only a measurement tells whether it pays
        (``tests/test_contracts.py::test_light_stages_are_those_waiting_on_something_else_than_the_cpus``)."""
        if not self.grants_light_workers:
            return ()
        shares = {s.name: u for s in self.stages if (u := s.cpu_share) is not None}
        top = max(shares.values(), default=0.0)
        return tuple(name for name, u in shares.items() if top > 0 and u <= LIGHT_CPU_SHARE * top)

    @property
    def memory_fraction(self) -> float:
        return self.memory_used_bytes / self.memory_limit_bytes if self.memory_limit_bytes > 0 else 0.0

    @property
    def free_memory_fraction(self) -> float:
        return max(0.0, 1.0 - self.memory_fraction)

    def kinds(self) -> dict[str, str]:
        """Each stage's kind (``STAGE_KINDS``) by stage name."""
        return {s.name: s.kind for s in self.stages}

    def stage(self, name: str) -> StageObservation:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r}; stages are {[s.name for s in self.stages]}")


def cpu_slack(stages: tuple[StageObservation, ...]) -> float:
    """Whole workers' worth of CPU that the stages' workers leave unused, as measured over the tick
    (live by the engine's counters, in the simulator by its model).

    A worker is counted as a CPU by the runner's budget, but a reader waiting on storage or blocked
    by a slower stage uses a fraction of one: on 2 CPUs such a reader would otherwise keep a CPU-bound
    UDF at one worker. With the slack, ``Observation.free_cpus`` is the CPUs minus the CPU the
    workers measurably use, so it falls to 0 by itself when the machine is saturated (oversubscribed
    workers share the CPUs and each uses less than one). Only stages that emitted items give evidence
    (a stage still warming up counts in full); the sum is rounded to whole workers. With remote workers,
    ``cpu_s_per_item`` is the local workers' CPU over every emitted chunk (``intune.monitor.live``), so
    the product is still the CPU used here.
    """
    unused = sum(
        max(0.0, s.workers - s.cpu_s_per_item * s.items_per_s)
        for s in stages
        if s.workers > 0 and s.items_per_s > 0
    )
    return float(round(unused))


def memory_factor(memory_fraction: float, safe: float = MEMORY_SAFE_FRACTION) -> float:
    """1 up to ``safe`` of the limit, falling linearly to 0 at the limit."""
    if memory_fraction <= safe:
        return 1.0
    if memory_fraction >= 1.0:
        return 0.0
    return (1.0 - memory_fraction) / (1.0 - safe)


def reward(obs: Observation, scale: float) -> float:
    """Throughput / ``scale`` times the memory factor; ``OOM_PENALTY`` on an OOM tick.

    ``scale`` normalises throughput (e.g. the rows/s of the even split, or the consumer's demand) so that
    rewards are comparable across pipelines.
    """
    if obs.oom:
        return OOM_PENALTY
    return (obs.throughput / scale if scale > 0 else 0.0) * memory_factor(obs.memory_fraction)
