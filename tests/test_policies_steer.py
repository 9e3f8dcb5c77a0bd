"""The steer policy: each rule on a small pipeline, the proposal it acts on, no OOM under tight memory,
and a live run. Each rule of ``steer_rules.RULES`` has a test here that fails without it."""

import time
from pathlib import Path

import numpy as np
import pytest

from _knobs import dict_knobs, kind_of
from intune.monitor.observation import Observation, StageObservation
from intune.policies import clamp_request, make
from intune.policies.steer import SteerConfig, SteerPolicy

MB = 1 << 20
DOWN5, DOWN1, HOLD, UP1 = 0, 1, 2, 3  # indices into the deltas (-5, -1, 0, +1, +5)
FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"


def fixed(cpu=HOLD, mb=HOLD):
    """A proposer that always asks one action of the two CPU knobs and one of the two buffer knobs."""
    return lambda obs, values, mask: np.array([cpu, cpu, mb, mb])


def per_knob(actions, hold=0):
    """A proposer that holds for ``hold`` ticks, then asks ``actions`` (by knob position; the rest hold)."""
    left = [hold]

    def propose(obs, values, mask):
        left[0] -= 1
        return np.array([HOLD if left[0] >= 0 else a for a in actions] + [HOLD] * (len(values) - len(actions)))

    return propose


def _stage(name, workers, buffer_mb, busy, starved):
    return StageObservation(name, workers, buffer_mb, 10.0, 2560.0, 0.01, 0.02, 1 * MB, busy, starved, 0.0, 0.5, 0.0, kind=kind_of(name))


def _obs(store, tick, throughput, memory_used=300 * MB, limit=8192 * MB, cpus=4.0, slack=0.0):
    stages = (
        _stage("read", store["read.workers"], 0, 1.0, 0.0),  # the bottleneck: busy all the time
        _stage("udf", store["udf.workers"], 0, 0.4, 0.6),
        _stage("shuffle", 0, store["shuffle.buffer_mb"], 0.1, 0.9),
        _stage("prefetch", 0, store["prefetch.buffer_mb"], 0.0, 1.0),
    )
    return Observation(tick, 1.0, throughput, 0.0, cpus, memory_used, limit, stages, cpu_slack=slack)


def _knobs():
    return dict_knobs({
        "read.workers": ("cpu", 1, 8, 2),
        "udf.workers": ("cpu", 1, 8, 2),
        "shuffle.buffer_mb": ("mb", 1, 4096, 64),
        "prefetch.buffer_mb": ("mb", 1, 4096, 64),
    })


def _run(propose, rate, ticks=20, config=None, **obs):
    """Run the policy from the even split; ``rate(store)`` is the throughput of the allocation in force."""
    knobs, store = _knobs()
    policy = SteerPolicy(propose, config=config)
    o = _obs(store, 0, rate(store), **obs)
    policy.reset(knobs, o)
    seen = []
    for tick in range(1, ticks + 1):
        store.update(policy.step(o))
        seen.append(dict(store))
        o = _obs(store, tick, rate(store), **obs)
    return seen, policy


def test_registered_and_holding_by_default():
    policy = make("steer")
    assert isinstance(policy, SteerPolicy) and policy.propose is None
    assert SteerConfig().action_deltas == (-5, -1, 0, 1, 5)


def test_a_hold_gets_a_probe_of_the_bottleneck_which_stays_when_better():  # probe_neck
    seen, policy = _run(None, lambda s: 10_000.0 * s["read.workers"])  # 4 CPUs, 4 workers: none free
    reads = [s["read.workers"] for s in seen]
    assert reads[0] == 2 and max(reads) == 3  # a worker moved from udf (least busy) to read (busiest)
    assert seen[-1]["read.workers"] == 3 and seen[-1]["udf.workers"] == 1
    assert policy.probes >= 1


def test_a_probe_that_measures_worse_is_stepped_back_and_not_tried_again():  # step_back_to_best
    seen, policy = _run(None, lambda s: 20_000.0 if s["read.workers"] == 2 else 12_000.0, ticks=30)
    reads = [s["read.workers"] for s in seen]
    assert 3 in reads and reads[-1] == 2  # tried, then back to the better vector
    assert policy.reverts >= 1
    assert policy.probes == 1  # the probed vector stays remembered: no second try


