"""The simulator's ticks: observations, OOM and restart, CPU schedules, determinism, episodes."""

import numpy as np
import pytest

from intune.monitor.observation import Observation
from intune.policies import even_split
from intune.sim import (
    Simulator,
    load_workload,
    paper_schedule,
    random_workload,
    run_episode,
    spec_from_dict,
    stepped_schedule,
)


def _spec(**machine):
    return spec_from_dict(
        {
            "name": "tiny",
            "batch_size": 1000,
            "chunk_rows": 1000,
            "bytes_per_row": 1000,
            "machine": {
                "cpus": 8,
                "memory_limit_gb": 4,
                "host_memory_gb": 64,
                "base_memory_gb": 1,
                "restart_delay_s": 3,
                **machine,
            },
            "stages": [
                {
                    "name": "read",
                    "cpu_us_per_row": 2.0,
                    "io_us_per_row": 8.0,
                    "buffer": {"min": 1, "max": 8192, "default": 16},
                },
                {"name": "prefetch", "kind": "prefetch", "cpu_us_per_row": 5.0},
            ],
        }
    )


class EvenSplit:
    """The paper's heuristic, written here so the simulator's tests do not depend on policies/."""

    name = "even"

    def reset(self, knobs, observation):
        self.knobs = knobs

    def step(self, observation):
        return even_split(self.knobs, observation.cpus)


def test_observation_matches_model_without_noise():
    sim = Simulator(_spec(), noise=0.0)
    obs = sim.reset()
    assert isinstance(obs, Observation) and obs.tick == 0
    assert set(sim.knobs) == {"read.workers", "read.buffer_mb", "prefetch.workers"}
    sim.knobs["read.workers"].set(4)
    obs = sim.step()
    # read: 4 / 10 us = 400k rows/s; prefetch 1 / 5 us = 200k; CPU 8 / 7 us = 1.14M: prefetch binds
    assert obs.throughput == pytest.approx(200_000)
    read = obs.stage("read")
    assert read.mode == "thread"  # as the spec runs its workers (the default)
    assert (
        read.workers == 4
        and read.items_per_s == pytest.approx(200.0)
        and read.rows_per_s == pytest.approx(2e5)
    )
    # 1000-row items: 2 ms of CPU each; busy wall time per item = 4 workers * 0.5 busy / 200 items/s
    assert read.cpu_s_per_item == pytest.approx(2e-3) and read.wall_s_per_item == pytest.approx(0.01)
    assert read.busy == pytest.approx(0.5) and obs.stage("prefetch").busy == pytest.approx(1.0)
    assert read.blocked == pytest.approx(0.5, abs=0.02) and read.starved == 0.0  # its queue is full
    assert obs.cpus == 8 and obs.host_memory_free_bytes > obs.memory_limit_bytes - obs.memory_used_bytes
    assert sim.true_throughput({"read.workers": 8}) == pytest.approx(200_000)
    assert sim.true_throughput({"prefetch.workers": 4}) == pytest.approx(400_000)
    assert isinstance(obs.throughput, float) and isinstance(read.busy, float)


def test_oom_kills_the_job_for_the_restart_delay():
    sim = Simulator(_spec(), noise=0.0)
    sim.reset()
    # read (4 workers, 400k rows/s) outpaces prefetch (200k rows/s), so read's output buffer fills:
    # 1 GB base + 8 GB of buffer > the 4 GB limit once it is full
    sim.knobs["read.buffer_mb"].set(8000)
    sim.knobs["read.workers"].set(4)
    seen = [sim.step() for _ in range(40)]
    first = next(i for i, o in enumerate(seen) if o.oom)
    assert first > 0 and seen[first].throughput == 0.0  # it took a few ticks for the buffer to fill
    assert [o.throughput for o in seen[first + 1 : first + 4]] == [0.0, 0.0, 0.0]  # 3 s restart
    assert seen[first + 4].throughput > 0 and not seen[first + 4].oom
    assert sim.ooms >= 2  # same configuration, same crash: a crash loop
    sim.knobs["read.buffer_mb"].set(64)
    after = [sim.step() for _ in range(40)]
    assert not any(o.oom for o in after[10:]) and after[-1].throughput == pytest.approx(200_000)


