"""Imitation of the oracle (DAgger): labels that match a hand computation, and a short run that learns."""

import numpy as np
import pytest
import torch

from _knobs import dict_knobs, kind_of
from intune.agent.config import AgentConfig
from intune.agent.dqn import new_network
from intune.agent.evaluate import score_episode
from intune.agent.imitation import DaggerPolicy, imitate
from intune.agent.policy import IntunePolicy
from intune.agent.teacher import action_regrets, knob_cost, label_weights, teacher_choice
from intune.monitor.observation import Observation, StageObservation
from intune.policies.safety import SafetyLayer
from intune.sim.episode import run_episode
from intune.sim.simulator import Simulator
from intune.sim.spec import spec_from_dict

MB = 1 << 20
DELTAS = (-5, -1, 0, 1, 5)

# read is cheap, the UDF costs 7x more: the even split (4 + 4 of 8 CPUs) starves on the UDF
TINY = spec_from_dict({
    "name": "tiny",
    "stages": [{"name": "read", "cpu_us_per_row": 1.0}, {"name": "udf", "mode": "process", "cpu_us_per_row": 7.0}],
    "machine": {"cpus": 8, "memory_limit_gb": 64, "base_memory_gb": 1, "oversubscription_cost": 0.3},
})


def _obs(values, cpus):
    stages = tuple(StageObservation(s, values[f"{s}.workers"], 0, 10.0, 1e4, 0.01, 0.01, MB, 0.5, 0.2, 0.3, 0.5, 0.0,
                                    kind=kind_of(s)) for s in ("read", "udf"))
    return Observation(1, 1.0, 1e4, 0.0, cpus, 1e9, 64e9, stages)


def test_the_teacher_moves_each_knob_toward_the_target_within_the_free_cpus():
    # 2 + 2 workers on 16 CPUs, target 3 + 12: the udf's +5 lands closest (7 of 12), the reader's +1 (3)
    knobs, store = dict_knobs({"read.workers": ("cpu", 1, 64, 2), "udf.workers": ("cpu", 1, 64, 2)})
    safety = SafetyLayer(list(knobs.values()), DELTAS, 0.85)
    obs = _obs(store, 16.0)
    values = [2, 2]
    label = teacher_choice(safety, obs, values, {"read.workers": 3, "udf.workers": 12}, safety.mask(obs, values))
    assert [DELTAS[a] for a in label] == [1, 5]
    # on 4 CPUs (0 free), moving a worker from the reader to the udf is the closest the CPUs allow
    obs = _obs(store, 4.0)
    label = teacher_choice(safety, obs, values, {"read.workers": 1, "udf.workers": 12}, safety.mask(obs, values))
    assert [DELTAS[a] for a in label] == [-1, 1]
    # at the target: hold
    label = teacher_choice(safety, obs, values, {"read.workers": 2, "udf.workers": 2}, safety.mask(obs, values))
    assert [DELTAS[a] for a in label] == [0, 0]


def test_a_label_weighs_the_throughput_its_knob_loses_if_it_stays():
    # throughput 1000 - (a - 5)^2 - 40 * max(0, 10 - b): the target a=5, b=10 makes 1000
    def throughput_of(alloc):
        return 1000.0 - (alloc["a"] - 5) ** 2 - 40.0 * max(0, 10 - alloc["b"])

    target = {"a": 5, "b": 10}
    # a at 7 alone loses 4/1000 = 0.004 -> 0.004 / 0.02 = 0.2; b at its target weighs the floor
    assert label_weights(throughput_of, target, ["a", "b"], [7, 10], 0.02, 0.05) == pytest.approx([0.2, 0.05])
    # b at 9 alone loses 40/1000 = 0.04, past the full-weight loss: 1; a at 6 loses 0.001 -> 0.05 (the floor)
    assert label_weights(throughput_of, target, ["a", "b"], [6, 9], 0.02, 0.05) == pytest.approx([0.05, 1.0])
    # more workers than the target that cost nothing weigh the floor too
    assert label_weights(throughput_of, target, ["a", "b"], [5, 20], 0.02, 0.05) == pytest.approx([0.05, 0.05])


def test_each_action_is_priced_at_what_its_knob_costs_where_it_lands_less_the_cheapest():
    # udf's 1 worker is below a target of 2: +1 lands on it (0), hold costs 0.3, -1 is not allowed;
    # read at its target of 3: -1 costs 0.8, hold and +1 nothing
    knobs, _ = dict_knobs({"read.workers": ("cpu", 1, 64, 3), "udf.workers": ("cpu", 1, 64, 1)})
    safety = SafetyLayer(list(knobs.values()), DELTAS)
    obs = Observation(1, 1.0, 1.0, 0.0, 8.0, 1e9, 1e10, tuple(
        StageObservation(n, w, 0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, kind=kind_of(n))
        for n, w in (("read", 3), ("udf", 1))))
    target = {"read.workers": 3, "udf.workers": 2}
    prices = {("read.workers", 2): 0.8, ("udf.workers", 1): 0.3}

    def cost(name, value):
        return prices.get((name, value), 0.0)

    mask = np.array([[False, True, True, True, False], [False, False, True, True, False]])
    regret = action_regrets(safety, obs, [3, 1], target, mask, cost)
    assert regret.ravel().tolist() == pytest.approx([0.0, 0.8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0])


