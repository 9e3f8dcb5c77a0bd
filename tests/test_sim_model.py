"""The simulator's model against hand-computed numbers: capacity, CPU bound, I/O, GIL, buffers, memory."""

import numpy as np
import pytest

from intune.sim import model, spec_from_dict
from intune.units import GB, MB


def _params(stages, **machine):
    data = {
        "name": "t",
        "batch_size": 100,
        "chunk_rows": 100,
        "bytes_per_row": 10,
        "machine": {
            "cpus": 4,
            "memory_limit_gb": 10,
            "host_memory_gb": 20,
            "base_memory_gb": 1,
            "oversubscription_cost": 0.0,
            **machine,
        },
        "stages": stages,
    }
    return model.params_from_spec(spec_from_dict(data))


def test_capacity_bound_single_stage():
    p = _params([{"name": "a", "cpu_us_per_row": 10.0, "mode": "process"}])
    # 4 workers x 1 row / 10 us = 400k rows/s, CPU bound 100 CPUs / 10 us = 10M
    assert model.throughput(p, [4], [0], cpus=100) == pytest.approx(400_000)


def test_cpu_bound_and_oversubscription():
    stages = [
        {"name": "a", "cpu_us_per_row": 10.0, "mode": "process"},
        {"name": "b", "cpu_us_per_row": 10.0, "mode": "process"},
    ]
    p = _params(stages)
    # capacities 800k each; 4 CPUs / 20 us per row = 200k
    assert model.throughput(p, [8, 8], [0, 0], cpus=4) == pytest.approx(200_000)
    p = _params(stages, oversubscription_cost=0.3)
    # 16 workers on 4 CPUs: eta = 1 / (1 + 0.3 * (16/4 - 1)) = 1/1.9
    assert model.throughput(p, [8, 8], [0, 0], cpus=4) == pytest.approx(200_000 / 1.9)
    assert model.throughput(p, [2, 2], [0, 0], cpus=4) == pytest.approx(200_000)  # no oversubscription
    # workers waiting on I/O want no CPU: 16 workers computing 1/10 of their time are 1.6 on 4 CPUs
    p = _params(
        [
            {"name": "a", "cpu_us_per_row": 1.0, "io_us_per_row": 9.0},
            {"name": "b", "cpu_us_per_row": 1.0, "io_us_per_row": 9.0},
        ],
        oversubscription_cost=0.3,
    )
    assert model.compute_workers(p, [8, 8]) == pytest.approx(1.6)
    assert model.throughput(p, [8, 8], [0, 0], cpus=4) == pytest.approx(800_000)


def test_a_thread_weighs_the_machines_thread_switch_share_in_the_oversubscription_count():
    process = {"cpu_us_per_row": 10.0, "mode": "process"}
    thread = {"cpu_us_per_row": 10.0, "mode": "thread"}
    # 4 CPUs / 20 us per row = 200k; 16 workers computing on 4 CPUs, at oversubscription cost 0.3:
    # processes count 16: eta = 1 / (1 + 0.3 * (16/4 - 1)) = 1/1.9
    p = _params([{"name": "a", **process}, {"name": "b", **process}], oversubscription_cost=0.3)
    assert model.throughput(p, [8, 8], [0, 0], cpus=4) == pytest.approx(200_000 / 1.9)
    # threads count a tenth each (the default share): 1.6, within the 4 CPUs
    p = _params([{"name": "a", **thread}, {"name": "b", **thread}], oversubscription_cost=0.3)
    assert model.switching_workers(p, [8, 8]) == pytest.approx(1.6)
    assert model.compute_workers(p, [8, 8]) == pytest.approx(16.0)  # the CPUs they want are not discounted
    assert model.throughput(p, [8, 8], [0, 0], cpus=4) == pytest.approx(200_000)
    # 8 processes and 8 threads: 8.8, eta = 1 / (1 + 0.3 * (8.8/4 - 1)) = 1/1.36
    p = _params([{"name": "a", **process}, {"name": "b", **thread}], oversubscription_cost=0.3)
    assert model.throughput(p, [8, 8], [0, 0], cpus=4) == pytest.approx(200_000 / 1.36)
    # at a share of 1 a thread counts as a process does
    p = _params([{"name": "a", **thread}, {"name": "b", **thread}], oversubscription_cost=0.3, thread_switch_share=1.0)
    assert model.throughput(p, [8, 8], [0, 0], cpus=4) == pytest.approx(200_000 / 1.9)


def test_threads_waiting_for_the_gil_want_no_cpu():
    stages = [
        {"name": "py", "cpu_us_per_row": 10.0, "gil_fraction": 0.8, "mode": "thread"},
        {"name": "c", "cpu_us_per_row": 10.0, "mode": "process"},
    ]
    p = _params(stages, oversubscription_cost=0.3)
    # 8 threads: 8 x 0.2 compute outside the GIL, and one holds it (8 x 0.8 wait for it): 1.6 + 1
    assert model.compute_workers(p, [8, 0]) == pytest.approx(2.6)
    assert model.compute_workers(p, [1, 0]) == pytest.approx(1.0)  # one thread: all of its CPU
    assert model.compute_workers(p, [8, 2]) == pytest.approx(4.6)
    # the stage is GIL-capped at 1 / 8 us = 125k; 4.6 on 4 CPUs: eta = 1 / (1 + 0.3 * 0.15), bound 200k * eta
    assert model.throughput(p, [8, 2], [0, 0], cpus=4) == pytest.approx(min(125_000, 200_000 / 1.045))
    # a process stage's workers all want a CPU however many
    assert model.compute_workers(p, [0, 8]) == pytest.approx(8.0)