def _saturated(store, tick, throughput):
    """2 CPUs, nothing free: 2 light readers (0.05 CPU each) and 2 busy CPU-bound UDF workers."""
    stages = (
        StageObservation("read", store["read.workers"], 0, 10.0, 2560.0, 0.01, 0.2, MB, 1.0, 0.0, 0.0, 0.5, 0.0, kind="read"),
        StageObservation("udf", store["udf.workers"], 0, 10.0, 2560.0, 0.19, 0.2, MB, 0.9, 0.1, 0.0, 0.5, 0.0, kind="map"),
        StageObservation("shuffle", 0, store["shuffle.buffer_mb"], 10.0, 2560.0, 0.0, 0.0, MB, 0.1, 0.9, 0.0, 0.5, 0.0, kind="shuffle"),
        StageObservation("prefetch", 0, store["prefetch.buffer_mb"], 10.0, 2560.0, 0.0, 0.0, MB, 0.0, 1.0, 0.0, 0.5, 0.0, kind="prefetch"),
    )
    slack = round(sum(max(0.0, s.workers - s.cpu_s_per_item * s.items_per_s) for s in stages if s.workers))
    return Observation(tick, 1.0, throughput, 0.0, 2.0, 300 * MB, 8192 * MB, stages, cpu_slack=slack, grants_light_workers=True)


def _run_saturated(rate, ticks):
    knobs, store = _knobs()
    policy = SteerPolicy()
    policy.reset(knobs, _saturated(store, 0, rate(store)))
    seen = []
    for tick in range(1, ticks + 1):
        store.update(policy.step(_saturated(store, tick, rate(store))))
        seen.append((store["read.workers"], store["udf.workers"]))
    return seen, policy


def test_on_a_saturated_machine_a_light_stage_is_probed_past_the_cpus_and_kept_when_better():
    seen, policy = _run_saturated(lambda s: 10_000.0 * min(s["read.workers"], 3), ticks=20)
    assert seen[0] == (1, 1)  # the even split of 2 CPUs; no CPU is free after it (free_cpus 0)
    assert (2, 1) in seen and (3, 1) in seen  # one reader more each probe, with no worker taken from udf
    assert seen[-1][0] >= 3 and all(u >= 1 for _, u in seen)


def test_a_light_probe_that_does_not_pay_is_undone():  # undo_unpaid_trial
    # more readers change nothing: each probe is undone, and the vector is not tried again
    seen, policy = _run_saturated(lambda s: 10_000.0, ticks=40)
    assert (2, 1) in seen and seen[-1] == (1, 1)
    assert seen.count((2, 1)) <= 3 and policy.reverts >= 1 and "undo_unpaid_trial" in policy.rule_ticks


def test_dwell_spaces_the_proposed_moves():  # hold_to_settle
    # 4 CPUs, but the workers leave 6 CPUs' worth unused (they wait): room to grow
    seen, _ = _run(fixed(cpu=UP1), lambda s: 1000.0 * s["read.workers"], ticks=7,
                   config=SteerConfig(probe_after=0, fill_free_cpus=0), slack=6.0)
    assert [s["read.workers"] for s in seen] == [2, 3, 3, 4, 4, 5, 5]  # start tick, then a move every other tick


def test_a_proposed_move_to_a_vector_measured_clearly_worse_is_held():  # hold_off_worse
    knobs, store = _knobs()
    policy = SteerPolicy(per_knob([HOLD, DOWN1]), warm_start="none")  # udf 2 -> 1
    policy.reset(knobs, _obs(store, 0, 20_000.0))
    for workers, rate in (((2, 1), 5_000.0), ((2, 1), 5_000.0), ((2, 2), 20_000.0)):
        policy.memory.observe(4.0, workers, rate)
    assert policy.step(_obs(store, 1, 20_000.0)) == {}
    assert policy.guard_holds == 1 and policy.last_rules == ("hold_off_worse",)


def test_a_proposal_exploring_a_new_vector_goes_through_instead_of_a_probe():  # let_proposal_explore
    # the proposal holds until a probe is due (``probe_after`` ticks), then takes a udf worker: a vector
    # not measured yet, which goes through as asked (the probe would have moved it to read)
    seen, policy = _run(per_knob([HOLD, DOWN1], hold=5), lambda s: 10_000.0 * s["read.workers"], ticks=7)
    assert [(s["read.workers"], s["udf.workers"]) for s in seen[5:]] == [(2, 2), (2, 1)]
    assert policy.probes == 0 and policy.rule_ticks["let_proposal_explore"] == 1


