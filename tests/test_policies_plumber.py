"""plumber: the LP allocation against brute force, the sequential rule, I/O-bound sources, prefetch
sizing, re-solving."""

import itertools
import random

import pytest

from _knobs import dict_knobs, kind_of
from intune.knobs import Knob
from intune.monitor.observation import Observation, StageObservation
from intune.policies import clamp_request, make
from intune.policies.plumber import (
    PlumberPolicy,
    StageProfile,
    prefetch_elements,
    rate_of,
    round_allocation,
    solve_lp,
)
from intune.policies.stage_costs import jitter_elements
from intune.sim import Simulator, constant_schedule, run_episode
from intune.sim.spec import spec_from_dict

MB = 1 << 20


_knobs = dict_knobs


def _stage(name, cpu, items=100.0, wall=None, workers=1, busy=1.0, size=1 * MB, rows_per_item=1000):
    return StageObservation(
        name=name,
        workers=workers,
        buffer_mb=0,
        items_per_s=items,
        rows_per_s=items * rows_per_item,
        cpu_s_per_item=cpu,
        wall_s_per_item=cpu if wall is None else wall,
        bytes_per_item=size,
        busy=busy,
        kind=kind_of(name),
        starved=0.0,
        blocked=0.0,
        queue_fill=0.0,
        buffered_bytes=0.0,
    )


def _obs(tick, stages, cpus=8.0, demand=0.0, step=0.0, used=1e9, limit=64e9):
    return Observation(
        tick=tick,
        dt_s=1.0,
        throughput=1e5,
        step_time_s=step,
        cpus=cpus,
        memory_used_bytes=used,
        memory_limit_bytes=limit,
        stages=tuple(stages),
        demand=demand,
    )


def _brute_force(work, cores, lo, hi):
    best = 0.0
    for alloc in itertools.product(*[range(a, b + 1) for a, b in zip(lo, hi, strict=True)]):
        if sum(alloc) <= cores:
            best = max(best, rate_of(alloc, work))
    return best


def test_lp_by_hand():
    cores, theta = solve_lp([1.0, 3.0], 8, [0, 0], [8, 8])
    assert theta == pytest.approx(2.0) and cores == pytest.approx([2.0, 6.0])
    # a sequential stage (at most one core) caps the rate; the others get only what that rate needs
    # (its one core is taken out of the 8: 7 left for work 4 -> theta 7/4)
    cores, theta = solve_lp([1.0, 3.0, 0.5], 8, [1, 1, 1], [8, 8, 1])
    assert theta == pytest.approx(1.75) and cores == pytest.approx([1.75, 5.25, 1.0])
    cores, theta = solve_lp([1.0, 3.0, 1.0], 8, [1, 1, 1], [8, 8, 1])
    assert theta == pytest.approx(1.0) and cores == pytest.approx([1.0, 3.0, 1.0])


def test_rounded_lp_matches_brute_force_on_small_cases():
    rng = random.Random(7)
    for _ in range(150):
        n = rng.randint(2, 4)
        cores = rng.randint(n, 9)
        work = [round(rng.uniform(0.05, 2.0), 3) for _ in range(n)]
        lo = [1] * n
        hi = [1 if rng.random() < 0.25 else rng.randint(2, 8) for _ in range(n)]
        fractional, theta = solve_lp(work, cores, lo, hi)
        alloc = round_allocation(fractional, work, cores, lo, hi)
        assert sum(alloc) <= cores and all(a <= b <= c for a, b, c in zip(lo, alloc, hi, strict=True))
        best = _brute_force(work, cores, lo, hi)
        assert rate_of(alloc, work) == pytest.approx(best), (work, cores, hi, alloc)
        assert theta >= best - 1e-9  # the relaxation bounds the integer optimum


