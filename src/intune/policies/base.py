"""The Policy contract and the runner-side clamp that every policy's request passes through.

A policy sees knobs and observations only (docs/design.md, "Contracts"): it never knows whether the native
engine, the simulator or an adapter is underneath. This module owns the protocol and ``clamp_request``; it must not hold any policy's algorithm.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from intune.knobs import Knob
from intune.monitor.observation import Observation
from intune.units import MB


@runtime_checkable
class Policy(Protocol):
    """Decides knob values. ``reset`` once, then ``step`` every tick."""

    name: str

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        """Start (or restart) on these knobs; ``observation`` is the first one."""

    def step(self, observation: Observation) -> dict[str, int]:
        """Return ``{knob_name: new_value}`` for the knobs to change (may be empty)."""


@runtime_checkable
class StatefulPolicy(Policy, Protocol):
    """A policy that keeps what it measured across a restart (``Tuner.state_dict``): optional.

    ``state_dict()`` returns plain values and numpy arrays (``intune.checkpoint`` stores them without
    pickle); ``load_state_dict(state)`` is called right after ``reset`` on the same knobs, and the
    policy goes on from there (no warm start: the tuner has restored the knobs)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class ClampResult:
    """What a policy asked for, and what the runner applied after clamping."""

    requested: dict[str, int]
    applied: dict[str, int]  # only knobs whose value changes

    @property
    def clipped(self) -> dict[str, tuple[int, int]]:
        """Knobs whose applied value differs from the request: name -> (requested, applied)."""
        return {
            k: (v, self.applied.get(k, v))
            for k, v in self.requested.items()
            if k in self.applied and self.applied[k] != v
        }


def clamp_request(
    knobs: Mapping[str, Knob],
    requested: Mapping[str, int],
    cpus: float,
    memory_free_bytes: float,
    light: Collection[str] = (),
    hold: Collection[str] = (),
    remote_cpus: float = 0.0,
) -> ClampResult:
    """Clamp a policy's request to knob bounds, to the CPUs and to the free memory.

    - every value is clamped to its knob's ``[min, max]``; unknown knob names raise ``ValueError``;
    - the sum of local ``cpu`` knobs may not exceed ``max(cpus, sum of minimums)``: increases are granted in
      the order requested until the CPUs run out (decreases always pass); past that, one worker in all
      may go to a knob in ``light`` (a stage whose workers mostly wait: ``Observation.light_stages``),
      so that a policy can measure whether one more reader pays on a saturated machine;
    - remote ``cpu`` knobs (``Knob.remote``: workers on a cluster) share ``remote_cpus`` (the cluster's
      CPUs that this pipeline may hold, ``Observation.remote_cpus``) the same way, without a light
      grant: a remote worker never takes this machine's CPUs, nor a local one the cluster's;
    - ``mb`` knobs may grow only by what ``memory_free_bytes`` allows;
    - knobs in ``hold`` may not grow (a stalled stage's workers: more workers do not unstick a hung
      function, they only take CPUs from the stages that still move).
    """
    unknown = [k for k in requested if k not in knobs]
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}; knobs are {sorted(knobs)}")
    current = {name: k.value for name, k in knobs.items()}
    target = {name: knobs[name].clamp(v) for name, v in requested.items()}
    for name in hold:
        if name in target:
            target[name] = min(target[name], current[name])

    local = [n for n, k in knobs.items() if k.unit == "cpu" and not k.remote]
    remote = [n for n, k in knobs.items() if k.unit == "cpu" and k.remote]
    _grant_cpus(knobs, local, current, target, cpus, light)
    _grant_cpus(knobs, remote, current, target, remote_cpus, ())

    mem_budget = max(0.0, memory_free_bytes)
    for name, value in list(target.items()):
        if knobs[name].unit == "mb" and value > current[name]:
            grant = min(value - current[name], int(mem_budget // MB))
            target[name] = current[name] + grant
            mem_budget -= grant * MB

    applied = {n: v for n, v in target.items() if v != current[n]}
    return ClampResult(requested=dict(requested), applied=applied)


def _grant_cpus(
    knobs: Mapping[str, Knob],
    names: list[str],
    current: Mapping[str, int],
    target: dict[str, int],
    cpus: float,
    light: Collection[str],
) -> None:
    """Cut the increases in ``target`` among ``names`` to ``cpus`` in all: decreases first, then
    increases in order while the budget lasts, with one worker past it for the knobs in ``light``.

    The light worker is granted jointly, whatever the order of the request: a light knob's increase
    draws on it before the CPUs, so ``{light: +1, heavy: +1}`` with one CPU free grants both, as
    ``{heavy: +1, light: +1}`` does (``light_worker_room`` is the same rule for planners)."""
    cpu_cap = max(int(cpus), sum(knobs[n].min for n in names))
    total = sum(min(target.get(n, current[n]), current[n]) for n in names)
    extra = light_worker_room(light, cpu_cap - total)
    for name in names:
        if name in target and target[name] > current[name]:
            want = target[name] - current[name]
            past = min(want, extra) if name in light else 0
            extra -= past
            grant = past + min(want - past, max(0, cpu_cap - total))
            target[name] = current[name] + grant
            total += grant - past


def light_worker_room(light: Collection[object], free_cpus: float) -> int:
    """Workers that may go past the CPUs, in all, to stages whose workers mostly wait
    (``Observation.light_stages``): one where there is such a stage and the workers do not already
    exceed the CPUs (``free_cpus`` >= 0 after the decreases). One rule for the runner's clamp and for
    every policy that plans under it (``SafetyLayer.select``)."""
    return 1 if light and free_cpus >= 0 else 0


def cpu_budget(obs: Observation, knobs: Mapping[str, Knob]) -> float:
    """The workers the ``workers`` knobs in ``knobs`` may hold in all: what the runner grants every policy
    alike (``clamp_request``).

    The machine's CPUs plus the CPU that waiting workers measurably leave unused (``cpu_slack``), less the
    workers of stages no local knob sizes (a source's thread, a one-thread stage): ``cpu_slack`` counts
    their unused CPU, so the CPU they do use is what is left of them. Then knob workers within the budget
    are exactly ``Observation.free_cpus >= 0``: one CPU budget for the runner, the planners and the
    safety layer. A baseline planning on the bare CPU count would leave unasked what the runner would
    give (on 2 CPUs with three stages of at least one worker each, it could never move).
    """
    sized = {k.stage for k in knobs.values() if k.unit == "cpu" and not k.remote}
    unsized = sum(s.workers for s in obs.stages if s.name not in sized)
    return obs.cpus + max(0.0, obs.cpu_slack) - unsized


def even_split(knobs: Mapping[str, Knob], cpus: float) -> dict[str, int]:
    """CPUs divided evenly over the local ``cpu`` knobs (the paper's Heuristic, InTune's starting point).

    The remainder goes to the first stages; each knob stays within its bounds. ``mb`` and remote knobs
    keep their values.
    """
    names = [n for n, k in knobs.items() if k.unit == "cpu" and not k.remote]
    if not names:
        return {}
    base, extra = divmod(max(int(cpus), len(names)), len(names))
    return {n: knobs[n].clamp(base + (1 if i < extra else 0)) for i, n in enumerate(names)}
