"""The safety layer: joint CPU budget, memory margin, and zero OOMs under random exploration."""

import dataclasses

import numpy as np

from _knobs import kind_of
from intune.agent.config import AgentConfig
from intune.agent.env import random_sim
from intune.knobs import Knob
from intune.monitor.observation import Observation, StageObservation
from intune.policies.safety import SafetyLayer
from intune.units import MB

DELTAS = (-5, -1, 0, 1, 5)
GB = 1 << 30


def _knobs(values: dict[str, int]) -> list[Knob]:
    out = []
    for name in values:
        unit = "cpu" if name.endswith(".workers") else "mb"
        out.append(Knob(name, unit, 1, 4096, get=lambda n=name: values[n], set=lambda v, n=name: values.__setitem__(n, v)))
    return out


def _obs(values: dict[str, int], cpus: float, used_gb: float, limit_gb: float, bytes_per_item: float = 0.5 * MB,
         buffered: dict[str, float] | None = None, modes: dict[str, str] | None = None) -> Observation:
    """``modes``: stage -> how its workers run; a stage not named does not say (priced as processes)."""
    stages = []
    for stage in sorted({n.split(".")[0] for n in values}):
        extra = {"mode": modes[stage]} if modes and stage in modes else {}
        stages.append(StageObservation(stage, values.get(f"{stage}.workers", 0), values.get(f"{stage}.buffer_mb", 0),
                                       10.0, 1e4, 0.01, 0.01, bytes_per_item, 0.5, 0.2, 0.3, 0.5,
                                       (buffered or {}).get(stage, 0.0), kind=kind_of(stage), **extra))
    return Observation(1, 1.0, 1e4, 0.0, cpus, used_gb * GB, limit_gb * GB, tuple(stages))


def test_near_the_ceiling_one_low_reading_does_not_let_workers_grow():
    # a base past the margin, memory read at 96 GB of 100 for 20 ticks, then one reading 5% low (noise):
    # the settled estimate of those readings stays near 96 GB, so no worker is added; a layer that saw
    # only the low reading would add one (91 GB + its noise + a probe's 0.5 GB is under the 97 GB ceiling)
    values = {"a.workers": 1, "b.workers": 1}
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    up = np.array(DELTAS) > 0
    for _ in range(20):
        safety.mask(_obs(values, cpus=64, used_gb=96.0, limit_gb=100.0))
    low = _obs(values, cpus=64, used_gb=91.0, limit_gb=100.0)
    assert not safety.mask(low)[:, up].any()
    assert safety.settled_memory(low) > 95.5 * GB
    assert SafetyLayer(_knobs(values), DELTAS, margin=0.8).mask(low)[:, up].any()


def test_simultaneous_increases_share_the_free_cpus_by_preference():
    values = {"a.workers": 2, "b.workers": 2, "c.workers": 2}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS)
    obs = _obs(values, cpus=7, used_gb=1, limit_gb=100)  # one free CPU; each stage could give up one
    mask = safety.mask(obs)
    assert not mask[:, 4].any()  # +5 never fits: 1 free + 2 from the others
    assert mask[:, 3].all()
    scores = np.full((3, 5), -10.0)  # decreasing anything is costly here
    scores[:, 2] = 0.0
    scores[0, 3], scores[1, 3], scores[2, 3] = 1.0, 3.0, 2.0  # all want +1; b wants it most
    moves = safety.moves(safety.select(scores, mask, obs), obs)
    assert moves.tolist() == [0, 1, 0]


def test_select_plans_the_light_worker_the_runner_grants():
    # one free CPU; the reader waits on storage (light), the UDF computes; both want +1. The runner grants
    # both (the reader's worker past the CPUs), so the plan holds both, not the one it could fit alone
    values = {"read.workers": 1, "udf.workers": 1}
    safety = SafetyLayer(_knobs(values), DELTAS)
    obs = dataclasses.replace(_obs(values, cpus=3, used_gb=1, limit_gb=100), grants_light_workers=True)
    reader = dataclasses.replace(obs.stage("read"), cpu_s_per_item=0.001, wall_s_per_item=0.01)
    obs = dataclasses.replace(obs, stages=(reader, obs.stage("udf")))
    assert obs.light_stages() == ("read",)
    mask = safety.mask(obs)
    scores = np.full((2, 5), -10.0)
    scores[:, 2] = 0.0
    scores[:, 3] = [1.0, 2.0]
    assert safety.moves(safety.select(scores, mask, obs), obs).tolist() == [1, 1]
    # without a light stage, one worker in all: the UDF's, which is preferred
    plain = dataclasses.replace(obs, grants_light_workers=False)
    assert safety.moves(safety.select(scores, safety.mask(plain), plain), plain).tolist() == [0, 1]


