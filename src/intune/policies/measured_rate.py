"""Measured rates: an allocation's elements/s over its recent settled ticks (``Measured``) and the
machine's tick-to-tick noise pooled over every window fitted so far (``TickSpread``).

What is measured outranks what is predicted, and a difference counts only past the noise: one rate
beats another where it is above by more than ``CONFIDENCE_Z`` standard errors of the difference, each
from the tick-to-tick spread. On a shared machine, where ticks vary by a third, a worker must then show
a larger gain to count: measurement noise alone never adds one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

CONFIDENCE_Z = 2.0  # standard errors by which one measured rate must beat another for the difference to count
MEASURED_TICKS = 16  # the most recent ticks at an allocation that its measured rate is read from


class Measured:
    """Elements/s of the last ``MEASURED_TICKS`` settled ticks at one allocation: a mean and its
    standard error, so that two allocations are compared by more than their noise."""

    def __init__(self) -> None:
        self.ticks: deque[float] = deque(maxlen=MEASURED_TICKS)

    def add(self, rates: Iterable[float]) -> Measured:
        self.ticks.extend(rates)
        return self

    @property
    def mean(self) -> float:
        return float(np.mean(self.ticks)) if self.ticks else 0.0

    @property
    def stderr(self) -> float:
        n = len(self.ticks)
        return float(np.std(self.ticks, ddof=1) / math.sqrt(n)) if n > 1 else 0.0

    @property
    def spread(self) -> float:
        """The tick-to-tick standard deviation as a share of the mean (0 below two ticks)."""
        n = len(self.ticks)
        return float(np.std(self.ticks, ddof=1) / self.mean) if n > 1 and self.mean > 0 else 0.0

    def noise(self, other: Measured) -> float:
        """``CONFIDENCE_Z`` standard errors of the difference between this rate and ``other``. A rate
        measured on one tick shows no spread of its own: it carries the other's, relative to its level
        (the same machine's tick noise)."""
        mine = self.stderr if len(self.ticks) > 1 else other.spread * self.mean
        theirs = other.stderr if len(other.ticks) > 1 else self.spread * other.mean
        return CONFIDENCE_Z * math.hypot(mine, theirs)

    def beats(self, other: Measured, gain: float) -> bool:
        """Above ``other`` by ``gain`` of its rate, and by more than the noise of the difference."""
        diff = self.mean - other.mean
        return diff >= gain * other.mean and diff > self.noise(other)

    def may_beat(self, other: Measured, gain: float) -> bool:
        """Within the noise of the difference of being above ``other`` by ``gain``: not yet ruled out."""
        return self.mean - other.mean + self.noise(other) >= gain * other.mean

    def not_below(self, other: Measured) -> bool:
        """Not below ``other`` by more than the noise of the difference."""
        return other.mean - self.mean <= self.noise(other)


class TickSpread:
    """The machine's tick-to-tick noise on the delivered rate, relative to its level, pooled over every
    window fitted so far (squared deviations from each window's mean over their degrees of freedom): a
    spell of ticks that agree by chance on a noisy machine does not make it quiet."""

    def __init__(self) -> None:
        self.squares, self.dof = 0.0, 0

    @staticmethod
    def _of(rates: Sequence[float]) -> tuple[float, int]:
        mean = sum(rates) / len(rates)
        if mean <= 0 or len(rates) < 2:
            return 0.0, 0
        return sum((r / mean - 1.0) ** 2 for r in rates), len(rates) - 1

    def add(self, rates: Sequence[float]) -> None:
        squares, dof = self._of(rates)
        self.squares += squares
        self.dof += dof

    def stderr(self, rates: Sequence[float]) -> float:
        """The standard error of the mean of ``rates``, as a share of it, at the noise pooled with theirs
        (infinite where nothing measures it)."""
        squares, dof = self._of(rates)
        dof += self.dof
        return math.sqrt((squares + self.squares) / dof / len(rates)) if dof else math.inf


__all__ = ["CONFIDENCE_Z", "MEASURED_TICKS", "Measured", "TickSpread"]
