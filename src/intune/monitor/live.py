"""Turns two engine metrics snapshots and a machine reading into the policies' Observation.

Owns the arithmetic from cumulative counters (``PipelineMetrics``) to per-tick rates and fractions,
so that the live engine yields the same Observation the simulator does (both fill it through
``intune.monitor.observation``'s helpers). A pure function: it must not
read the machine, the clock or the engine itself; the tuner passes everything in.
"""

from __future__ import annotations

from collections.abc import Mapping

from intune.knobs import REMOTE_SETTING, Knob
from intune.monitor.observation import Observation, StageObservation, cpu_slack, observed_kind
from intune.pipeline.metrics import PipelineMetrics, StageMetrics


def _knob_value(knobs: Mapping[str, Knob | int], name: str) -> int:
    """The value of knob ``name`` (a Knob or a plain int), 0 when the stage has no such knob."""
    if name not in knobs:
        return 0
    knob = knobs[name]
    return int(knob.value) if isinstance(knob, Knob) else int(knob)


def _bytes_per_item(prev: StageMetrics | None, cur: StageMetrics, d_items: int) -> float:
    """Mean bytes of an emitted chunk.

    From the cumulative ``bytes_out`` counter; in a tick where nothing was emitted, estimated from
    what sits in the output queue now (or at the previous snapshot).
    """
    if d_items > 0:
        d_bytes = cur.bytes_out - (prev.bytes_out if prev is not None else 0)
        if d_bytes > 0:
            return d_bytes / d_items
    for snap in (cur, prev):
        if snap is not None and snap.queue_len > 0 and snap.buffered_bytes > 0:
            return snap.buffered_bytes / snap.queue_len
    return 0.0


def observe_stage(
    prev: StageMetrics | None,
    cur: StageMetrics,
    dt: float,
    workers: int,
    buffer_mb: int,
    remote_workers: int = 0,
) -> StageObservation:
    """One stage over ``dt`` seconds; ``prev`` is ``None`` for a stage that appeared during the tick.

    With remote workers, ``items_per_s`` / ``rows_per_s`` count every chunk the stage emitted, and the
    per-chunk costs (CPU, busy wall time) are the local workers' time over every emitted chunk, as the
    simulator reports them, so that ``cpu_s_per_item * items_per_s`` stays the CPU the stage uses on
    this machine (``cpu_slack``, ``intune.policies.remote_sizing``); the busy / starved / blocked
    fractions are the local workers'. The remote chunks give ``remote_items_per_s`` and the transfer
    time and bytes per remote chunk.
    """
    d_items = cur.items - (prev.items if prev else 0)
    d_remote = cur.remote_items - (prev.remote_items if prev else 0)
    d_transfer_s = cur.transfer_s - (prev.transfer_s if prev else 0.0)
    d_transfer_bytes = cur.transfer_bytes - (prev.transfer_bytes if prev else 0)
    d_rows = cur.rows - (prev.rows if prev else 0)
    d_cpu = cur.cpu_s - (prev.cpu_s if prev else 0.0)
    d_cpu_wait = cur.cpu_wait_s - (prev.cpu_wait_s if prev else 0.0)
    d_busy = cur.busy_s - (prev.busy_s if prev else 0.0)
    d_starved = cur.starved_s - (prev.starved_s if prev else 0.0)
    d_blocked = cur.blocked_s - (prev.blocked_s if prev else 0.0)
    # worker time available over the tick: the mean of the worker counts at both ends; an inline stage
    # (no pool, 0 workers) still runs on one thread
    mean_workers = (cur.workers + (prev.workers if prev else cur.workers)) / 2
    worker_time = max(mean_workers, 1.0) * dt

    def fraction(seconds: float) -> float:
        return min(1.0, max(0.0, seconds / worker_time))

    return StageObservation(
        name=cur.name,
        workers=workers,
        buffer_mb=buffer_mb,
        items_per_s=max(0, d_items) / dt,
        rows_per_s=max(0, d_rows) / dt,
        cpu_s_per_item=max(0.0, d_cpu) / d_items if d_items > 0 else 0.0,
        wall_s_per_item=max(0.0, d_busy) / d_items if d_items > 0 else 0.0,
        bytes_per_item=_bytes_per_item(prev, cur, d_items),
        busy=fraction(d_busy),
        starved=fraction(d_starved),
        blocked=fraction(d_blocked),
        queue_fill=min(1.0, max(0.0, cur.queue_fill)),
        buffered_bytes=float(cur.buffered_bytes),
        stalled=bool(cur.stalled),
        kind=observed_kind(cur.kind),
        mode=cur.mode,
        remote_workers=remote_workers,
        remote_items_per_s=max(0, d_remote) / dt,
        transfer_s_per_item=max(0.0, d_transfer_s) / d_remote if d_remote > 0 else 0.0,
        transfer_bytes_per_item=max(0, d_transfer_bytes) / d_remote if d_remote > 0 else 0.0,
        worker_bytes=float(cur.worker_bytes),
        cpu_wait_s_per_item=(max(0.0, d_cpu_wait) / d_items if d_items > 0 else 0.0) if cur.cpu_wait_measured else None,
    )


def observe(
    prev: PipelineMetrics,
    cur: PipelineMetrics,
    knobs: Mapping[str, Knob | int],
    tick: int,
    cpus: float,
    mem_used: float,
    mem_limit: float,
    host_free: float = 0.0,
) -> Observation:
    """The Observation of the tick between snapshots ``prev`` and ``cur``.

    Throughput is rows delivered to the consumer per second over the tick; the step time is the
    engine's recent consumer step time. Stages come in the engine's order. ``knobs`` maps knob names
    to Knobs or to their values. ``remote_cpus`` is the snapshot's (``PipelineMetrics.remote_cpus``).
    """
    dt = cur.time_s - prev.time_s
    if dt <= 0:
        raise ValueError(
            f"metrics snapshots must move forward in time: prev at {prev.time_s}, cur at {cur.time_s}"
        )
    stages = tuple(
        observe_stage(
            prev.stages.get(name),
            stage,
            dt,
            workers=_knob_value(knobs, f"{name}.workers"),
            buffer_mb=_knob_value(knobs, f"{name}.buffer_mb"),
            remote_workers=_knob_value(knobs, f"{name}.{REMOTE_SETTING}"),
        )
        for name, stage in cur.stages.items()
    )
    return Observation(
        tick=tick,
        dt_s=dt,
        throughput=max(0, cur.rows_out - prev.rows_out) / dt,
        step_time_s=cur.consumer_step_s,
        cpus=float(cpus),
        memory_used_bytes=float(mem_used),
        memory_limit_bytes=float(mem_limit),
        stages=stages,
        host_memory_free_bytes=float(host_free),
        cpu_slack=cpu_slack(stages),
        remote_cpus=float(cur.remote_cpus),
    )


__all__ = ["observe", "observe_stage"]