def test_sequential_rule():
    knob = Knob("s.workers", "cpu", 1, 8, get=lambda: 4, set=lambda v: None)
    one = Knob("t.workers", "cpu", 1, 1, get=lambda: 1, set=lambda v: None)

    def profile(workers, cpu, wall, items):
        return StageProfile(
            items=items, cpu_s=cpu * items, wall_s=wall * items, busy_workers_s=workers, time_s=1.0
        )

    assert PlumberPolicy.is_sequential(one, StageProfile())
    # 4 busy workers using one core between them, each element taking 4x its CPU time: GIL-bound
    assert PlumberPolicy.is_sequential(knob, profile(4, 0.01, 0.04, 100))
    # I/O-bound: 4 busy workers but a tenth of a core
    assert not PlumberPolicy.is_sequential(knob, profile(4, 0.001, 0.04, 100))
    # scales: 4 busy workers using 4 cores
    assert not PlumberPolicy.is_sequential(knob, profile(4, 0.01, 0.01, 400))


def test_prefetch_depth_from_the_rate_gap():
    assert prefetch_elements(10.0, 5.0) == 2  # rho 0.5: 1 + 1
    assert prefetch_elements(10.0, 9.0) == 10  # rho 0.9: 1 + 9
    assert prefetch_elements(10.0, 12.0) == 1  # the consumer outruns the pipeline: depth does not help
    assert prefetch_elements(10.0, 0.0) == 1  # unknown demand
    assert prefetch_elements(10.0, 9.9999) == 256  # capped


SPEC = {
    "read.workers": ("cpu", 1, 32, 1),
    "udf.workers": ("cpu", 1, 32, 1),
    "prefetch.workers": ("cpu", 1, 32, 1),
    "prefetch.buffer_mb": ("mb", 1, 4096, 1),
}


def _stages(read_wall=None):
    # CPU seconds per element: read 0.01, udf 0.05, prefetch 0.002; read's wall time as given (I/O waits)
    return [_stage("read", 0.01, wall=read_wall), _stage("udf", 0.05), _stage("prefetch", 0.002, size=4 * MB)]


def _run(policy, knobs, store, observations):
    policy.reset(knobs, observations[0])
    for obs in observations:
        store.update(clamp_request(knobs, policy.step(obs), obs.cpus, 1e15).applied)


def test_plans_after_the_profile_and_keeps_its_plan_unless_adaptive():
    observations = [_obs(t, _stages(), cpus=8.0 if t < 10 else 16.0, demand=50_000.0) for t in range(20)]
    knobs, store = _knobs(SPEC)
    p = make("plumber")
    p.reset(knobs, observations[0])
    for t in range(4):
        assert p.step(observations[t]) == {}  # profiling: the pipeline runs as it is
    _run(p, knobs, store, observations)
    # LP on 8 cores, work 0.01 / 0.05 / 0.002 s, one core at least each: prefetch 1, then 7 / 0.06 ->
    # theta 116.7/s, cores 1.17 / 5.83 / 1; floors 1 / 5 / 1 and the spare core to the slowest (a tie at
    # 100/s: the first, read) -> 2 / 5 / 1, 100 elements/s
    assert (store["read.workers"], store["udf.workers"], store["prefetch.workers"]) == (2, 5, 1)
    assert p.solves == 1 and p.plan.cpus == 8.0  # non-adaptive: the first plan stays
    # demand 50 elements/s vs theta 100/s (udf: 6 / 0.05 = 120, read: 1 / 0.01 = 100): rho 0.5 -> 2 x 4 MB
    assert p.plan.theta == pytest.approx(100.0)
    assert p.plan.prefetch_elements == 2 and store["prefetch.buffer_mb"] == 8

    knobs, store = _knobs(SPEC)
    a = make("plumber-adaptive")
    _run(a, knobs, store, observations)
    assert a.solves == 2 and a.plan.cpus == 16.0
    assert sum(v for k, v in store.items() if k.endswith("workers")) == 16
    assert a.plan.theta == pytest.approx(min(store["read.workers"] / 0.01, store["udf.workers"] / 0.05))


def test_lp_cpu_constraint_bounds_the_rate():
    # 8 workers would carry 4 elements/s at 1 worker-second each, but 1.5 CPU seconds per element on 3 CPUs
    # allow 2/s: each stage gets only the 2 workers that rate needs
    cores, theta = solve_lp([1.0, 1.0], 8, [1, 1], [8, 8], cpu_work=[0.5, 1.0], cpus=3.0)
    assert theta == pytest.approx(2.0) and cores == pytest.approx([2.0, 2.0])


