"""IntunePolicy: the pretrained network as a Policy (registry name ``intune``), fine-tuned online.

The decisions are the network's, under a mask of hard limits and nothing else (``SafetyLayer``): knob
bounds, the CPU budget the runner grants, the projected memory and its margin, and the user's shuffle
window as a floor while memory allows. It starts from the even split (the paper's choice) or from
Plumber's estimate (``warm_start="plumber"``), then every tick each knob takes one of the deltas under
the mask, by the network's decision rule (``intune.agent.decision``: the best-valued move, or the move
nearest the expected one). ``observe`` (the live tuner calls it every tick with the reward) feeds a
small replay buffer and takes a DQN step every few ticks (``OnlineLearner``: numpy, on the caller's
thread). It returns requests; the runner applies them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from intune.agent.config import ACTION_DELTAS, AgentConfig
from intune.agent.decision import decision_scores
from intune.agent.dqn import new_network
from intune.agent.features import MAX_KNOBS, N_FEATURES, FeatureBuilder, pad
from intune.agent.network import NumpyQ, QNetwork
from intune.agent.online_learning import OnlineLearner
from intune.agent.replay import ReplayBuffer
from intune.knobs import Knob
from intune.monitor.observation import OOM_PENALTY, Observation
from intune.monitor.observation import reward as contract_reward
from intune.policies.remote_sizing import with_remote_placement
from intune.policies.safety import SafetyLayer, shuffle_floor, start_allocation
from intune.rng import rng_from_state, rng_state

WEIGHTS_DIR = Path(__file__).with_name("weights")
DEFAULT_WEIGHTS = WEIGHTS_DIR / "intune_network.pt"
WEIGHTS_FORMAT = 2


def save_weights(path: str | Path, q: QNetwork, config: AgentConfig) -> Path:
    """Write the network and its config as plain tensors and primitives (loadable with weights_only)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in q.state_dict().items()}
    torch.save({"format": WEIGHTS_FORMAT, "config": config.to_dict(), "state_dict": state}, out)
    return out


def load_weights(path: str | Path = DEFAULT_WEIGHTS) -> tuple[QNetwork, AgentConfig]:
    """Load a weights file written by ``save_weights``; errors name the file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"agent weights {path} not found; make them with `intune pretrain --out {path}`")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload.get("format") != WEIGHTS_FORMAT:
            raise ValueError(f"format {payload.get('format')!r}, expected {WEIGHTS_FORMAT}")
        config = AgentConfig.from_dict(payload["config"])
        # the initial weights are replaced at once: drawing them must not move torch's global generator,
        # which belongs to the caller (a DataLoader's shuffle draws from it, as torch's does)
        with torch.random.fork_rng(devices=[]):
            q = new_network(config)
        q.load_state_dict(payload["state_dict"])
    except Exception as exc:
        raise ValueError(f"agent weights {path}: cannot load ({exc})") from exc
    q.eval()
    return q, config


def network_state(q: QNetwork) -> dict[str, np.ndarray]:
    """A network's weights as numpy arrays (a checkpoint holds no torch objects)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in q.state_dict().items()}


def load_network_state(q: QNetwork, state: Mapping[str, Any], what: str) -> None:
    """Set ``q``'s weights from ``network_state``; a missing, extra or reshaped tensor raises naming it."""
    own = q.state_dict()
    if set(own) != set(state):
        raise ValueError(f"{what}: weights {sorted(state)} do not match the network's {sorted(own)}")
    for name, tensor in own.items():
        if tuple(tensor.shape) != tuple(np.shape(state[name])):
            raise ValueError(f"{what}: weight {name!r} has shape {np.shape(state[name])}, the network's is {tuple(tensor.shape)}")
    q.load_state_dict({name: torch.from_numpy(np.asarray(v, dtype=np.float32).copy()) for name, v in state.items()})


class NetworkChooser:
    """The network's greedy choice per knob under the safety mask: what ``intune`` does every tick.

    Shared by ``IntunePolicy`` and by ``intune+steer`` (the same choice, handed to the steering rules).
    """

    def __init__(self, q: QNetwork, config: AgentConfig, knobs: Mapping[str, Knob]) -> None:
        self.q = q
        self.config = config
        self.builder = FeatureBuilder(knobs)
        # decisions run in numpy (see NumpyQ: torch spins on a saturated machine); a stand-in network
        # of another class (tests) runs as it is
        self.numpy_q = NumpyQ(q) if isinstance(q, QNetwork) else None
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # this tick's padded rows and valid mask

    def q_values(self, obs: Observation) -> np.ndarray:
        """``[n_knobs, n_actions]`` Q-values of this tick (also kept as ``last`` for learning)."""
        rows, valid = pad(self.builder.rows(obs))
        self.last = (rows, valid)
        n = len(self.builder.knob_names)
        if self.numpy_q is not None:
            return self.numpy_q(rows[:n], valid[:n])
        with torch.inference_mode():
            return self.q(torch.from_numpy(rows[:n]), torch.from_numpy(valid[:n])).numpy()

    def refresh(self, q: QNetwork) -> None:
        self.q = q
        if self.numpy_q is not None:
            self.numpy_q.refresh(q)


