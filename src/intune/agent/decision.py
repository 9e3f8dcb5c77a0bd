"""How the network's Q-values become one move per knob (``AgentConfig.decision``).

``argmax``: each knob's best-valued allowed move. ``mean``: the allowed move nearest the expected move
under the softmax of the allowed moves' values. An imitation-trained head is a classifier over moves;
where states that look alike carry opposite labels it splits its mass between -5 and +5, and the
argmax then acts on a coin toss at full size, while the expected move of a split head is small. Both
rules return scores for ``SafetyLayer.select``, which then applies the joint CPU and memory limits to
the scores: under ``mean`` the move nearest the expectation scores highest, and ties among equally
near moves go to the higher-valued one.
"""

from __future__ import annotations

import numpy as np

DECISIONS = ("argmax", "mean")
TIE_BREAK = 1e-3  # weight of the Q-values in the ``mean`` scores: far below the 1-step gap between moves


def expected_moves(q_values: np.ndarray, allowed: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Per knob, sum over the allowed moves of delta * softmax(Q) (temperature 1, disallowed moves weigh 0).

    A knob with no allowed move (never, with hold always allowed) expects 0.
    """
    z = np.where(allowed, q_values, -np.inf)
    top = z.max(axis=1, keepdims=True)
    weights = np.where(allowed, np.exp(z - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = weights.sum(axis=1, keepdims=True)
    probabilities = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return probabilities @ deltas.astype(float)


def decision_scores(q_values: np.ndarray, allowed: np.ndarray, deltas: np.ndarray, rule: str) -> np.ndarray:
    """``[n_knobs, n_actions]`` scores whose masked argmax is ``rule``'s move per knob."""
    if rule == "argmax":
        return q_values
    if rule == "mean":
        expected = expected_moves(q_values, allowed, deltas)
        distance = np.abs(deltas[None, :].astype(float) - expected[:, None])
        return -distance + TIE_BREAK * np.where(allowed, q_values, 0.0)
    raise ValueError(f"agent decision rule must be one of {DECISIONS}, got {rule!r}")
