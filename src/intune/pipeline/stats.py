"""Per-worker counters of a stage, summed into a snapshot without locks.

Owns the cumulative counters behind ``StageMetrics`` (items, rows, CPU, run-queue delay, busy, starved, blocked,
skipped, restarts, bytes out, and for remote workers the transfer time and bytes) and two gauges (bytes a worker holds in hand, and since when it has
held work without progress). Each worker thread writes only its own ``WorkerStats``, so the hot path takes no
lock and a snapshot is a cheap sum. It must not compute rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class WorkerStats:
    items: int = 0
    rows: int = 0
    cpu_s: float = 0.0
    cpu_wait_s: float = 0.0  # of busy_s, seconds ready to run while no CPU ran it (``cpu_wait``)
    busy_s: float = 0.0
    starved_s: float = 0.0
    blocked_s: float = 0.0
    skipped: int = 0
    restarts: int = 0
    bytes_out: int = 0
    transfer_s: float = 0.0  # remote workers: seconds their chunks spent in transit, both ways
    transfer_bytes: int = 0  # remote workers: bytes their chunks moved, both ways
    held_bytes: int = 0  # gauge: bytes of the chunks this worker has taken and not yet delivered
    # gauge: perf_counter() since when this worker has held work without delivering (0.0: none in
    # hand), and the item it waits on; the stall watchdog and the stalled metric read them
    work_since: float = 0.0
    work_item: Any = None


class StageStats:
    """All workers' counters of one stage, kept for the pipeline's life (across epochs)."""

    FIELDS = (
        "items",
        "rows",
        "cpu_s",
        "cpu_wait_s",
        "busy_s",
        "starved_s",
        "blocked_s",
        "skipped",
        "restarts",
        "bytes_out",
        "transfer_s",
        "transfer_bytes",
        "held_bytes",
    )

    def __init__(self) -> None:
        self._workers: list[WorkerStats] = []

    def worker(self, index: int) -> WorkerStats:
        while len(self._workers) <= index:
            self._workers.append(WorkerStats())
        return self._workers[index]

    def oldest_work(self) -> tuple[float, Any]:
        """(perf_counter() when the longest-held work in hand was taken or last progressed, its item);
        (0.0, None) when no worker holds work."""
        oldest, item = 0.0, None
        for w in list(self._workers):
            since = w.work_since
            if since and (not oldest or since < oldest):
                oldest, item = since, w.work_item
        return oldest, item

    def in_hand_s(self, now: float) -> float:
        """Seconds of work in hand not yet counted in ``busy_s`` (it is added when the work ends)."""
        return sum(now - w.work_since for w in list(self._workers) if w.work_since)

    def totals(self) -> dict[str, float]:
        out = dict.fromkeys(self.FIELDS, 0)
        for w in list(self._workers):
            for name in self.FIELDS:
                out[name] += getattr(w, name)
        return out
