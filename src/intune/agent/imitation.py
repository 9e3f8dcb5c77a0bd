"""Imitation of the oracle (DAgger): the network first learns the moves that lead to the optimum.

A DQN trained from scratch on throughput rewards rarely sees the consistent multi-tick reallocations a
good allocation needs, so pretraining starts by imitation. The teacher knows the simulated workload's
true optimum (``intune.sim.oracle``) and labels every state with, per knob, the allowed action whose
move lands closest to the optimum's value (jointly resolved under the safety mask, as the agent's own
choices are). DAgger (Ross et al. 2011): round 0 rolls out the teacher; later rounds roll out the
learner (with a share of teacher ticks) and the teacher labels the states the learner reaches, so the
network learns to recover from its own mistakes. Each label is weighted by what it is worth
(``teacher.label_weights``: the throughput lost if that knob stayed put, or the CPUs its workers past
the target hold), so that a bottleneck's move outweighs the exact value of a knob on a flat optimum.
The teacher's target is the reward's optimum (``OraclePolicy``'s default objective). Every rollout
goes through ``intune.sim.run_episode`` (the one runner). It must not be used live: the teacher reads the
simulator's true model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from intune.agent.config import AgentConfig
from intune.agent.features import MAX_KNOBS
from intune.agent.network import BranchingQNetwork
from intune.agent.policy import IntunePolicy
from intune.agent.teacher import action_regrets, knob_cost, teacher_choice, weights_of
from intune.monitor.observation import Observation
from intune.policies.remote_sizing import local_knobs
from intune.policies.safety import WORKER_CEILING
from intune.sim.oracle import OraclePolicy

TEACHER_REFRESH_TICKS = 30  # drift moves the optimum slowly: the teacher re-searches it this often


class DaggerPolicy:
    """The learner, with the oracle teacher labelling every state and acting on a share of the ticks.

    ``states`` collects ``(rows, valid, mask, label, weight, regret)`` padded to ``MAX_KNOBS``. A run starts at the
    even split or, with ``random_start``, at a random allocation (asked of the runner like any request),
    so that the network also learns to recover from allocations it would never choose.
    """

    name = "dagger"

    def __init__(self, student: IntunePolicy, teacher_share: float, rng: np.random.Generator,
                 random_start: float, refresh_ticks: int = TEACHER_REFRESH_TICKS) -> None:
        self.student = student
        self.sim = None
        self.teacher_share = teacher_share
        self.rng = rng
        self.random_start = random_start
        self.refresh_ticks = refresh_ticks
        self.teacher = OraclePolicy(refresh_ticks=refresh_ticks, margins=(student.config.memory_margin, WORKER_CEILING))
        self._remote_key: tuple[int, int] | None = None
        self._remote_tick = 0
        self._remote_target: dict[str, int] = {}
        self.states: list[tuple[np.ndarray, ...]] = []

    def bind_simulator(self, sim) -> None:
        self.sim = sim
        self.teacher.bind_simulator(sim)

    def reset(self, knobs, observation: Observation) -> None:
        self.knobs = knobs
        self.student.reset(knobs, observation)
        self.teacher.reset(knobs, observation)
        self._first = True

    def step(self, observation: Observation) -> dict[str, int]:
        if self._first:
            self._first = False
            start = self.student.step(observation)
            if self.rng.random() < self.random_start:
                start = self._random_allocation(observation)
            return start
        request = self.student.step(observation)
        safety, values, mask = self.student.safety, [k.value for k in self.student.safety.knobs], self.student.last_mask
        target = self._target(observation)
        label = teacher_choice(safety, observation, values, target, mask, self.sim.true_throughput)
        config = self.student.config
        cost = knob_cost(self.sim.true_throughput, target, config.imitation_full_weight_loss,
                         self.sim.held_cpus, float(self.sim.cpus), config.imitation_full_weight_held_cpus)
        weight = weights_of(cost, target, [k.name for k in safety.knobs], values, config.imitation_min_weight)
        rows, valid = self.student.chooser.last
        n = len(values)
        padded_mask = np.zeros((MAX_KNOBS, len(safety.deltas)), dtype=bool)
        padded_mask[:n] = mask
        padded_mask[n:, safety.zero] = True
        padded_label = np.full(MAX_KNOBS, safety.zero, dtype=np.int64)
        padded_label[:n] = label
        padded_weight = np.zeros(MAX_KNOBS, dtype=np.float32)
        padded_weight[:n] = weight
        padded_regret = np.zeros((MAX_KNOBS, len(safety.deltas)), dtype=np.float32)
        if config.imitation_regret_weight > 0:
            padded_regret[:n] = action_regrets(safety, observation, values, target, mask, cost)
        self.states.append((rows, valid, padded_mask, padded_label, padded_weight, padded_regret))
        local = {k.name for k in safety.knobs}
        if self.rng.random() < self.teacher_share:
            wanted, choice = safety.hard_limits(label, observation, values, self.student.floor)
            self.student.chooser.builder.applied(safety.deltas[choice])
            remote = {name: value for name, value in request.items() if name not in local}  # the sizing rule's
            return {**remote, **{k.name: int(w) for k, v, w in zip(safety.knobs, values, wanted, strict=True) if w != v}}
        return request

    def _target(self, observation: Observation) -> dict[str, int]:
        """The teacher's allocation of the local knobs. With a remote pool, the optimum beside the remote
        workers running now (the shared sizing rule sets those, not the network): a label toward the
        optimum beside another worker count would teach moves this state does not need."""
        pool = getattr(self.sim, "remote_pool", None)
        remote = None if pool is None else int(self.sim.knobs[f"{self.sim.params.names[pool.stage]}.remote_workers"].value)
        return self.teacher.target(observation, remote_workers=remote)

    def _random_allocation(self, obs: Observation) -> dict[str, int]:
        """Local workers log-uniform in [1, 2 x CPUs / stages], buffers log-uniform within their bounds
        (capped at 1 GB); the runner and the memory margin decide what is granted."""
        out = {}
        knobs = local_knobs(self.knobs)
        n = max(1, sum(k.unit == "cpu" for k in knobs.values()))
        for name, knob in knobs.items():
            hi = max(2.0, 2.0 * obs.cpus / n) if knob.unit == "cpu" else min(knob.max, 1024)
            lo = max(knob.min, 1)
            out[name] = knob.clamp(float(np.exp(self.rng.uniform(np.log(lo), np.log(max(hi, lo))))))
        return out


@dataclass
class ImitationLog:
    """Per DAgger round: states labelled so far, the learner's validation score, the loss, seconds."""

    rounds: list[int] = field(default_factory=list)
    states: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    agreement: list[float] = field(default_factory=list)  # weighted share of knob labels the network's argmax matches
    eval_score: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    best_round: int = -1  # the round whose network is returned (-1: the last, without validation)


