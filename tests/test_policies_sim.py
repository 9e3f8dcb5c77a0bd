"""The baselines on the simulator: each runs the criteo workload, the useful ones beat Unoptimized."""

import pytest

try:
    from intune.sim import Simulator, run_episode
except ImportError:  # the simulator package is not there yet
    pytest.skip("intune.sim does not export Simulator and run_episode yet", allow_module_level=True)

from intune.policies import make

BASELINES = ("none", "heuristic", "autotune", "autotune-adaptive", "plumber", "plumber-adaptive")


@pytest.fixture(scope="module")
def results():
    out = {}
    for name in BASELINES:
        sim = Simulator("criteo", seed=0)
        out[name] = run_episode(sim, make(name), ticks=200, seed=0)
    return out


def test_every_baseline_runs_200_ticks_of_criteo(results):
    for name, r in results.items():
        assert r.ticks == 200, name
        assert r.throughput.min() >= 0 and r.throughput.mean() > 0, name


def test_heuristic_plumber_and_autotune_beat_none(results):
    none = results["none"].throughput.mean()
    for name in ("heuristic", "plumber", "autotune"):
        assert results[name].throughput.mean() > 1.5 * none, (name, results[name].throughput.mean(), none)


def test_autotune_uses_at_most_its_launch_pool(results):
    r = results["autotune"]
    workers = sum(v for k, v in r.knobs.items() if k.endswith(".workers"))
    assert workers.max() <= r.cpus[0]