def test_a_forbidden_proposal_becomes_a_hold_and_scores_are_resolved_jointly():
    knobs, store = _knobs()
    # +5 workers on both stages with no CPU free: the mask allows neither, the proposal is held
    policy = SteerPolicy(fixed(cpu=4), config=SteerConfig(probe_after=0), warm_start="none")
    policy.reset(knobs, _obs(store, 0, 1.0))
    assert policy.step(_obs(store, 1, 1.0)) == {}
    # Q-values: read +1 and udf -1 preferred; the CPU budget allows them only together
    q = np.zeros((4, 5))
    q[:, HOLD] = 0.5
    q[0, UP1], q[1, DOWN1] = 1.0, 0.6
    policy = SteerPolicy(lambda obs, values, mask: q, config=SteerConfig(probe_after=0), warm_start="none")
    policy.reset(knobs, _obs(store, 0, 1.0))
    assert policy.step(_obs(store, 1, 1.0)) == {"read.workers": 3, "udf.workers": 1}


def test_the_shuffle_buffer_keeps_the_users_size_while_prefetch_may_shrink():
    seen, policy = _run(fixed(mb=DOWN5), lambda s: 10_000.0, ticks=10, config=SteerConfig(probe_after=0))
    assert all(s["shuffle.buffer_mb"] == 64 for s in seen)
    assert seen[-1]["prefetch.buffer_mb"] < 64 and policy.rule_ticks["hard_limits"] >= 1


def test_memory_pressure_still_cuts_the_shuffle_buffer():
    # 900 MB used of 1 GB: past the margin, buffers must shrink whatever the floor
    seen, _ = _run(None, lambda s: 10_000.0, ticks=3, config=SteerConfig(probe_after=0), memory_used=900 * MB, limit=1024 * MB)
    assert seen[-1]["shuffle.buffer_mb"] < 64


def test_under_a_tight_limit_the_proposal_may_shrink_the_shuffle_buffer():
    # 600 MB used of 1 GB, buffers full would take ~700 MB: below the margin (no trim) but not comfortable
    seen, _ = _run(fixed(mb=DOWN5), lambda s: 10_000.0, ticks=4, config=SteerConfig(probe_after=0), memory_used=600 * MB, limit=1024 * MB)
    assert seen[-1]["shuffle.buffer_mb"] < 64


def test_buffer_growth_the_proposal_asks_for_goes_through():
    seen, _ = _run(fixed(mb=UP1), lambda s: 10_000.0, ticks=6, config=SteerConfig(probe_after=0))
    assert seen[-1]["prefetch.buffer_mb"] > 64 and seen[-1]["shuffle.buffer_mb"] > 64


def _idle_obs(store, tick, throughput):
    """16 CPUs; after the even split (8 / 8) nothing is free, so the tests free CPUs by hand."""
    return _obs(store, tick, throughput, cpus=16.0)


def test_idle_cpus_go_to_the_busiest_stage_unless_remembered_worse():  # fill_idle_cpus
    knobs, store = _knobs()
    policy = SteerPolicy(config=SteerConfig(probe_after=0))
    policy.reset(knobs, _idle_obs(store, 0, 10_000.0))
    store.update(policy.step(_idle_obs(store, 1, 10_000.0)))  # the start: the even split
    store.update({"read.workers": 2, "udf.workers": 2})  # 12 CPUs idle
    store.update(policy.step(_idle_obs(store, 2, 20_000.0)))
    assert store["read.workers"] == 7 and store["udf.workers"] == 2  # +5 on read, the busiest
    assert policy.last_rules == ("fill_idle_cpus",)
    # a vector measured clearly worse is not filled into: from 2 workers again, one step instead of five
    for workers, rate in [((7, 2), 5_000.0), ((7, 2), 5_000.0), ((2, 2), 30_000.0), ((2, 2), 30_000.0)]:
        policy.memory.observe(16.0, workers, rate)
    store.update({"read.workers": 2})
    store.update(policy.step(_idle_obs(store, 3, 30_000.0)))
    assert store["read.workers"] == 3


