"""``intune bench fidelity``: the fields it compares, per row, match a hand computation."""

import pytest

from intune.bench import fidelity_threads
from intune.bench.fidelity import fields, simulated_ticks
from intune.bench.tune_workload import Workload
from intune.monitor.observation import Observation, StageObservation


def test_fields_are_per_row_and_per_stage():
    # 50 chunks/s of 200 rows; 4 ms CPU and 10 ms busy wall per chunk; one worker holds 3 MB
    udf = StageObservation("udf", 2, 0, 50.0, 10_000.0, 0.004, 0.010, 1e5, 0.25, 0.5, 0.25, 0.1, 0.0,
                           worker_bytes=3 * (1 << 20))
    other = StageObservation("prefetch", 1, 8, 50.0, 10_000.0, 0.0, 0.0, 1e5, 0.0, 1.0, 0.0, 0.5, 0.0)
    obs = Observation(1, 1.0, 10_000.0, 0.0, 2.0, 1e9, 4e9, (udf, other), cpu_slack=1.0)
    f = fields(obs)
    assert f["udf.cpu_s_per_row"] == pytest.approx(0.004 / 200)
    assert f["udf.wall_s_per_row"] == pytest.approx(0.010 / 200)
    assert f["udf.cpu_share"] == pytest.approx(0.4)
    assert f["udf.worker_mb"] == pytest.approx(3.0)
    assert f["free_cpus"] == pytest.approx(2.0 + 1.0 - 3)
    assert not any(k.startswith("prefetch.") for k in f)


def test_the_twin_runs_at_the_allocation_asked():
    ticks = simulated_ticks({"read.workers": 2, "udf.workers": 3}, cpus=2, ticks=3, workload=Workload())
    assert len(ticks) == 3
    assert {s.name: s.workers for s in ticks[-1].stages if s.name in ("read", "udf")} == {"read": 2, "udf": 3}


def test_the_surplus_threads_simulated_rate_is_the_models_hand_computation():
    """2 and 32 threads of a stage holding the GIL for half of 8 ms a chunk, behind a one-thread source,
    on 2 CPUs at oversubscription cost 0.1: the compute-wanting workers are the source's one plus, of
    the stage's w, w / 2 outside the GIL and one holding it, each weighing the thread switch share s in
    the count W; the CPUs bound the rate at efficiency 1 / (1 + 0.1 (W / 2 - 1)) times 2 CPUs over the
    CPU per row (at s = 0.1, 32 threads weigh 1.8: within the 2 CPUs)."""
    c = 0.008 / fidelity_threads.CHUNK_ROWS
    src = 0.01e-6
    for s in (1.0, 0.1):
        for w in (2, 32):
            count = s * (1 + w / 2 + 1)
            eta = 1 / (1 + 0.1 * max(0.0, count / 2 - 1))
            expected = min(eta * 2 / (c + src), 1 / (0.5 * c))
            got = fidelity_threads.simulated_rate(0.008, 0.5, w, cpus=2, cost=0.1, switch_share=s)
            assert got == pytest.approx(expected, rel=1e-6)


def test_the_gil_share_grows_with_the_python_loop():
    _, low = fidelity_threads.gil_share(1_000, 200_000, repeats=5)
    _, high = fidelity_threads.gil_share(200_000, 1_000, repeats=5)
    assert 0 < low < 0.5 < high < 1
