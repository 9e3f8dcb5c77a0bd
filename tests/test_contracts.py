"""The shared contracts: Knob bounds, the runner's clamp, even split, the reward."""

import pytest

from _knobs import dict_knobs
from intune.knobs import Knob
from intune.monitor.observation import OOM_PENALTY, Observation, memory_factor, reward
from intune.policies import clamp_request, even_split, make


def _knobs(**spec):
    return dict_knobs(spec)


def test_knob_set_validates_and_names_range():
    knobs, store = _knobs(**{"udf.workers": ("cpu", 1, 8, 1)})
    knobs["udf.workers"].set(3)
    assert store["udf.workers"] == 3 and knobs["udf.workers"].value == 3
    with pytest.raises(ValueError, match=r"udf.workers.*\[1, 8\]"):
        knobs["udf.workers"].set(9)
    with pytest.raises(ValueError, match="integer"):
        knobs["udf.workers"].set(2.5)
    assert knobs["udf.workers"].stage == "udf" and knobs["udf.workers"].setting == "workers"


def test_knob_rejects_bad_definition():
    with pytest.raises(ValueError, match="unit"):
        Knob("a.workers", "gpu", 1, 2, get=lambda: 1, set=lambda v: None)
    with pytest.raises(ValueError, match="min <= max"):
        Knob("a.workers", "cpu", 3, 2, get=lambda: 1, set=lambda v: None)


def test_clamp_respects_bounds_cpus_and_memory():
    knobs, _ = _knobs(
        **{
            "read.workers": ("cpu", 1, 16, 1),
            "udf.workers": ("cpu", 1, 16, 1),
            "prefetch.buffer_mb": ("mb", 1, 1024, 8),
        }
    )
    # 4 CPUs: 2 already used, so only 2 more workers can be granted, in request order
    r = clamp_request(knobs, {"read.workers": 2, "udf.workers": 5}, cpus=4, memory_free_bytes=1 << 30)
    assert r.applied == {"read.workers": 2, "udf.workers": 2}
    assert r.clipped == {"udf.workers": (5, 2)}
    # a decrease frees CPUs for an increase in the same request
    r = clamp_request(knobs, {"read.workers": 1, "udf.workers": 3}, cpus=4, memory_free_bytes=0)
    assert r.applied == {"udf.workers": 3}
    # buffers grow only by free memory (10 MB free -> 8 + 10)
    r = clamp_request(knobs, {"prefetch.buffer_mb": 500}, cpus=4, memory_free_bytes=10 * (1 << 20))
    assert r.applied == {"prefetch.buffer_mb": 18}
    with pytest.raises(ValueError, match="unknown knob"):
        clamp_request(knobs, {"nope.workers": 1}, cpus=4, memory_free_bytes=0)


def test_clamp_grants_a_light_knob_one_worker_past_the_cpus():
    knobs, _ = _knobs(**{"read.workers": ("cpu", 1, 16, 2), "udf.workers": ("cpu", 1, 16, 2)})
    light = ["read.workers"]
    # 4 CPUs, all held: a light knob gets one worker past them, however many it asks for
    r = clamp_request(knobs, {"read.workers": 5}, cpus=4, memory_free_bytes=0, light=light)
    assert r.applied == {"read.workers": 3}
    # a knob that is not light gets nothing past the CPUs, and the extra worker is one in all
    assert clamp_request(knobs, {"udf.workers": 3}, cpus=4, memory_free_bytes=0, light=light).applied == {}
    both = ["read.workers", "udf.workers"]
    r = clamp_request(knobs, {"udf.workers": 4, "read.workers": 4}, cpus=5, memory_free_bytes=0, light=both)
    assert r.applied == {"read.workers": 4}  # one within the CPUs, one past them; none left for udf
    # already past the CPUs (they shrank): nothing more, light or not
    assert clamp_request(knobs, {"read.workers": 3}, cpus=3, memory_free_bytes=0, light=light).applied == {}


