"""What each stage costs per element, read from a window of Observations: the profile that rate-based
planners (``plumber``, ``planner``) solve on.

A stage's cost is measured, never assumed: its elements, CPU seconds and busy wall seconds over the
window (``StageObservation.cpu_s_per_item``, ``wall_s_per_item``), and of the wall seconds those it
waited for a CPU (``cpu_wait_s_per_item``). Visit ratios (elements of a stage
per element leaving the pipeline) turn them into seconds per delivered element. Two rules read the
profile's shape:

- I/O-bound (``io_bound``): a stage whose CPU share (CPU seconds per busy wall second) is at most
  ``IO_BOUND_SHARE`` of the largest stage's spends most of its busy time waiting, so its rate per
  worker is its wall time's, not its CPU time's. The share is relative because a profile on saturated
  CPUs lowers every stage's share alike.
- Sequential (``is_sequential``): a stage whose knob allows one worker, or whose workers take turns:
  on average at least 1.5 busy workers, yet only 0.85-1.15 cores of CPU used, with wall time per
  element at least 0.8 x busy workers x its CPU time (GIL-bound threads). More workers do not raise
  its rate.

Also the prefetch depth that a rate gap calls for (``prefetch_elements``), and the depth a stage's
buffer needs for the jitter its slowest stage shows (``jitter_elements``). It must not choose an
allocation: that is each planner's own decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from intune.knobs import Knob
from intune.monitor.observation import Observation

MAX_PREFETCH_ELEMENTS = 256
IO_BOUND_SHARE = 0.5
"""A stage whose CPU share (CPU seconds per busy wall second) is at most this share of the largest
stage's waits more than it computes: it is rated by its wall time (I/O), not its CPU time."""


@dataclass
class StageProfile:
    """One stage's totals over a window of ticks."""

    items: float = 0.0
    rows: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    busy_workers_s: float = 0.0
    bytes: float = 0.0
    time_s: float = 0.0
    remote_items: float = 0.0  # of ``items``, those remote workers processed (no local CPU or wall time)
    cpu_wait_s: float | None = 0.0  # of ``wall_s``, ready to run with no CPU running it; None: a tick did not measure it


def profile_of(window: Iterable[Observation]) -> dict[str, StageProfile]:
    """Each stage's totals over the observations of ``window``."""
    prof: dict[str, StageProfile] = {}
    for o in window:
        for s in o.stages:
            p = prof.setdefault(s.name, StageProfile())
            n = s.items_per_s * o.dt_s
            p.items += n
            p.rows += s.rows_per_s * o.dt_s
            p.cpu_s += s.cpu_s_per_item * n
            p.wall_s += s.wall_s_per_item * n
            queued = s.cpu_wait_s_per_item
            p.cpu_wait_s = None if queued is None or p.cpu_wait_s is None else p.cpu_wait_s + queued * n
            p.busy_workers_s += s.busy * s.workers * o.dt_s
            p.bytes += s.bytes_per_item * n
            p.time_s += o.dt_s
            p.remote_items += s.remote_items_per_s * o.dt_s
    return prof


def is_sequential(knob: Knob, p: StageProfile) -> bool:
    """Whether more workers cannot raise the stage's rate (module docstring)."""
    if knob.max <= 1:
        return True
    if p.time_s <= 0 or p.cpu_s <= 0:
        return False
    busy_workers = p.busy_workers_s / p.time_s
    cores_used = p.cpu_s / p.time_s
    return busy_workers >= 1.5 and 0.85 <= cores_used <= 1.15 and p.wall_s >= 0.8 * busy_workers * p.cpu_s


def io_bound(profiles: Mapping[str, StageProfile]) -> set[str]:
    """Stages whose CPU share is at most ``IO_BOUND_SHARE`` of the largest (module docstring)."""
    shares = {n: p.cpu_s / p.wall_s for n, p in profiles.items() if p.wall_s > 0 and p.items > 0}
    top = max(shares.values(), default=0.0)
    return {n for n, u in shares.items() if top > 0 and u <= IO_BOUND_SHARE * top}


def prefetch_elements(theta: float, demand: float) -> int:
    """Prefetch depth from the rate gap: ``1 + ceil(rho / (1 - rho))`` with ``rho = demand / theta``
    (an M/M/1 queue's mean backlog: the closer the rates, the deeper the buffer); one element when the
    consumer outruns the pipeline or its demand is unknown (no depth helps then)."""
    if demand <= 0 or theta <= 0 or not math.isfinite(theta) or demand >= theta:
        return 1
    rho = demand / theta
    return int(min(MAX_PREFETCH_ELEMENTS, 1 + math.ceil(rho / (1.0 - rho) - 1e-9)))


def jitter_elements(starved: float, held: float, target: float) -> float:
    """Elements a buffer must hold for the slowest stage's jitter loss to fall to ``target``.

    The slowest stage of a line of queues should be busy all the time; what it idles starved is the
    rate lost to the stages' varying costs, which a buffer of ``n`` elements absorbs as ``1 / (1 + n)``
    (a finite queue between two stages of nearly equal rates). So the share ``starved`` measured while
    the buffer held ``held`` elements falls to ``target`` at ``(1 + held) * starved / target - 1``."""
    if starved <= target or target <= 0:
        return held
    return (1.0 + max(held, 0.0)) * starved / target - 1.0


__all__ = ["IO_BOUND_SHARE", "MAX_PREFETCH_ELEMENTS", "StageProfile", "io_bound", "is_sequential", "jitter_elements",
           "prefetch_elements", "profile_of"]
