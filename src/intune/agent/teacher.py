"""The oracle teacher's labels: per knob, the move toward the simulated workload's optimum.

Used by pretraining only (imitation rounds and the DQN's guided exploration): the target is the
oracle's allocation, which reads the simulator's true model. The label is what the agent itself could
do this tick: one action per knob, allowed by the safety mask and resolved jointly under its CPU and
memory limits. It must not be used to act live.
"""

from __future__ import annotations

import numpy as np

from intune.observation import Observation
from intune.policies.safety import SafetyLayer


def teacher_choice(safety: SafetyLayer, obs: Observation, values: list[int], target: dict[str, int],
                   mask: np.ndarray) -> np.ndarray:
    """Per knob, the allowed action whose move lands closest to ``target`` (on ties, the smaller move),
    resolved jointly under the CPU and memory limits by ``SafetyLayer.select``."""
    now = np.asarray(values, dtype=np.float64)
    goal = np.array([target.get(k.name, v) for k, v in zip(safety.knobs, values, strict=True)], dtype=np.float64)
    landed = now[:, None] + safety.deltas[None, :] * safety.units(obs)[:, None]
    scale = np.maximum(safety.units(obs), 1)[:, None]
    scores = -np.abs(landed - goal[:, None]) / scale - 1e-3 * np.abs(safety.deltas)[None, :]
    choice = safety.select(scores, mask, obs, values)
    # over-allocated with no decrease allowed, the joint programme has no feasible answer: hold
    return np.where(mask[np.arange(len(choice)), choice], choice, safety.zero)