def test_the_light_worker_is_granted_jointly_whatever_the_knobs_order():
    # one CPU free and two co-bottleneck stages asking +1 each, the reader light: both are granted (the
    # reader's worker past the CPUs, the UDF's within them), whichever knob comes first
    for order in (("read.workers", "udf.workers"), ("udf.workers", "read.workers")):
        knobs, _ = _knobs(**{name: ("cpu", 1, 16, 1) for name in order})
        r = clamp_request(knobs, {"read.workers": 2, "udf.workers": 2}, cpus=3, memory_free_bytes=0,
                          light=["read.workers"])
        assert r.applied == {"read.workers": 2, "udf.workers": 2}, order
    # the light worker is one in all, and only a light knob's increase opens it
    knobs, _ = _knobs(**{"read.workers": ("cpu", 1, 16, 1), "udf.workers": ("cpu", 1, 16, 1)})
    r = clamp_request(knobs, {"read.workers": 2, "udf.workers": 3}, cpus=3, memory_free_bytes=0, light=["read.workers"])
    assert r.applied == {"read.workers": 2, "udf.workers": 2}
    assert clamp_request(knobs, {"udf.workers": 3}, cpus=3, memory_free_bytes=0, light=["read.workers"]).applied == {
        "udf.workers": 2}


def test_clamp_counts_remote_workers_against_the_cluster_not_this_machine():
    knobs, _ = _knobs(
        **{
            "udf.workers": ("cpu", 1, 16, 2),
            "udf.remote_workers": ("cpu", 0, 64, 0),
        }
    )
    assert knobs["udf.remote_workers"].remote and not knobs["udf.workers"].remote
    # 2 local CPUs all held: the remote pool grows to the cluster's 3 CPUs, the local one not at all
    r = clamp_request(knobs, {"udf.workers": 4, "udf.remote_workers": 5}, cpus=2, memory_free_bytes=0, remote_cpus=3)
    assert r.applied == {"udf.remote_workers": 3}
    # no cluster: no remote worker, however many local CPUs are free
    assert clamp_request(knobs, {"udf.remote_workers": 2}, cpus=16, memory_free_bytes=0).applied == {}
    # even split leaves the remote knob alone
    assert even_split(knobs, 4) == {"udf.workers": 4}


def test_light_stages_are_those_waiting_on_something_else_than_the_cpus():
    from intune.monitor.observation import StageObservation

    def stage(name, workers, cpu_s, wall_s):
        return StageObservation(name, workers, 0, 10.0, 1000.0, cpu_s, wall_s, 1.0, 1.0, 0.0, 0.0, 0.5, 0.0)

    def light(*stages, grants=True):
        return Observation(1, 1.0, 1e4, 0.0, 2.0, 0.0, 0.0, stages, grants_light_workers=grants).light_stages()

    # the reader spends 4 ms of CPU per 40 ms read (share 0.1); the UDF 90 of 100 (0.9): 0.1 <= 0.25 x 0.9
    reader, udf, idle = stage("read", 4, 0.004, 0.04), stage("udf", 2, 0.09, 0.1), stage("batch", 1, 0.0, 0.0)
    assert light(reader, udf, idle) == ("read",)
    assert idle.cpu_share is None and reader.cpu_share == pytest.approx(0.1)
    # on one CPU shared by many workers every share falls alike: the UDF (0.18) is not light, the reader is
    assert light(stage("read", 4, 0.004, 0.2), stage("udf", 4, 0.09, 0.5)) == ("read",)
    assert light(reader, udf, grants=False) == ()  # the simulator's runner grants nothing past the CPUs


def test_even_split_hands_out_remainder_first():
    knobs, _ = _knobs(**{f"s{i}.workers": ("cpu", 1, 64, 1) for i in range(3)}, **{"p.buffer_mb": ("mb", 1, 64, 4)})
    assert even_split(knobs, 8) == {"s0.workers": 3, "s1.workers": 3, "s2.workers": 2}
    assert even_split(knobs, 2) == {"s0.workers": 1, "s1.workers": 1, "s2.workers": 1}


def test_reward_memory_factor_and_oom():
    base = dict(tick=0, dt_s=1.0, throughput=100.0, step_time_s=0.0, cpus=2, stages=())
    assert reward(Observation(memory_used_bytes=10, memory_limit_bytes=100, **base), scale=50) == 2.0
    assert memory_factor(0.925) == pytest.approx(0.5)
    assert reward(Observation(memory_used_bytes=100, memory_limit_bytes=100, **base), scale=50) == 0.0
    assert reward(Observation(memory_used_bytes=1, memory_limit_bytes=100, oom=True, **base), scale=50) == OOM_PENALTY


def test_unknown_policy_names_choices():
    with pytest.raises(ValueError, match="heuristic"):
        make("nonsense")


def test_cli_help_lists_command_options(capsys):
    from intune.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "sim", "--help"])
    assert done.value.code == 0
    assert "--json" in capsys.readouterr().out
