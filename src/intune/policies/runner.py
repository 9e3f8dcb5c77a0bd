"""The runner: the one place where a policy's requests become knob values, live and simulated alike.

Every path that lets a policy act (the live ``Tuner``, ``intune.sim.run_episode``, pretraining, every
benchmark) goes through ``Runner``, so every policy sees the same Observation fields and gets the same
clamps and grants:

- ``observe`` completes the Observation a policy sees: the CPU budget (CPUs plus the CPU that waiting
  workers measurably leave unused, ``Observation.cpu_slack``) is kept at its highest over the last
  ``CPU_BUDGET_TICKS`` ticks at one CPU count, and a light stage may get one worker past it;
- ``apply`` clamps the request (``clamp_request``: knob bounds, that budget less the workers of stages no
  knob sizes (``cpu_budget``, the one rule every planning policy reads too), the free memory, no growth
  for a stalled stage's workers, remote workers within the cluster's CPUs ``Observation.remote_cpus``) and sets the knobs, decreases first, so that a worker moved between
  stages never oversubscribes on the way.

It must not hold any policy's algorithm, nor read the machine (the Observation carries what it needs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from intune.knobs import Knob
from intune.monitor.cpu_budget import CPU_BUDGET_TICKS, RecentCpuBudget
from intune.monitor.observation import Observation
from intune.policies.base import ClampResult, clamp_request, cpu_budget


def memory_free_bytes(obs: Observation) -> float:
    """Memory the buffers may still grow into: the limit minus what is in use (0 past the limit)."""
    return max(0.0, obs.memory_limit_bytes - obs.memory_used_bytes)


class Runner:
    """Applies one policy's requests to ``knobs``; ``observe`` every tick, then ``apply`` its request."""

    def __init__(self, knobs: Mapping[str, Knob], budget_ticks: int = CPU_BUDGET_TICKS) -> None:
        self.knobs = knobs
        self._budget = RecentCpuBudget(budget_ticks)

    def observe(self, obs: Observation) -> Observation:
        """The Observation every policy sees: the recent CPU budget, light workers granted."""
        return replace(self._budget.apply(obs), grants_light_workers=True)

    def clamp(self, obs: Observation, request: Mapping[str, int]) -> ClampResult:
        """What ``apply`` would set for ``request`` on ``obs`` (an Observation from ``observe``)."""
        return clamp_request(
            self.knobs,
            request,
            cpu_budget(obs, self.knobs),
            memory_free_bytes(obs),
            light=[f"{stage}.workers" for stage in obs.light_stages()],
            hold=[f"{s.name}.workers" for s in obs.stages if s.stalled],
            remote_cpus=obs.remote_cpus,
        )

    def apply(
        self,
        obs: Observation,
        request: Mapping[str, int],
        on_error: Callable[[str, int, Exception], None] | None = None,
    ) -> ClampResult:
        """Clamp ``request`` (``clamp``) and set the knobs (``set``)."""
        return self.set(self.clamp(obs, request), on_error)

    def set(self, clamped: ClampResult, on_error: Callable[[str, int, Exception], None] | None = None) -> ClampResult:
        """Set the knobs to a clamp's result, decreases first. A knob that refuses its value is passed to
        ``on_error(name, value, exc)`` (the live tuner logs it and goes on) or, without it, raised.
        Returns the result with ``applied`` holding only the values actually set."""
        if not clamped.applied:
            return clamped
        order = sorted(clamped.applied.items(), key=lambda kv: kv[1] - self.knobs[kv[0]].value)
        applied: dict[str, int] = {}
        for name, value in order:
            try:
                self.knobs[name].set(value)
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(name, value, exc)
                continue
            applied[name] = value
        return ClampResult(requested=clamped.requested, applied=applied)


__all__ = ["Runner", "memory_free_bytes"]