def test_schedule_changes_cpus_and_oversubscription_costs():
    # threads counted as processes are (a share of 1), so that 10 workers on 2 CPUs oversubscribe them
    sim = Simulator(_spec(thread_switch_share=1.0), cpus=stepped_schedule([8, 2], period_ticks=5), noise=0.0)
    sim.reset()
    sim.knobs["read.workers"].set(7)
    sim.knobs["prefetch.workers"].set(3)
    cpus = [sim.step().cpus for _ in range(8)]
    assert cpus == [8, 8, 8, 8, 2, 2, 2, 2]
    # on 2 CPUs: 7 read workers compute 2/10 of their time (1.4 want a CPU) plus 3 prefetch workers:
    # eta = 1 / (1 + 0.3 * (4.4 / 2 - 1)) = 1 / 1.36; CPU bound 2 / 7 us / 1.36 = 210k < the stages' 600k
    assert sim.last_model_throughput == pytest.approx(2 / 7e-6 / 1.36)
    assert paper_schedule(10).levels == (32, 64, 128, 64, 32) and paper_schedule(10).cpus_at(25) == 128


def test_same_seed_same_episode_other_seed_differs():
    def trace(seed):
        sim = Simulator("criteo", cpus=paper_schedule(20), seed=seed)
        return run_episode(sim, EvenSplit(), 100).throughput

    assert np.array_equal(trace(3), trace(3))
    assert not np.array_equal(trace(3), trace(4))


def test_run_episode_clamps_to_cpus_and_records_arrays():
    sim = Simulator("criteo", cpus=paper_schedule(30))
    result = run_episode(sim, EvenSplit(), 150)
    assert result.ticks == 150 and list(np.unique(result.cpus)) == [32, 64, 128]
    workers = sum(result.knobs[k] for k in result.knobs if k.endswith(".workers"))
    # the allocation in force at tick k was chosen on tick k-1's observation, clamped to its CPUs
    assert workers[0] <= 32 and (workers[1:] <= result.cpus[:-1]).all()
    assert workers.max() == 128
    assert result.summary()["ooms"] == 0 and 0 < result.cpu_util <= 1


def test_variants_and_random_workloads_simulate():
    spec = load_workload("production", cpus=16, batch_size=8192)
    assert (
        spec.machine.cpus == 16 and spec.batch_size == 8192 and spec.name == "production@cpus=16@batch=8192"
    )
    rng = np.random.default_rng(0)
    for _ in range(10):
        spec = random_workload(rng)
        sim = Simulator(spec)
        run_episode(sim, EvenSplit(), 20)
        assert 2 <= len(spec.stages) <= 8
    assert len(random_workload(1, n_stages=5).stages) == 5


def test_a_long_run_counts_every_tick_without_ooms():
    # its speed (target >= 10,000 ticks/s) is measured by `intune bench sim`, not here
    sim = Simulator("criteo", cpus=64)
    sim.reset()
    for name, value in even_split(sim.knobs, 64).items():
        sim.knobs[name].set(value)
    observations = [sim.step() for _ in range(3000)]
    assert [o.tick for o in observations] == list(range(1, 3001))
    assert not any(o.oom for o in observations) and all(o.throughput > 0 for o in observations)


def test_consumer_stall_stops_delivery_and_fills_buffers():
    data = {
        "name": "stall",
        "batch_size": 1000,
        "chunk_rows": 1000,
        "bytes_per_row": 1000,
        "machine": {"cpus": 8, "memory_limit_gb": 64, "host_memory_gb": 64, "base_memory_gb": 1},
        "consumer": {"stall_every_s": 10, "stall_s": 3},
        "stages": [
            {"name": "read", "cpu_us_per_row": 10.0},
            {"name": "prefetch", "cpu_us_per_row": 1.0, "buffer": {"min": 1, "max": 4096, "default": 1000}},
        ],
    }
    sim = Simulator(spec_from_dict(data), noise=0.0)
    sim.reset()
    obs = [sim.step() for _ in range(10)]
    assert [o.throughput for o in obs[6:9]] == [0.0, 0.0, 0.0]  # ticks 7, 8, 9 (t % 10 >= 7)
    assert obs[5].throughput == pytest.approx(100_000) and obs[9].throughput == pytest.approx(100_000)
    # 100k rows/s * 1000 B = 100 MB per stalled second into the prefetch buffer
    assert obs[8].stage("prefetch").buffered_bytes == pytest.approx(3 * 1e8, rel=0.01)


def test_step_fast_path_agrees_with_the_pure_model():

    rng = np.random.default_rng(11)
    for _ in range(8):
        spec = random_workload(rng, consumer_bound_p=0.5)
        sim = Simulator(spec, noise=0.0)
        sim.reset()
        for name, value in even_split(sim.knobs, sim.cpus + 3).items():  # sometimes oversubscribed
            sim.knobs[name].set(value)
        sim.step()
        if sim.last_model_throughput > 0:  # not stalled, not killed
            assert sim.last_model_throughput == pytest.approx(sim.true_throughput())