def test_a_worker_moves_from_a_stage_with_slack_to_the_bottleneck_in_one_tick():
    values = {"a.workers": 6, "b.workers": 2}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS)
    obs = _obs(values, cpus=8, used_gb=1, limit_gb=100)  # no free CPU
    mask = safety.mask(obs)
    assert mask[1, 3] and mask[1, 4]  # b may grow if a gives up workers
    scores = np.zeros((2, 5))
    scores[0] = [-3.0, -0.1, 0.0, -1.0, -1.0]  # a: slack, losing one worker costs little
    scores[1] = [-2.0, -1.0, 0.0, 1.0, 1.5]  # b: the bottleneck
    moves = safety.moves(safety.select(scores, mask, obs), obs)
    assert moves.tolist() == [-1, 1]  # -5/+5 would cost a 3.0 for b's extra 0.5
    rng = np.random.default_rng(0)
    for _ in range(200):  # whatever the preferences, no net growth without a free CPU
        assert safety.moves(safety.select(rng.normal(size=(2, 5)), mask, obs), obs).sum() <= 0


def test_past_the_memory_margin_buffers_must_shrink_and_nothing_grows():
    values = {"a.workers": 2, "a.buffer_mb": 100, "b.workers": 2}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS, margin=0.85)
    obs = _obs(values, cpus=64, used_gb=9.0, limit_gb=10.0)
    mask = safety.mask(obs)
    up = np.array(DELTAS) > 0
    assert not mask[:, up].any()
    assert mask[1].tolist() == [True, True, False, False, False]  # the buffer: only -5 or -1


def test_behind_a_base_past_the_margin_measured_workers_still_grow_one_at_a_time():
    # 84 GB of 100 used outside any buffer (past the 0.8 margin), three stages whose workers measure 50 MB
    # each: three +1s would fit under the ceiling at their measured price, but the memory reading's noise
    # there (2% of 84 GB) is far above a worker, so one worker is added a tick, the most preferred
    values = {"a.workers": 2, "b.workers": 2, "c.workers": 2}
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    obs = _obs(values, cpus=64, used_gb=84.0, limit_gb=100.0)
    obs = dataclasses.replace(obs, stages=tuple(dataclasses.replace(s, worker_bytes=50 * MB) for s in obs.stages))
    mask = safety.mask(obs)
    assert mask[:, 3].all()
    scores = np.zeros((3, 5))
    scores[:, 3], scores[:, 4] = [1.0, 3.0, 2.0], [0.5, 4.0, 1.0]  # b prefers +5
    assert safety.moves(safety.select(scores, mask, obs), obs).tolist() == [0, 1, 0]
    # with room under the margin, the same preferences all apply
    roomy = _obs(values, cpus=64, used_gb=10.0, limit_gb=100.0)
    roomy = dataclasses.replace(roomy, stages=tuple(dataclasses.replace(s, worker_bytes=50 * MB) for s in roomy.stages))
    assert safety.moves(safety.select(scores, safety.mask(roomy), roomy), roomy).tolist() == [1, 5, 1]