def test_io_is_hidden_by_workers_and_uses_no_cpu():
    p = _params([{"name": "read", "cpu_us_per_row": 2.0, "io_us_per_row": 18.0}])
    assert model.throughput(p, [1], [0], cpus=2) == pytest.approx(50_000)  # 1 / 20 us
    # 10 workers: 500k rows/s using 500k * 2 us = 1 CPU, within 2 CPUs
    assert model.throughput(p, [10], [0], cpus=2) == pytest.approx(500_000)
    # 40 workers would need 4 CPUs of compute: the CPU bound 2 / 2 us = 1M rows/s binds
    assert model.throughput(p, [40], [0], cpus=2) == pytest.approx(1_000_000)


def test_gil_bound_thread_stage_gains_nothing_past_one_cpu():
    p = _params([{"name": "py", "cpu_us_per_row": 10.0, "gil_fraction": 1.0}])
    assert model.throughput(p, [1], [0], cpus=64) == pytest.approx(100_000)
    assert model.throughput(p, [8], [0], cpus=64) == pytest.approx(100_000)
    p = _params([{"name": "py", "cpu_us_per_row": 10.0, "gil_fraction": 0.25}])  # GIL held 2.5 us per row
    assert model.throughput(p, [8], [0], cpus=64) == pytest.approx(400_000)
    p = _params([{"name": "py", "cpu_us_per_row": 10.0, "mode": "process"}])
    assert model.throughput(p, [8], [0], cpus=64) == pytest.approx(800_000)


def test_contention_curve_and_bottleneck():
    p = _params(
        [{"name": "a", "cpu_us_per_row": 10.0, "contention": 0.1}, {"name": "b", "cpu_us_per_row": 1.5}]
    )
    # 11 workers act like 11 / (1 + 0.1 * 10) = 5.5: 550k rows/s; b with 1 worker: 666.7k rows/s
    assert model.throughput(p, [11, 1], [0, 0], cpus=100) == pytest.approx(550_000)
    # 40 workers act like 40 / 4.9 = 8.16 (the curve tends to 1 / 0.1 = 10): a makes 816k, b binds
    assert model.throughput(p, [40, 1], [0, 0], cpus=100) == pytest.approx(1e6 / 1.5)
    assert model.stage_capacity(p, np.array([40, 1]))[0] == pytest.approx(40 / 4.9 / 10e-6)


def test_buffer_absorbs_variance():
    stage = {"name": "a", "cpu_us_per_row": 10.0, "cpu_cv": 1.0, "queue_items": 1}
    p = _params([stage])
    # v = cv^2 / 2 = 0.5, one item of queue: factor 1 - 0.5 / 2 = 0.75
    assert model.throughput(p, [1], [0], cpus=4) == pytest.approx(75_000)
    p = _params([{**stage, "buffer": {"min": 1, "max": 100, "default": 1}}])
    # items are 100 rows * 10 B = 1000 B; 1 MB holds 1048.576 items: factor 1 - 0.5 / 1049.576
    assert model.throughput(p, [1], [1], cpus=4) == pytest.approx(100_000 * (1 - 0.5 / (1 + MB / 1000)))


def test_consumer_demand_caps_throughput():
    data = {
        "name": "t",
        "batch_size": 1000,
        "consumer": {"model_latency_s": 0.01},
        "stages": [{"name": "a", "kind": "batch", "cpu_us_per_row": 1.0}],
    }
    p = model.params_from_spec(spec_from_dict(data))
    assert p.demand == pytest.approx(100_000)
    assert model.throughput(p, [50], [0], cpus=64) == pytest.approx(100_000)


def test_memory_counts_base_fixed_workers_inflight_and_buffers():
    p = _params(
        [
            {
                "name": "a",
                "cpu_us_per_row": 1.0,
                "mode": "process",
                "worker_mb": 100,
                "inflight_items": 2,
                "fixed_mb": 512,
            },
            {
                "name": "b",
                "cpu_us_per_row": 1.0,
                "worker_mb": 8,
                "buffer": {"min": 1, "max": 1000, "default": 10},
            },
        ]
    )
    item = 100 * 10  # bytes
    expected = 1 * GB + 512 * MB + 3 * (100 * MB + 2 * item) + 2 * (8 * MB + 2 * item) + (2 * item + 10 * MB)
    assert model.worst_case_memory(p, [3, 2], [0, 10]) == pytest.approx(expected)


def test_queue_fill_upstream_of_bottleneck_is_full():
    fill = model.queue_fill_target(np.array([10.0, 1.0, 10.0]), demand=0.0, capacity_items=100.0)
    assert fill[0] > 0.99 and fill[1] < 0.01 and fill[2] == 0.0
    fill = model.queue_fill_target(np.array([10.0, 10.0]), demand=1.0, capacity_items=100.0)  # consumer-bound
    assert fill.min() > 0.99
    # a faster consumer keeps a big buffer nearly empty: rho = 0.9 holds about 9 items of 10,000
    fill = model.queue_fill_target(np.array([9.0]), demand=10.0, capacity_items=10_000.0)
    assert fill[0] * 10_000 == pytest.approx(9.0)


def test_mm1k_occupancy_by_hand():
    # rho = 0.5, K = 2: (0 * 1 + 1 * 0.5 + 2 * 0.25) / 1.75
    assert model.mm1k_occupancy(0.5, 2.0) == pytest.approx(1.0 / 1.75)
    # rho = 2, K = 2: (0 + 2 + 8) / 7
    assert model.mm1k_occupancy(2.0, 2.0) == pytest.approx(10.0 / 7.0)
    assert model.mm1k_occupancy(1.0, 6.0) == pytest.approx(3.0)
    assert model.mm1k_occupancy(1e6, 5.0) == pytest.approx(5.0, abs=1e-4)
