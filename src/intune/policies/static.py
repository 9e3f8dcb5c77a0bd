"""The two static baselines: ``none`` (the paper's Unoptimized) and ``heuristic`` (the paper's Heuristic).

``none`` gives every stage one worker and its smallest buffer, and no remote worker. ``heuristic``
divides the CPUs evenly over the stages (``even_split``) and divides them again whenever the CPU count
changes; buffers keep their values. Remote knobs (``Knob.remote``) get the same treatment from the
cluster: ``heuristic`` divides the cluster's CPUs (``Observation.remote_cpus``) evenly over them, again
whenever that count changes (a lost node), whatever the pipeline needs. A shuffle stage's buffer is the user's shuffle window (it sets how random the order is),
not a performance buffer, so ``none`` leaves it as configured too.

Also owns ``changes`` (ask only for knobs whose value differs), which every baseline uses. Neither policy reads anything but the CPU count: they must not look at stage signals.
"""

from __future__ import annotations

from collections.abc import Mapping

from intune.knobs import Knob
from intune.monitor.observation import Observation
from intune.policies.base import cpu_budget, even_split


def changes(knobs: Mapping[str, Knob], target: Mapping[str, int]) -> dict[str, int]:
    """The entries of ``target`` whose knob does not already hold that value.

    Re-asserting a target every tick (rather than once) keeps a policy's plan in force after the
    engine restarts or the runner clips a request.
    """
    return {name: int(v) for name, v in target.items() if knobs[name].value != int(v)}


class NonePolicy:
    """One worker per stage and minimal buffers, whatever the machine (the paper's Unoptimized)."""

    name = "none"

    def __init__(self) -> None:
        self._knobs: Mapping[str, Knob] = {}

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self._knobs = knobs
        self._kinds = observation.kinds()

    def target(self) -> dict[str, int]:
        out = {}
        for name, k in self._knobs.items():
            if k.unit == "cpu":
                out[name] = k.min if k.remote else k.clamp(1)
            elif self._kinds.get(k.stage) != "shuffle":
                out[name] = k.min
        return out

    def step(self, observation: Observation) -> dict[str, int]:
        return changes(self._knobs, self.target())


class HeuristicPolicy:
    """CPUs divided evenly over the stages, re-divided when the CPU count changes (the paper's Heuristic)."""

    name = "heuristic"

    def __init__(self) -> None:
        self._knobs: Mapping[str, Knob] = {}
        self._split: dict[str, int] = {}
        self._cpus: float | None = None
        self._remote_cpus: float | None = None

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self._knobs = knobs
        self._cpus = observation.cpus
        self._split = even_split(knobs, cpu_budget(observation, knobs))
        self._remote_cpus = None

    def step(self, observation: Observation) -> dict[str, int]:
        if observation.cpus != self._cpus:
            self._cpus = observation.cpus
            self._split = {**self._split, **even_split(self._knobs, cpu_budget(observation, self._knobs))}
        if observation.remote_cpus != self._remote_cpus and any(k.remote for k in self._knobs.values()):
            self._remote_cpus = observation.remote_cpus
            self._split = {**self._split, **remote_split(self._knobs, observation.remote_cpus)}
        return changes(self._knobs, self._split)


def remote_split(knobs: Mapping[str, Knob], remote_cpus: float) -> dict[str, int]:
    """The cluster's CPUs divided evenly over the remote knobs (the remainder to the first ones)."""
    names = [n for n, k in knobs.items() if k.remote]
    if not names:
        return {}
    base, extra = divmod(max(int(remote_cpus), 0), len(names))
    return {n: knobs[n].clamp(base + (1 if i < extra else 0)) for i, n in enumerate(names)}


__all__ = ["HeuristicPolicy", "NonePolicy", "changes", "remote_split"]