def test_a_base_past_the_margin_still_lets_workers_grow_a_step_under_the_ceiling():
    # 84 GB of a 100 GB limit used outside any buffer: no buffer cut reaches the 0.8 margin, so workers may
    # still grow (each priced at most PROBE_WORKER_BYTES until measured) while under WORKER_CEILING (0.97);
    # the buffer still may only shrink
    values = {"a.workers": 1, "a.buffer_mb": 1, "b.workers": 1}
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    up = np.array(DELTAS) > 0
    mask = safety.mask(_obs(values, cpus=64, used_gb=84.0, limit_gb=100.0))
    assert mask[0].tolist() == [False, False, True, True, False]  # +1 only: +5 is priced 5 x 42 GB until measured
    assert mask[2].tolist() == [False, False, True, True, False]
    assert not mask[1, up].any()  # the buffer
    # at the ceiling nothing grows, and neither after an OOM
    assert not SafetyLayer(_knobs(values), DELTAS, margin=0.8).mask(_obs(values, cpus=64, used_gb=96.8, limit_gb=100.0))[:, up].any()
    oom = _obs(values, cpus=64, used_gb=84.0, limit_gb=100.0)
    oom = Observation(oom.tick, oom.dt_s, oom.throughput, oom.step_time_s, oom.cpus, oom.memory_used_bytes,
                      oom.memory_limit_bytes, oom.stages, oom=True)
    assert not SafetyLayer(_knobs(values), DELTAS, margin=0.8).mask(oom)[:, up].any()
    # memory past the margin because a buffer holds it is not that case: the buffer must shrink first
    held = {"a.workers": 1, "a.buffer_mb": 20 * 1024, "b.workers": 1}
    mask = SafetyLayer(_knobs(held), DELTAS, margin=0.8).mask(
        _obs(held, cpus=64, used_gb=84.0, limit_gb=100.0, buffered={"a": 20.0 * GB}))
    assert not mask[:, up].any()


def test_buffer_steps_are_one_item_and_respect_the_memory_budget():
    values = {"a.workers": 1, "a.buffer_mb": 40}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS, margin=0.5)
    obs = _obs(values, cpus=4, used_gb=4.97, limit_gb=10.0, bytes_per_item=8 * MB)  # 8 MB items
    assert safety.units(obs).tolist() == [1, 8]
    mask = safety.mask(obs)
    # 40 MB room is left to the margin (buffer counted full): +1 item (8 MB) fits, +5 items (40 MB) does too, barely
    budget = safety.memory_budget(obs, [1, 40])
    assert mask[1, 3] == (8 * MB <= budget) and mask[1, 4] == (40 * MB <= budget)


def test_random_exploration_through_the_mask_never_ooms_on_tight_memory():
    """Random scores on tight-memory simulated pipelines: the safety layer alone must prevent every OOM."""
    config = AgentConfig(tight_memory_probability=1.0)
    rng = np.random.default_rng(123)
    ooms = 0
    grew_past_cpus = 0
    for _ in range(12):
        sim = random_sim(rng, config, ticks=60)
        knobs = list(sim.knobs.values())
        safety = SafetyLayer(knobs, DELTAS, config.memory_margin)
        obs = sim.reset()
        for _ in range(60):
            values = [k.value for k in knobs]
            before = sum(v for k, v in zip(knobs, values, strict=True) if k.unit == "cpu")
            mask = safety.mask(obs, values)
            moves = safety.moves(safety.select(rng.random(mask.shape), mask, obs, values), obs)
            for k, v, d in zip(knobs, values, moves, strict=True):
                if d:
                    k.set(int(v + d))
            after = sum(k.value for k in knobs if k.unit == "cpu")
            grew_past_cpus += after > before and after > obs.cpus + obs.cpu_slack
            obs = sim.step()
            ooms += obs.oom
    assert grew_past_cpus == 0
    assert ooms == 0


def test_buffers_that_cannot_fit_when_full_are_cut_in_one_tick_largest_most():
    """1 GiB limit, margin 0.85 (870.4 MB), 307.2 MB used outside the buffers, buffers of 1536 + 512 MB:
    1484.8 MB too much, so 1485 MB go, shared in proportion to the MB above the minimum (1 MB)."""
    values = {"read.workers": 2, "shuffle.buffer_mb": 1536, "prefetch.buffer_mb": 512}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS, margin=0.85)
    obs = _obs(values, cpus=2, used_gb=0.3, limit_gb=1.0)  # nothing buffered yet: the shuffle is still filling
    trimmed = safety.trim(obs, list(values.values())).tolist()
    # keep = 2046 - 1485 = 561 MB above minimums: 1535*561/2046 -> 420, 511*561/2046 -> 140
    assert trimmed == [2, 421, 141]
    assert 307.2 + 421 + 141 <= 0.85 * 1024
    assert safety.trim(obs, [2, 421, 141]).tolist() == [2, 421, 141]  # what fits stays
    assert safety.trim(_obs(values, cpus=2, used_gb=0.3, limit_gb=4.0), [2, 1536, 512]).tolist() == [2, 1536, 512]


