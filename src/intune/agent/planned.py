"""``planner+agent``: the planner's allocation, with the pretrained network's moves tried on top.

The planner (``intune.policies.planner``) jumps to the allocation its rate models predict best. Its
models can be wrong where a stage's behaviour is not what one fit shows (a worker that helps only in
company, a cost that changes with the neighbours' workers). The network, pretrained in the simulator
over many such pipelines, proposes where to look: once the plan is in force and settled, every
``PROBE_EVERY`` ticks the worker move the network values most above holding (one worker, up or down)
is tried for one fit, and kept only where the measured rate beats the plan's by the planner's ``GAIN``
(``PlannerPolicy.try_move``). The network never overrides a plan and never acts past the safety
layer: its proposals go through the planner's ``SafetyLayer.admit`` like the plan's own moves.

It must not learn during an episode of the benchmark (the simulator calls no ``observe``); which moves
are kept is what it measures.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from intune.agent.config import ACTION_DELTAS
from intune.agent.policy import DEFAULT_WEIGHTS, NetworkProposer, load_weights
from intune.knobs import Knob
from intune.monitor.observation import Observation
from intune.policies.planner import PlannerPolicy
from intune.policies.remote_sizing import local_knobs
from intune.policies.safety import SafetyLayer

PROBE_EVERY = 30  # ticks between tried moves once a plan is in force


class PlannerWithAgent:
    """The planner's plan; the network's best worker move tried on top every ``PROBE_EVERY`` ticks."""

    name = "planner+agent"

    def __init__(self, weights: str | Path | None = None) -> None:
        q, self.config = load_weights(weights or DEFAULT_WEIGHTS)
        self.proposer = NetworkProposer(q, self.config)
        self.planner = PlannerPolicy()
        self.probes = 0

    @property
    def probes_kept(self) -> int:
        return self.planner.probes_kept

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self.planner.reset(knobs, observation)
        local = dict(local_knobs(knobs))
        self.proposer.reset(local, observation)
        self.safety = SafetyLayer(list(local.values()), ACTION_DELTAS, self.config.memory_margin,
                                  self.config.trim_margin)
        self._since = 0
        self.probes = 0

    def step(self, observation: Observation) -> dict[str, int]:
        request = self.planner.step(observation)
        values = [k.value for k in self.safety.knobs]
        mask = self.safety.mask(observation, values)
        scores = self.proposer(observation, values, mask)
        self._since += 1
        if self._since < PROBE_EVERY or not self.planner.settled():
            return request
        move = self._best_move(scores, mask)
        if move is None:
            return request
        self._since = 0
        self.probes += 1
        self.planner.try_move(*move)
        return self.planner.request(observation, [k.value for k in self.planner.safety.knobs])

    def _best_move(self, scores: np.ndarray, mask: np.ndarray) -> tuple[str, int] | None:
        """The worker knob and value of the network's most valued move above holding, one worker."""
        zero = self.safety.zero
        best, pick = 0.0, None
        for k, knob in enumerate(self.safety.knobs):
            if knob.unit != "cpu":
                continue
            row = np.where(mask[k], scores[k], -np.inf)
            a = int(np.argmax(row))
            gain = float(row[a] - row[zero])
            if a != zero and np.isfinite(gain) and gain > best:
                best, pick = gain, (knob.name, knob.value + int(np.sign(self.safety.deltas[a])))
        return pick

    def state_dict(self) -> dict[str, Any]:
        return {"planner": self.planner.state_dict(), "proposer": self.proposer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.planner.load_state_dict(state["planner"])
        self.proposer.load_state_dict(state["proposer"])


__all__ = ["PROBE_EVERY", "PlannerWithAgent"]
