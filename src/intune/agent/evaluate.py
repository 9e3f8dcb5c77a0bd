"""Scoring a policy in the simulator against the phase optimum: ratio, OOMs, convergence ticks.

Used by pretraining (the learning curve's validation score) and by the agent's simulator benchmark
(``intune bench agent``, ``intune.bench.agent``). Every episode goes through ``intune.sim.run_episode``, exactly as
the live runner applies requests. The optimum is the most rows/s of any allocation that cannot OOM at
the current CPUs and drift (``search_optimum(..., objective="throughput")``: no policy can exceed it),
searched at every resize and every ``OPTIMUM_REFRESH_TICKS``. It must not train anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from intune.agent.env import OPTIMUM_REFRESH_TICKS
from intune.monitor.observation import reward


@dataclass
class EpisodeScore:
    workload: str
    policy: str
    ratio: float  # mean model throughput / mean optimum over the episode
    ooms: int
    convergence: list[int | None]  # ticks to 95% of the optimum from the start and each resize
    phase_ratios: list[float]  # the ratio within each phase: the first from the start allocation, the rest after a resize
    mean_reward: float
    ticks: int


def score_episode(sim, policy, ticks: int | None = None, seed: int | None = None, online: bool = False) -> EpisodeScore:
    """Run ``policy`` on ``sim`` via ``run_episode``; with ``online`` feed it rewards through ``observe``
    scaled as the live tuner scales them (by the first throughput seen), not by the unknowable optimum."""
    from intune.sim.episode import convergence_ticks, run_episode

    n = int(ticks if ticks is not None else sim.schedule.length_ticks)
    optimum = np.zeros(n)
    state = {"k": 0, "cpus": None, "since": 0, "value": 0.0}
    rewards = np.zeros(n)
    learn = getattr(policy, "observe", None) if online else None

    def on_tick(obs, applied) -> None:
        k = state["k"]
        if obs.cpus != state["cpus"] or state["since"] >= OPTIMUM_REFRESH_TICKS:
            state["value"] = float(sim.optimum(int(obs.cpus), objective="throughput")[1])
            state["cpus"], state["since"] = obs.cpus, 0
        state["since"] += 1
        optimum[k] = state["value"]
        rewards[k] = reward(obs, state["value"])
        if learn is not None:  # live, the optimum is unknown: the tuner scales by the first throughput
            state.setdefault("live_scale", obs.throughput if obs.throughput > 0 else None)
            if state["live_scale"] is None and obs.throughput > 0:
                state["live_scale"] = obs.throughput
            learn(obs, reward(obs, state["live_scale"] or 0.0))
        state["k"] = k + 1

    result = run_episode(sim, policy, n, seed=seed, on_tick=on_tick)
    phases = [(s, e, c) for s, e, c in sim.schedule.phases() if s < n]
    conv = convergence_ticks(result.model_throughput, optimum, phases)
    bounds = [(max(start - 1, 0), min(end - 1, n)) for start, end, _ in phases]  # arrays are indexed by tick - 1
    model = result.model_throughput
    return EpisodeScore(
        workload=result.workload,
        policy=result.policy,
        ratio=float(model.sum() / max(optimum.sum(), 1e-12)),
        ooms=result.oom_count,
        convergence=conv,
        phase_ratios=[float(model[a:b].sum() / max(optimum[a:b].sum(), 1e-12)) for a, b in bounds],
        mean_reward=float(rewards.mean()),
        ticks=n,
    )
