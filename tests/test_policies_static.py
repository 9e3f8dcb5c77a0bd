"""The static baselines: none (one worker, minimal buffers) and heuristic (even split, re-split on resize)."""

from _knobs import dict_knobs
from intune.monitor.observation import Observation, StageObservation
from intune.policies import make

_knobs = dict_knobs


def _obs(cpus, tick=0, stages=()):
    return Observation(tick=tick, dt_s=1.0, throughput=1.0, step_time_s=0.0, cpus=cpus,
                       memory_used_bytes=1e9, memory_limit_bytes=8e9, stages=tuple(stages))


SPEC = {
    "read.workers": ("cpu", 1, 32, 4),
    "udf.workers": ("cpu", 1, 32, 7),
    "batch.workers": ("cpu", 1, 32, 2),
    "prefetch.buffer_mb": ("mb", 8, 1024, 300),
}


def test_none_leaves_the_shuffle_window_as_configured():
    knobs, store = _knobs({"read.workers": ("cpu", 1, 8, 3), "shuffle.buffer_mb": ("mb", 1, 4096, 256)})
    p = make("none")
    stages = [StageObservation(n, 1, 0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0, kind=n) for n in ("read", "shuffle")]
    p.reset(knobs, _obs(4, stages=stages))
    assert p.step(_obs(4, stages=stages)) == {"read.workers": 1}


def test_none_sets_one_worker_and_minimal_buffers_and_then_stays_quiet():
    knobs, store = _knobs(SPEC)
    p = make("none")
    assert p.name == "none"
    p.reset(knobs, _obs(16))
    req = p.step(_obs(16))
    assert req == {"read.workers": 1, "udf.workers": 1, "batch.workers": 1, "prefetch.buffer_mb": 8}
    store.update(req)
    assert p.step(_obs(64, tick=1)) == {}  # the machine does not matter
    store["udf.workers"] = 5  # something else moved a knob: none puts it back
    assert p.step(_obs(64, tick=2)) == {"udf.workers": 1}


def test_heuristic_splits_evenly_and_resplits_when_cpus_change():
    knobs, store = _knobs(SPEC)
    p = make("heuristic")
    p.reset(knobs, _obs(8))
    req = p.step(_obs(8))
    assert req == {"read.workers": 3, "udf.workers": 3}  # 3, 3, 2: batch already has 2; buffers untouched
    store.update(req)
    assert p.step(_obs(8, tick=1)) == {}
    req = p.step(_obs(16, tick=2))
    assert req == {"read.workers": 6, "udf.workers": 5, "batch.workers": 5}
    store.update(req)
    assert sum(store[k] for k in SPEC if k.endswith("workers")) == 16
    assert store["prefetch.buffer_mb"] == 300
    # fewer CPUs than stages: one each (the knob minimum)
    assert p.step(_obs(2, tick=3)) == {"read.workers": 1, "udf.workers": 1, "batch.workers": 1}
