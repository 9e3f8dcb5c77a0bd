"""autotune: tf.data's AUTOTUNE as a policy, on hand-built observations."""

import pytest

from _knobs import dict_knobs, kind_of
from intune.monitor.observation import Observation, StageObservation
from intune.policies import clamp_request, make
from intune.policies.autotune import LegacyPrefetchAutotuner, RamBudget, share_pool

MB = 1 << 20


_knobs = dict_knobs


def _stage(name, wall, items=100.0, cpu=None, size=1 * MB, fill=0.0, rows_per_item=1000):
    return StageObservation(name=name, workers=1, buffer_mb=0, items_per_s=items, rows_per_s=items * rows_per_item,
                            cpu_s_per_item=wall if cpu is None else cpu, wall_s_per_item=wall, bytes_per_item=size,
                            busy=1.0, starved=0.0, blocked=0.0, queue_fill=fill, buffered_bytes=0.0,
                            kind=kind_of(name))


def _obs(tick, stages, cpus=8.0, host_free=1e12, oom=False, used=1e9, limit=1e12, throughput=None):
    return Observation(tick=tick, dt_s=1.0, throughput=1e5 if throughput is None else throughput, step_time_s=0.0,
                       cpus=cpus, memory_used_bytes=used, memory_limit_bytes=limit, stages=tuple(stages),
                       oom=oom, host_memory_free_bytes=host_free)


def _run(policy, knobs, store, observations):
    """Reset on the first observation, then step and apply through the runner's clamp, as run_episode does."""
    policy.reset(knobs, observations[0])
    for obs in observations:
        req = policy.step(obs)
        store.update(clamp_request(knobs, req, obs.cpus, 1e15).applied)


PIPE = {
    "read.workers": ("cpu", 1, 64, 1),
    "udf.workers": ("cpu", 1, 64, 1),
    "prefetch.workers": ("cpu", 1, 64, 1),
    "prefetch.buffer_mb": ("mb", 1, 4096, 1),
}


def _pipe_stages(fill=0.0):
    return [_stage("read", 0.01), _stage("udf", 0.04), _stage("prefetch", 0.001, fill=fill)]


def test_replans_after_10ms_doubling_to_once_a_minute():
    knobs, store = _knobs(PIPE)
    p = make("autotune")
    p.reset(knobs, _obs(0, _pipe_stages()))
    ticks = []
    for t in range(150):
        before = p.optimizations
        store.update(clamp_request(knobs, p.step(_obs(t, _pipe_stages())), 8, 1e15).applied)
        if p.optimizations > before:
            ticks.append(t)
    # optimisations due at 0, .02, .06, ..., 1.26, 2.54, 5.10, 10.22, 20.46, 40.94, 81.9, 141.9 s
    assert ticks == [0, 1, 2, 3, 6, 11, 21, 41, 82, 142]


def test_ignores_cpus_added_after_launch_unless_adaptive():
    observations = [_obs(t, _pipe_stages(), cpus=4.0 if t < 10 else 16.0) for t in range(120)]
    knobs, store = _knobs(PIPE)
    fixed = make("autotune")
    _run(fixed, knobs, store, observations)
    workers = {k: v for k, v in store.items() if k.endswith("workers")}
    assert fixed.launches == 1 and fixed.pool_size == 4
    assert sum(workers.values()) <= 4 and max(fixed.plan.parallelism.values()) <= 4
    assert workers["udf.workers"] == max(workers.values())  # the stage with the most wall time per element

    knobs, store = _knobs(PIPE)
    adaptive = make("autotune-adaptive")
    _run(adaptive, knobs, store, observations)
    assert adaptive.launches == 2 and adaptive.pool_size == 16
    assert sum(v for k, v in store.items() if k.endswith("workers")) == 16
    assert max(adaptive.plan.parallelism.values()) == 16


