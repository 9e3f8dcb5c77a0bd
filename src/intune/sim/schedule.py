"""CPU schedules: how many CPUs the simulated job may use at each tick (machine resizing).

Owns ``CpuSchedule`` (piecewise-constant CPUs over ticks) and the paper's schedule
32 -> 64 -> 128 -> 64 -> 32 at regular intervals (section 5, "Hardware Setup"). It must not know about
stages or policies.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

PAPER_LEVELS: tuple[int, ...] = (32, 64, 128, 64, 32)


@dataclass(frozen=True)
class CpuSchedule:
    """CPUs ``levels[k]`` from tick ``starts[k]`` on (``starts[0] == 0``); the last level holds forever.

    ``period_ticks`` is the length of the schedule (the start of a would-be next phase), used as the
    default episode length.
    """

    starts: tuple[int, ...]
    levels: tuple[int, ...]
    length_ticks: int

    def __post_init__(self) -> None:
        if not self.starts or len(self.starts) != len(self.levels):
            raise ValueError(f"CpuSchedule needs one start per level, got {self.starts} and {self.levels}")
        if self.starts[0] != 0 or list(self.starts) != sorted(set(self.starts)):
            raise ValueError(f"CpuSchedule starts must begin at 0 and increase, got {self.starts}")
        if any(int(c) < 1 for c in self.levels):
            raise ValueError(f"CpuSchedule levels must be >= 1 CPU, got {self.levels}")
        if self.length_ticks <= self.starts[-1]:
            raise ValueError(
                f"CpuSchedule length {self.length_ticks} must exceed the last start {self.starts[-1]}"
            )

    def cpus_at(self, tick: int) -> int:
        return self.levels[bisect.bisect_right(self.starts, tick) - 1]

    def phases(self) -> list[tuple[int, int, int]]:
        """``(start_tick, end_tick, cpus)`` for each phase within ``length_ticks``."""
        ends = list(self.starts[1:]) + [self.length_ticks]
        return [(s, e, c) for s, e, c in zip(self.starts, ends, self.levels, strict=True)]

    @property
    def max_cpus(self) -> int:
        return max(self.levels)


def constant_schedule(cpus: int, length_ticks: int = 1000) -> CpuSchedule:
    return CpuSchedule(starts=(0,), levels=(int(cpus),), length_ticks=int(length_ticks))


def stepped_schedule(levels: Sequence[int], period_ticks: int) -> CpuSchedule:
    """``levels[k]`` CPUs for ticks ``[k * period, (k + 1) * period)``."""
    if period_ticks < 1:
        raise ValueError(f"period_ticks must be >= 1, got {period_ticks}")
    return CpuSchedule(
        starts=tuple(k * period_ticks for k in range(len(levels))),
        levels=tuple(int(c) for c in levels),
        length_ticks=len(levels) * period_ticks,
    )


def paper_schedule(period_ticks: int = 600, levels: Sequence[int] = PAPER_LEVELS) -> CpuSchedule:
    """The paper's resize schedule: 32 -> 64 -> 128 -> 64 -> 32 CPUs, ``period_ticks`` each."""
    return stepped_schedule(levels, period_ticks)
