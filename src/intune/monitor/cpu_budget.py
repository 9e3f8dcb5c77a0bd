"""The recent CPU budget: the CPUs a policy may fill, held at their recent highest.

Owns ``RecentCpuBudget``, the one rule that turns a tick's measured ``cpu_slack`` into the budget every
policy sees (the ``Runner`` applies it, live and simulated alike). It must not read the machine or
the engine, nor clamp requests (``intune.policies.runner`` does).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from intune.monitor.observation import Observation

CPU_BUDGET_TICKS = 20
"""Ticks over which the CPU budget (CPUs + measured slack) keeps its highest value."""


class RecentCpuBudget:
    """Keeps the CPU budget at its highest over the last ``CPU_BUDGET_TICKS`` ticks at one CPU count.

    On a saturated machine the measured budget equals the workers in place (they use every CPU), so
    right after a worker is removed the budget falls with it and the worker could never come back, even
    where it had just been measured better. Granting what was recently granted lets a policy undo a
    step; a CPU change starts afresh.
    """

    def __init__(self, ticks: int = CPU_BUDGET_TICKS) -> None:
        self._cpus: float | None = None
        self._budgets: deque[float] = deque(maxlen=ticks)

    def apply(self, obs: Observation) -> Observation:
        """``obs`` with ``cpu_slack`` raised so that CPUs + slack is the recent highest budget."""
        if obs.cpus != self._cpus:
            self._cpus = obs.cpus
            self._budgets.clear()
        self._budgets.append(obs.cpus + obs.cpu_slack)
        return replace(obs, cpu_slack=max(self._budgets) - obs.cpus)


__all__ = ["CPU_BUDGET_TICKS", "RecentCpuBudget"]
