"""IntunePolicy: the pretrained DQN as a Policy (registry name ``intune``), fine-tuned online.

Starts from the even split (the paper's choice) or from Plumber's estimate (``warm_start="plumber"``),
then every tick moves each knob by one of the deltas, greedily under the safety mask; a guard holds the
CPU knobs where the move leads back to a worker vector recently measured clearly worse
(``intune.policies.allocation_memory``: the network can be wrong in a live state it never saw). ``observe``
(the live tuner calls it each tick with the reward) feeds a small replay buffer and takes a gradient
step every few ticks, off the decision path. Weights load with ``torch.load(weights_only=True)``. It
must not touch knobs itself: it returns requests, the runner applies them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from intune.agent.config import AgentConfig
from intune.agent.dqn import new_network, td_loss
from intune.agent.features import MAX_KNOBS, N_FEATURES, FeatureBuilder, pad
from intune.policies.allocation_memory import AllocationMemory, Workers
from intune.agent.network import BranchingQNetwork, NumpyQ
from intune.agent.online_adam import OnlineAdam
from intune.agent.replay import ReplayBuffer
from intune.policies.safety import SafetyLayer
from intune.knobs import Knob
from intune.observation import OOM_PENALTY, Observation
from intune.observation import reward as contract_reward
from intune.policies.base import even_split

WEIGHTS_DIR = Path(__file__).with_name("weights")
DEFAULT_WEIGHTS = WEIGHTS_DIR / "intune_dqn.pt"
WEIGHTS_FORMAT = 1
FILL_BUSY = 0.8  # idle CPUs go to the busiest stage only if its workers are busy at least this share of the tick
SWAP_BUSY = 0.9  # a worker moves to the busiest stage from another's idle workers only if it is this busy
SWAP_IDLE = 1.5  # ... and the other stage has at least this many idle workers (workers x share not busy)


def save_weights(path: str | Path, q: BranchingQNetwork, config: AgentConfig) -> Path:
    """Write the network and its config as plain tensors and primitives (loadable with weights_only)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in q.state_dict().items()}
    torch.save({"format": WEIGHTS_FORMAT, "config": config.to_dict(), "state_dict": state}, out)
    return out


