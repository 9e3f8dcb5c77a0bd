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
    """Per knob, what its label is worth, clipped to ``[floor, 1]``: for a knob off its target, the cost
    of leaving it where it is (every other knob at the target). A value's cost is the larger of two, each
    scaled to 1 at its full weight:

    - the share of the optimum's throughput lost, over ``full_weight_loss``;
    - with ``held_cpus_of`` (``Simulator.held_cpus``), the CPUs its workers past the target want when
      busy, as a share of ``cpus``, over ``full_weight_held``. Workers the pipeline cannot use may cost
      no throughput here (a stage capped by the GIL, with CPUs to spare) and still hold CPUs that
      anything else on the machine would need; a worker waiting on I/O holds little.

    ``throughput_of(allocation)`` is the true model's throughput (``Simulator.true_throughput``). A knob
    whose label costs nothing to get wrong (a flat optimum; at its target) weighs ``floor``; one that
    costs the full weight or more weighs 1 (cost-sensitive imitation: the network spends its capacity on
    the choices that matter).
    """
    cost_of = knob_cost(throughput_of, target, full_weight_loss, held_cpus_of, cpus, full_weight_held)
    return weights_of(cost_of, target, names, values, floor)


def weights_of(cost_of: Callable[[str, int], float], target: Mapping[str, int], names: Sequence[str],
               values: Sequence[int], floor: float) -> np.ndarray:
    """``label_weights`` with the knobs' cost (``knob_cost``) already built, for a caller that prices
    actions with it too (``action_regrets``)."""
    cost = np.zeros(len(names))
    for i, (name, value) in enumerate(zip(names, values, strict=True)):
        if name not in target:
            continue
        if target[name] != value:
            cost[i] = cost_of(name, value)
    return np.clip(cost, floor, 1.0).astype(np.float32)


def knob_cost(throughput_of, target: Mapping[str, int], full_weight_loss: float,
              held_cpus_of: Callable[[dict[str, int]], float] | None = None, cpus: float = 0.0,
              full_weight_held: float = 0.5) -> Callable[[str, int], float]:
    """``cost(name, value)``: what one knob at ``value`` costs with every other knob at ``target``, the
    larger of the share of the optimum's throughput lost over ``full_weight_loss`` and (with
    ``held_cpus_of``) the CPUs its workers past the target want when busy, as a share of ``cpus``, over
    ``full_weight_held`` (``label_weights`` says why both)."""
    best = throughput_of(dict(target))
    count_held = held_cpus_of is not None and cpus > 0 and full_weight_held > 0
    base_held = held_cpus_of(dict(target)) if count_held else 0.0

    def cost(name: str, value: int) -> float:
        c = max(0.0, 1.0 - throughput_of({**target, name: value}) / best) / full_weight_loss if best > 0 else 0.0
        if count_held and value > target[name]:
            held = max(0.0, held_cpus_of({**target, name: value}) - base_held) / cpus
            c = max(c, held / full_weight_held)
        return c

    return cost


def action_regrets(safety: SafetyLayer, obs: Observation, values: Sequence[int], target: Mapping[str, int],
                   mask: np.ndarray, cost: Callable[[str, int], float]) -> np.ndarray:
    """``[knobs, actions]``: each allowed action's cost (``knob_cost``) where it lands, less the least of
    the knob's allowed actions, capped at 1; 0 for actions not allowed and knobs without a target.

    Why: one weight per label says how much a knob's choice matters, not which wrong choices are
    costly. Priced per action, moving a knob off its target costs what that move loses (a bottleneck's
    worker shed), while a harmless alternative costs nothing, so "hold where you are" is taught where
    leaving costs, and nowhere else. The cap applies to the difference, not to each cost: far from the
    target every landing loses past the full weight, and capped each, they would all cost the same, so
    the term would teach nothing where the network is furthest off (a reader 10 workers into a target of
    128 would be as well shed as grown)."""
    out = np.zeros(mask.shape, dtype=np.float32)
    units = safety.units(obs)
    for k, (knob, v) in enumerate(zip(safety.knobs, values, strict=True)):
        if knob.name not in target:
            continue
        allowed = np.flatnonzero(mask[k])
        if len(allowed) < 2:
            continue
        landed = {a: knob.clamp(v + int(safety.deltas[a]) * int(units[k])) for a in allowed}
        priced = {x: cost(knob.name, x) for x in set(landed.values())}
        least = min(priced.values())
        for a in allowed:
            out[k, a] = min(1.0, priced[landed[a]] - least)
    return out