def imitation_loss(q: BranchingQNetwork, rows, valid, mask, label, weight, regret=None,
                   regret_weight: float = 0.0) -> tuple[torch.Tensor, float]:
    """Cross-entropy of each real knob's masked Q-values (as logits) against the teacher's action,
    weighted by the label's ``weight``; with ``regret_weight`` > 0, plus that times each real knob's
    expected ``regret`` under the softmax of its logits (mean over knobs); and the weighted share of
    knobs whose argmax already agrees."""
    logits = q(rows, valid).masked_fill(~mask, -1e9)
    per_knob = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), label.reshape(-1), reduction="none")
    weights = valid.reshape(-1).float() * weight.reshape(-1)
    agree = ((logits.argmax(-1) == label).float().reshape(-1) * weights).sum() / weights.sum().clamp_min(1e-9)
    loss = (per_knob * weights).sum() / weights.sum().clamp_min(1e-9)
    if regret is not None and regret_weight > 0:
        expected = (torch.softmax(logits, dim=-1) * regret).sum(-1).reshape(-1)
        real = valid.reshape(-1).float()
        loss = loss + regret_weight * (expected * real).sum() / real.sum().clamp_min(1.0)
    return loss, float(agree)


def fit(q: BranchingQNetwork, data: list[tuple[np.ndarray, ...]], config: AgentConfig,
        optimizer: torch.optim.Optimizer, rng: np.random.Generator, batch: int = 256) -> tuple[float, float]:
    """``imitation_epochs`` passes of minibatch cross-entropy over ``data``; returns the last epoch's
    mean loss and agreement."""
    rows = torch.from_numpy(np.stack([d[0] for d in data]))
    valid = torch.from_numpy(np.stack([d[1] for d in data]))
    mask = torch.from_numpy(np.stack([d[2] for d in data]))
    label = torch.from_numpy(np.stack([d[3] for d in data]))
    weight = torch.from_numpy(np.stack([d[4] for d in data]))
    # the regrets only where their term counts (off, they are all zero)
    regret = torch.from_numpy(np.stack([d[5] for d in data])) if config.imitation_regret_weight > 0 else None
    losses, agrees = [], []
    for _ in range(config.imitation_epochs):
        order = rng.permutation(len(data))
        losses, agrees = [], []
        for start in range(0, len(order), batch):
            idx = torch.from_numpy(order[start : start + batch])
            loss, agree = imitation_loss(q, rows[idx], valid[idx], mask[idx], label[idx], weight[idx],
                                         None if regret is None else regret[idx], config.imitation_regret_weight)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(q.parameters(), config.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
            agrees.append(agree)
    return float(np.mean(losses)), float(np.mean(agrees))


def imitate(
    config: AgentConfig,
    make_sim: Callable[[np.random.Generator], object],
    q: BranchingQNetwork,
    evaluate: Callable[[BranchingQNetwork], float] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[BranchingQNetwork, ImitationLog]:
    """DAgger rounds on simulators drawn by ``make_sim``; returns the network and its curve.

    With ``evaluate``, the network returned is the best-validated round's (DAgger's choice among its
    policies); without, the last round's."""
    from intune.sim.episode import run_episode

    rng = np.random.default_rng(config.seed + 17)
    optimizer = torch.optim.Adam(q.parameters(), lr=config.imitation_learning_rate)
    data: list[tuple[np.ndarray, ...]] = []
    history = ImitationLog()
    best_score, best_state = -np.inf, None
    started = time.perf_counter()
    for round_ in range(config.imitation_rounds):
        share = 1.0 if round_ == 0 else config.imitation_teacher_share
        q.eval()
        for _ in range(config.imitation_episodes):
            sim = make_sim(rng)
            student = IntunePolicy(network=q, config=config, online=False)
            policy = DaggerPolicy(student, share, rng, config.random_start_probability)
            run_episode(sim, policy, config.imitation_ticks)
            data.extend(policy.states)
        q.train()
        loss, agree = fit(q, data, config, optimizer, rng)
        q.eval()
        score = evaluate(q) if evaluate is not None else float("nan")
        if evaluate is not None and score > best_score:
            best_score, best_state = score, {k: v.clone() for k, v in q.state_dict().items()}
            history.best_round = round_
        history.rounds.append(round_)
        history.states.append(len(data))
        history.loss.append(loss)
        history.agreement.append(agree)
        history.eval_score.append(score)
        history.seconds.append(time.perf_counter() - started)
        log(f"dagger round {round_}: {len(data)} states, loss {loss:.3f}, agreement {agree:.3f}, "
            f"validation {score:.3f}, {time.perf_counter() - started:.0f}s")
    if best_state is not None:
        q.load_state_dict(best_state)
    return q, history


__all__ = ["DaggerPolicy", "ImitationLog", "fit", "imitate", "imitation_loss"]