def test_far_from_its_target_each_action_is_priced_by_how_much_more_it_loses_than_the_best():
    # a reader whose throughput grows with its workers up to a target of 128, now at 10 of 32 CPUs:
    # every landing loses far past the full-weight loss (0.02), yet +5 (15) loses the least; each other
    # action loses 4/128 to 10/128 more, 1.56 to 3.9 full weights: capped at 1
    knobs, _ = dict_knobs({"read.workers": ("cpu", 1, 256, 10)})
    safety = SafetyLayer(list(knobs.values()), DELTAS)
    obs = Observation(1, 1.0, 1.0, 0.0, 32.0, 1e9, 1e10, (
        StageObservation("read", 10, 0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, kind="read"),))
    target = {"read.workers": 128}
    cost = knob_cost(lambda alloc: float(alloc["read.workers"]), target, 0.02)
    mask = np.ones((1, len(DELTAS)), dtype=bool)
    assert action_regrets(safety, obs, [10], target, mask, cost).ravel().tolist() == pytest.approx([1, 1, 1, 1, 0])
    # near the target the differences stay below the cap: at 126, +5 (131, past the target) loses
    # nothing, +1 (127) loses 1/128 (0.39 of the full weight), hold 2/128 (0.78), -1 3/128 (capped)
    regret = action_regrets(safety, obs, [126], target, mask, cost).ravel().tolist()
    assert regret == pytest.approx([1, 1, 2 / 128 / 0.02, 1 / 128 / 0.02, 0])


def test_a_label_that_sheds_workers_weighs_the_cpus_they_hold_past_the_target():
    # a flat optimum: no allocation loses throughput; a's workers compute (1 CPU each), b's wait (0.1 each)
    def throughput_of(alloc):
        return 1000.0

    def held_cpus_of(alloc):
        return 1.0 * alloc["a"] + 0.1 * alloc["b"]

    target = {"a": 2, "b": 2}
    # on 8 CPUs, a's 4 past the target hold 4 / 8 = 0.5 of them -> 0.5 / 0.5 = 1; b's 4 hold 0.05 -> 0.1
    assert label_weights(throughput_of, target, ["a", "b"], [6, 6], 0.02, 0.05, held_cpus_of, 8.0, 0.5) == \
        pytest.approx([1.0, 0.1])
    # one past the target: 1 / 8 / 0.5 = 0.25; below the target holds nothing more: the floor
    assert label_weights(throughput_of, target, ["a", "b"], [3, 1], 0.02, 0.05, held_cpus_of, 8.0, 0.5) == \
        pytest.approx([0.25, 0.05])
    # without the held CPUs (or a full weight of 0), only the throughput counts: the floor
    assert label_weights(throughput_of, target, ["a", "b"], [6, 6], 0.02, 0.05) == pytest.approx([0.05, 0.05])
    assert label_weights(throughput_of, target, ["a", "b"], [6, 6], 0.02, 0.05, held_cpus_of, 8.0, 0.0) == \
        pytest.approx([0.05, 0.05])
    with pytest.raises(ValueError, match="imitation_full_weight_held_cpus"):
        AgentConfig(imitation_full_weight_held_cpus=-1.0)


def test_dagger_labels_every_state_the_learner_reaches_with_an_allowed_action():
    config = AgentConfig()
    rng = np.random.default_rng(0)
    policy = DaggerPolicy(IntunePolicy(network=new_network(config), config=config, online=False), 0.0, rng, 0.0)
    run_episode(Simulator(TINY, cpus=8, seed=0), policy, 30)
    assert len(policy.states) == 29  # every tick but the start
    for _rows, valid, mask, label, weight, regret in policy.states:
        assert valid.sum() == 2 and mask[np.arange(len(label)), label].all()
        assert ((weight[:2] >= 0.05) & (weight[:2] <= 1)).all() and (weight[2:] == 0).all()
        assert (regret == 0).all()  # the regret term is off by default: nothing priced


