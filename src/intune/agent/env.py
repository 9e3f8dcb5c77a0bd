"""Simulated pipelines as training environments: the reward scale, and the randomised draws.

``SimEnv`` wraps an ``intune.sim.Simulator`` into the ``Env`` protocol of ``dqn``: the reward is the
contract's ``reward(obs, scale)`` with the phase optimum (``sim.optimum(cpus)``) as the scale, so a
perfect allocation earns 1 per tick on every pipeline. ``random_sim`` draws the pretraining
distribution (2-8 stages, 2-128 CPUs with resizes at random times, tight and loose memory, model
latency from 0 to the pipeline's own) from the generators in ``intune.sim.random_specs``;
``with_remote_pool`` gives a share of the imitation's pipelines a remote pool. It must not learn or
choose actions.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from intune.agent.config import AgentConfig
from intune.monitor.observation import Observation, reward

OPTIMUM_REFRESH_TICKS = 120  # drift moves the optimum slowly; recompute it this often (a search is ~20 ms)


class SimEnv:
    """One simulated pipeline; reward = throughput / phase optimum x memory factor, OOM penalty."""

    def __init__(self, sim) -> None:
        self.sim = sim
        self.knobs = sim.knobs
        self._optimum: dict[float, tuple[int, dict[str, int], float]] = {}
        self._tick = 0

    def reset(self) -> Observation:
        self._optimum.clear()
        self._tick = 0
        return self.sim.reset()

    def scramble(self, rng: np.random.Generator, memory_margin: float) -> Observation:
        """Move to a random allocation (up to twice the CPUs, within the memory margin) and observe it.

        Pretraining starts some episodes here, so that the agent also learns to shed workers it does
        not need and to recover from allocations it would never choose itself.
        """
        cpus = self.sim.cpus
        names = list(self.knobs)
        for _ in range(10):
            alloc = {}
            for name in names:
                knob = self.knobs[name]
                if knob.unit == "cpu":
                    alloc[name] = knob.clamp(math.exp(rng.uniform(0.0, math.log(max(2.0, 2.0 * cpus / len(names) * 2)))))
                else:
                    alloc[name] = knob.clamp(math.exp(rng.uniform(math.log(max(knob.min, 1)), math.log(min(knob.max, 1024)))))
            if self.sim.worst_case_memory(alloc) <= memory_margin * self.sim.memory_limit_bytes:
                for name, value in alloc.items():
                    self.knobs[name].set(value)
                break
        return self.step()

    def step(self) -> Observation:
        self._tick += 1
        return self.sim.step()

    def optimum_allocation(self, cpus: float) -> tuple[dict[str, int], float]:
        """The oracle's allocation at ``cpus`` and its rows/s (cached, refreshed as drift moves it)."""
        cached = self._optimum.get(cpus)
        if cached is None or self._tick - cached[0] >= OPTIMUM_REFRESH_TICKS:
            alloc, value = self.sim.optimum(int(cpus))
            cached = (self._tick, alloc, float(value))
            self._optimum[cpus] = cached
        return cached[1], cached[2]

    def optimum(self, cpus: float) -> float:
        """Best throughput at ``cpus`` (cached, refreshed as drift moves it)."""
        return self.optimum_allocation(cpus)[1]

    def reward(self, obs: Observation) -> float:
        return reward(obs, self.optimum(obs.cpus))


def _log_uniform_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def random_schedule(rng: np.random.Generator, config: AgentConfig, ticks: int):
    """CPUs drawn log-uniformly in [min_cpus, max_cpus], resized at random ticks."""
    from intune.sim.schedule import CpuSchedule

    starts, levels = [0], [_log_uniform_int(rng, config.min_cpus, config.max_cpus)]
    for t in range(1, ticks):
        if rng.random() < config.resize_probability:
            level = _log_uniform_int(rng, config.min_cpus, config.max_cpus)
            if level != levels[-1]:
                starts.append(t)
                levels.append(level)
    return CpuSchedule(starts=tuple(starts), levels=tuple(levels), length_ticks=ticks + 1)


def random_sim(rng: np.random.Generator, config: AgentConfig, ticks: int | None = None, seed: int | None = None):
    """A random pipeline on a random machine, as a Simulator (the pretraining distribution)."""
    from intune.sim.simulator import Simulator

    ticks = ticks or config.episode_ticks
    n_stages = int(rng.integers(config.min_stages, config.max_stages + 1))
    schedule = random_schedule(rng, config, ticks)
    if rng.random() < 0.5:  # the simulator's own generator (its own memory limits and consumers)
        from intune.sim import random_workload

        spec = random_workload(rng, n_stages=n_stages, cpus=schedule.levels[0])
    else:  # a wider spread of stage costs on a fixed machine, memory and consumer drawn below
        from intune.sim.random_specs import random_pipeline_spec

        spec = _with_memory_and_consumer(rng, config, random_pipeline_spec(rng, n_stages), schedule.max_cpus)
    return Simulator(spec, cpus=schedule, seed=int(rng.integers(2**31)) if seed is None else seed)


