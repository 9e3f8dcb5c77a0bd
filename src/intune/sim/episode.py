"""Run one policy on one simulator for a number of ticks, exactly as the live runner would.

Owns ``run_episode`` (reset, then per tick: the Observation completed by the one ``Runner``, the
policy's request, the runner's clamp and apply, step) and ``EpisodeResult`` (per-tick arrays and a
summary, including the convergence metric of the benchmark). It must not change what a policy asks for
beyond the shared clamp, and must not know any policy's internals (a policy that needs the simulator,
like the oracle, exposes ``bind_simulator``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from intune.monitor.observation import Observation
from intune.policies.base import Policy
from intune.policies.runner import Runner


@dataclass
class EpisodeResult:
    """Per-tick arrays (index k is tick k + 1) and what the policy did."""

    policy: str
    workload: str
    throughput: np.ndarray  # realised rows/s (with noise): what the consumer got
    model_throughput: np.ndarray  # noise-free model rows/s of the allocation in force
    cpus: np.ndarray
    cpu_used: np.ndarray  # CPUs the pipeline kept busy
    memory_bytes: np.ndarray
    oom: np.ndarray  # bool
    knobs: dict[str, np.ndarray] = field(default_factory=dict)
    clipped_ticks: int = 0  # ticks where the clamp changed the policy's request
    rewards: np.ndarray | None = None

    @property
    def ticks(self) -> int:
        return len(self.throughput)

    @property
    def oom_count(self) -> int:
        return int(self.oom.sum())

    @property
    def cpu_util(self) -> float:
        return float(np.mean(self.cpu_used / self.cpus)) if self.ticks else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "mean_throughput": float(self.throughput.mean()) if self.ticks else 0.0,
            "mean_model_throughput": float(self.model_throughput.mean()) if self.ticks else 0.0,
            "ooms": self.oom_count,
            "cpu_util": self.cpu_util,
            "clipped_ticks": self.clipped_ticks,
        }


def run_episode(
    sim,
    policy: Policy,
    ticks: int | None = None,
    *,
    seed: int | None = None,
    reward_fn: Callable[[Observation], float] | None = None,
    on_tick: Callable[[Observation, dict[str, int]], None] | None = None,
) -> EpisodeResult:
    """Reset ``sim`` (with ``seed`` if given), run ``policy`` for ``ticks`` (default: the schedule's length).

    Per tick: ``obs = runner.observe(obs)``; ``request = policy.step(obs)``; the ``Runner`` clamps it (knob
    bounds, the CPU budget, the free memory) and applies it, as the live tuner does; ``obs = sim.step()``.
    ``reward_fn(obs)`` (e.g. ``lambda o: reward(o, scale)``) fills ``rewards``; ``on_tick(obs, applied)``
    sees every tick (for pretraining buffers or logs).
    """
    if hasattr(policy, "bind_simulator"):
        policy.bind_simulator(sim)
    n = int(ticks if ticks is not None else sim.schedule.length_ticks)
    runner = Runner(sim.knobs)
    obs = runner.observe(sim.reset(seed))
    policy.reset(sim.knobs, obs)
    names = list(sim.knobs)
    knobs = sim.knobs
    out = {k: np.empty(n) for k in ("throughput", "model", "cpus", "cpu_used", "memory")}
    oom = np.zeros(n, dtype=bool)
    values = np.empty((len(names), n), dtype=np.int64)
    rewards = np.empty(n) if reward_fn else None
    clipped = 0
    for k in range(n):
        request = policy.step(obs)
        applied: dict[str, int] = {}
        if request:
            result = runner.apply(obs, request)
            applied = result.applied
            clipped += bool(result.clipped)
        obs = runner.observe(sim.step())
        out["throughput"][k] = obs.throughput
        out["model"][k] = sim.last_model_throughput
        out["cpus"][k] = obs.cpus
        out["cpu_used"][k] = sim.last_cpu_used
        out["memory"][k] = sim.last_memory_bytes
        oom[k] = obs.oom
        values[:, k] = [knobs[name].value for name in names]
        if rewards is not None:
            rewards[k] = reward_fn(obs)
        if on_tick is not None:
            on_tick(obs, applied)
    return EpisodeResult(
        policy=getattr(policy, "name", type(policy).__name__),
        workload=sim.spec.name,
        throughput=out["throughput"],
        model_throughput=out["model"],
        cpus=out["cpus"],
        cpu_used=out["cpu_used"],
        memory_bytes=out["memory"],
        oom=oom,
        knobs={name: values[i] for i, name in enumerate(names)},
        clipped_ticks=int(clipped),
        rewards=rewards,
    )


def convergence_ticks(
    model_throughput: np.ndarray,
    optimum: np.ndarray,
    phases: list[tuple[int, int, int]],
    level: float = 0.95,
    hold: int = 5,
) -> list[int | None]:
    """Per phase ``(start, end, cpus)``: ticks from its start until the throughput reaches ``level`` of the
    optimum and stays there for ``hold`` ticks (or to the phase's end); None if it never does.

    Arrays are indexed by tick - 1 (as in ``EpisodeResult``); phases are in ticks.
    """
    ok = model_throughput >= level * optimum
    out: list[int | None] = []
    for start, end, _ in phases:
        lo, hi = max(start - 1, 0), min(end - 1, len(ok))
        found = None
        for k in range(lo, hi):
            if ok[k : min(k + hold, hi)].all():
                found = k - lo
                break
        out.append(found)
    return out