def test_a_short_imitation_learns_to_feed_the_udf():
    torch.set_num_threads(1)
    torch.manual_seed(0)  # seeded initial weights: from some draws this short imitation learns to starve the udf
    config = AgentConfig(seed=1, imitation_rounds=3, imitation_episodes=6, imitation_ticks=40, imitation_epochs=20)
    q, log = imitate(config, lambda rng: Simulator(TINY, cpus=8, seed=int(rng.integers(1 << 30))), new_network(config),
                     log=lambda _: None)
    sim = Simulator(TINY, cpus=8, seed=99)
    optimum = sim.optimum(8)[1]
    even = sim.true_throughput({"read.workers": 4, "udf.workers": 4})
    assert even < 0.6 * optimum  # the start is poor
    score = score_episode(sim, IntunePolicy(network=q, config=config, online=False), ticks=40, seed=1)
    assert sim.true_throughput() > 1.5 * even and score.ratio > 0.8 and score.ooms == 0
    assert log.states[-1] > log.states[0]


# the UDF (process workers) may run on 2 remote nodes of 4 CPUs; the trainer needs 3x what its 4 CPUs make
REMOTE = spec_from_dict({
    "name": "tiny-remote",
    "batch_size": 1000,
    "chunk_rows": 1000,
    "bytes_per_row": 1000,
    "machine": {"cpus": 4, "memory_limit_gb": 16, "host_memory_gb": 64, "base_memory_gb": 1},
    "consumer": {"model_latency_s": 1000 / 450_000},
    "stages": [
        {"name": "read", "kind": "read", "cpu_us_per_row": 2.0},
        {"name": "udf", "kind": "udf", "mode": "process", "cpu_us_per_row": 20.0,
         "remote": {"nodes": 2, "cpus_per_node": 4, "bandwidth_mb_s": 1000.0, "latency_ms": 1.0}},
        {"name": "prefetch", "kind": "prefetch", "cpu_us_per_row": 1.0},
    ],
})


def test_beside_a_remote_pool_the_teacher_targets_the_local_optimum_beside_the_remote_workers_running():
    from intune.sim.oracle import search_optimum

    config = AgentConfig()
    sim = Simulator(REMOTE, cpus=4, seed=0)
    policy = DaggerPolicy(IntunePolicy(network=new_network(config), config=config, online=False), 0.0,
                          np.random.default_rng(0), 0.0)
    seen = set()

    def check(obs, applied):
        remote = sim.knobs["udf.remote_workers"].value
        target = policy._target(obs)
        assert "udf.remote_workers" not in target or target["udf.remote_workers"] == remote
        assert target == search_optimum(sim, int(obs.cpus), "reward", policy.teacher.margins,
                                        remote_workers=remote)[0]
        seen.add(remote)

    run_episode(sim, policy, 60, on_tick=check)
    assert len(seen) > 1  # the sizing rule moved the remote workers, and the target followed them
    # the more remote workers run, the fewer local ones the udf needs
    few, many = (search_optimum(sim, 4, "throughput", remote_workers=r)[0] for r in (0, 8))
    assert many["udf.workers"] < few["udf.workers"]


def test_on_the_teachers_ticks_the_remote_sizing_rule_still_sizes_the_remote_workers():
    config = AgentConfig()
    policy = DaggerPolicy(IntunePolicy(network=new_network(config), config=config, online=False), 1.0,
                          np.random.default_rng(0), 0.0)
    result = run_episode(Simulator(REMOTE, cpus=4, seed=0), policy, 60)
    assert result.knobs["udf.remote_workers"][-1] > 0  # the trainer needs 3x what 4 CPUs make: workers were added
    assert len(policy.states) == 59 and all(valid.sum() == 3 for _r, valid, *_ in policy.states)  # local knobs only


def test_where_the_limits_admit_one_step_the_teacher_gives_it_to_the_knob_that_lifts_throughput_now():
    # 2 + 2 workers, one CPU free, the target 3 + 3: both steps land as close, only one fits; the udf
    # (7x the reader's cost per row) is the bottleneck, so its step is the one that pays now
    knobs, store = dict_knobs({"read.workers": ("cpu", 1, 64, 2), "udf.workers": ("cpu", 1, 64, 2)})
    safety = SafetyLayer(list(knobs.values()), DELTAS, 0.85)
    obs = _obs(store, 5.0)
    values = [2, 2]

    def throughput_of(alloc):
        return min(alloc["read.workers"] * 1e6, alloc["udf.workers"] * 1e6 / 7)

    target = {"read.workers": 3, "udf.workers": 3}
    mask = safety.mask(obs, values)
    assert [DELTAS[a] for a in teacher_choice(safety, obs, values, target, mask, throughput_of)] == [0, 1]
    # the reader as the bottleneck: its step goes first
    def reader_bound(alloc):
        return min(alloc["read.workers"] * 1e6 / 7, alloc["udf.workers"] * 1e6)

    assert [DELTAS[a] for a in teacher_choice(safety, obs, values, target, mask, reader_bound)] == [1, 0]