def test_idle_cpus_stay_idle_when_no_stage_is_busy():
    knobs, store = _knobs()

    def obs(tick):  # every stage mostly waits: the consumer is the limit, more workers would not help
        stages = tuple(
            StageObservation(s.name, s.workers, s.buffer_mb, 10.0, 2560.0, 0.01, 0.02, MB, 0.3, 0.0, 0.7, 1.0, 0.0, kind=kind_of(s.name))
            for s in _obs(store, tick, 1.0).stages
        )
        return Observation(tick, 1.0, 10_000.0, 0.0, 16.0, 300 * MB, 8192 * MB, stages)

    policy = SteerPolicy(config=SteerConfig(probe_after=0))
    policy.reset(knobs, obs(0))
    store.update(policy.step(obs(1)))
    store.update({"read.workers": 2, "udf.workers": 2})
    for tick in range(2, 6):
        store.update(policy.step(obs(tick)))
    assert (store["read.workers"], store["udf.workers"]) == (2, 2)


def test_idle_cpus_are_filled_one_by_one_without_the_plus_five_action():
    knobs, store = _knobs()
    config = SteerConfig(probe_after=0, action_deltas=(-1, 0, 1))
    policy = SteerPolicy(fixed(cpu=1, mb=1), config=config)  # index 1 of (-1, 0, 1): hold
    policy.reset(knobs, _idle_obs(store, 0, 10_000.0))
    store.update(policy.step(_idle_obs(store, 1, 10_000.0)))
    store.update({"read.workers": 2, "udf.workers": 2})
    store.update(policy.step(_idle_obs(store, 2, 20_000.0)))
    assert store["read.workers"] == 3


@pytest.mark.parametrize(("proposer", "read_busy", "added"), [(True, 0.9, 1), (True, 1.0, 5), (False, 0.9, 5)])
def test_behind_a_proposer_idle_cpus_go_five_at_a_time_only_to_a_saturated_stage(proposer, read_busy, added):
    # a proposer cuts a stage to what its load needs; +5 at busy 0.9 would give the cut back every time
    knobs, store = _knobs()

    def busy(s):
        return {"read": read_busy, "udf": 0.5}

    policy = SteerPolicy(fixed() if proposer else None, config=SteerConfig(probe_after=0))
    policy.reset(knobs, _busy_obs(store, 0, 10_000.0, busy, 16.0))
    store.update(policy.step(_busy_obs(store, 1, 10_000.0, busy, 16.0)))  # the start: the even split
    store.update({"read.workers": 2, "udf.workers": 2})  # 12 CPUs idle
    store.update(policy.step(_busy_obs(store, 2, 20_000.0, busy, 16.0)))
    assert (store["read.workers"], store["udf.workers"]) == (2 + added, 2)
    assert policy.last_rules == ("fill_idle_cpus",)


def _busy_obs(store, tick, throughput, busy, cpus):
    """read and udf stages with the given busy shares (the rest of the tick starved)."""
    stages = tuple(
        StageObservation(name, store[f"{name}.workers"], 0, 10.0, 2560.0, 0.01, 0.02, MB, b, 1.0 - b, 0.0, 0.5, 0.0, kind=kind_of(name))
        for name, b in busy(store).items()
    ) + (
        _stage("shuffle", 0, store["shuffle.buffer_mb"], 0.1, 0.9),
        _stage("prefetch", 0, store["prefetch.buffer_mb"], 0.0, 1.0),
    )
    return Observation(tick, 1.0, throughput, 0.0, cpus, 300 * MB, 8192 * MB, stages)


def _run_busy(propose, rate, busy, start, cpus, ticks):
    """From ``start`` workers (no warm start), with the runner's clamp (over-allocated: only decreases pass)."""
    knobs, store = _knobs()
    store.update(start)
    policy = SteerPolicy(propose, warm_start="none")
    policy.reset(knobs, _busy_obs(store, 0, rate(store), busy, cpus))
    seen = []
    for tick in range(1, ticks + 1):
        request = policy.step(_busy_obs(store, tick, rate(store), busy, cpus))
        store.update(clamp_request(knobs, request, cpus, 8 << 30).applied)
        seen.append((store["read.workers"], store["udf.workers"]))
    return seen, policy


def _read_neck(store):
    """read is the bottleneck (busy all the tick); udf's workers share what read delivers."""
    return {"read": 1.0, "udf": min(1.0, 0.6 * store["read.workers"] / store["udf.workers"])}