def _tune_pipeline(read: int, udf: int, **kw) -> Simulator:
    """bench tune's pipeline simulated on 2 CPUs at ``read`` / ``udf`` workers, noise off."""
    from intune.bench.tune_workload import simulated_spec

    sim = Simulator(simulated_spec(), cpus=2, seed=0, noise=0.0, **kw)
    sim.reset()
    sim.knobs["read.workers"].set(read)
    sim.knobs["udf.workers"].set(udf)
    return sim


def _settled(sim: Simulator, ticks: int = 30) -> Observation:
    for _ in range(ticks):
        obs = sim.step()
    return obs


def test_on_saturated_cpus_the_busiest_stage_reads_busy_and_no_worker_uses_more_cpu_than_its_time():
    # 2 readers and 3 UDF workers on 2 CPUs: CPU-bound. The engine counts a worker waiting for a CPU as
    # busy, so the UDF's three read busy 1.0, each at a share of a CPU below 1
    udf = _settled(_tune_pipeline(2, 3)).stage("udf")
    assert udf.busy == pytest.approx(1.0, abs=0.02)
    assert 0.5 < udf.cpu_share < 0.75  # two CPUs shared by three busy workers (and a little for the rest)
    obs = _settled(_tune_pipeline(2, 3))
    assert all(s.cpu_share is None or s.cpu_share <= 1.0 + 1e-9 for s in obs.stages)


def test_workers_that_a_slower_trainer_holds_back_are_not_busy_on_oversubscribed_cpus():
    # the same workers, but the trainer takes half of what the CPUs make: nobody waits for a CPU, the
    # UDF's workers wait for the trainer (the engine counts that as blocked, not busy)
    free = _settled(_tune_pipeline(2, 3))
    latency = 2.0 * _tune_pipeline(2, 3).spec.batch_size / free.throughput
    held = _settled(_tune_pipeline(2, 3, model_latency_s=latency))
    assert held.throughput == pytest.approx(free.throughput / 2, rel=0.05)
    assert held.stage("udf").busy < 0.75


def test_local_workers_beside_a_remote_pool_read_busy_on_saturated_cpus():
    # 6 local UDF workers on 4 CPUs with 4 remote ones taking part of the rows: the local workers, all
    # runnable, read busy as the engine counts them; the remote pool's rows are not theirs
    spec = spec_from_dict({
        "name": "remote-busy", "batch_size": 1024, "chunk_rows": 1024, "bytes_per_row": 200,
        "machine": {"cpus": 4, "memory_limit_gb": 64, "host_memory_gb": 128, "base_memory_gb": 2},
        "stages": [
            {"name": "read", "kind": "read", "cpu_us_per_row": 0.5},
            {"name": "udf", "kind": "udf", "mode": "process", "cpu_us_per_row": 30.0, "worker_mb": 100,
             "remote": {"nodes": 1, "cpus_per_node": 8, "bandwidth_mb_s": 1000.0, "latency_ms": 2.0}},
            {"name": "batch", "kind": "batch", "cpu_us_per_row": 0.5},
        ],
    })
    sim = Simulator(spec, cpus=4, seed=0, noise=0.0)
    sim.reset()
    sim.knobs["udf.workers"].set(6)
    sim.knobs["udf.remote_workers"].set(4)
    udf = _settled(sim).stage("udf")
    assert udf.remote_workers == 4 and udf.busy == pytest.approx(1.0, abs=0.02)


def test_a_workers_wall_time_is_its_cpu_time_its_wait_for_a_cpu_and_its_own_wait():
    # 2 readers and 3 UDF workers on 2 CPUs: CPU-bound. The UDF computes only: its wall time past its CPU
    # time is all spent waiting for a CPU. The reader waits on storage, 78.125 us a row and 512 rows an
    # element: 0.04 s of its own, and waits for a CPU as well
    obs = _settled(_tune_pipeline(2, 3))
    udf, read = obs.stage("udf"), obs.stage("read")
    assert udf.cpu_wait_s_per_item > 0.3 * udf.wall_s_per_item
    assert udf.cpu_s_per_item + udf.cpu_wait_s_per_item == pytest.approx(udf.wall_s_per_item)
    assert read.cpu_wait_s_per_item > 0.0
    assert read.wall_s_per_item - read.cpu_s_per_item - read.cpu_wait_s_per_item == pytest.approx(0.04)
    # one worker each: the CPUs are not all taken, and no worker waits for one
    assert all(s.cpu_wait_s_per_item == 0.0 for s in _settled(_tune_pipeline(1, 1)).stages)
