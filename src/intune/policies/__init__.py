"""Policies that set knob values: none, heuristic, autotune(-adaptive), plumber(-adaptive), steer, planner,
planner+agent, network, network+steer, oracle, oracle-safe; ``intune`` is the default (``DEFAULT_POLICY``).

``make(name)`` builds one by name; the classes live one per module so that each algorithm can be read
on its own. The registry maps names to ``module:Class`` and imports lazily (the agent needs torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from intune.policies.base import ClampResult, Policy, StatefulPolicy, clamp_request, even_split

_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "none": ("intune.policies.static", "NonePolicy", {}),
    "heuristic": ("intune.policies.static", "HeuristicPolicy", {}),
    "autotune": ("intune.policies.autotune", "AutotunePolicy", {"adaptive": False}),
    "autotune-adaptive": ("intune.policies.autotune", "AutotunePolicy", {"adaptive": True}),
    "plumber": ("intune.policies.plumber", "PlumberPolicy", {"adaptive": False}),
    "plumber-adaptive": ("intune.policies.plumber", "PlumberPolicy", {"adaptive": True}),
    "steer": ("intune.policies.steer", "SteerPolicy", {}),
    "planner": ("intune.policies.planner", "PlannerPolicy", {}),
    "planner+agent": ("intune.agent.planned", "PlannerWithAgent", {}),
    "network": ("intune.agent.policy", "IntunePolicy", {}),
    "network+steer": ("intune.agent.policy", "network_with_rules", {}),
    "oracle": ("intune.sim.oracle", "OraclePolicy", {}),
    "oracle-safe": ("intune.sim.oracle", "safe_oracle", {}),
}

DEFAULT_POLICY = "planner"
"""What ``intune`` (the default of ``tune``, ``intune.DataLoader`` and the demo) names: the policy that
measures best where users run it (docs/agent.md, "Which part earns what")."""
_REGISTRY["intune"] = _REGISTRY[DEFAULT_POLICY]

POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)
SIMULATOR_ONLY: tuple[str, ...] = ("oracle", "oracle-safe")
"""Policies that read the simulated workload's true costs, which a live pipeline does not have."""


def make(name: str, **kwargs: Any) -> Policy:
    """Build the policy called ``name`` (one of ``POLICY_NAMES``)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; choose one of {list(POLICY_NAMES)}")
    module, cls, defaults = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(**{**defaults, **kwargs})


__all__ = [
    "DEFAULT_POLICY", "ClampResult", "POLICY_NAMES", "SIMULATOR_ONLY", "Policy", "StatefulPolicy", "clamp_request", "even_split", "make",
]