def test_memory_past_the_margin_cuts_buffers_even_when_their_knobs_would_fit():
    values = {"a.workers": 2, "a.buffer_mb": 100, "b.buffer_mb": 1}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS, margin=0.85)
    # 921.6 MB used, a's 100 MB buffer full: its knob fits (821.6 + 100 = 921.6 when full), but the
    # projection (b's 1 MB too) is 52.2 MB past the margin (870.4 MB): 53 MB go, all from a (b is at its minimum)
    obs = _obs(values, cpus=4, used_gb=0.9, limit_gb=1.0, buffered={"a": 100 * MB})
    assert safety.trim(obs, [2, 100, 1]).tolist() == [2, 47, 1]  # 99 - 53 = 46 MB above the minimum


def test_buffer_steps_grow_with_the_buffer():
    values = {"a.workers": 1, "a.buffer_mb": 1536, "b.buffer_mb": 64}
    safety = SafetyLayer(_knobs(values), DELTAS)
    assert safety.units(_obs(values, cpus=4, used_gb=1, limit_gb=10, bytes_per_item=2 * MB)).tolist() == [1, 96, 4]


def test_the_cpu_budget_choice_is_the_best_joint_choice_within_the_budget():
    """Against brute force over every joint action (up to 4 knobs): the best summed score whose net added
    workers fit the budget, whether the knobs' own best actions fit (the shortcut) or not (the programme)."""
    import itertools

    rng = np.random.default_rng(0)
    for case in range(300):
        n = int(rng.integers(1, 5))
        values = {f"s{i}.workers": 8 for i in range(n)}
        layer = SafetyLayer(_knobs(values), DELTAS)
        scores = rng.normal(size=(n, len(DELTAS)))
        scores[rng.random(scores.shape) < 0.25] = -np.inf
        scores[:, DELTAS.index(0)] = np.where(np.isinf(scores[:, DELTAS.index(0)]), 0.0, scores[:, DELTAS.index(0)])
        budget = int(rng.integers(0, 8))
        best = max(
            (combo for combo in itertools.product(range(len(DELTAS)), repeat=n) if sum(DELTAS[a] for a in combo) <= budget),
            key=lambda combo: sum(scores[k, a] for k, a in enumerate(combo)),
        )
        got = layer._best_under_cpu_budget(scores, budget)
        assert sum(DELTAS[a] for a in got) <= budget, case
        assert np.isclose(sum(scores[k, a] for k, a in enumerate(got)), sum(scores[k, a] for k, a in enumerate(best))), case


def _with_a_measured_at_60_mb(values: dict[str, int]) -> tuple[SafetyLayer, float]:
    """A safety layer that saw stage a's workers grow by 5 eight times at 60 MB each (every other stage
    held), from 10 GB used; ``values`` is updated; returns the layer and the GB used now."""
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    used = 10.0
    for _ in range(8):
        safety.mask(_obs(values, cpus=256, used_gb=used, limit_gb=17.4))
        values["a.workers"] += 5
        used += 5 * 60 / 1024
    return safety, used


def test_a_stage_whose_workers_never_moved_cannot_jump_five_on_the_other_stages_price():
    # a's workers were seen to cost 60 MB each (8 moves of +5); b's never moved (live: perhaps a process
    # worker of 250 MB or more). With 1.5 GB of room, +5 on b (priced PROBE_WORKER_BYTES a worker) does not
    # fit; +5 on a, at its measured price, does, and so does +1 on b
    values = {"a.workers": 1, "b.workers": 1}
    safety, used = _with_a_measured_at_60_mb(values)
    obs = _obs(values, cpus=256, used_gb=used, limit_gb=17.4)
    mask = safety.mask(obs)
    assert mask[0].tolist() == [True, True, True, True, True]  # a: +5 fits at its measured price
    assert mask[1].tolist() == [False, False, True, True, False]  # b: +1 only
    prices = safety.stage_worker_bytes(obs)
    assert prices[1] == 512 * MB and prices[0] < 0.25 * prices[1]


