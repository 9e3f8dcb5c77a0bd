"""The oracle teacher's labels: per knob, the move toward the simulated workload's optimum, and its weight.

Used by pretraining only (imitation rounds and the DQN's guided exploration): the target is the
oracle's allocation, which reads the simulator's true model. The label is what the agent itself could
do this tick: one action per knob, allowed by the safety mask and resolved jointly under its CPU and
memory limits. The weight says how much that label matters: near a flat optimum many allocations are
as good as the oracle's, and its exact values there cannot be read from any observation, so those
labels must not weigh as much as the move of a bottleneck. It must not be used to act live.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from intune.monitor.observation import Observation
from intune.policies.safety import SafetyLayer


def teacher_choice(safety: SafetyLayer, obs: Observation, values: list[int], target: dict[str, int],
                   mask: np.ndarray, throughput_of: Callable[[dict[str, int]], float] | None = None) -> np.ndarray:
    """Per knob, the allowed action whose move lands closest to ``target`` (on ties, the smaller move),
    resolved jointly under the CPU and memory limits by ``SafetyLayer.select``.

    With ``throughput_of`` (the true model), each knob's step toward the target also scores the share of
    throughput it gains now, alone: where the limits admit only some of the steps, those that lift the
    pipeline now go first (the bottleneck's, not whichever knob comes first)."""
    now = np.asarray(values, dtype=np.float64)
    goal = np.array([target.get(k.name, v) for k, v in zip(safety.knobs, values, strict=True)], dtype=np.float64)
    landed = now[:, None] + safety.deltas[None, :] * safety.units(obs)[:, None]
    scale = np.maximum(safety.units(obs), 1)[:, None]
    scores = -np.abs(landed - goal[:, None]) / scale - 1e-3 * np.abs(safety.deltas)[None, :]
    if throughput_of is not None:
        scores = scores + _gain_now(safety, values, landed, np.where(mask, scores, -np.inf).argmax(1), throughput_of)
    choice = safety.select(scores, mask, obs, values)
    # over-allocated with no decrease allowed, the joint programme has no feasible answer: hold
    return np.where(mask[np.arange(len(choice)), choice], choice, safety.zero)


def _gain_now(safety: SafetyLayer, values: Sequence[int], landed: np.ndarray, best: np.ndarray,
              throughput_of: Callable[[dict[str, int]], float]) -> np.ndarray:
    """``[knobs, actions]``: each knob's preferred action scores the relative throughput it gains alone."""
    names = [k.name for k in safety.knobs]
    current = dict(zip(names, (int(v) for v in values), strict=True))
    bonus = np.zeros(landed.shape)
    base = throughput_of(current)
    if base <= 0:
        return bonus
    for k, (name, action) in enumerate(zip(names, best, strict=True)):
        if action != safety.zero:
            bonus[k, action] = max(0.0, throughput_of({**current, name: int(landed[k, action])}) / base - 1.0)
    return bonus


def label_weights(throughput_of, target: Mapping[str, int], names: Sequence[str], values: Sequence[int],
                  full_weight_loss: float, floor: float,
                  held_cpus_of: Callable[[dict[str, int]], float] | None = None, cpus: float = 0.0,
                  full_weight_held: float = 0.5) -> np.ndarray:
    """Per knob, the larger of two costs of leaving it where it is (every other knob at the target),
    each scaled to 1 at its full weight, clipped to ``[floor, 1]``:

    - the share of the optimum's throughput lost, over ``full_weight_loss``;
    - with ``held_cpus_of`` (``Simulator.held_cpus``), the CPUs its workers past the target want when
      busy, as a share of ``cpus``, over ``full_weight_held``. Workers the pipeline cannot use may cost
      no throughput here (a stage capped by the GIL, with CPUs to spare) and still hold CPUs that
      anything else on the machine would need; a worker waiting on I/O holds little.

    ``throughput_of(allocation)`` is the true model's throughput (``Simulator.true_throughput``). A knob
    at its target, or whose distance from it costs nothing, weighs ``floor``; one whose distance costs
    the full weight or more weighs 1 (cost-sensitive imitation: the network spends its capacity on the
    moves that matter).
    """
    best = throughput_of(dict(target))
    cost = np.zeros(len(names))
    count_held = held_cpus_of is not None and cpus > 0 and full_weight_held > 0
    base_held = held_cpus_of(dict(target)) if count_held else 0.0
    for i, (name, value) in enumerate(zip(names, values, strict=True)):
        if target.get(name, value) == value:
            continue
        if best > 0:
            cost[i] = max(0.0, 1.0 - throughput_of({**target, name: value}) / best) / full_weight_loss
        if count_held and value > target[name]:
            held = max(0.0, held_cpus_of({**target, name: value}) - base_held) / cpus
            cost[i] = max(cost[i], held / full_weight_held)
    return np.clip(cost, floor, 1.0).astype(np.float32)