def test_io_bound_rule():
    def profile(cpu, wall):
        return StageProfile(items=100, cpu_s=cpu * 100, wall_s=wall * 100, time_s=1.0)

    waiting = PlumberPolicy.io_bound(
        {"read": profile(0.01, 0.1), "udf": profile(0.05, 0.05), "batch": profile(0.02, 0.03)}
    )
    assert waiting == {"read"}  # read computes 10% of its busy time; batch 67%, udf 100%
    # saturated CPUs stretch every stage's wall time alike: nothing is taken for I/O
    assert PlumberPolicy.io_bound({"read": profile(0.01, 0.03), "udf": profile(0.05, 0.15)}) == set()


def test_an_io_bound_reader_is_rated_by_its_wall_time():
    observations = [_obs(t, _stages(read_wall=0.1), cpus=8.0, demand=20_000.0) for t in range(10)]
    knobs, store = _knobs(SPEC)
    p = make("plumber")
    _run(p, knobs, store, observations)
    # read waits 90% of its busy time: 0.1 worker-seconds per element (CPU time would say 0.01, and give
    # it 2 workers). Per-worker times 0.1 / 0.05 / 0.002 on 8 workers, prefetch at its minimum 1: 7 / 0.15
    # -> theta 46.7/s, workers 4.67 / 2.33 / 1; floors 4 / 2 / 1 and the spare to the slowest (a tie at
    # 40/s: the first, read) -> 5 / 2 / 1, 40 elements/s, 2.5 of the 8 CPUs busy
    assert (store["read.workers"], store["udf.workers"], store["prefetch.workers"]) == (5, 2, 1)
    assert p.plan.io_bound == ["read"] and p.plan.theta == pytest.approx(40.0)
    # demand 20 elements/s vs 40/s: rho 0.5 -> 2 elements of 4 MB
    assert p.plan.prefetch_elements == 2 and store["prefetch.buffer_mb"] == 8


# A reader that waits 19 of every 20 us per row on storage, a CPU-bound UDF, a light prefetch; no
# contention and no cost variance, so that the model's rates are linear in workers.
IO_SOURCE = {
    "name": "io-source",
    "batch_size": 1024,
    "chunk_rows": 1024,
    "bytes_per_row": 256,
    "machine": {"cpus": 16, "memory_limit_gb": 64, "host_memory_gb": 256, "base_memory_gb": 2},
    "consumer": {"model_latency_s": 0.0},
    "stages": [
        {"name": "read", "kind": "read", "cpu_us_per_row": 1.0, "io_us_per_row": 19.0},
        {"name": "udf", "kind": "udf", "mode": "process", "cpu_us_per_row": 20.0},
        {
            "name": "prefetch",
            "kind": "prefetch",
            "cpu_us_per_row": 0.5,
            "buffer": {"min": 16, "max": 4096, "default": 16},
        },
    ],
}


def test_gives_a_simulated_io_bound_reader_the_workers_its_io_needs():
    spec = spec_from_dict(IO_SOURCE)
    sim = Simulator(spec, cpus=constant_schedule(16, 60), seed=0)
    r = run_episode(sim, make("plumber"), 60)
    # 20 us per row per worker for read and udf, 0.5 for prefetch (1 worker): on the 16 CPUs alone, 15
    # workers for 40 us -> 7.5 each: 7 workers / 20 us = 350k rows/s. The reader's workers wait on I/O
    # 95% of the time, so the runner grants the CPU they leave unused (cpu_slack) as more workers: it
    # plans on more than 16. CPU time alone (1 us per row) gave read 1 worker: 50k rows/s.
    read, udf = r.knobs["read.workers"][-1], r.knobs["udf.workers"][-1]
    assert min(read, udf) >= 7 and read + udf >= 15 and r.knobs["prefetch.workers"][-1] == 1
    assert r.model_throughput[-1] >= 350_000 * (1 - 1e-6)


def test_jitter_depth_by_hand():
    # starved 6.5% at 2 elements: (1 + 2) * 0.065 / 0.01 - 1 = 18.5 elements for 1%
    assert jitter_elements(0.065, 2.0, 0.01) == pytest.approx(18.5)
    assert jitter_elements(0.005, 2.0, 0.01) == 2.0  # already under the target: what it holds
