"""The oracle's search equals exhaustive search on small cases, and runs as a policy."""

import dataclasses
import itertools

import numpy as np
import pytest

from intune.observation import MEMORY_SAFE_FRACTION, memory_factor
from intune.policies import even_split
from intune.sim import Simulator, model, paper_schedule, random_workload, run_episode, spec_from_dict
from intune.sim.oracle import Bounds, OraclePolicy, optimal_allocation, reward_optimal_allocation


def _brute_force(p, cpus, bounds, budget):
    """Every integer allocation within the bounds, the CPU cap and the memory budget."""
    n = p.n_stages
    cap = max(cpus, int(bounds.w_min.sum()))
    best = 0.0
    w_ranges = [range(bounds.w_min[i], bounds.w_max[i] + 1) for i in range(n)]
    b_ranges = [range(bounds.b_min[i], bounds.b_max[i] + 1) if p.has_buffer[i] else [0] for i in range(n)]
    for w in itertools.product(*w_ranges):
        if sum(w) > cap:
            continue
        for b in itertools.product(*b_ranges):
            if model.worst_case_memory(p, w, b) > budget:
                continue
            best = max(best, model.throughput(p, w, b, cpus))
    return best


def _small_spec(rng, n):
    stages = []
    for i in range(n):
        stage = {
            "name": f"s{i}",
            "cpu_us_per_row": float(rng.uniform(1, 20)),
            "io_us_per_row": float(rng.choice([0.0, rng.uniform(1, 30)])),
            "contention": float(rng.choice([0.0, rng.uniform(0, 0.2)])),
            "cpu_cv": float(rng.uniform(0, 1.5)),
            "queue_items": int(rng.integers(1, 3)),
            "worker_mb": float(rng.uniform(50, 400)),
        }
        if rng.random() < 0.3:
            stage["gil_fraction"] = float(rng.uniform(0.2, 1.0))
        if rng.random() < 0.5:
            stage["buffer"] = {"min": 1, "max": 6, "default": 1}
        stages.append(stage)
    return spec_from_dict(
        {
            "name": "small",
            "batch_size": 4000,
            "chunk_rows": 4000,
            "bytes_per_row": 100,
            "machine": {
                "cpus": 8,
                "memory_limit_gb": float(rng.uniform(1.6, 4.0)),
                "host_memory_gb": 8,
                "base_memory_gb": 1.0,
                "oversubscription_cost": 0.3,
            },
            "consumer": {"model_latency_s": float(rng.choice([0.0, rng.uniform(0.005, 0.05)]))},
            "stages": stages,
        }
    )


@pytest.mark.parametrize("case", range(12))
def test_oracle_equals_exhaustive_search(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(1, 4))
    p = model.params_from_spec(_small_spec(rng, n))
    cpus = int(rng.integers(max(1, n - 1), 9))
    bounds = Bounds(np.ones(n, int), np.full(n, 6), np.ones(n, int), np.full(n, 6))
    budget = MEMORY_SAFE_FRACTION * p.limit_bytes
    w, b, t = optimal_allocation(p, cpus, bounds)
    expected = _brute_force(p, cpus, bounds, budget)
    assert t == pytest.approx(expected, rel=1e-9)
    assert sum(w) <= max(cpus, n) and model.worst_case_memory(p, w, b) <= budget or expected == 0.0
    assert model.throughput(p, w, b, cpus) == pytest.approx(t)


def _brute_force_reward(p, cpus, bounds):
    """The most rows/s x memory factor (of worst-case memory) of any allocation that cannot OOM."""
    cap = max(cpus, int(bounds.w_min.sum()))
    best = 0.0
    w_ranges = [range(bounds.w_min[i], bounds.w_max[i] + 1) for i in range(p.n_stages)]
    b_ranges = [range(bounds.b_min[i], bounds.b_max[i] + 1) if p.has_buffer[i] else [0] for i in range(p.n_stages)]
    for w in itertools.product(*w_ranges):
        if sum(w) > cap:
            continue
        for b in itertools.product(*b_ranges):
            mem = model.worst_case_memory(p, w, b)
            if mem < p.limit_bytes:
                best = max(best, model.throughput(p, w, b, cpus) * memory_factor(mem / p.limit_bytes))
    return best


@pytest.mark.parametrize("case", range(12))
def test_the_oracle_maximises_what_the_reward_pays_when_memory_binds(case):
    # a base that takes most of the limit: more workers are worth some of the memory factor
    rng = np.random.default_rng(100 + case)
    n = int(rng.integers(1, 4))
    p = model.params_from_spec(_small_spec(rng, n))
    cpus = int(rng.integers(max(1, n - 1), 9))
    bounds = Bounds(np.ones(n, int), np.full(n, 6), np.ones(n, int), np.full(n, 6))
    least = model.worst_case_memory(p, bounds.w_min, np.where(p.has_buffer, bounds.b_min, 0))
    p = dataclasses.replace(p, limit_bytes=least / rng.uniform(0.72, 0.84))
    w, b, t = reward_optimal_allocation(p, cpus, bounds)
    mem = model.worst_case_memory(p, w, b)
    paid = t * memory_factor(mem / p.limit_bytes)
    assert paid >= 0.99 * _brute_force_reward(p, cpus, bounds)
    safe = optimal_allocation(p, cpus, bounds)
    assert paid >= safe[2] * memory_factor(model.worst_case_memory(p, safe[0], safe[1]) / p.limit_bytes) * (1 - 1e-9)
    assert model.throughput(p, w, b, cpus) == pytest.approx(t)


def test_oracle_policy_reaches_the_optimum_and_beats_even_split():
    sim = Simulator("criteo", cpus=paper_schedule(40))
    result = run_episode(sim, OraclePolicy(), 200)
    for _, _, cpus in sim.schedule.phases():
        sim_alloc, _ = sim.optimum(cpus)
        assert sum(v for k, v in sim_alloc.items() if k.endswith(".workers")) <= cpus
    # after the first tick of each phase the oracle is at its optimum: compare with even split
    sim2 = Simulator("criteo", cpus=paper_schedule(40))
    sim2.reset()
    for phase_start, _, cpus in sim.schedule.phases():
        even = sim2.true_throughput(even_split(sim2.knobs, cpus), cpus)
        assert result.model_throughput[phase_start + 2] > 1.5 * even
    assert result.oom_count == 0


def test_oracle_needs_the_simulator():
    from intune.sim import Simulator as S

    sim = S("criteo")
    with pytest.raises(RuntimeError, match="simulator"):
        OraclePolicy().reset(sim.knobs, sim.reset())


def test_oracle_on_random_workloads_is_at_least_even_split():
    rng = np.random.default_rng(7)
    for _ in range(5):
        sim = Simulator(random_workload(rng))
        sim.reset()
        alloc, best = sim.optimum()
        even = even_split(sim.knobs, sim.cpus)
        if sim.worst_case_memory(even) <= MEMORY_SAFE_FRACTION * sim.memory_limit_bytes:
            assert best >= sim.true_throughput(even) * (1 - 1e-9)