def load_weights(path: str | Path = DEFAULT_WEIGHTS) -> tuple[BranchingQNetwork, AgentConfig]:
    """Load a weights file written by ``save_weights``; errors name the file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"agent weights {path} not found; make them with `intune pretrain --out {path}`")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload.get("format") != WEIGHTS_FORMAT:
            raise ValueError(f"format {payload.get('format')!r}, expected {WEIGHTS_FORMAT}")
        config = AgentConfig.from_dict(payload["config"])
        q = new_network(config)
        q.load_state_dict(payload["state_dict"])
    except Exception as exc:
        raise ValueError(f"agent weights {path}: cannot load ({exc})") from exc
    q.eval()
    return q, config


class IntunePolicy:
    """The InTune agent. ``network``/``config`` override the shipped weights (used in pretraining)."""

    name = "intune"

    def __init__(
        self,
        weights: str | Path | None = None,
        warm_start: str = "even",
        online: bool = True,
        network: BranchingQNetwork | None = None,
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
        self._optimizer: OnlineAdam | None = None
        self._target: BranchingQNetwork | None = None
        self._buffer: ReplayBuffer | None = None
        self._observed = 0
        self.guard_holds = 0  # ticks the allocation memory turned the network's CPU moves into holds

    # -- Policy protocol ---------------------------------------------------------------------------
    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        self.knobs = dict(knobs)
        self.builder = FeatureBuilder(self.knobs, global_only=self.config.global_only)
        self.safety = SafetyLayer(
            list(self.knobs.values()), self.config.action_deltas, self.config.memory_margin, self.config.trim_margin
        )
        self._is_cpu = np.array([k.unit == "cpu" for k in self.safety.knobs])
        self.memory = AllocationMemory(
            self.config.memory_ticks,
            self.config.memory_tolerance,
            drift=self.config.memory_drift,
        )
        self._is_shuffle = np.array(
            [k.unit == "mb" and observation.kinds().get(k.stage) == "shuffle" for k in self.safety.knobs]
        )
        # the user's shuffle buffer sets how random the order is: a floor, except when memory forces a cut
        self._floor = np.array([k.value if f else k.min for k, f in zip(self.safety.knobs, self._is_shuffle, strict=True)])
        self._held_ticks = 0  # ticks the workers have not moved
        self._fresh_ticks = 0  # ticks since the workers last went to a vector not measured recently
        self._moved_once = False
        self._busy_of: tuple[Observation, dict[str, float]] | None = None
        self.probes = 0  # ticks the policy tried a worker the network did not ask for
        self.swaps = 0  # ticks it moved a worker from idle workers to the bottleneck over the network's choice
        self.sheds = 0  # ticks it took idle workers away while over-allocated, so that the bottleneck can grow
        self.neck_holds = 0  # ticks it kept the network from taking a worker off a busy (co-)bottleneck
        self.reverts = 0  # ticks it stepped back towards a remembered better vector (or undid a probe)
        self._probe: tuple[Workers, Workers, bool] | None = None  # (before, after, must gain) until judged
        self._start = self._start_allocation(observation)
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pending_reward: float | None = None
        # decisions run in numpy (see NumpyQ: torch spins on a saturated machine); a stand-in network
        # of another class (tests) runs as it is
        self._numpy_q = NumpyQ(self.q) if isinstance(self.q, BranchingQNetwork) else None

    def step(self, observation: Observation) -> dict[str, int]:
        # the throughput of the last tick belongs to the workers in place now, before this tick's move
        workers = tuple(int(k.value) for k, c in zip(self.safety.knobs, self._is_cpu, strict=True) if c)
        self.memory.observe(observation.cpus, workers, observation.throughput, valid=not observation.oom)
        if self._start is not None:
            start, self._start = self._start, None
            self.safety.track(observation)  # so the start's change of workers teaches what a worker costs
            return start
        rows, valid = pad(self.builder.rows(observation))
        values = [k.value for k in self.safety.knobs]
        mask = self.safety.mask(observation, values)
        self._remember(rows, valid, mask)
        n = len(values)
        if self._numpy_q is not None:
            q_values = self._numpy_q(rows[:n], valid[:n])
        else:
            with torch.inference_mode():
                q_values = self.q(torch.from_numpy(rows[:n]), torch.from_numpy(valid[:n])).numpy()
        choice = self._guard(self.safety.select(q_values, mask, observation, values), observation, values)
        choice = self._steer(choice, mask, observation, values)
        choice = self._fill_idle_cpus(choice, mask, observation, values)
        now = np.asarray(values, dtype=np.int64)
        wanted = now + self.safety.moves(choice, observation)
        # a shuffle buffer does not go below the user's size while memory is comfortable; when the
        # buffers full would take memory near the limit, the network may shrink it too (the projection
        # misses what starts later: live, a process worker's first chunk), and the trim below may cut it
        floored = self._is_shuffle & (wanted < self._floor) & (wanted < now) & self._memory_comfortable(observation, values)
        wanted = np.where(floored, now, wanted)
        choice[floored] = self.safety.zero
        # buffers that cannot fit when full are cut now, whatever the network chose (recorded as -5)
        trimmed = self.safety.trim(observation, values)  # never above the current values
        forced = ~self._is_cpu & (trimmed < now) & (trimmed < wanted)
        wanted = np.where(forced, trimmed, wanted)
        choice[forced] = int(np.argmin(self.safety.deltas))
        moved = bool((wanted != now)[self._is_cpu].any())
        self._held_ticks = 0 if moved else self._held_ticks + 1
        fresh = moved and self.memory.recall(tuple(wanted[self._is_cpu].tolist())) is None
        self._fresh_ticks = 0 if fresh else self._fresh_ticks + 1
        self._moved_once = self._moved_once or moved
        self.builder.applied(self.safety.deltas[choice])
        actions = np.full(MAX_KNOBS, self.safety.zero, dtype=np.int64)
        actions[:n] = choice
        self._last = (rows, valid, actions)
        return {k.name: int(w) for k, v, w in zip(self.safety.knobs, values, wanted, strict=True) if w != v}

    def _guard(self, choice: np.ndarray, obs: Observation, values: list[int]) -> np.ndarray:
        """Hold every CPU knob if their moves lead to a worker vector recently measured clearly worse
        than the current one. Only moves become holds, so the safety layer's limits still hold (fewer
        added workers, no memory added); buffer moves go through."""
        moves = self.safety.moves(choice, obs)
        if not self.memory.enabled or not moves[self._is_cpu].any():
            return choice
        held = choice.copy()
        held[self._is_cpu] = self.safety.zero
        if self._moved_once and self._held_ticks < self.config.dwell_ticks:
            return held  # stay until the new vector has a settled reading
        now = np.asarray(values, dtype=np.int64)[self._is_cpu]
        if not self.memory.is_worse(tuple((now + moves[self._is_cpu]).tolist()), tuple(now.tolist())):
            return choice
        self.guard_holds += 1
        return held

    def _memory_comfortable(self, obs: Observation, values: list[int]) -> bool:
        """Every buffer full would still leave a quarter of the margin free (or there is no limit)."""
        if obs.memory_limit_bytes <= 0:
            return True
        return self.safety.worst_case_memory(obs, values) <= 0.75 * self.config.memory_margin * obs.memory_limit_bytes

    def _steer(self, choice: np.ndarray, mask: np.ndarray, obs: Observation, values: list[int]) -> np.ndarray:
        """Moves of the workers the network does not make, in this order:

        1. undo a probe or swap once measured, if it did not pay (``_judge``);
        2. move one worker from idle workers to a busy bottleneck (``_idle_swap``), over the network;
           over-allocated (the runner then grants no worker), shed the donor's idle workers instead;
        3. hold the network's move of a worker off the busy bottleneck, or off a stage as busy unless
           it goes to the bottleneck (and what that worker would have paid for), unless the memory knows
           the result to be clearly better; then hold its moves away from a remembered vector clearly
           better than the current one;
        4. when the network holds the workers or cycles among vectors measured recently: step back
           towards the best one the runner can grant again (``_most_workers``) if clearly better, or
           after ``probe_after`` ticks without a new vector, probe one worker more on a busy stage
           (``_probes``).

        Each CPU move is one that the safety mask allows on its own, and at most one worker is added,
        only when a CPU is free, one is removed in the same tick, or it goes to a light stage (which the
        runner grants past the CPUs), so the safety limits still hold. A swap also needs the mask to
        allow a worker more on the donor, so that it can be undone."""
        if not self.memory.enabled or self.config.probe_after <= 0 or not self._is_cpu.any():
            return choice
        cpu = np.flatnonzero(self._is_cpu)
        now = np.asarray(values, dtype=np.int64)
        current = tuple(now[cpu].tolist())
        network = self.safety.moves(choice, obs)[self._is_cpu]
        light = set(obs.light_stages())
        up = int(np.flatnonzero(self.safety.deltas == 1)[0])
        down = int(np.flatnonzero(self.safety.deltas == -1)[0])
        free = int(np.floor(obs.free_cpus + 1e-9))
        held = choice.copy()  # the network's choice with the workers held (its buffer moves stay)
        held[self._is_cpu] = self.safety.zero

        def vector(moves: dict[int, int]) -> Workers:
            after = now.copy()
            for k, d in moves.items():
                after[k] += d
            return tuple(after[cpu].tolist())

        def unfunded(choice: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(choice, its worker moves) with the increases held if, some decreases held, they no longer
            fit the free CPUs: the runner would refuse them."""
            network = self.safety.moves(choice, obs)[self._is_cpu]
            if network.sum() > free:
                choice[cpu[network > 0]] = self.safety.zero
                network = self.safety.moves(choice, obs)[self._is_cpu]
            return choice, network

        def try_moves(moves: dict[int, int]) -> np.ndarray | None:
            """Apply +-1 moves (knob index -> +1/-1) if each is allowed and the CPUs allow them together,
            as the runner grants them: an increase only while the workers after every move fit the CPUs
            (over-allocated after a shrink, only decreases pass); a lone +1 on a light stage needs no
            free CPU."""
            lone_light = len(moves) == 1 and list(moves.values()) == [1] and self.safety.knobs[next(iter(moves))].stage in light
            rising = any(d > 0 for d in moves.values())
            if not moves or (rising and sum(moves.values()) > free and not lone_light):
                return None
            out = held.copy()
            for k, d in moves.items():
                allowed = mask[k, up if d > 0 else down] or (lone_light and self.safety.memory_allows_worker(obs, values, k))
                if not allowed:
                    return None
                out[k] = up if d > 0 else down
            return out

        def step_towards(target: Workers) -> np.ndarray | None:
            """One worker back where ``target`` has more (paid by the free CPUs or the workers given
            back), else only give back."""
            diff = np.asarray(target, dtype=np.int64) - now[cpu]
            falling = {int(cpu[i]): -1 for i in np.flatnonzero(diff < 0)}
            rising = [int(cpu[i]) for i in np.flatnonzero(diff > 0)]
            for moves in ([{**falling, rising[0]: 1}] if rising else []) + [falling]:
                out = try_moves(moves)
                if out is not None:
                    return out
            return None

        origin = self._judge(current)
        if origin is not None:
            out = step_towards(origin)
            if out is not None:
                self.reverts += 1
                return out
        neck = self._busy_neck(cpu, obs, light)
        found = self._idle_swap(cpu, now, obs, neck)
        if found is not None:
            donor, idle = found
            swap = {neck: 1, donor: -1}
            if self._held_ticks >= self.config.dwell_ticks and self.memory.recall(vector(swap)) is None:
                out = try_moves(swap)
                if out is not None and network[list(cpu).index(neck)] <= 0 and mask[donor, up]:
                    # clear evidence, over the network's choice: the bottleneck is busy while another stage
                    # idles whole workers. Judged like a probe: undone if the memory then finds it clearly worse
                    self.swaps += 1
                    self._probe = (current, vector(swap), False)
                    return out
            if free < 0:
                # over-allocated (after a shrink) the runner grants no worker, so the swap cannot happen:
                # shed the donor's idle workers (5 at a time while more than 5 idle), the only way back
                # under the CPUs (seen in the simulator: 84 UDF workers, 23 of them idle, on 64 CPUs while
                # the decoder, at 1 worker, starved the pipeline for 130 ticks)
                for d in (-5, -1):
                    a = np.flatnonzero(self.safety.deltas == d)
                    if len(a) and idle >= -d + 0.5 and mask[donor, int(a[0])]:
                        out = held.copy()
                        out[donor] = int(a[0])
                        self.sheds += 1
                        return out
        saturated = self._saturated(cpu, network, neck, obs, light)
        if saturated and free >= 0:
            after = tuple((now[cpu] + network).tolist())
            if not self.memory.is_better(after, current):
                # the network takes a worker from the busy bottleneck (or a co-bottleneck, not for the
                # bottleneck): held, unless the memory knows the result to be clearly better (seen in the
                # simulator: production's UDF, 0.94 busy and 2 workers short, lost workers to idle stages
                # every few ticks and the swaps brought them back, so a whole phase stayed under 95% of
                # the optimum). Over-allocated, the runner needs it.
                choice = choice.copy()
                choice[saturated] = self.safety.zero
                choice, network = unfunded(choice)  # what those workers paid for is held too
                self.neck_holds += 1
        best = self.memory.best()
        behind = best is not None and self.memory.is_better(best[0], current)
        if behind and network.any():
            # the memory knows a clearly better vector: the network's moves away from it do not go through
            # (seen in the simulator: over-allocated after a shrink, the runner refused the network's
            # increases and applied its decreases, so a swap it repeated shed a reader every other tick)
            diff = np.asarray(best[0], dtype=np.int64) - now[cpu]
            away = (network * diff < 0) | ((diff == 0) & (network != 0))
            if away.any():
                choice = choice.copy()
                choice[cpu[away]] = self.safety.zero
                choice, network = unfunded(choice)
        if network.any() and self.memory.recall(tuple((now[cpu] + network).tolist())) is None:
            return choice  # the network (or the guard) explores a vector not measured recently: leave it
        # the network holds, or cycles among vectors already measured (seen in the simulator: 4 stages
        # moved back and forth every other tick for a whole phase, so nothing was ever probed)
        if behind:
            # towards the best vector the runner can grant again (over-allocated readings after a shrink
            # still steer the network above, but cannot be stepped back to)
            target = self.memory.best(self._most_workers(obs))
            if target is not None and self.memory.is_better(target[0], current):
                out = step_towards(target[0])
                if out is not None:
                    self.reverts += 1
                    return out
        if self._fresh_ticks < self.config.probe_after:
            return choice
        for moves in self._probes(cpu, now, free, light, obs):
            probed = vector(moves)
            if self.memory.recall(probed) is not None:
                continue  # measured recently: the guard and the step back already use what it showed
            if any(d < 0 and not mask[k, up] for k, d in moves.items()):
                continue  # a worker taken where the mask would not give it back (memory): a one-way door
            out = try_moves(moves)
            if out is not None:
                self.probes += 1
                # a light stage's worker stays only if clearly better: light workers leave their CPU
                # unused, so the free CPUs never run out and each probe would add one more
                if any(d > 0 and self.safety.knobs[k].stage in light for k, d in moves.items()):
                    self._probe = (current, probed, True)
                return out
        return choice

    def _judge(self, current: Workers) -> Workers | None:
        """The vector to go back to if the pending probe or swap has been measured (settled) and did not
        pay: a light probe must be clearly better than where it started, a swap not clearly worse."""
        if self._probe is None:
            return None
        origin, probed, must_gain = self._probe
        reading = self.memory.recall(probed)
        if current != probed:
            self._probe = None  # moved on (the network, or a resize)
            return None
        if reading is None or not reading.settled:
            return None
        self._probe = None
        failed = not self.memory.is_better(probed, origin) if must_gain else self.memory.is_worse(probed, origin)
        return origin if failed else None

    def _fill_idle_cpus(self, choice: np.ndarray, mask: np.ndarray, obs: Observation, values: list[int]) -> np.ndarray:
        """CPUs left idle after the network's moves (at least ``fill_free_cpus``) go to the busiest stage,
        +5 workers when 5 are free, else +1, if its workers are busy and not light, unless the network
        already adds there, a step back to a remembered better vector is due, or the memory knows the
        result to be worse. In the simulator the network often left a sixth of 128 CPUs idle while
        the bottleneck starved; each move is one the mask allows on its own, within the free CPUs."""
        if self.config.fill_free_cpus <= 0 or not self._is_cpu.any():
            return choice
        moves = self.safety.moves(choice, obs)
        free = int(np.floor(obs.free_cpus + 1e-9)) - int(moves[self._is_cpu].sum())
        if free < self.config.fill_free_cpus:
            return choice
        cpu = np.flatnonzero(self._is_cpu)
        busy = self._busy(obs)
        neck = self._busiest(cpu, obs)
        now = np.asarray(values, dtype=np.int64)
        stage = self.safety.knobs[neck].stage
        if moves[neck] > 0 or busy.get(stage, 0.0) < FILL_BUSY or stage in obs.light_stages():
            # already growing; or no stage keeps its workers busy (the consumer is the limit); or its
            # workers wait on something else than the CPUs (the light-stage probe decides those)
            return choice
        best = self.memory.best()
        if best is not None and self.memory.is_better(best[0], tuple(now[cpu].tolist())):
            return choice  # the step back towards a better vector goes first
        for delta in (d for d in ((5, 1) if free >= 5 else (1,)) if d in self.safety.deltas):
            a = int(np.flatnonzero(self.safety.deltas == delta)[0])
            out = choice.copy()
            out[neck] = a
            after = now + self.safety.moves(out, obs)
            if mask[neck, a] and not self.memory.is_worse(tuple(after[cpu].tolist()), tuple(now[cpu].tolist())):
                return out
        return choice

    def _busy(self, obs: Observation) -> dict[str, float]:
        """Each stage's busy share of the tick, built once per observation (several steps ask)."""
        if self._busy_of is None or self._busy_of[0] is not obs:
            self._busy_of = (obs, {s.name: s.busy for s in obs.stages})
        return self._busy_of[1]

    def _most_workers(self, obs: Observation) -> int:
        """The most workers the CPU knobs can have again: those in place now (over-allocated after a
        shrink, the runner lets them run), or as many as the runner grants: the CPUs (or the knobs'
        minimums), plus the one worker it grants a light stage past them."""
        knobs = [k for k, c in zip(self.safety.knobs, self._is_cpu, strict=True) if c]
        granted = max(int(np.floor(obs.cpus + 1e-9)), sum(k.min for k in knobs)) + (1 if obs.light_stages() else 0)
        return max(granted, sum(int(k.value) for k in knobs))

    def _busiest(self, cpu: np.ndarray, obs: Observation) -> int:
        """The CPU knob of the stage busy the largest share of the tick."""
        busy = self._busy(obs)
        return int(max(cpu, key=lambda k: busy.get(self.safety.knobs[k].stage, 0.0)))

    def _busy_neck(self, cpu: np.ndarray, obs: Observation, light: set[str]) -> int | None:
        """The busiest stage's CPU knob, if busy at least ``SWAP_BUSY`` of the tick and not light; else None."""
        neck = self._busiest(cpu, obs)
        stage = self.safety.knobs[neck].stage
        return None if self._busy(obs).get(stage, 0.0) < SWAP_BUSY or stage in light else neck

    def _saturated(self, cpu: np.ndarray, network: np.ndarray, neck: int | None, obs: Observation, light: set[str]) -> list[int]:
        """CPU knobs whose worker the network takes and must keep: the busy bottleneck ``neck``, and any
        other stage as busy (``SWAP_BUSY``, not light) unless the worker goes to the bottleneck.

        A co-bottleneck loses as much as the bottleneck from one worker less (seen in the simulator:
        production under 48 GB, reader at 0.91 and UDF at 0.94 busy; the network moved a reader to the
        batcher and back every five ticks, 3% below the optimum each time, for 50 ticks)."""
        if neck is None:
            return []
        busy = self._busy(obs)
        feeds_neck = network[list(cpu).index(neck)] > 0
        return [int(k) for i, k in enumerate(cpu) if network[i] < 0 and (
            k == neck or (not feeds_neck and busy.get(self.safety.knobs[k].stage, 0.0) >= SWAP_BUSY
                          and self.safety.knobs[k].stage not in light))]

    def _idle_swap(self, cpu: np.ndarray, now: np.ndarray, obs: Observation, neck: int | None) -> tuple[int, float] | None:
        """(donor, the donor's idle workers) for a worker to the busy bottleneck ``neck`` (``_busy_neck``):
        the stage with the most idle workers (workers x share of the tick not busy), if at least
        ``SWAP_IDLE``; else None."""
        if neck is None:
            return None
        busy = self._busy(obs)
        stage = [self.safety.knobs[k].stage for k in range(len(self.safety.knobs))]
        idle = {int(k): now[k] * (1.0 - busy.get(stage[k], 1.0)) for k in cpu if k != neck and now[k] > self.safety.knobs[k].min}
        donor = max(idle, key=idle.__getitem__, default=None)
        if donor is None or idle[donor] < SWAP_IDLE:
            return None
        return donor, float(idle[donor])

    def _probes(self, cpu: np.ndarray, now: np.ndarray, free: int, light: set[str], obs: Observation) -> list[dict[int, int]]:
        """Probe moves, most promising first: one worker more on the busiest stage (from a free CPU, or
        past the CPUs if the stage is light), one moved there from the stage with the most idle workers
        (or the next one), then one more on any other busy light stage (a reader waiting on storage can
        be the co-bottleneck)."""
        busy = self._busy(obs)
        starved = {s.name: s.starved for s in obs.stages}
        order = [int(k) for k in sorted(cpu, key=lambda k: (-busy.get(self.safety.knobs[k].stage, 0.0), starved.get(self.safety.knobs[k].stage, 0.0)))]
        neck = order[0]
        # a donor is the stage with the most idle workers (workers x share of the tick not busy): one with
        # 2 workers half idle has 1 idle worker, and gives it up only by becoming the next bottleneck
        idle = {int(k): now[k] * (1.0 - busy.get(self.safety.knobs[k].stage, 0.0)) for k in cpu}
        donors = sorted((k for k in order if k != neck and now[k] > self.safety.knobs[k].min), key=lambda k: -idle[k])
        out: list[dict[int, int]] = [{neck: 1}] if free >= 1 or self.safety.knobs[neck].stage in light else []
        out += [{neck: 1, d: -1} for d in donors[:2]]
        others = (self.safety.knobs[k].stage for k in order[1:])
        out += [{k: 1} for k, stage in zip(order[1:], others) if stage in light and busy.get(stage, 0.0) >= 0.5]
        return out

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
        best = max(self.builder.best_throughput, observation.throughput)
        self._pending_reward = OOM_PENALTY if observation.oom else float(contract_reward(observation, best))
        self._observed += 1
        buffer = self._buffer
        if buffer is not None and buffer.size >= self.config.batch_size // 4 and self._observed % self.config.online_train_every == 0:
            self._learn(buffer)

    def _remember(self, rows: np.ndarray, valid: np.ndarray, mask: np.ndarray) -> None:
        """Complete the previous tick's transition now that its next state is known."""
        if not self.online or self._last is None or self._pending_reward is None:
            return
        if self._buffer is None:
            self._buffer = ReplayBuffer(self.config.online_buffer_size, MAX_KNOBS, N_FEATURES, len(self.config.action_deltas))
        next_mask = np.zeros((MAX_KNOBS, len(self.config.action_deltas)), dtype=bool)
        next_mask[: len(mask)] = mask
        prev_rows, prev_valid, actions = self._last
        self._buffer.add(prev_rows, prev_valid, actions, self._pending_reward, self.config.gamma, rows, valid, next_mask)
        self._pending_reward = None

    def _learn(self, buffer: ReplayBuffer) -> None:
        if self._optimizer is None:
            self.q = copy.deepcopy(self.q)  # never modify a network shared with the caller
            self._target = copy.deepcopy(self.q)
            self._optimizer = OnlineAdam(self.q.parameters(), lr=self.config.online_learning_rate)
        batch = buffer.sample(min(buffer.size, self.config.batch_size // 4), self._rng)
        loss = td_loss(self.q, self._target, batch)
        self._optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.config.max_grad_norm)
        self._optimizer.step()
        if self._numpy_q is not None:
            self._numpy_q.refresh(self.q)
        if (self._observed // self.config.online_train_every) % 50 == 0:
            self._target.load_state_dict(self.q.state_dict())

    # -- start ----------------------------------------------------------------------------------
    def _start_allocation(self, obs: Observation) -> dict[str, int]:
        """Even split or Plumber's estimate, with buffers cut to fit the memory (``SafetyLayer.trim``)
        and worker growth trimmed to the memory budget that leaves."""
        if self.warm_start == "plumber":
            from intune.policies import make

            plumber = make("plumber", profile_ticks=1)  # plan from the first observation
            plumber.reset(self.knobs, obs)
            wanted: dict[str, Any] = {**even_split(self.knobs, obs.cpus), **plumber.step(obs)}
        else:
            wanted = even_split(self.knobs, obs.cpus)
        values = {n: k.value for n, k in self.knobs.items()}
        # buffers the memory cannot hold when full are cut before anything else (the tuner applies
        # decreases first); the workers then grow only into what is left
        trimmed = dict(zip(values, self.safety.trim(obs, list(values.values())).tolist(), strict=True))
        for n, v in trimmed.items():
            if v < values[n]:
                wanted[n] = min(int(wanted.get(n, v)), v)
        after = {n: int(wanted.get(n, v)) if self.knobs[n].unit == "mb" else v for n, v in values.items()}
        budget = self.safety.worker_budget(obs, list(after.values()))
        per_worker = self.safety.worker_memory_bytes(obs)
        growth = sum(max(0, int(v) - values[n]) for n, v in wanted.items() if self.knobs[n].unit == "cpu")
        if growth and per_worker > 0 and growth * per_worker > budget:
            scale = max(0.0, budget) / (growth * per_worker)
            wanted = {
                n: (values[n] + int((int(v) - values[n]) * scale) if self.knobs[n].unit == "cpu" and int(v) > values[n] else int(v))
                for n, v in wanted.items()
            }
        return {n: int(v) for n, v in wanted.items() if int(v) != values[n]}
