"""``intune bench fidelity``: the fields it compares, per row, match a hand computation."""

import pytest

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