def test_a_worker_behind_a_large_noisy_base_is_priced_from_the_ramp_of_levels():
    # 30 GB of base whose reading moves by ~2% (0.6 GB) a tick hides a 150 MB worker from tick-to-tick
    # changes; twelve ticks of one +1 each measure it on the levels: the price falls well under the plain
    # bound (memory / workers, ~2.5 GB) and stays above the true cost
    rng = np.random.default_rng(3)
    values = {"a.workers": 2, "b.workers": 1}
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    obs = None
    for _ in range(12):
        used = (30 * GB + 150 * MB * (values["a.workers"] + values["b.workers"])) * (1 + 0.02 * rng.standard_normal())
        obs = _obs(values, cpus=64, used_gb=used / GB, limit_gb=52)
        safety.mask(obs)
        values["a.workers"] += 1
    price = safety.worker_memory_bytes(obs)
    assert 150 * MB < price < 0.5 * obs.memory_used_bytes / 14
    # without the ramp (the same workers throughout) nothing is learnt: the plain bound
    still = SafetyLayer(_knobs({"a.workers": 8, "b.workers": 6}), DELTAS, margin=0.8)
    for _ in range(12):
        obs = _obs({"a.workers": 8, "b.workers": 6}, cpus=64, used_gb=32.1 * (1 + 0.02 * rng.standard_normal()), limit_gb=52)
        still.mask(obs)
    assert still.worker_memory_bytes(obs) == obs.memory_used_bytes / 14


def test_the_memory_margin_is_where_the_reward_starts_to_fall() -> None:
    from intune.agent.config import AgentConfig
    from intune.monitor.observation import MEMORY_SAFE_FRACTION, memory_factor
    from intune.policies.steer import SteerConfig

    default = SafetyLayer(_knobs({"a.workers": 1}), DELTAS).margin
    assert default == AgentConfig().memory_margin == SteerConfig().memory_margin == MEMORY_SAFE_FRACTION
    assert memory_factor(MEMORY_SAFE_FRACTION) == 1.0 > memory_factor(MEMORY_SAFE_FRACTION + 0.01)


def test_several_single_worker_increases_are_each_priced_at_their_own_stage():
    # a's workers were seen to cost 60 MB each; b, c and d never moved (each perhaps a process worker of
    # 250 MB or more). All four ask for +1 with about 0.8 GB of room: a's +1 at its price and one probe at
    # PROBE_WORKER_BYTES fit, a second untried stage does not. Priced at the pooled slope (~60 MB) all
    # four would fit, and four process workers would take memory past the limit in one tick
    values = {"a.workers": 1, "b.workers": 1, "c.workers": 1, "d.workers": 1}
    safety, used = _with_a_measured_at_60_mb(values)
    limit = (used + 0.8) / 0.8
    obs = _obs(values, cpus=256, used_gb=used, limit_gb=limit)
    mask = safety.mask(obs)
    assert mask[:, 3].all()  # each +1 alone fits
    assert safety.worker_memory_bytes(obs) < 100 * MB
    scores = np.zeros((4, 5))
    scores[:, 3] = [4.0, 3.0, 2.0, 1.0]  # every stage wants +1, a most
    moves = safety.moves(safety.select(scores, mask, obs, list(values.values())), obs)
    assert moves.tolist() == [1, 1, 0, 0]


def test_a_lone_worker_on_a_stage_that_never_moved_is_priced_at_the_probe_not_the_pooled_slope():
    # a's workers were seen to cost 60 MB each; b's never moved (a process worker may take 250 MB or
    # more). With 0.3 GB of room, +1 on a fits at its price; +1 on b alone, at PROBE_WORKER_BYTES, does
    # not. Priced at the slope pooled over all stages (~60 MB, a's), it would
    values = {"a.workers": 1, "b.workers": 1}
    safety, used = _with_a_measured_at_60_mb(values)
    obs = _obs(values, cpus=256, used_gb=used, limit_gb=(used + 0.3) / 0.8)
    mask = safety.mask(obs)
    assert safety.worker_memory_bytes(obs) < 100 * MB
    assert mask[0, 3] and not mask[1, 3]
    scores = np.zeros((2, 5))
    scores[1, 3] = 1.0  # only b wants to grow; the mask's choice and the joint one agree
    assert safety.moves(safety.select(scores, np.ones_like(mask), obs, list(values.values())), obs).tolist() == [0, 0]
    # the same price where a light stage's lone worker is granted past the CPUs (``steer``'s rule)
    assert safety.memory_allows_worker(obs, list(values.values()), 0)
    assert not safety.memory_allows_worker(obs, list(values.values()), 1)


