"""The baselines run unchanged on the real engine: every row once, no policy failure, knobs moved."""

import time
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
engine = pytest.importorskip("intune.pipeline.engine", reason="the engine has not landed")
tuner_mod = pytest.importorskip("intune.tuner")
monitor_mod = pytest.importorskip("intune.monitor")
FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"

BASELINES = ("none", "heuristic", "autotune", "autotune-adaptive", "plumber", "plumber-adaptive")


def _pipeline(n_chunks=150, rows=200):
    def chunks():
        for i in range(n_chunks):
            yield {"id": np.arange(i * rows, (i + 1) * rows)}

    def udf(chunk):
        time.sleep(0.002)  # an I/O-like wait: wall time without CPU time (what AUTOTUNE's wall clock sees)
        start = time.thread_time()
        while time.thread_time() - start < 0.001:  # and CPU work (what Plumber's CPU-time rates see)
            pass
        return {"id": chunk["id"], "twice": chunk["id"] * 2}

    pipe = engine.Pipeline.from_iterable(chunks).map(udf, name="udf").batch(100).prefetch(depth=2, buffer_mb=8)
    return pipe, n_chunks * rows


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_on_the_live_engine(name):
    pipe, n_rows = _pipeline()
    # the real monitor on a fixture cgroup tree: 8 CPUs, 4 GiB used of 16 GiB (this box has 2 CPUs)
    monitor = monitor_mod.Monitor(root=FIXTURES / "v2-unlimited", affinity=set(range(8)))
    kwargs = {"profile_ticks": 2} if "plumber" in name else {}
    with tuner_mod.tune(pipe, name, tick_s=0.02, monitor=monitor, **kwargs) as tuner:
        ids = sorted(int(i) for batch in tuner for i in batch["id"])
    assert ids == list(range(n_rows))
    rows = tuner.history()
    assert rows and tuner.failures == {}, tuner.failures
    assert all(row["error"] is None for row in rows)
    if name != "none":  # none's one worker per stage is the engine's default already
        assert max(row["knobs"]["udf.workers"] for row in rows) > 1, name