@with_remote_placement  # remote knobs: the shared sizing rule, not the network (docs/remote_tuning.md)
class IntunePolicy:
    """The InTune agent. ``network``/``config`` override the shipped weights (used in pretraining)."""

    name = "network"

    def __init__(
        self,
        weights: str | Path | None = None,
        warm_start: str = "even",
        online: bool = True,
        network: QNetwork | None = None,
        config: AgentConfig | None = None,
        seed: int = 0,
    ) -> None:
        if warm_start not in ("even", "plumber"):
            raise ValueError(f"warm_start must be 'even' or 'plumber', got {warm_start!r}")
        if network is None:
            network, loaded = load_weights(weights or DEFAULT_WEIGHTS)
            config = config or loaded
        self.q = network
        self.config = config or AgentConfig()
        self.warm_start = warm_start
        self.online = online
        self._rng = np.random.default_rng(seed)
        self._learner: OnlineLearner | None = None  # from the first online step: the weights it trains
        self._buffer: ReplayBuffer | None = None
        self._observed = 0

    # -- Policy protocol ---------------------------------------------------------------------------
    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self.knobs = dict(knobs)
        self.chooser = NetworkChooser(self.q, self.config, self.knobs)
        self.safety = SafetyLayer(list(self.knobs.values()), ACTION_DELTAS, self.config.memory_margin,
                                  self.config.trim_margin)
        self.floor = shuffle_floor(self.safety, observation)
        self._start: dict[str, int] | None = start_allocation(self.knobs, self.safety, observation, self.warm_start)
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pending_reward: float | None = None
        self.last_mask: np.ndarray | None = None  # this tick's mask (imitation labels the same state)

    def step(self, observation: Observation) -> dict[str, int]:
        if self._start is not None:
            start, self._start = self._start, None
            self.safety.track(observation)  # so the start's change of workers teaches what a worker costs
            return start
        values = [k.value for k in self.safety.knobs]
        mask = self.last_mask = self.safety.mask(observation, values)
        q_values = self.chooser.q_values(observation)
        self._remember(mask)
        scores = decision_scores(q_values, mask, self.safety.deltas, self.config.decision)
        choice = self.safety.select(scores, mask, observation, values)
        wanted, choice = self.safety.hard_limits(choice, observation, values, self.floor)
        self.chooser.builder.applied(self.safety.deltas[choice])
        actions = np.full(MAX_KNOBS, self.safety.zero, dtype=np.int64)
        actions[: len(values)] = choice
        rows, valid = self.chooser.last
        self._last = (rows, valid, actions)
        return {k.name: int(w) for k, v, w in zip(self.safety.knobs, values, wanted, strict=True) if w != v}

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self, replay: bool = False) -> dict[str, Any]:
        """What a restarted job needs to go on where this one was, as plain values and numpy arrays.

        Always: the online network's weights (fine-tuned, not the shipped ones), the features' memory
        (best and last throughput, the CPU count and ticks since it changed), the safety layer's
        measurements of what a worker costs, the count of rewards observed and the sampling generator.
        Once online learning has taken a step: the target network and the optimizer's moments too
        (``OnlineLearner.state_dict``).
        The replay buffer only with ``replay=True``: at its full 2,048 transitions it is 10.7 MB (per
        transition two 16 x 39 float32 feature grids, actions, masks), against 0.16 MB for the weights
        (the target and the optimizer's moments triple that once learning has stepped), and a restarted
        job refills the 32 transitions its first step needs within a minute of 1 s ticks.
        Call it on a policy that has been ``reset`` (the tuner does).
        """
        online = None if self._learner is None else self._learner.state_dict()
        buffer = None
        if replay and self._buffer is not None:
            b = self._buffer
            n = b.size
            buffer = {
                "capacity": b.capacity, "size": n, "pos": b._pos,
                **{field: getattr(b, field)[:n].copy() for field in _REPLAY_FIELDS},
            }  # fmt: skip
        return {
            "weights": network_state(self.q),
            "online": online,
            "observed": self._observed,
            "rng": rng_state(self._rng),
            "features": self.chooser.builder.state_dict(),
            "safety": self.safety.state_dict(),
            "replay": buffer,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()``, on a policy ``reset`` on the same knobs (the tuner does both).

        The warm start is skipped: the knobs already hold the saved allocation (the tuner restores them,
        clamped to this machine), so the first decision is the network's, from there.
        """
        q = copy.deepcopy(self.q)  # never modify a network shared with the caller
        load_network_state(q, state["weights"], "intune policy state")
        self.q = q
        self.chooser.refresh(q)
        online = state["online"]
        self._learner = None
        if online is not None:
            self._learner = self._new_learner()
            self._learner.load_state_dict(online)
        self._observed = int(state["observed"])
        self._rng = rng_from_state(state["rng"], "intune policy state rng")
        self.chooser.builder.load_state_dict(state["features"])
        self.safety.load_state_dict(state["safety"])
        saved = state["replay"]
        if saved is not None:
            buffer = ReplayBuffer(int(saved["capacity"]), MAX_KNOBS, N_FEATURES, len(ACTION_DELTAS))
            n = int(saved["size"])
            for field in _REPLAY_FIELDS:
                getattr(buffer, field)[:n] = saved[field]
            buffer.size, buffer._pos = n, int(saved["pos"])
            self._buffer = buffer
        self._start = None
        self._last = None
        self._pending_reward = None

    # -- online fine-tuning ------------------------------------------------------------------------
    def observe(self, observation: Observation, reward: float) -> None:
        """The reward of the last action; every ``online_train_every`` calls, one gradient step.

        The caller's reward scale is arbitrary (the live tuner divides by the first throughput it saw),
        while the network was pretrained on throughput / phase optimum. So the reward learned from is
        re-expressed on that scale, with the best throughput seen since the last resize standing in for
        the unknown optimum (an OOM still earns the contract's penalty).
        """
        if not self.online or self._last is None:
            return
        best = max(self.chooser.builder.best_throughput, observation.throughput)
        self._pending_reward = OOM_PENALTY if observation.oom else float(contract_reward(observation, best))
        self._observed += 1
        buffer = self._buffer
        if buffer is not None and buffer.size >= self.config.batch_size // 4 and self._observed % self.config.online_train_every == 0:
            self._learn(buffer)

    def _remember(self, mask: np.ndarray) -> None:
        """Complete the previous tick's transition now that its next state is known."""
        if not self.online or self._last is None or self._pending_reward is None:
            return
        if self._buffer is None:
            self._buffer = ReplayBuffer(self.config.online_buffer_size, MAX_KNOBS, N_FEATURES, len(ACTION_DELTAS))
        next_mask = np.zeros((MAX_KNOBS, len(ACTION_DELTAS)), dtype=bool)
        next_mask[: len(mask)] = mask
        prev_rows, prev_valid, actions = self._last
        rows, valid = self.chooser.last
        self._buffer.add(prev_rows, prev_valid, actions, self._pending_reward, self.config.gamma, rows, valid, next_mask)
        self._pending_reward = None

    def _new_learner(self) -> OnlineLearner:
        return OnlineLearner(self.q, self.config.online_learning_rate, self.config.max_grad_norm)

    def _learn(self, buffer: ReplayBuffer) -> None:
        if self._learner is None:
            self.q = copy.deepcopy(self.q)  # never modify a network shared with the caller
            self._learner = self._new_learner()
        self._learner.step(buffer.sample(min(buffer.size, self.config.batch_size // 4), self._rng))
        self._learner.write_to(self.q)
        self.chooser.refresh(self.q)
        if (self._observed // self.config.online_train_every) % 50 == 0:
            self._learner.sync_target()


class NetworkProposer:
    """The network's choice as a proposal for the steering rules (``intune+steer``): its Q-values under
    its decision rule (``AgentConfig.decision``), as ``intune`` decides. Raw Q-values would act on the
    argmax, a full-size move where a network trained for the ``mean`` rule splits its head."""

    def __init__(self, q: QNetwork, config: AgentConfig) -> None:
        self.q = q
        self.config = config
        self.deltas = np.asarray(ACTION_DELTAS, dtype=np.int64)

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self.chooser = NetworkChooser(self.q, self.config, knobs)

    def state_dict(self) -> dict[str, Any]:
        """The features' memory (the network is the shipped one: it does not learn here)."""
        return {"features": self.chooser.builder.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.chooser.builder.load_state_dict(state["features"])

    def __call__(self, observation: Observation, values: list[int], mask: np.ndarray) -> np.ndarray:
        return decision_scores(self.chooser.q_values(observation), mask, self.deltas, self.config.decision)


def network_with_rules(weights: str | Path | None = None, **steer_kwargs: Any):
    """``intune+steer``: the network's Q-values handed to the ``steer`` rules (the agent as it shipped
    before the network learned to act alone; a row of the benchmark, not the default)."""
    from intune.policies.steer import SteerPolicy

    q, config = load_weights(weights or DEFAULT_WEIGHTS)
    policy = SteerPolicy(propose=NetworkProposer(q, config), **steer_kwargs)
    policy.name = "network+steer"
    return policy


_REPLAY_FIELDS = ("rows", "valid", "actions", "returns", "discount", "next_rows", "next_valid", "next_mask")
