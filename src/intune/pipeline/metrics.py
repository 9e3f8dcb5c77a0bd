"""The engine's metrics snapshot: what ``Pipeline.metrics()`` returns.

Owns the field names that the monitor, the tuner and the benchmarks read. Counters are cumulative
since the pipeline was built (callers take differences between two snapshots); gauges are current.
It must not compute rates over windows of its own beyond ``rows_per_s`` and ``consumer_step_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageMetrics:
    """One stage. Counters (items .. restarts) are cumulative; the rest are gauges."""

    name: str
    kind: str  # "read" | "shuffle" | "map" | "batch" | "prefetch" | "dedup" | ...
    mode: str  # "thread" | "process" | "inline"
    workers: int  # active (not parked) workers now
    items: int  # chunks this stage has emitted
    rows: int  # rows this stage has emitted
    cpu_s: float  # CPU seconds spent by this stage's workers doing work
    busy_s: float  # worker wall seconds spent doing work (tf.data's "self time")
    starved_s: float  # worker wall seconds waiting for input
    blocked_s: float  # worker wall seconds waiting for room downstream
    queue_len: int  # items in this stage's output queue now
    queue_capacity: int  # capacity of that queue in items (0 = bounded by bytes only)
    queue_fill: float  # fullness of the output queue/buffer in [0, 1]
    buffered_bytes: int  # bytes this stage holds now (output queue + internal buffer)
    skipped: int = 0  # chunks skipped by on_error="skip"
    restarts: int = 0  # process workers restarted after dying
    bytes_out: int = 0  # bytes of the chunks this stage has emitted (cumulative)
    stalled_s: float = 0.0  # gauge: seconds the oldest work in hand has gone without progress
    stalled: bool = False  # gauge: stalled_s is past the pipeline's stall_after_s (hung, not starved)
    # gauge: memory one local worker holds, the mean over the workers (process: its private pages and
    # shared-memory segments; thread: the chunks in its hands, input and output); 0 = not measured
    worker_bytes: float = 0.0
    # of busy_s, seconds the local workers were ready to run while no CPU ran them (the kernel's
    # run-queue delay, ``intune.pipeline.cpu_wait``; cumulative); ``cpu_wait_measured`` False: not read
    cpu_wait_s: float = 0.0
    cpu_wait_measured: bool = False
    # a map stage's remote workers (``remote_ray``): items, rows and bytes_out above count their output
    # too; cpu_s, busy_s, starved_s, blocked_s and workers are the local workers' only
    remote_workers: int = 0  # gauge: value of "<name>.remote_workers" (0 without a remote pool)
    remote_items: int = 0  # chunks the remote workers emitted (cumulative)
    remote_rows: int = 0  # rows the remote workers emitted (cumulative)
    remote_cpu_s: float = 0.0  # CPU seconds the remote workers spent in the function (cumulative)
    remote_busy_s: float = 0.0  # wall seconds the remote workers spent in the function (cumulative)
    transfer_s: float = 0.0  # seconds remote chunks spent in transit, both ways (cumulative)
    transfer_bytes: int = 0  # bytes remote chunks moved, both ways (cumulative)
    remote_restarts: int = 0  # remote workers lost (actor or node died) while holding chunks (cumulative)


@dataclass(frozen=True)
class PipelineMetrics:
    """A snapshot of the whole pipeline."""

    time_s: float  # time.monotonic() when taken
    rows_out: int  # rows delivered to the consumer (cumulative)
    batches_out: int  # batches delivered to the consumer (cumulative)
    rows_per_s: float  # recent delivery rate (about the last second)
    consumer_step_s: float  # recent mean time the consumer spends between batches ("model latency")
    consumer_wait_s: float  # cumulative time the consumer waited inside next()
    buffered_bytes: int  # sum over stages
    stages: dict[str, StageMetrics] = field(default_factory=dict)
    remote_cpus: float = 0.0  # gauge: the cluster's free CPUs plus those this pipeline's remote workers hold (0: none)
