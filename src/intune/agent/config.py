"""The agent's hyperparameters: one typed dataclass, one docstring per field.

Owns every number that shapes the DQN (network width, learning rate, schedules, replay, safety
margins, pretraining randomisation). It must not hold code that uses them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from intune.agent.decision import DECISIONS
from intune.monitor.observation import MEMORY_SAFE_FRACTION
from intune.policies.safety import TRIM_MARGIN

ACTION_DELTAS: tuple[int, ...] = (-5, -1, 0, 1, 5)
"""Each knob's moves, in units of its step: one Q-value head per knob over these (the paper's +-1 and +-5)."""

RETIRED_AT: dict[str, Any] = {"action_deltas": list(ACTION_DELTAS), "global_only": False}
"""Retired fields that decide how a network acts, with the one value this code acts by: a weights file
storing another value was made for another action set or feature layout and is refused, naming the field."""

RETIRED_TRAINING = ("teacher_objective", "imitation_waiting_gil_share", "imitation_hold_share", "imitation_weigh_holds")
"""Retired fields that only shaped how a network was pretrained (experiments' options, docs/experiments.md):
a weights file storing them loads, whatever they held, and they are dropped."""


@dataclass
class AgentConfig:
    """Hyperparameters of the InTune DQN, its pretraining and its online fine-tuning."""

    seed: int = 0
    """Seed of torch, numpy and the simulated workloads drawn for pretraining."""

    total_steps: int = 1500
    """Vector steps of pretraining (each steps every parallel simulated pipeline once)."""

    num_envs: int = 16
    """Simulated pipelines stepped in parallel; every one contributes a transition per vector step."""

    episode_ticks: int = 300
    """Ticks of one pretraining episode before its pipeline is replaced by a fresh random one."""

    hidden: int = 128
    """Width of the two hidden layers of the shared three-layer MLP."""

    ensemble_members: int = 1
    """Networks pretrained apart (seeds ``seed`` to ``seed + members - 1``) whose mean Q-values decide
    (``network.EnsembleQNetwork``); 1: one network."""

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
    """Share of exploratory ticks whose moves come from the oracle teacher (``imitation``), not at random."""

    validation_pipelines: int = 40
    """Episodes the greedy network is scored on after each DAgger round and DQN evaluation: the agent
    benchmark's kind (random specs on the paper's resize schedule, 60-tick phases) drawn from ``seed`` +
    1,000,003, never trained on; the best-scored network is kept. Fewer rank the rounds less reliably
    (docs/agent.md)."""

    imitation_rounds: int = 10
    """DAgger rounds before the DQN steps: round 0 follows the teacher, later rounds the learner."""

    imitation_episodes: int = 64
    """Simulated episodes rolled out per DAgger round."""

    imitation_ticks: int = 200
    """Ticks per DAgger episode."""

    imitation_epochs: int = 6
    """Passes over all labelled states after each round (cross-entropy on each knob's head)."""

    imitation_remote_share: float = 0.0
    """Share of the imitation's pipelines (and of extra validation pipelines) whose heaviest map stage
    gets a remote pool (``env.with_remote_pool``): the local allocation beside remote workers is one
    no local-only pipeline shows (the shipped weights': 0.25). 0 draws none and leaves every other draw
    as it was."""
    imitation_waiting_share: float = 0.0
    """Share of the imitation's pipelines (and of extra validation pipelines) with one map stage after
    the first made to wait on I/O (``env.with_waiting_stage``): a stage that needs more workers than
    CPUs while it looks idle on the CPU (the shipped weights': 0.25). 0 draws none and leaves every other
    draw as it was."""
    imitation_teacher_share: float = 0.2
    """Share of ticks in the learner's rounds where the teacher acts (the states it leads to get labels too)."""

    imitation_learning_rate: float = 2e-3
    """Adam learning rate of the imitation rounds."""

    imitation_full_weight_loss: float = 0.02
    """A label weighs 1 when leaving its knob where it is would lose this share of the optimum's
    throughput; less in proportion (``teacher.label_weights``)."""

    imitation_full_weight_held_cpus: float = 0.5
    """A label that sheds workers weighs 1 when those past the target want this share of the CPUs when
    busy, whether or not they cost throughput here; less in proportion (``teacher.label_weights``).
    0 leaves that cost out: labels weigh the throughput lost alone."""

    imitation_regret_weight: float = 0.0
    """Weight of a second imitation loss term: each knob's expected cost under the network's softmax over
    its allowed actions, every action priced at what it costs where it lands (``teacher.action_regrets``;
    ``intune pretrain --regret-weight``). 0: the cross-entropy alone."""

    imitation_min_weight: float = 0.05
    """The weight of a label whose knob's distance from the target costs nothing (at the target, or on
    a flat optimum): it still counts, a little."""

    max_grad_norm: float = 10.0
    """Gradient clipping norm (Huber loss already bounds the per-sample gradient)."""

    memory_margin: float = MEMORY_SAFE_FRACTION
    """The safety mask never lets projected memory use exceed this fraction of the limit (where the
    reward starts to fall)."""

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

    trim_margin: float = TRIM_MARGIN
    """Share of the memory limit that the buffers, if full, plus what is used outside them may take
    before the policy cuts buffers in one tick (``SafetyLayer.trim``); below ``memory_margin`` because
    that projection misses memory that only comes once data flows."""

    decision: str = "argmax"
    """How the Q-values become a move per knob (``intune.agent.decision``): ``argmax``, or ``mean``
    (the allowed move nearest the expected move under softmax(Q)). Pretraining picks its network while
    acting by this rule, and the network file carries it, so it always acts as it was chosen."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes stored with the weights (e.g. the command that produced them)."""

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"AgentConfig.decision must be one of {DECISIONS}, got {self.decision!r}")
        for name in ("imitation_remote_share", "imitation_waiting_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"AgentConfig.{name} must be a share in [0, 1], got {getattr(self, name)!r}")
        if self.imitation_regret_weight < 0:
            raise ValueError(f"AgentConfig.imitation_regret_weight must be >= 0 (0: off), got {self.imitation_regret_weight!r}")
        if self.imitation_full_weight_held_cpus < 0:
            raise ValueError("AgentConfig.imitation_full_weight_held_cpus must be >= 0 (0: not counted), "
                             f"got {self.imitation_full_weight_held_cpus!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain types only, so the config can be stored beside weights and loaded without pickle."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentConfig:
        """Inverse of ``to_dict``; unknown keys raise so that a stale weights file is noticed, missing
        keys take their defaults (weights saved before a field existed still load). Retired fields are
        dropped: those of pretraining whatever they hold (``RETIRED_TRAINING``), those that decide how
        the network acts only at the value this code acts by (``RETIRED_AT``)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names - set(RETIRED_AT) - set(RETIRED_TRAINING))
        if unknown:
            raise ValueError(f"AgentConfig: unknown field(s) {unknown}")
        for name, value in RETIRED_AT.items():
            stored = list(data[name]) if isinstance(data.get(name), (list, tuple)) else data.get(name, value)
            if stored != value:
                raise ValueError(f"AgentConfig: retired field {name!r} is {data[name]!r}; this version acts only "
                                 f"with {value!r} (a network made for another {name} cannot act here)")
        return cls(**{k: v for k, v in data.items() if k in names})
