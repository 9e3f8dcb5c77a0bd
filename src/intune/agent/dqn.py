"""The DQN training loop, read top to bottom (CleanRL's dqn.py, with action branching).

Many simulated pipelines are stepped in parallel; every knob of every pipeline picks one of the
deltas (epsilon-greedy per knob; an exploring knob follows the oracle teacher or a random score, then
the safety layer resolves them jointly), the one runner (``intune.policies.runner``) applies the
request, the transition goes into an n-step replay buffer, and one gradient step with a Huber loss
against a target network follows. The branching target is the mean over knobs of each knob's double-DQN value (Tavakoli et
al.'s BDQ). It must not know how pipelines are simulated: it sees the ``Env`` protocol only.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from intune.agent.config import ACTION_DELTAS, AgentConfig
from intune.agent.features import MAX_KNOBS, N_FEATURES, FeatureBuilder, pad
from intune.agent.network import BranchingQNetwork, EnsembleQNetwork, QNetwork
from intune.agent.replay import NStepAccumulator, ReplayBuffer
from intune.agent.teacher import teacher_choice
from intune.knobs import Knob
from intune.monitor.observation import Observation
from intune.policies.runner import Runner
from intune.policies.safety import SafetyLayer


class Env(Protocol):
    """A pipeline the agent can train on: knobs to move, ticks to advance, a reward per tick."""

    knobs: Mapping[str, Knob]

    def reset(self) -> Observation: ...

    def step(self) -> Observation: ...

    def reward(self, obs: Observation) -> float: ...

    def optimum_allocation(self, cpus: float) -> tuple[dict[str, int], float]: ...

    # optional: ``scramble(rng, memory_margin) -> Observation`` moves to a random allocation


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """Epsilon at step ``t``: linear from ``start`` to ``end`` over ``duration`` steps, then flat."""
    slope = (end - start) / max(duration, 1)
    return max(slope * t + start, end) if end < start else min(slope * t + start, end)


@dataclass
class _Slot:
    """One parallel pipeline and what the loop remembers about it."""

    env: Env
    runner: Runner
    builder: FeatureBuilder
    safety: SafetyLayer
    nstep: NStepAccumulator
    obs: Observation
    rows: np.ndarray
    valid: np.ndarray
    mask: np.ndarray
    ticks: int = 0
    episode_reward: float = 0.0


@dataclass
class TrainingLog:
    """The learning curve: what pretraining reports and plots."""

    steps: list[int] = field(default_factory=list)
    episode_reward: list[float] = field(default_factory=list)  # mean reward per tick of finished episodes
    eval_steps: list[int] = field(default_factory=list)
    eval_score: list[float] = field(default_factory=list)  # greedy mean throughput / optimum
    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0
    best_step: int = 0  # the validated network returned (the best of the second half of training)


def new_network(config: AgentConfig) -> QNetwork:
    """A fresh network of ``config``'s shape: one, or an ensemble of ``ensemble_members``."""
    if config.ensemble_members < 1:
        raise ValueError(f"ensemble_members must be at least 1, got {config.ensemble_members}")
    members = [BranchingQNetwork(N_FEATURES, len(ACTION_DELTAS), config.hidden) for _ in range(config.ensemble_members)]
    return members[0] if len(members) == 1 else EnsembleQNetwork(members)


def _open(env: Env, config: AgentConfig, nstep: NStepAccumulator | None = None,
          rng: np.random.Generator | None = None) -> _Slot:
    runner = Runner(env.knobs)
    obs = env.reset()
    if rng is not None and hasattr(env, "scramble") and rng.random() < config.random_start_probability:
        obs = env.scramble(rng, config.memory_margin)
    obs = runner.observe(obs)
    knobs = list(env.knobs.values())
    builder = FeatureBuilder(env.knobs)
    safety = SafetyLayer(knobs, ACTION_DELTAS, config.memory_margin, config.trim_margin)
    rows, valid = pad(builder.rows(obs))
    return _Slot(env, runner, builder, safety, nstep or NStepAccumulator(config.n_step, config.gamma), obs, rows, valid,
                 _pad_mask(safety.mask(obs), len(ACTION_DELTAS)))


def _pad_mask(mask: np.ndarray, n_actions: int) -> np.ndarray:
    out = np.zeros((MAX_KNOBS, n_actions), dtype=bool)
    out[: len(mask)] = mask
    return out


def td_loss(q: QNetwork, target: QNetwork, batch) -> torch.Tensor:
    """Huber loss of the taken actions' Q against r + gamma^n * mean_k Q_target_k(s', argmax Q_k(s'))."""
    with torch.no_grad():
        next_online = q(batch.next_rows, batch.next_valid).masked_fill(~batch.next_mask, -1e9)
        best = next_online.argmax(-1, keepdim=True)
        next_value = target(batch.next_rows, batch.next_valid).gather(-1, best).squeeze(-1)
        weights = batch.next_valid.float()
        next_value = (next_value * weights).sum(-1) / weights.sum(-1).clamp_min(1.0)
        y = batch.returns + batch.discount * next_value
    taken = q(batch.rows, batch.valid).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
    per_knob = F.smooth_l1_loss(taken, y.unsqueeze(-1).expand_as(taken), reduction="none")
    weights = batch.valid.float()
    return (per_knob * weights).sum() / weights.sum().clamp_min(1.0)