def test_idle_workers_move_to_a_busy_bottleneck_without_waiting_for_a_probe():  # swap_idle_to_neck
    # 8 CPUs, none free: read 2 (busy), udf 6 at 0.2 busy = 4.8 idle workers
    seen, policy = _run_busy(None, lambda s: 10_000.0 * s["read.workers"], _read_neck, {"read.workers": 2, "udf.workers": 6}, 8.0, 12)
    assert seen[:2] == [(2, 6), (3, 5)]  # right after the dwell, not after ``probe_after`` ticks of holding
    assert seen[-1][0] >= 4 and sum(seen[-1]) == 8
    assert policy.swaps >= 2


def test_a_swap_that_measures_clearly_worse_is_undone_and_not_tried_again():  # undo_unpaid_trial
    rate = lambda s: 20_000.0 if s["read.workers"] == 2 else 12_000.0  # noqa: E731 - read's busy share misleads
    seen, policy = _run_busy(None, rate, _read_neck, {"read.workers": 2, "udf.workers": 6}, 8.0, 30)
    assert seen[1] == (3, 5) and seen[-1] == (2, 6)
    assert policy.swaps == 1 and policy.reverts >= 1


def test_over_allocated_a_swap_the_runner_cannot_grant_does_not_shed_a_reader_every_tick():  # shed_idle_workers
    # 4 CPUs, 6 workers (after a shrink). The proposal moves a reader to udf every tick; the runner
    # refuses the increase and applies the decrease. Once fewer readers are measured clearly worse, the
    # memory stops the moves away from the better vector; the policy sheds udf's idle worker instead,
    # and once under the CPUs moves one to read
    propose = per_knob([DOWN1, UP1], hold=3)  # read -1, udf +1, after 3 ticks in place
    seen, policy = _run_busy(propose, lambda s: 10_000.0 * s["read.workers"], _read_neck, {"read.workers": 3, "udf.workers": 3}, 4.0, 20)
    assert min(r for r, _ in seen) >= 2
    assert seen[-1] == (3, 1) and policy.sheds >= 1


def test_over_allocated_idle_workers_are_shed_five_at_a_time_so_the_bottleneck_can_grow():  # shed_idle_workers
    # 4 CPUs after a shrink: 1 reader (the bottleneck) and 7 udf workers at 0.09 busy (6.4 idle)
    seen, policy = _run_busy(None, lambda s: 10_000.0 * s["read.workers"], _read_neck, {"read.workers": 1, "udf.workers": 7}, 4.0, 12)
    assert seen[0] == (1, 2)  # -5 at once
    assert policy.sheds == 1 and seen[-1] == (2, 2)  # then a reader on the CPU that freed


def test_a_proposal_cannot_take_a_worker_off_the_busy_bottleneck_nor_spend_it():  # keep_neck_workers
    # 6 CPUs, none free: read (busy all the tick) is the bottleneck. The proposal moves a reader to udf
    # every tick: the -1 is held unless the memory knows the result to be better, and the +1 it paid for
    # is held too (the runner would refuse it), so the workers stay and no tick counts as a new vector
    seen, policy = _run_busy(per_knob([DOWN1, UP1]), lambda s: 10_000.0 * s["read.workers"], _read_neck,
                             {"read.workers": 3, "udf.workers": 3}, 6.0, 10)
    assert all(r >= 3 for r, _ in seen) and all(r + u <= 6 for r, u in seen)
    assert policy.neck_holds >= 5


def test_a_co_bottleneck_keeps_its_workers_unless_one_goes_to_the_bottleneck():  # keep_neck_workers
    def co_neck(s):  # read (busy all the tick) is the bottleneck and udf, at 0.95, nearly one too
        return {"read": 1.0, "udf": 0.95}

    rate = lambda s: 10_000.0 * min(s["read.workers"], s["udf.workers"])  # noqa: E731
    # the proposal takes a udf worker and gives it to no one: held (until a probe, after ``probe_after``)
    seen, policy = _run_busy(per_knob([HOLD, DOWN1]), rate, co_neck, {"read.workers": 3, "udf.workers": 3}, 6.0, 5)
    assert all(u == 3 for _, u in seen) and policy.neck_holds >= 3
    # the proposal moves a udf worker to the bottleneck: it goes through
    seen, policy = _run_busy(per_knob([UP1, DOWN1]), rate, co_neck, {"read.workers": 3, "udf.workers": 3}, 6.0, 2)
    assert seen[0] == (4, 2) and policy.neck_holds == 0