def test_ram_budget_stops_growth_and_is_blind_to_the_cgroup_limit():
    spec = {"read.workers": ("cpu", 1, 16, 1), "udf.workers": ("cpu", 1, 16, 1), "udf.buffer_mb": ("mb", 1, 4096, 1)}
    knobs, store = _knobs(spec)
    stages = [_stage("read", 0.01, size=10 * MB), _stage("udf", 0.04, size=10 * MB)]
    # host: 200 MB free -> budget 100 MB; the cgroup allows only 150 MB and 100 MB are used already
    observations = [_obs(t, stages, cpus=16.0, host_free=200 * MB, used=100 * MB, limit=150 * MB) for t in range(3)]
    p = make("autotune")
    _run(p, knobs, store, observations)
    par = p.plan.parallelism
    # growth stops at the first step whose buffers (parallelism x 10 MB) exceed 100 MB
    assert sum(par.values()) == 11 and max(par.values()) < 16
    assert p.plan.max_buffered_bytes == pytest.approx(110 * MB)
    assert store["udf.buffer_mb"] == 10 * par["udf"]  # parallelism elements of 10 MB each
    # blind to the cgroup: 100 MB used + 110 MB of buffers is over the 150 MB limit
    assert 100 * MB + p.plan.max_buffered_bytes > 150 * MB


