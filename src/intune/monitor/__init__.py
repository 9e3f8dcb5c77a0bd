"""What the policies see: the machine readers and the Observation, live and simulated alike.

One package for the observation (docs/design.md: every policy runs unchanged on the simulator and the live
engine because both hand it the same ``Observation``):

- ``machine``: the kernel's view of this process's resources (CPUs from affinity, cpuset and quota;
  memory against the cgroup or host limit; the process tree's PSS), and the ``Monitor`` that samples it;
- ``observation``: the ``Observation`` dataclass, its helpers (``cpu_slack``, ``observed_kind``) and
  the reward;
- ``live``: two engine metrics snapshots and a machine sample -> an ``Observation`` (the simulator
  builds its own from its model through the same dataclass and helpers, ``intune.sim.simulator``);
- ``cpu_budget``: ``RecentCpuBudget``, the CPU budget held at its recent highest (the runner applies it).

Importing the package loads ``machine`` and ``observation`` only (no engine, no torch); it must not
hold a policy's algorithm nor change knobs.
"""

from __future__ import annotations

from intune.monitor.machine import (
    MachineSample,
    Monitor,
    available_cpus,
    cpu_quota,
    cpuset_cpus,
    host_free_memory,
    host_memory,
    memory_usage,
    parse_cpu_list,
    process_tree_rss,
)
from intune.monitor.observation import Observation, StageObservation

__all__ = [
    "MachineSample",
    "Monitor",
    "Observation",
    "StageObservation",
    "available_cpus",
    "cpu_quota",
    "cpuset_cpus",
    "host_free_memory",
    "host_memory",
    "memory_usage",
    "parse_cpu_list",
    "process_tree_rss",
]
