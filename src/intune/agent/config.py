"""The agent's hyperparameters: one typed dataclass, one docstring per field.

Owns every number that shapes the DQN (network width, learning rate, schedules, replay, safety
margins, pretraining randomisation). It must not hold code that uses them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class AgentConfig:
    """Hyperparameters of the InTune DQN, its pretraining and its online fine-tuning."""

    seed: int = 0
    """Seed of torch, numpy and the simulated workloads drawn for pretraining."""

    total_steps: int = 6000
    """Vector steps of pretraining (each steps every parallel simulated pipeline once)."""

    num_envs: int = 16
    """Simulated pipelines stepped in parallel; every one contributes a transition per vector step."""

    episode_ticks: int = 300
    """Ticks of one pretraining episode before its pipeline is replaced by a fresh random one."""

    hidden: int = 64
    """Width of the two hidden layers of the shared three-layer MLP."""

    learning_rate: float = 1e-3
    """Adam learning rate of pretraining."""

    online_learning_rate: float = 2e-4
    """Adam learning rate of online fine-tuning (smaller: live rewards are few and noisy)."""

    gamma: float = 0.8
    """Discount per tick; short horizon because an allocation's effect shows within a few ticks."""

    n_step: int = 3
    """Rewards summed into one n-step return (faster credit for a run of moves toward the optimum)."""

    buffer_size: int = 32768
    """Transitions kept in the replay buffer."""

    batch_size: int = 128
    """Transitions per gradient step."""

    learning_starts: int = 200
    """Vector steps of pure exploration before the first gradient step."""

    train_frequency: int = 1
    """Vector steps between gradient steps."""

    target_update_frequency: int = 250
    """Gradient steps between copies of the online network into the target network."""

    epsilon_start: float = 1.0
    """Exploration rate at the start of pretraining."""

    epsilon_end: float = 0.05
    """Exploration rate after the decay."""

    exploration_fraction: float = 0.5
    """Fraction of ``total_steps`` over which epsilon falls linearly from start to end."""

    teacher_fraction: float = 0.5
    """Share of exploratory ticks whose moves come from the proportional-share teacher, not at random."""

    max_grad_norm: float = 10.0
    """Gradient clipping norm (Huber loss already bounds the per-sample gradient)."""

    action_deltas: tuple[int, ...] = (-5, -1, 0, 1, 5)
    """Per-knob actions; (-1, 0, 1) is the ablation without the paper's +-5 moves."""

    global_only: bool = False
    """Ablation: hide the per-stage signals and keep only the paper's global factors and knob values."""

    memory_margin: float = 0.85
    """The safety mask never lets projected memory use exceed this fraction of the limit."""

    min_cpus: int = 2
    """Fewest CPUs of a randomised pretraining machine."""

    max_cpus: int = 128
    """Most CPUs of a randomised pretraining machine."""

    min_stages: int = 2
    """Fewest stages of a randomised pretraining pipeline."""

    max_stages: int = 8
    """Most stages of a randomised pretraining pipeline (the network is sized for this)."""

    resize_probability: float = 0.015
    """Chance per tick of a CPU resize event during a pretraining episode."""

    random_start_probability: float = 0.5
    """Share of pretraining episodes that start from a random allocation instead of the spec's."""

    tight_memory_probability: float = 0.4
    """Share of pretraining episodes whose memory limit is tight enough to matter."""

    eval_every: int = 500
    """Vector steps between greedy evaluations on the fixed validation pipelines (learning curve)."""

    online_train_every: int = 4
    """Live ticks between gradient steps of online fine-tuning."""

    online_buffer_size: int = 2048
    """Transitions kept for online fine-tuning."""

    memory_ticks: int = 120
    """Ticks a worker vector's measured throughput is remembered by the policy's guard, which holds the
    CPU knobs instead of moving back to a vector measured clearly worse (0 turns the guard off)."""

    memory_tolerance: float = 0.05
    """How much worse (relative) a remembered vector must be for the guard to hold; about the live
    noise. Doubled when a value comes only from the tick right after a change (partly transitional)."""

    trim_margin: float = 0.65
    """Share of the memory limit that the buffers, if full, plus what is used outside them may take
    before the policy cuts buffers in one tick (``SafetyLayer.trim``); below ``memory_margin`` because
    that projection misses memory that only comes once data flows."""

    memory_drift: float = 0.25
    """A settled reading this far (relative) from the current vector's average means the workload
    changed, and the guard forgets every vector (0: only ``memory_ticks`` expiry forgets)."""

    dwell_ticks: int = 1
    """Ticks the CPU knobs hold after a move (so the new vector's throughput is measured settled)."""

    probe_after: int = 5
    """Ticks without a new worker vector (the network holding, or cycling among vectors measured
    recently) before the policy tries one worker more on the bottleneck stage, or moves one there from
    the stage with the most idle workers when no CPU is free, or adds one to a busy light stage
    (``Observation.light_stages``: granted past the CPUs, and undone unless the rate clearly rises); a
    vector the memory knows is not tried again while remembered (0: no probes, and no steering at all).
    This is how the agent gets out of a live state where the sim-trained network keeps holding below
    the optimum."""

    fill_free_cpus: int = 2
    """Free CPUs, left after the network's moves, from which the policy gives the busiest stage more
    workers itself (+5 when 5 are free, else +1), unless the memory knows that to be worse (0: never)."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes stored with the weights (e.g. the command that produced them)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, so the config can be stored beside weights and loaded without pickle."""
        out = asdict(self)
        out["action_deltas"] = list(self.action_deltas)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentConfig:
        """Inverse of ``to_dict``; unknown keys raise so that a stale weights file is noticed, missing
        keys take their defaults (weights saved before a field existed still load)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"AgentConfig: unknown field(s) {unknown}")
        data = dict(data)
        if "action_deltas" in data:
            data["action_deltas"] = tuple(int(d) for d in data["action_deltas"])
        return cls(**data)
