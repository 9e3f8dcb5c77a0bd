"""What one worker costs in memory, measured: by the engine for its workers, by the simulator from its
model, and how the safety layer prices an added worker from it."""

import dataclasses

import numpy as np
import pytest

import intune
from intune.agent.config import ACTION_DELTAS
from intune.policies.safety import PROBE_WORKER_BYTES, READING_MARGIN, SafetyLayer
from intune.sim import Simulator, load_workload
from intune.units import MB

HELD = 96 * MB


def _chunks(rows=4000, size=100):
    return [{"id": np.arange(i, i + size), "f": np.ones(size)} for i in range(0, rows, size)]


def _hold_memory(chunk, _held=[]):  # noqa: B006 - the child's own list: memory it keeps between chunks
    if not _held:
        _held.append(np.ones(HELD // 8))  # written, so its pages are the child's own
    return chunk


def test_a_process_worker_s_private_memory_is_measured():
    pipe = intune.Pipeline.from_iterable(_chunks()).map(_hold_memory, name="udf", mode="process", workers=2).batch(100)
    with pipe:
        it = iter(pipe)
        for _ in range(20):
            next(it)
        reading = pipe.metrics().stages["udf"].worker_bytes
    # each child holds the 96 MB it allocated, plus the interpreter's own private pages (tens of MB)
    assert HELD <= reading <= HELD + 256 * MB


def test_a_thread_worker_holds_an_input_and_an_output_chunk():
    pipe = intune.Pipeline.from_iterable(_chunks()).map(lambda c: c, name="udf", mode="thread", workers=2).batch(100)
    with pipe:
        list(pipe)
        stage = pipe.metrics().stages["udf"]
    assert stage.worker_bytes == pytest.approx(2 * stage.bytes_out / stage.items)
    assert stage.worker_bytes == pytest.approx(2 * 100 * 16)  # two columns of 100 8-byte values, twice


def test_the_simulator_reports_the_model_s_worker_memory_with_a_reading_s_noise():
    sim = Simulator(load_workload("criteo"), cpus=32, seed=3)
    readings = []
    sim.reset()
    for _ in range(200):
        obs = sim.step()
        readings.append([s.worker_bytes for s in obs.stages])
    mean = np.mean(readings, axis=0)
    truth = sim.params.worker_bytes
    np.testing.assert_allclose(mean, truth, rtol=0.02)
    assert np.std(readings, axis=0).max() > 0  # a reading, not the model's exact figure


def test_an_added_worker_is_priced_at_its_reading_not_the_probe():
    values = {"udf.workers": 2, "prefetch.buffer_mb": 8}
    knobs = [intune.knobs.Knob(n, "cpu" if n.endswith("workers") else "mb", 1, 64, get=lambda n=n: values[n],
                               set=lambda v, n=n: values.__setitem__(n, v)) for n in values]
    safety = SafetyLayer(knobs, ACTION_DELTAS)
    sim_obs = Simulator(load_workload("criteo"), cpus=32, seed=0).step()
    stage = dataclasses.replace(sim_obs.stages[0], name="udf", workers=2, items_per_s=10.0, mode="process")
    unmeasured = dataclasses.replace(sim_obs, stages=(dataclasses.replace(stage, worker_bytes=0.0),))
    measured = dataclasses.replace(sim_obs, stages=(dataclasses.replace(stage, worker_bytes=40 * MB),))
    assert safety.stage_worker_bytes(unmeasured)[0] >= PROBE_WORKER_BYTES
    assert safety.stage_worker_bytes(measured)[0] == pytest.approx(40 * MB * READING_MARGIN)


def test_while_the_trainer_stalls_on_saturated_cpus_every_field_is_a_number():
    # a CPU-bound spec whose trainer pauses: nothing flows during the pause, and no field may turn NaN
    from intune.bench.tune_workload import simulated_spec

    spec = simulated_spec()
    spec = dataclasses.replace(spec, consumer=dataclasses.replace(spec.consumer, stall_every_s=20.0, stall_s=5.0))
    sim = Simulator(spec, cpus=2, seed=0, noise=0.0)
    sim.reset()
    sim.knobs["read.workers"].set(2)
    sim.knobs["udf.workers"].set(3)
    stalled = 0
    for _ in range(60):
        obs = sim.step()
        stalled += obs.throughput == 0
        for s in obs.stages:
            assert np.isfinite([s.busy, s.starved, s.blocked, s.cpu_s_per_item, s.wall_s_per_item]).all(), (obs.tick, s)
    assert stalled >= 5