def _remembering(propose, readings):
    """A policy at read 2 / udf 2 on 4 CPUs (none free, no busy bottleneck) that remembers ``readings``."""
    knobs, store = _knobs()
    busy = lambda s: {"read": 0.8, "udf": 0.6}  # noqa: E731 - no busy bottleneck: no swap, no neck hold
    policy = SteerPolicy(propose, warm_start="none")
    policy.reset(knobs, _busy_obs(store, 0, 30_000.0, busy, 4.0))
    for workers, rate in readings:
        policy.memory.observe(4.0, workers, rate)
    return policy, _busy_obs(store, 1, 30_000.0, busy, 4.0)


def test_over_allocated_readings_do_not_stop_a_step_back_to_a_better_vector_within_the_cpus():  # step_back_to_best
    # remembered: 3 / 3 (45k, 6 workers: read while over-allocated after a shrink, never granted again)
    # and 3 / 1 (35k, within the CPUs). A step towards 3 / 3 needs a free CPU and never comes; the policy
    # steps back to 3 / 1 instead
    policy, obs = _remembering(None, [((3, 3), 45_000.0), ((3, 3), 45_000.0), ((3, 1), 35_000.0), ((3, 1), 35_000.0), ((2, 2), 30_000.0)])
    assert policy.step(obs) == {"read.workers": 3, "udf.workers": 1} and policy.reverts == 1
    assert policy.last_rules == ("step_back_to_best",)


def test_a_move_held_for_leading_away_from_a_better_vector_does_not_leave_the_increase_it_paid_for():  # hold_toward_best
    # remembered better: 3 / 2 (over-allocated). The proposal moves a worker from udf to read: udf's -1
    # leads away from 3 / 2 and is held, so read's +1 has no CPU to use and is held too (the runner would
    # refuse it, and the policy would count a move that never happened)
    policy, obs = _remembering(per_knob([UP1, DOWN1]), [((3, 2), 40_000.0), ((3, 2), 40_000.0), ((2, 2), 30_000.0)])
    assert not {"read.workers", "udf.workers"} & set(policy.step(obs))
    assert "hold_toward_best" in policy.last_rules


def test_never_ooms_on_tight_memory_random_episodes():
    from intune.agent.config import AgentConfig
    from intune.agent.env import random_sim
    from intune.sim import run_episode

    class Greedy:  # grows every knob every tick: shows that the episodes are tight
        name = "greedy"

        def reset(self, knobs, obs):
            self.knobs = knobs

        def step(self, obs):
            return {n: k.value + (5 if k.unit == "cpu" else 64) for n, k in self.knobs.items()}

    rng = np.random.default_rng(0)
    ooms = {"steer": 0, "greedy": 0}
    for _ in range(24):
        sim = random_sim(rng, AgentConfig(tight_memory_probability=1.0), ticks=60)
        for policy in (SteerPolicy(), Greedy()):
            ooms[policy.name] += run_episode(sim, policy, 60).oom_count
    assert ooms["steer"] == 0 and ooms["greedy"] > 0, ooms


def test_steer_on_the_live_engine():
    engine = pytest.importorskip("intune.pipeline.engine")
    from intune.monitor import Monitor
    from intune.tuner import tune

    def chunks():
        for i in range(150):
            yield {"id": np.arange(i * 200, (i + 1) * 200)}

    def udf(chunk):
        time.sleep(0.002)  # an I/O-like wait, and CPU work
        start = time.thread_time()
        while time.thread_time() - start < 0.001:
            pass
        return {"id": chunk["id"]}

    pipe = engine.Pipeline.from_iterable(chunks).map(udf, name="udf").batch(100).prefetch(depth=2, buffer_mb=8)
    # the real monitor on a fixture cgroup tree: 8 CPUs, 4 GiB used of 16 GiB (this box has 2 CPUs)
    monitor = Monitor(root=FIXTURES / "v2-unlimited", affinity=set(range(8)))
    with tune(pipe, "steer", tick_s=0.02, monitor=monitor) as tuner:
        ids = sorted(int(i) for batch in tuner for i in batch["id"])
    assert ids == list(range(150 * 200))
    rows = tuner.history()
    assert rows and tuner.failures == {}, tuner.failures
    assert max(row["knobs"]["udf.workers"] for row in rows) > 1
