"""The baselines on the simulator: each runs the criteo workload, the useful ones beat Unoptimized."""

import pytest

try:
    from intune.sim import Simulator, run_episode
    from intune.sim.schedule import stepped_schedule
    from intune.sim.spec import spec_from_dict
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
    assert workers.max() <= workers[0]  # the pool it launched with (the runner's CPU budget at launch)


def test_autotune_cannot_use_cpus_added_after_launch_but_its_relaunch_can():
    out = {}
    for name in ("autotune", "autotune-adaptive"):
        sim = Simulator("criteo", cpus=stepped_schedule([8, 32], 60), seed=0)
        out[name] = run_episode(sim, make(name), seed=0)
    for name, r in out.items():
        workers = sum(v for k, v in r.knobs.items() if k.endswith(".workers"))
        late = workers[80:]
        if name == "autotune":
            assert late.max() <= workers[:60].max()  # its thread pool was sized at launch, on 8 CPUs
        else:
            assert late.min() > 16
    fixed, relaunched = (out[n].throughput[80:].mean() for n in ("autotune", "autotune-adaptive"))
    assert relaunched > 2.5 * fixed


# A trainer that pauses (evaluation, checkpoints) in front of a slower pipeline of large batches, with a
# 6 GB shuffle buffer, in a 16 GB cgroup on a 256 GB host.
PAUSES = {
    "name": "pauses-big-batches", "batch_size": 8192, "chunk_rows": 8192, "bytes_per_row": 4096,
    "machine": {"cpus": 8, "memory_limit_gb": 16, "host_memory_gb": 256, "base_memory_gb": 2, "restart_delay_s": 30},
    "consumer": {"model_latency_s": 0.01, "stall_every_s": 20, "stall_s": 10},
    "stages": [
        {"name": "read", "kind": "read", "cpu_us_per_row": 5.0},
        {"name": "shuffle", "kind": "shuffle", "cpu_us_per_row": 2.0, "fixed_mb": 6144},
        {"name": "udf", "kind": "udf", "cpu_us_per_row": 12.0},
        {"name": "prefetch", "kind": "prefetch", "cpu_us_per_row": 1.0,
         "buffer": {"min": 32, "max": 65536, "default": 64}},
    ],
}


def test_autotune_grows_its_prefetch_into_an_oom_that_its_ram_budget_does_not_see():
    spec = spec_from_dict(PAUSES)
    out = {name: run_episode(Simulator(spec, seed=0), make(name), ticks=200, seed=0)
           for name in ("autotune", "heuristic", "plumber")}
    r = out["autotune"]
    # every pause fills the buffer and the starved consumer then finds it empty: the limit doubles
    assert r.knobs["prefetch.buffer_mb"].max() >= 4096
    # half the host's free memory (over 100 GB) never binds; the 16 GB cgroup does
    assert r.oom_count >= 1
    assert out["heuristic"].oom_count == 0 and out["plumber"].oom_count == 0