def test_after_an_oom_nothing_grows_until_rows_flow_again():
    # the job was killed; while it restarts the pipeline delivers nothing and memory reads as the base
    # alone (3 GB of 40): growing on that reading would OOM it again once it runs
    values = {"a.workers": 4, "b.workers": 2, "b.buffer_mb": 64}
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    up = np.array(DELTAS) > 0
    assert safety.mask(_obs(values, cpus=64, used_gb=3.0, limit_gb=40))[:, up].any()
    safety.mask(dataclasses.replace(_obs(values, cpus=64, used_gb=41.0, limit_gb=40), oom=True, throughput=0.0))
    down = dataclasses.replace(_obs(values, cpus=64, used_gb=3.0, limit_gb=40), throughput=0.0)
    for _ in range(5):
        assert not safety.mask(down)[:, up].any()
    assert safety.mask(_obs(values, cpus=64, used_gb=3.0, limit_gb=40))[:, up].any()  # rows flow: it may grow


def test_an_untried_thread_worker_is_probed_at_the_thread_price_a_process_one_at_the_process_price():
    # b's workers never moved; with 0.3 GB of room a lone +1 on b fits only if b declares thread workers
    # (probed at 64 MB: they share the process's memory), not if it declares processes or says nothing
    for mode, fits in (("thread", True), ("process", False), (None, False)):
        values = {"a.workers": 1, "b.workers": 1}
        safety, used = _with_a_measured_at_60_mb(values)
        obs = _obs(values, cpus=256, used_gb=used, limit_gb=(used + 0.3) / 0.8, modes={"b": mode} if mode else None)
        mask = safety.mask(obs)
        assert bool(mask[1, 3]) is fits, mode
        assert safety.memory_allows_worker(obs, list(values.values()), 1) is fits, mode
        assert not mask[1, 4], mode  # +5 untried workers is priced at the pooled slope or the probe, whichever is more


def test_a_stage_ramp_behind_a_noisy_base_prices_its_workers_long_after_they_stopped():
    # 8 GB of base whose reading moves by ~2% a tick; a (a thread stage) ramps 1 -> 11 at 20 MB a worker
    # while b (a process stage, 200 MB a worker) ramps 1 -> 3, then nothing moves for 60 ticks. Tick-to-tick
    # changes price a's worker at hundreds of MB; its levels price it well under that, and above its cost
    rng = np.random.default_rng(5)
    values = {"a.workers": 1, "b.workers": 1}
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)

    def tick() -> Observation:
        used = (8 * GB + 20 * MB * values["a.workers"] + 200 * MB * values["b.workers"]) * (1 + 0.02 * rng.standard_normal())
        obs = _obs(values, cpus=64, used_gb=used / GB, limit_gb=10.6, modes={"a": "thread", "b": "process"})
        safety.mask(obs)
        return obs

    for t in range(12):
        tick()
        values["a.workers"] += 1
        if t % 5 == 4:
            values["b.workers"] += 1
    for _ in range(60):
        obs = tick()
    price = safety.stage_worker_bytes(obs)
    assert 20 * MB < price[0] < 200 * MB and price[1] > 200 * MB  # each above its cost
    without = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    without.load_state_dict({**safety.state_dict(), "stage_levels": []})  # the changes alone
    assert without.stage_worker_bytes(obs)[0] > 2 * price[0]
    # the levels are carried across a restart; a state saved before they were kept still loads
    state = safety.state_dict()
    again = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    again.load_state_dict(state)
    assert again.stage_worker_bytes(obs)[0] == price[0]
    legacy = {k: v for k, v in state.items() if k != "stage_levels"}
    SafetyLayer(_knobs(values), DELTAS, margin=0.8).load_state_dict(legacy)


