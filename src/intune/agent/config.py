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

    teacher_objective: str = "reward"
    """What the imitation teacher's allocation maximises (``intune.sim.oracle.search_optimum``):
    ``reward`` (rows/s times the reward's memory factor: the shipped weights'), ``reachable`` (the most
    rows/s of any allocation the safety mask lets the agent reach: memory under ``memory_margin``, or,
    buffers at their minimum, under the mask's worker ceiling) or ``throughput`` (the scores'
    optimum, which may need memory the mask refuses: a label toward it teaches only the parts the mask
    allows, which may lead away from it)."""

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
    no local-only pipeline shows. 0 (the shipped weights') draws none and leaves every other draw as
    it was."""
    imitation_waiting_share: float = 0.0
    """Share of the imitation's pipelines (and of extra validation pipelines) with one map stage after
    the first made to wait on I/O (``env.with_waiting_stage``): a stage that needs more workers than
    CPUs while it looks idle on the CPU. 0 draws none and leaves every other draw as it was."""
    imitation_waiting_gil_share: float = 0.0
    """Share of those waiting stages that wait on the GIL instead (``env.with_waiting_stage``): busy on
    little CPU alike, but more workers add nothing. 0 leaves the waiting draws as they were."""
    imitation_teacher_share: float = 0.2
    """Share of ticks in the learner's rounds where the teacher acts (the states it leads to get labels too)."""

    imitation_hold_share: float = 0.0
    """Share of the imitation's ticks that begin a hold spell: for 2-8 ticks no local knob moves,
    whatever the learner or the teacher asks, and every state reached is labelled as any other
    (``imitation.DaggerPolicy``). Why: a learner that stops short of its target (after a resize, on a
    pipeline it misreads) reaches states whose history says "hold" while the allocation is off, and
    rollouts that keep moving toward the target rarely show them; without them a network learns to
    continue its last move instead of reading the stages. 0 draws nothing: the rollouts as before."""

    imitation_learning_rate: float = 2e-3
    """Adam learning rate of the imitation rounds."""

    imitation_full_weight_loss: float = 0.02
    """A label weighs 1 when leaving its knob where it is would lose this share of the optimum's
    throughput; less in proportion (``teacher.label_weights``)."""

    imitation_full_weight_held_cpus: float = 0.5
    """A label that sheds workers weighs 1 when those past the target want this share of the CPUs when
    busy, whether or not they cost throughput here; less in proportion (``teacher.label_weights``).
    0 leaves that cost out: labels weigh the throughput lost alone."""

    imitation_weigh_holds: bool = False
    """True: a knob at its target weighs what its costlier move one step away would cost
    (``teacher.label_weights``; ``intune pretrain --weigh-holds``). False: the floor. Off by default: the
    one network pretrained with it no longer swapped a worker between two stages and back, but validated
    lower (0.82 against 0.89) and learned to hold (``docs/experiments.md``)."""

    imitation_regret_weight: float = 0.0
    """Weight of a second imitation loss term: each knob's expected cost under the network's softmax over
    its allowed actions, every action priced at what it costs where it lands (``teacher.action_regrets``;
    ``intune pretrain --regret-weight``). 0: the cross-entropy alone."""

    imitation_min_weight: float = 0.05
    """The weight of a label whose knob's distance from the target costs nothing (at the target, or on
    a flat optimum): it still counts, a little."""

    max_grad_norm: float = 10.0
    """Gradient clipping norm (Huber loss already bounds the per-sample gradient)."""

    action_deltas: tuple[int, ...] = (-5, -1, 0, 1, 5)
    """Per-knob actions; (-1, 0, 1) is the ablation without the paper's +-5 moves."""

    global_only: bool = False
    """Ablation: hide the per-stage signals and keep only the paper's global factors and knob values."""

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
        for name in ("imitation_remote_share", "imitation_waiting_share", "imitation_waiting_gil_share", "imitation_hold_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"AgentConfig.{name} must be a share in [0, 1], got {getattr(self, name)!r}")
        if self.imitation_regret_weight < 0:
            raise ValueError(f"AgentConfig.imitation_regret_weight must be >= 0 (0: off), got {self.imitation_regret_weight!r}")
        if self.imitation_full_weight_held_cpus < 0:
            raise ValueError("AgentConfig.imitation_full_weight_held_cpus must be >= 0 (0: not counted), "
                             f"got {self.imitation_full_weight_held_cpus!r}")

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
