"""The shipped agent as a Policy: weights load safely, it runs on the simulator, acts within 1 ms."""

import time

import numpy as np
import pytest
import torch

from intune.agent.policy import DEFAULT_WEIGHTS, IntunePolicy, load_weights
from intune.policies import even_split, make
from intune.sim import Simulator, load_workload, run_episode


def test_shipped_weights_load_with_weights_only_and_are_small():
    assert DEFAULT_WEIGHTS.stat().st_size < 1_000_000
    payload = torch.load(DEFAULT_WEIGHTS, map_location="cpu", weights_only=True)
    assert payload["config"]["extra"]["command"].startswith("intune pretrain")
    q, config = load_weights()
    assert config.action_deltas == (-5, -1, 0, 1, 5)
    assert sum(p.numel() for p in q.parameters()) > 0


def test_missing_or_broken_weights_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        IntunePolicy(weights=tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a weights file")
    with pytest.raises(ValueError, match="bad.pt"):
        IntunePolicy(weights=bad)
    with pytest.raises(ValueError, match="warm_start"):
        IntunePolicy(warm_start="random")


def test_registry_builds_it_and_it_starts_from_the_even_split():
    sim = Simulator(load_workload("criteo", memory_limit_gb=380), cpus=32, seed=0)  # memory to spare
    policy = make("intune")
    obs = sim.reset()
    policy.reset(sim.knobs, obs)
    first = policy.step(obs)
    assert {k: v for k, v in first.items() if k.endswith(".workers")} == even_split(sim.knobs, 32)


def test_the_start_is_trimmed_to_what_memory_allows():
    sim = Simulator(load_workload("criteo"), cpus=32, seed=0)  # 16 GB used by 5 workers: 3.2 GB each, at most
    policy = make("intune")
    obs = sim.reset()
    policy.reset(sim.knobs, obs)
    first = policy.step(obs)
    even = even_split(sim.knobs, 32)
    assert all(1 < first[k] <= even[k] for k in even)


def test_it_improves_criteo_over_the_even_split_without_ooms():
    sim = Simulator(load_workload("criteo"), cpus=32, seed=1)
    result = run_episode(sim, IntunePolicy(online=False), 60)
    even = sim.true_throughput(even_split(sim.knobs, 32))
    assert result.oom_count == 0
    assert result.model_throughput[-10:].mean() > even


def test_decision_takes_under_a_millisecond():
    sim = Simulator(load_workload("criteo"), cpus=64, seed=2)
    policy = IntunePolicy(online=False)
    obs = sim.reset()
    policy.reset(sim.knobs, obs)
    times = []
    for _ in range(120):
        t = time.perf_counter()
        request = policy.step(obs)
        times.append(time.perf_counter() - t)
        for name, value in request.items():
            sim.knobs[name].set(sim.knobs[name].clamp(value))
        obs = sim.step()
    assert float(np.median(times[20:])) < 1e-3


def test_online_fine_tuning_learns_without_touching_the_shipped_network():
    shipped, _ = load_weights()
    before = [p.detach().clone() for p in shipped.parameters()]
    policy = IntunePolicy(network=shipped, online=True)
    sim = Simulator(load_workload("criteo"), cpus=16, seed=3)
    obs = sim.reset()
    policy.reset(sim.knobs, obs)
    for _ in range(80):
        for name, value in policy.step(obs).items():
            sim.knobs[name].set(sim.knobs[name].clamp(value))
        obs = sim.step()
        policy.observe(obs, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(before, shipped.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.q.parameters()))