def test_the_level_fit_runs_only_where_the_coarse_price_binds(monkeypatch):
    # with room to spare every move fits at the coarse price, which the level fit only lowers: it is
    # not computed; where memory binds it is, and the mask is what the refined prices allow
    values = {"a.workers": 1, "b.workers": 1}
    safety, used = _with_a_measured_at_60_mb(values)
    calls = []
    fit = SafetyLayer._stage_level_bounds
    monkeypatch.setattr(SafetyLayer, "_stage_level_bounds", lambda self, obs: calls.append(1) or fit(self, obs))
    loose = _obs(values, cpus=256, used_gb=used, limit_gb=4 * used)
    mask = safety.mask(loose)
    scores = np.zeros((2, 5))
    scores[:, 4] = 1.0
    safety.select(scores, mask, loose, list(values.values()))
    assert mask[:, 4].all() and not calls
    tight = _obs(values, cpus=256, used_gb=used, limit_gb=(used + 0.3) / 0.8)
    safety.mask(tight)
    assert calls


def test_what_one_tick_computes_once_is_what_a_layer_without_that_tick_s_memory_computes():
    # the fits and prices kept for the rest of a tick (and the ridge fit kept until a worker moves) must
    # never answer for another tick or another allocation: at every tick of a tight-memory episode, the
    # layer that tracked it answers as a fresh layer loaded from its state, which has computed nothing yet
    assert _ticks_checked_against_fresh_layers(seed=1) + _ticks_checked_against_fresh_layers(seed=4) == 240


def _ticks_checked_against_fresh_layers(seed: int) -> int:
    from intune.policies import make
    from intune.sim import run_episode

    sim = random_sim(np.random.default_rng(seed), AgentConfig(tight_memory_probability=1.0), ticks=120)
    knobs = list(sim.knobs.values())
    safety = SafetyLayer(knobs, DELTAS)
    checked = 0

    def on_tick(obs: Observation, applied: dict[str, int]) -> None:
        nonlocal checked
        values = [k.value for k in knobs]
        safety.mask(obs, values)
        state = safety.state_dict()

        def fresh() -> SafetyLayer:  # a layer that has computed nothing for this tick
            layer = SafetyLayer(knobs, DELTAS)
            layer.load_state_dict(state)
            layer._restarting = safety._restarting  # not part of the state: an OOM's restart is not resumed
            return layer

        for trial in (values, [2 * v + 1 for v in values], values):
            assert safety.worst_case_memory(obs, trial) == fresh().worst_case_memory(obs, trial)
            assert safety.worker_budget(obs, trial) == fresh().worker_budget(obs, trial)
        assert safety.settled_memory(obs) == fresh().settled_memory(obs)
        for refined in (False, True):
            assert np.array_equal(safety.stage_worker_bytes(obs, refined), fresh().stage_worker_bytes(obs, refined))
        checked += 1

    run_episode(sim, make("steer"), 120, on_tick=on_tick)
    return checked


def _cheap_then_heavy_climb(seed: int) -> tuple[SafetyLayer, Observation, dict[str, int], float]:
    """A base past the margin; a (thread workers, 100 MB each) climbs 1 -> 25, then b (process workers,
    1.2 GB each) 1 -> 8, memory read with 2% noise, the last reading one standard deviation low: the layer,
    that reading, the workers, and the memory truly used."""
    rng = np.random.default_rng(seed)
    values = {"a.workers": 1, "b.workers": 1}
    safety = SafetyLayer(_knobs(values), DELTAS, margin=0.8)
    obs = None
    for t in range(32):
        used = 84 * GB + 100 * MB * values["a.workers"] + 1200 * MB * values["b.workers"]
        z = rng.standard_normal() if t < 31 else -1.0
        obs = _obs(values, cpus=64, used_gb=used * (1 + 0.02 * z) / GB, limit_gb=100.0, modes={"a": "thread", "b": "process"})
        safety.mask(obs)
        if t < 24:
            values["a.workers"] += 1
        elif t < 31:
            values["b.workers"] += 1
    assert obs is not None
    return safety, obs, values, used


def test_after_cheap_workers_then_heavy_ones_the_settled_memory_covers_what_is_used():
    # one slope over the total worker count reads b's workers at a's price and settles 3-5% under what is
    # used; a slope per stage covers it, and leaves no room for another of b's workers under the ceiling
    for seed in range(10):
        safety, low, values, used = _cheap_then_heavy_climb(seed)
        assert safety.settled_memory(low) >= used, seed
        assert safety.worker_budget(low, list(values.values())) < 1200 * MB, seed