def train(
    config: AgentConfig,
    make_env: Callable[[np.random.Generator], Env],
    evaluate: Callable[[QNetwork], float] | None = None,
    log: Callable[[str], None] = print,
    q: QNetwork | None = None,
) -> tuple[QNetwork, TrainingLog]:
    """Pretrain (or continue training ``q``) on pipelines drawn by ``make_env``; return it and its curve.

    With ``evaluate``, the network returned is the best-scoring one of the second half of training
    (validation pipelines, never trained on); without, the last one.
    """
    # -- setup ----------------------------------------------------------------------------------
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    n_actions = len(ACTION_DELTAS)
    q = q or new_network(config)
    target = copy.deepcopy(q)
    optimizer = torch.optim.Adam(q.parameters(), lr=config.learning_rate)
    buffer = ReplayBuffer(config.buffer_size, MAX_KNOBS, N_FEATURES, n_actions)
    slots = [_open(make_env(rng), config, rng=rng) for _ in range(config.num_envs)]
    history = TrainingLog()
    finished: list[float] = []
    grad_steps = 0
    best_score, best_state = -np.inf, None
    started = time.perf_counter()

    for step in range(config.total_steps):
        epsilon = linear_schedule(
            config.epsilon_start, config.epsilon_end, int(config.exploration_fraction * config.total_steps), step
        )
        # -- act: one batched forward pass over every pipeline -------------------------------------
        with torch.no_grad():
            rows = torch.from_numpy(np.stack([s.rows for s in slots]))
            valid = torch.from_numpy(np.stack([s.valid for s in slots]))
            q_values = q(rows, valid).numpy()
        for i, slot in enumerate(slots):
            n = len(slot.builder.knob_names)
            scores = q_values[i, :n].copy()
            explore = rng.random(n) < epsilon
            values = [k.value for k in slot.safety.knobs]
            if explore.any():
                if rng.random() < config.teacher_fraction:  # guided exploration (off-policy demonstrations)
                    goal, _ = slot.env.optimum_allocation(slot.obs.cpus)
                    label = teacher_choice(slot.safety, slot.obs, values, goal, slot.mask[:n])
                    guided = np.where(np.arange(n_actions)[None, :] == label[:, None], 1.0, 0.0)
                    scores[explore] = guided[explore]
                else:
                    scores[explore] = rng.random((int(explore.sum()), n_actions))
            choice = slot.safety.select(scores, slot.mask[:n], slot.obs, values)
            wanted = np.asarray(values, dtype=np.int64) + slot.safety.moves(choice, slot.obs)
            request = {k.name: int(w) for k, v, w in zip(slot.safety.knobs, values, wanted, strict=True) if w != v}
            if request:
                slot.runner.apply(slot.obs, request)
            slot.builder.applied(slot.safety.deltas[choice])

            # -- environment tick, reward, n-step transition --------------------------------------
            next_obs = slot.runner.observe(slot.env.step())
            reward = slot.env.reward(next_obs)
            terminal = bool(next_obs.oom)
            next_rows, next_valid = pad(slot.builder.rows(next_obs))
            next_mask = _pad_mask(slot.safety.mask(next_obs), n_actions)
            actions = np.full(MAX_KNOBS, slot.safety.zero, dtype=np.int64)
            actions[:n] = choice
            slot.nstep.push(buffer, slot.rows, slot.valid, actions, reward, next_rows, next_valid, next_mask, terminal)
            slot.obs, slot.rows, slot.valid, slot.mask = next_obs, next_rows, next_valid, next_mask
            slot.ticks += 1
            slot.episode_reward += reward
            if terminal or slot.ticks >= config.episode_ticks:
                finished.append(slot.episode_reward / slot.ticks)
                slot.nstep.clear()
                slots[i] = _open(make_env(rng), config, slot.nstep, rng)

        # -- learn ------------------------------------------------------------------------------
        if step >= config.learning_starts and step % config.train_frequency == 0:
            loss = td_loss(q, target, buffer.sample(config.batch_size, rng))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(q.parameters(), config.max_grad_norm)
            optimizer.step()
            grad_steps += 1
            if grad_steps % config.target_update_frequency == 0:
                target.load_state_dict(q.state_dict())
            if grad_steps % 100 == 0:
                history.loss.append(loss.item())

        # -- record -----------------------------------------------------------------------------
        if finished and (step + 1) % 100 == 0:
            history.steps.append(step + 1)
            history.episode_reward.append(float(np.mean(finished)))
            finished.clear()
        if evaluate is not None and ((step + 1) % config.eval_every == 0 or step + 1 == config.total_steps):
            score = evaluate(q)
            history.eval_steps.append(step + 1)
            history.eval_score.append(score)
            if score > best_score and step + 1 > config.total_steps // 2:  # keep the best late network
                best_score, best_state = score, copy.deepcopy(q.state_dict())
                history.best_step = step + 1
            last = history.episode_reward[-1] if history.episode_reward else float("nan")
            log(
                f"step {step + 1:6d}/{config.total_steps}  eps {epsilon:.2f}  train reward/tick {last:.3f}  "
                f"eval {score:.3f}  {time.perf_counter() - started:.0f}s"
            )
    history.seconds = time.perf_counter() - started
    if best_state is not None:
        q.load_state_dict(best_state)
    return q, history