def _with_memory_and_consumer(rng: np.random.Generator, config: AgentConfig, spec, max_cpus: int):
    """Tight or loose memory limit, and a consumer from unbounded to as slow as the pipeline."""
    from intune.sim.simulator import Simulator

    probe = Simulator(spec, cpus=max_cpus, seed=0)
    best_alloc, best_throughput = probe.optimum(max_cpus)
    machine, consumer = spec.machine, spec.consumer
    if rng.random() < config.tight_memory_probability:
        from intune.sim.model import params_from_spec, worst_case_memory
        from intune.units import GB

        p = params_from_spec(spec)
        workers = [best_alloc.get(f"{n}.workers", 1) for n in p.names]
        buffers = [best_alloc.get(f"{n}.buffer_mb", 0) for n in p.names]
        need = worst_case_memory(p, workers, buffers) / GB
        least = worst_case_memory(p, np.ones(p.n_stages), np.ones(p.n_stages)) / GB  # 1 worker, 1 MB each
        limit = max(least / 0.75, need * rng.uniform(0.6, 1.3))
        machine = dataclasses.replace(machine, memory_limit_gb=limit, host_memory_gb=max(machine.host_memory_gb, limit))
    if rng.random() < 0.5 and best_throughput > 0:
        latency = spec.batch_size / best_throughput * rng.uniform(0.0, 1.0)
        consumer = dataclasses.replace(consumer, model_latency_s=latency)
    return dataclasses.replace(spec, machine=machine, consumer=consumer)


def with_waiting_stage(rng: np.random.Generator, sim, gil_share: float = 0.0):
    """``sim``'s pipeline with one of its map stages after the first made to wait, as a fresh
    Simulator on the same CPU schedule; ``sim`` itself where it has no such stage.

    The stage: thread workers, 1-8x the costliest stage's CPU per row, 80-99% of it a wait
    (``random_specs.with_waiting_map_stage``): on I/O, or in ``gil_share`` of the draws on the GIL
    (then the first stage, a reader that parses in pure Python, may be the one, and its time per row
    is 0.25-8x the costliest stage's: a GIL-bound parser is often not the costliest stage, and a
    network shown only costly ones reads a cheap one that floods with workers as a stage waiting on
    I/O).
    Waiting on I/O, busy all the time on almost no CPU, it needs more workers than the CPUs (the
    runner grants a light stage one past the budget each tick): a state the other draws never show,
    where only the first stage waits. Waiting on the GIL it looks alike but gains nothing from more
    workers: the contrast that keeps a network from adding workers to every busy stage that uses
    little CPU. ``gil_share`` 0 draws exactly what it drew before the option existed.
    """
    from intune.sim.random_specs import with_waiting_map_stage
    from intune.sim.simulator import Simulator

    on = "gil" if gil_share > 0 and rng.random() < gil_share else "io"  # no draw at 0: the draws as before
    stages = [i for i, s in enumerate(sim.spec.stages)
              if (i > 0 and s.kind in ("map", "udf")) or (on == "gil" and i == 0 and s.kind in ("map", "udf", "read"))]
    if not stages:
        return sim
    least = math.log(0.25) if on == "gil" else 0.0  # an I/O draw as it always was
    spec = with_waiting_map_stage(sim.spec, int(rng.choice(stages)), float(rng.uniform(0.8, 0.99)),
                                  float(math.exp(rng.uniform(least, math.log(8.0)))), float(rng.uniform(4.0, 32.0)),
                                  min_max_workers=4 * sim.schedule.max_cpus, on=on)
    if spec is None:
        return sim
    return Simulator(spec, cpus=sim.schedule, seed=int(rng.integers(2**31)))


def with_remote_pool(rng: np.random.Generator, sim, ticks: int):
    """``sim``'s pipeline with its costliest map stage made heavy (half to nine tenths of the CPU per row)
    and given a remote pool, as a fresh Simulator on the same CPU schedule; ``sim`` itself where the
    pipeline has no regular map stage.

    The pool: 1-32 nodes of 4, 8 or 16 CPUs, links of 200-2,000 MB/s and 1-20 ms, remote CPUs 1-1.5x
    as slow as local ones, in a third of the pipelines up to half the nodes lost within the ``ticks``
    the episode runs. The
    demand: unknown in half of them, otherwise 1.2-4x the most the machine makes alone. Remote workers
    are sized by the shared rule (``intune.policies.remote_sizing``), not the network; the pool is
    here because the local allocation beside it differs from any local-only pipeline's: with the
    heavy stage's rows going remote, the light stages carry several times their usual rows/s, every
    stage can be busy while CPUs are free, and they need workers their share of the cost would never
    suggest.
    """
    from intune.sim.oracle import local_best_rows
    from intune.sim.random_specs import with_heavy_map_stage
    from intune.sim.simulator import Simulator
    from intune.sim.spec import RemotePoolSpec, workload_variant

    heavy = with_heavy_map_stage(sim.spec, float(rng.uniform(0.5, 0.9)), min_max_workers=4 * sim.schedule.max_cpus)
    if heavy is None:
        return sim
    spec, stage = heavy
    nodes = _log_uniform_int(rng, 1, 32)
    loss = {}
    if nodes >= 2 and rng.random() < 1 / 3:
        loss = {int(rng.integers(ticks // 4, 3 * ticks // 4 + 1)):
                int(rng.integers(1, nodes // 2 + 1))}
    pool = RemotePoolSpec(nodes=nodes, cpus_per_node=int(rng.choice([4, 8, 16])),
                          bandwidth_mb_s=float(math.exp(rng.uniform(math.log(200.0), math.log(2000.0)))),
                          latency_ms=float(rng.uniform(1.0, 20.0)), cost_factor=float(rng.uniform(1.0, 1.5)),
                          node_loss=loss)
    stages = tuple(dataclasses.replace(s, remote=pool) if s.name == stage else s for s in spec.stages)
    spec = dataclasses.replace(spec, stages=stages)
    latency = 0.0
    if rng.random() < 0.5:
        alone = local_best_rows(workload_variant(spec, name=spec.name, cpus=int(sim.schedule.levels[0])))
        latency = spec.batch_size / (float(rng.uniform(1.2, 4.0)) * alone) if alone > 0 else 0.0
    spec = workload_variant(spec, name=f"{spec.name}+remote", model_latency_s=latency)
    return Simulator(spec, cpus=sim.schedule, seed=int(rng.integers(2**31)))
