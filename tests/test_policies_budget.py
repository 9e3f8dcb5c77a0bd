"""Every baseline plans on the CPU budget the runner grants every policy: CPUs plus measured slack."""

from _knobs import dict_knobs
from intune.monitor.observation import Observation, StageObservation
from intune.policies import make
from intune.policies.base import cpu_budget

SPEC = {
    "read.workers": ("cpu", 1, 16, 1),
    "udf.workers": ("cpu", 1, 16, 1),
    "batch.workers": ("cpu", 1, 16, 1),
}


def stage(name, cpu_s_per_item, wall_s_per_item, items_per_s=10.0):
    return StageObservation(
        name=name, workers=1, buffer_mb=0, items_per_s=items_per_s, rows_per_s=items_per_s * 1000,
        cpu_s_per_item=cpu_s_per_item, wall_s_per_item=wall_s_per_item, bytes_per_item=1e6,
        busy=cpu_s_per_item * items_per_s, starved=0.0, blocked=0.0, queue_fill=0.5, buffered_bytes=1e6,
    )


def obs(cpus, slack, tick=0):
    stages = (stage("read", 0.005, 0.09), stage("udf", 0.09, 0.095), stage("batch", 0.001, 0.002))
    return Observation(tick=tick, dt_s=1.0, throughput=10_000.0, step_time_s=0.0, cpus=cpus,
                       memory_used_bytes=1e9, memory_limit_bytes=8e9, stages=stages, cpu_slack=slack)


def test_the_budget_is_cpus_plus_slack():
    knobs, _ = dict_knobs(SPEC)
    assert cpu_budget(obs(2, 2.0), knobs) == 4.0
    assert cpu_budget(obs(2, -1.0), knobs) == 2.0


def test_a_stage_no_knob_sizes_keeps_the_cpu_it_uses_out_of_the_budget():
    """``cpu_slack`` counts every stage's unused CPU; a stage without a ``workers`` knob (here ``batch``, one
    thread) must then have its worker taken off, else its idle share is granted to the others and the
    knob workers within the budget put ``free_cpus`` below 0: two CPU budgets that disagree."""
    spec = {k: v for k, v in SPEC.items() if k != "batch.workers"}
    knobs, _ = dict_knobs(spec)
    o = obs(2, 3.0)
    assert cpu_budget(o, knobs) == 4.0  # 2 CPUs + 3 slack, less batch's one worker
    assert o.free_cpus == cpu_budget(o, knobs) - sum(s.workers for s in o.stages if s.name != "batch")


def test_the_even_split_divides_the_runners_budget():
    knobs, _ = dict_knobs(SPEC)
    p = make("heuristic")
    p.reset(knobs, obs(2, 3.0))
    assert p.step(obs(2, 3.0)) == {"read.workers": 2, "udf.workers": 2}  # 5 over 3 stages: 2, 2, 1


def test_plumber_plans_workers_past_the_bare_cpus():
    knobs, store = dict_knobs(SPEC)
    p = make("plumber", profile_ticks=2)
    first = obs(2, 2.0)
    p.reset(knobs, first)
    request = {}
    for tick in range(6):
        request.update(p.step(obs(2, 2.0, tick)))
    total = sum(request.get(k, store[k]) for k in SPEC)
    assert total == 4  # the runner's budget; on the bare 2 CPUs it could not leave 1/1/1
    assert request["read.workers"] == 2  # the waiting reader first: both bottlenecks at 11 chunks/s


def test_autotunes_thread_pool_is_the_runners_budget():
    knobs, _ = dict_knobs(SPEC)
    p = make("autotune")
    p.reset(knobs, obs(2, 2.0))
    assert p.pool_size == 4
