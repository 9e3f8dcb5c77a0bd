"""Per-worker counters of a stage, summed into a snapshot without locks.

Owns the cumulative counters behind ``StageMetrics`` (items, rows, CPU, busy, starved, blocked,
skipped, restarts, bytes out) and one gauge (bytes a worker holds in hand). Each worker thread writes only its own ``WorkerStats``, so the hot path takes no
lock and a snapshot is a cheap sum. It must not compute rates.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerStats:
    items: int = 0
    rows: int = 0
    cpu_s: float = 0.0
    busy_s: float = 0.0
    starved_s: float = 0.0
    blocked_s: float = 0.0
    skipped: int = 0
    restarts: int = 0
    bytes_out: int = 0
    held_bytes: int = 0  # gauge: bytes of the chunks this worker has taken and not yet delivered


class StageStats:
    """All workers' counters of one stage, kept for the pipeline's life (across epochs)."""

    FIELDS = (
        "items",
        "rows",
        "cpu_s",
        "busy_s",
        "starved_s",
        "blocked_s",
        "skipped",
        "restarts",
        "bytes_out",
        "held_bytes",
    )

    def __init__(self) -> None:
        self._workers: list[WorkerStats] = []

    def worker(self, index: int) -> WorkerStats:
        while len(self._workers) <= index:
            self._workers.append(WorkerStats())
        return self._workers[index]

    def totals(self) -> dict[str, float]:
        out = dict.fromkeys(self.FIELDS, 0)
        for w in list(self._workers):
            for name in self.FIELDS:
                out[name] += getattr(w, name)
        return out
