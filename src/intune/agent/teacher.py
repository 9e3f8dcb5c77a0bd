"""A simple teacher for exploration: move workers toward each stage's share of the pipeline's work.

Random exploration rarely performs the consistent multi-tick reallocations (take from stages with
slack, give to the bottleneck) that a good policy needs to see rewarded. During pretraining, some
exploratory knob moves come from this teacher instead of uniformly at random; DQN is off-policy, so
the agent learns the value of these moves without copying them. The teacher is a pure function of
the observation: a stage's need is its busy workers (``busy * workers``), and the CPUs are shared in
proportion to need. It must not be used to act live.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from intune.observation import Observation


def teacher_moves(obs: Observation, stages: Sequence[str], is_cpu: np.ndarray, values: Sequence[int]) -> np.ndarray:
    """Wanted change per knob: workers toward ``need_i * cpus / sum(need)``; buffers held (0)."""
    by_name = {s.name: s for s in obs.stages}
    need = {s.name: max(s.busy, 0.02) * max(s.workers, 1) for s in obs.stages}
    total = sum(need.values()) or 1.0
    out = np.zeros(len(stages))
    for k, (stage, cpu, value) in enumerate(zip(stages, is_cpu, values)):
        if cpu and stage in by_name:
            out[k] = need[stage] * obs.cpus / total - value
    return out


def teacher_scores(moves: np.ndarray, deltas: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Scores that make the delta closest to each wanted move the best choice (ties broken by noise)."""
    distance = np.abs(moves[:, None] - deltas[None, :])
    return -distance + 0.01 * rng.random(distance.shape)
