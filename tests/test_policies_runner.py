"""The one runner: every policy's request becomes knob values through ``Runner``, live and simulated."""

from __future__ import annotations

import pytest

from _knobs import dict_knobs, kind_of
from intune.monitor.observation import Observation, StageObservation
from intune.policies.runner import Runner

MB = 1 << 20


def _obs(values, cpus=4.0, slack=0.0, used=1e9, limit=8e9, stalled=(), cpu_share=None):
    stages = []
    for stage in sorted({n.split(".")[0] for n in values}):
        cpu = 0.01 if cpu_share is None else cpu_share.get(stage, 0.01)
        stages.append(StageObservation(stage, values.get(f"{stage}.workers", 0), values.get(f"{stage}.buffer_mb", 0),
                                       10.0, 1e4, cpu, 0.01, MB, 0.5, 0.2, 0.3, 0.5, 0.0,
                                       stalled=stage in stalled, kind=kind_of(stage)))
    return Observation(1, 1.0, 1e4, 0.0, cpus, used, limit, tuple(stages), cpu_slack=slack)


SPEC = {"read.workers": ("cpu", 1, 16, 2), "udf.workers": ("cpu", 1, 16, 2), "prefetch.buffer_mb": ("mb", 1, 4096, 64)}


def test_decreases_are_set_before_increases():
    knobs, store = dict_knobs(SPEC)
    order = []
    for name, knob in knobs.items():
        inner = knob._set
        knob._set = lambda v, n=name, inner=inner: (order.append(n), inner(v))
    runner = Runner(knobs)
    obs = runner.observe(_obs(store))
    result = runner.apply(obs, {"udf.workers": 3, "read.workers": 1})
    assert result.applied == {"udf.workers": 3, "read.workers": 1}
    assert order == ["read.workers", "udf.workers"]


def test_the_budget_is_the_cpus_plus_the_measured_slack_kept_at_its_recent_highest():
    knobs, store = dict_knobs(SPEC)
    runner = Runner(knobs)
    seen = runner.observe(_obs(store, cpus=4.0, slack=2.0))
    assert seen.grants_light_workers
    later = runner.observe(_obs(store, cpus=4.0, slack=0.0))
    assert later.cpu_slack == 2.0  # the recent highest budget: a worker just removed can come back
    # 4 workers in place, budget 6: two more granted, not three
    assert runner.apply(later, {"udf.workers": 5}).applied == {"udf.workers": 4}
    fresh = runner.observe(_obs(store, cpus=8.0, slack=0.0))
    assert fresh.cpu_slack == 0.0  # a CPU change starts afresh


def test_a_stalled_stage_gets_no_more_workers_and_memory_bounds_buffers():
    knobs, store = dict_knobs(SPEC)
    runner = Runner(knobs)
    obs = runner.observe(_obs(store, cpus=8.0, stalled=("udf",), used=8e9 - 10 * MB, limit=8e9))
    result = runner.apply(obs, {"udf.workers": 4, "read.workers": 3, "prefetch.buffer_mb": 200})
    assert result.applied == {"read.workers": 3, "prefetch.buffer_mb": 74}


def test_a_knob_that_refuses_its_value_goes_to_on_error_or_raises():
    knobs, store = dict_knobs(SPEC)

    def refuse(v):
        raise RuntimeError("engine closing")

    knobs["read.workers"]._set = refuse
    runner = Runner(knobs)
    obs = runner.observe(_obs(store, cpus=8.0))
    errors = []
    result = runner.apply(obs, {"read.workers": 3, "udf.workers": 3}, on_error=lambda n, v, e: errors.append((n, v)))
    assert result.applied == {"udf.workers": 3} and errors == [("read.workers", 3)]
    with pytest.raises(RuntimeError, match="engine closing"):
        runner.apply(obs, {"read.workers": 4})


def test_the_live_tuner_and_run_episode_go_through_the_same_runner(monkeypatch):
    """Both paths call ``Runner.observe`` and ``Runner.clamp``: no second way to apply a request."""
    import intune.policies.runner as runner_mod
    from intune.policies import make
    from intune.sim import Simulator, run_episode

    calls = {"observe": 0, "clamp": 0}
    observe, clamp = runner_mod.Runner.observe, runner_mod.Runner.clamp

    def counted_observe(self, obs):
        calls["observe"] += 1
        return observe(self, obs)

    def counted_clamp(self, obs, request):
        calls["clamp"] += 1
        return clamp(self, obs, request)

    monkeypatch.setattr(runner_mod.Runner, "observe", counted_observe)
    monkeypatch.setattr(runner_mod.Runner, "clamp", counted_clamp)
    run_episode(Simulator("criteo", cpus=8, seed=0), make("heuristic"), 5)
    assert calls["observe"] == 6 and calls["clamp"] >= 1  # reset + 5 ticks; the heuristic asks once

    import itertools
    import time

    import numpy as np

    import intune

    def slow(chunk):
        time.sleep(0.002)
        return chunk

    calls.update(observe=0, clamp=0)
    pipe = intune.Pipeline.from_iterable({"x": np.arange(64)} for _ in itertools.count()).map(slow, workers=1)
    with intune.tune(pipe, "heuristic", tick_s=0.05) as tuner:
        for _ in tuner:
            if len(tuner.history()) >= 3:
                break
    assert calls["observe"] >= 3 and calls["clamp"] >= 3