def test_legacy_prefetch_autotuner_doubles_on_empty_never_shrinks_and_respects_its_grant():
    ram = RamBudget(100)
    t = LegacyPrefetchAutotuner(ram)
    t.set_element_size(10)
    assert (t.buffer_limit, ram.legacy_prefetch) == (1, 10)
    t.record_consumption(0)  # upswing: empty does not count until the buffer was full
    assert t.buffer_limit == 1
    for limit in (2, 4, 8):
        t.record_consumption(limit // 2)  # reached the limit: downswing
        t.record_consumption(1)  # not empty yet
        assert t.buffer_limit == limit // 2
        t.record_consumption(0)  # the consumer found it empty: double
        assert t.buffer_limit == limit
    assert ram.legacy_prefetch == 80
    t.record_consumption(8)
    t.record_consumption(0)  # doubling to 16 needs 80 more bytes, only 20 left: refused
    assert t.buffer_limit == 8 and ram.legacy_prefetch == 80 and t.mode == "upswing"
    big = LegacyPrefetchAutotuner(RamBudget(1e9))
    big.set_element_size(1)
    big.buffer_limit = 2048
    big.record_consumption(2048)
    big.record_consumption(0)
    assert big.buffer_limit == 4096  # linear past the threshold: +2048


def test_policy_prefetch_buffer_follows_the_legacy_autotuner():
    knobs, store = _knobs(PIPE)
    p = make("autotune")
    sizes = []
    observations = [_obs(0, _pipe_stages(fill=0.0))]
    p.reset(knobs, observations[0])
    for t, fill in enumerate([0.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 1.0]):
        req = p.step(_obs(t, _pipe_stages(fill=fill)))
        store.update(clamp_request(knobs, req, 8, 1e15).applied)
        sizes.append(store["prefetch.buffer_mb"])
    # 1 MB elements: limit 1, full -> downswing, empty -> 2, full, half, empty -> 4, empty (upswing) stays
    assert sizes == [1, 1, 2, 2, 2, 4, 4, 4]


def test_share_pool_by_hand():
    assert share_pool(8, [1.0, 3.0], [8, 8], [1, 1]) == [2, 6]  # proportional to thread demand
    assert share_pool(8, [1.0, 3.0], [8, 4], [1, 1]) == [2, 4]  # stage 2 capped: the pipeline stops there
    assert share_pool(4, [0.1, 10.0], [4, 4], [1, 1]) == [1, 3]
    assert share_pool(3, [0.0, 1.0, 1.0], [3, 3, 3], [1, 1, 1]) == [1, 1, 1]  # no room beyond the minimums
    assert share_pool(5, [0.0, 1.0], [5, 5], [1, 1]) == [1, 4]  # no measured demand: the minimum


def test_self_time_is_wall_time_so_gil_waits_count_as_work():
    # same CPU per element, but udf's workers wait on the GIL: 4x the wall time
    stages = [_stage("read", 0.01, cpu=0.01), _stage("udf", 0.04, cpu=0.01)]
    knobs, store = _knobs({"read.workers": ("cpu", 1, 64, 1), "udf.workers": ("cpu", 1, 64, 1)})
    _run(make("autotune"), knobs, store, [_obs(t, stages, cpus=10.0) for t in range(3)])
    assert (store["read.workers"], store["udf.workers"]) == (2, 8)


def test_relaunches_when_the_job_comes_back_from_an_oom():
    knobs, store = _knobs(PIPE)
    p = make("autotune")
    obs = [_obs(0, _pipe_stages()), _obs(1, _pipe_stages(), oom=True), _obs(2, _pipe_stages(), throughput=0.0),
           _obs(3, _pipe_stages(), cpus=16.0)]
    _run(p, knobs, store, obs)
    assert p.launches == 2 and p.pool_size == 16  # a restarted process sees the machine as it is now


def test_dedicated_pool_maps_parallelism_to_workers():
    knobs, store = _knobs({"read.workers": ("cpu", 1, 64, 1), "udf.workers": ("cpu", 1, 64, 1)})
    p = make("autotune", pool="dedicated")
    _run(p, knobs, store, [_obs(t, [_stage("read", 0.01), _stage("udf", 0.04)], cpus=6.0) for t in range(2)])
    assert p.plan.workers == {"read": 6, "udf": 6}  # the runner's clamp then keeps the total to 6 CPUs
    with pytest.raises(ValueError, match="pool"):
        make("autotune", pool="bogus")


def test_shuffle_window_is_neither_tuned_nor_counted():
    # the live engine's shuffle stage: no workers, its buffer_mb is the shuffle window (256 MB of 10 MB rows)
    spec = {"read.workers": ("cpu", 1, 16, 1), "shuffle.buffer_mb": ("mb", 1, 4096, 256), "udf.workers": ("cpu", 1, 16, 1)}
    knobs, store = _knobs(spec)
    stages = [_stage("read", 0.01, size=10 * MB), _stage("shuffle", 0.001, size=10 * MB), _stage("udf", 0.04, size=10 * MB)]
    p = make("autotune")
    _run(p, knobs, store, [_obs(t, stages, cpus=16.0, host_free=200 * MB) for t in range(3)])
    assert store["shuffle.buffer_mb"] == 256
    assert set(p.plan.parallelism) == {"read", "udf"}
    assert p.plan.max_buffered_bytes == pytest.approx(110 * MB)  # as without the shuffle: 2560 MB unseen


def test_trainer_pauses_in_front_of_a_slower_pipeline_double_the_prefetch_until_the_grant_runs_out():
    knobs, store = _knobs(PIPE)
    p = make("autotune")
    demand = 2e5  # rows/s the trainer would take; the pipeline delivers 1e5: the consumer is starved

    def obs(t, fill, throughput):
        o = _obs(t, _pipe_stages(fill=fill), throughput=throughput, host_free=64 * MB)  # 32 MB budget
        return Observation(**{**o.__dict__, "demand": demand})

    ticks = [obs(0, 0.0, 1e5)]
    for cycle in range(8):  # a 2-tick pause (nothing taken, the buffer fills), then 3 starved ticks
        t = 1 + 5 * cycle
        ticks += [obs(t, 0.5, 0.0), obs(t + 1, 1.0, 0.0)]
        ticks += [obs(t + k, 0.05, 1e5) for k in (2, 3, 4)]
    sizes = []
    p.reset(knobs, ticks[0])
    for o in ticks:
        store.update(clamp_request(knobs, p.step(o), o.cpus, 1e15).applied)
        sizes.append(store["prefetch.buffer_mb"])
    limits = sorted(set(sizes))
    assert limits[:4] == [1, 2, 4, 8]  # doubled after each pause
    # the RAM grant (32 MB, less the model's parallel buffers) stops it; it never shrank
    assert max(sizes) < 32 and sizes == sorted(sizes)
    assert p.ram.legacy_prefetch + p.ram.model <= p.ram.total + 1


def test_no_prefetch_growth_when_the_pipeline_keeps_up():
    knobs, store = _knobs(PIPE)
    p = make("autotune")
    ticks = [Observation(**{**_obs(t, _pipe_stages(fill=0.9)).__dict__, "demand": 1e5}) for t in range(30)]
    _run(p, knobs, store, ticks)  # throughput 1e5 = demand, the buffer stays nearly full
    assert store["prefetch.buffer_mb"] == 1
