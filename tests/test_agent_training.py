"""A short seeded training run on a tiny simulated pipeline must beat the allocation it starts from."""

import numpy as np
import pytest
import torch

from intune.agent.config import AgentConfig
from intune.agent.dqn import train
from intune.agent.env import SimEnv
from intune.agent.evaluate import score_episode
from intune.agent.features import KNOB_FEATURES, FeatureBuilder
from intune.agent.policy import IntunePolicy
from intune.sim.simulator import Simulator
from intune.sim.spec import spec_from_dict

# read is cheap, the UDF costs 7x more: the even split (4 + 4 of 8 CPUs) starves on the UDF;
# the optimum gives the UDF 7 of the 8 CPUs.
TINY = spec_from_dict({
    "name": "tiny",
    "stages": [{"name": "read", "cpu_us_per_row": 1.0}, {"name": "udf", "mode": "process", "cpu_us_per_row": 7.0}],
    "machine": {"cpus": 8, "memory_limit_gb": 64, "base_memory_gb": 1, "oversubscription_cost": 0.3},
})


def _sim(seed: int) -> Simulator:
    return Simulator(TINY, cpus=8, seed=seed, noise=0.02)


def test_short_seeded_training_improves_over_the_even_split():
    torch.set_num_threads(1)
    config = AgentConfig(seed=3, total_steps=400, num_envs=8, episode_ticks=40, learning_starts=50, learning_rate=2e-3, hidden=64,
                         exploration_fraction=0.6, target_update_frequency=50, batch_size=64)
    q, history = train(config, lambda rng: SimEnv(_sim(int(rng.integers(1 << 30)))), log=lambda _: None)
    sim = _sim(99)
    optimum = sim.optimum(8)[1]
    even = sim.true_throughput({"read.workers": 4, "udf.workers": 4})
    assert even < 0.6 * optimum  # the start is poor
    score = score_episode(sim, IntunePolicy(network=q, config=config, online=False), ticks=40, seed=1)
    final = sim.true_throughput()
    # the runner grants the CPU that idle workers leave unused, so a net that over-allocates the UDF is
    # granted it (0.84 of the optimum with 12 workers on 8 CPUs): still well over the even split
    assert final > 1.4 * even, (sim.allocation(), final / optimum)
    assert score.ratio > 0.8 and score.ooms == 0
    assert history.episode_reward[-1] > history.episode_reward[0]


def test_the_gain_feature_is_the_relative_rate_change_per_relative_worker_change_at_the_last_binding_move():
    """A stage waiting on I/O and one waiting on the GIL look alike in one tick (busy, little CPU per
    worker); what an added worker did to the stage's rate tells them apart, and it is kept until the
    next move, through a checkpoint too. Only a move made alone while the stage bound counts: the rate of
    a stage that does not bind follows the pipeline's whatever its workers, and a second stage's move
    shares the change of rate."""
    from dataclasses import replace

    sim = _sim(0)
    obs = sim.reset()
    read, udf = obs.stages

    def tick(workers: int, rate: float, busy: float = 1.0):
        return replace(obs, stages=(read, replace(udf, workers=workers, items_per_s=rate, busy=busy)))

    gain, known = KNOB_FEATURES.index("gain"), KNOB_FEATURES.index("gain_known")
    udf_row = list(sim.knobs).index("udf.workers")
    read_row = list(sim.knobs).index("read.workers")
    builder = FeatureBuilder(sim.knobs)
    rows = builder.rows(tick(1, 100.0))
    assert rows[udf_row, known] == 0 and rows[udf_row, gain] == 0  # no move yet: nothing measured
    rows = builder.rows(tick(2, 150.0))  # +100% workers, +50% rows
    assert rows[udf_row, gain] == pytest.approx(0.5) and rows[udf_row, known] == 1
    assert rows[read_row, known] == 0
    rows = builder.rows(tick(4, 150.0))  # +100% workers, nothing more: the GIL's signature
    assert rows[udf_row, gain] == pytest.approx(0.0) and rows[udf_row, known] == 1
    rows = builder.rows(tick(4, 90.0))  # no move: the last move's gain stays
    assert rows[udf_row, gain] == pytest.approx(0.0)
    resumed = FeatureBuilder(sim.knobs)
    resumed.load_state_dict(builder.state_dict())
    rows = resumed.rows(tick(2, 45.0))  # -50% workers, -50% rows: every worker counted
    assert rows[udf_row, gain] == pytest.approx(1.0)
    rows = resumed.rows(tick(3, 450.0, busy=0.4))  # +50% workers, +900% rows: clipped
    assert rows[udf_row, gain] == pytest.approx(2.0)
    rows = resumed.rows(tick(1, 450.0))  # moved while busy 0.4 (another stage bound): not measured
    assert rows[udf_row, gain] == pytest.approx(2.0) and rows[udf_row, known] == 1
    fresh = FeatureBuilder(sim.knobs)
    fresh.rows(tick(4, 100.0, busy=0.5))
    assert fresh.rows(tick(2, 100.0))[udf_row, known] == 0  # the only move was made while it did not bind
    both = FeatureBuilder(sim.knobs)
    both.rows(tick(2, 100.0))
    swapped = replace(obs, stages=(replace(read, workers=read.workers + 1), replace(udf, workers=1, items_per_s=100.0)))
    assert both.rows(swapped)[udf_row, known] == 0  # the reader moved too: the change of rate is shared


def test_imitation_draws_remote_pools_on_a_heavy_map_stage_with_a_demand_past_the_machine():
    from intune.agent.env import with_remote_pool
    from intune.agent.pretrain import training_sim
    from intune.sim.oracle import local_best_rows
    from intune.sim.spec import workload_variant

    config = AgentConfig()
    rng = np.random.default_rng(5)
    pooled = 0
    for _ in range(30):
        base = training_sim(rng, config, 200)
        sim = with_remote_pool(rng, base, 200)
        if sim is base:  # no map stage, or irregular stages: no pool is modelled
            continue
        pooled += 1
        stage = sim.spec.stages[sim.remote_pool.stage]
        rows = sim.spec.rows_per_item()
        cost = [s.cpu_us_per_row + s.item_overhead_us / r for s, r in zip(sim.spec.stages, rows, strict=True)]
        assert stage.kind in ("map", "udf") and 0.5 <= cost[sim.remote_pool.stage] / sum(cost) <= 0.9
        assert all(0 < t < 200 and 1 <= n <= stage.remote.nodes // 2 for t, n in stage.remote.node_loss.items())
        demand = sim.params.demand
        if demand > 0:  # 1.2-4x the most the machine makes alone at the episode's first CPU count
            alone = local_best_rows(workload_variant(sim.spec, cpus=int(sim.schedule.levels[0])))
            assert 1.2 * 0.999 <= demand / alone <= 4.0 * 1.001
    assert pooled >= 10


# ids -> fetch (a map stage, in processes until it is made to wait) -> udf -> prefetch on 2 CPUs
FETCH = spec_from_dict({
    "name": "fetch",
    "stages": [{"name": "ids", "kind": "read", "cpu_us_per_row": 0.5},
               {"name": "fetch", "kind": "map", "mode": "process", "cpu_us_per_row": 2.0},
               {"name": "udf", "kind": "udf", "mode": "process", "cpu_us_per_row": 10.0},
               {"name": "prefetch", "kind": "prefetch", "cpu_us_per_row": 0.2}],
    "machine": {"cpus": 2, "memory_limit_gb": 64, "base_memory_gb": 1, "oversubscription_cost": 0.3},
})


def test_a_waiting_map_stage_waits_as_asked_and_needs_more_workers_than_cpus():
    from intune.sim.random_specs import with_waiting_map_stage

    spec = with_waiting_map_stage(FETCH, 1, wait_share=0.9, slowdown=4.0, worker_mb=8.0, min_max_workers=200)
    fetch = spec.stages[1]
    assert fetch.mode == "thread" and fetch.kind == "map" and fetch.max_workers == 200 and fetch.worker_mb == 8.0
    assert fetch.io_us_per_row == pytest.approx(0.9 * 4.0 * 10.0) and fetch.cpu_us_per_row == pytest.approx(0.1 * 40.0)
    assert spec.stages[0] == FETCH.stages[0] and spec.stages[2:] == FETCH.stages[2:]
    assert with_waiting_map_stage(FETCH, 0, 0.9, 4.0, 8.0) is None  # the first stage is the source
    assert with_waiting_map_stage(FETCH, 3, 0.9, 4.0, 8.0) is None  # not a map stage
    best, _ = Simulator(spec, cpus=2, seed=0).optimum(2)
    assert best["fetch.workers"] > 2  # waiting workers pay past the CPUs


def test_a_map_stage_waiting_on_the_gil_tops_at_one_cpu_however_many_workers_it_has():
    from intune.sim.random_specs import with_waiting_map_stage

    spec = with_waiting_map_stage(FETCH, 1, wait_share=0.9, slowdown=4.0, worker_mb=8.0, min_max_workers=200, on="gil")
    fetch = spec.stages[1]
    assert fetch.mode == "thread" and fetch.io_us_per_row == 0.0 and fetch.cpu_us_per_row == pytest.approx(40.0)
    assert fetch.gil_fraction == pytest.approx(0.9)
    best, rows = Simulator(spec, cpus=8, seed=0).optimum(8)
    assert best["fetch.workers"] <= 2  # more workers add nothing: the oracle keeps the fewest
    assert rows <= 1.01 / (0.9 * 40e-6)  # one CPU's worth of the GIL-held part
    with pytest.raises(ValueError, match="on must be one of"):
        with_waiting_map_stage(FETCH, 1, 0.9, 4.0, 8.0, on="lock")
    reader = with_waiting_map_stage(FETCH, 0, 0.9, 4.0, 8.0, on="gil")  # a reader parsing in pure Python
    assert reader is not None and reader.stages[0].gil_fraction == pytest.approx(0.9) and reader.stages[0].kind == "read"
    assert with_waiting_map_stage(FETCH, 3, 0.9, 4.0, 8.0, on="gil") is None  # the prefetch stage


def test_shedding_workers_a_gil_bound_stage_cannot_use_weighs_the_cpus_they_hold():
    from intune.agent.teacher import label_weights
    from intune.sim.random_specs import with_waiting_map_stage

    config = AgentConfig()

    def weight(on: str, held: bool) -> float:
        sim = Simulator(with_waiting_map_stage(FETCH, 1, 0.9, 4.0, 8.0, min_max_workers=200, on=on), cpus=8, seed=0)
        target, _ = sim.optimum(8)
        names = list(target)
        values = [target[n] + 20 if n == "fetch.workers" else target[n] for n in names]
        extra = (sim.held_cpus, 8.0, config.imitation_full_weight_held_cpus) if held else ()
        w = label_weights(sim.true_throughput, target, names, values, config.imitation_full_weight_loss,
                          config.imitation_min_weight, *extra)
        return float(w[names.index("fetch.workers")])

    # 20 GIL-bound workers past the target cost no throughput on 8 CPUs; waiting for the GIL they want
    # none, but each computes a tenth of its time outside it: 2 CPUs of 8, at full weight past 0.5 of
    # them, weigh 0.5, where the throughput alone gives them the floor
    assert weight("gil", held=True) == pytest.approx(0.5)
    assert weight("gil", held=False) == pytest.approx(config.imitation_min_weight)
    # 20 threads waiting on I/O 90% of the time want 2 CPUs too: 0.5 with the held CPUs; they cost no
    # throughput (weighing a tenth of a process each in the oversubscription count, within 8 CPUs)
    assert weight("io", held=True) == pytest.approx(0.5)
    assert weight("io", held=False) == pytest.approx(config.imitation_min_weight)


def test_imitation_draws_waiting_map_stages_in_the_share_asked_and_none_by_default():
    from dataclasses import replace

    from intune.agent.env import with_waiting_stage
    from intune.agent.pretrain import imitation_sim, training_sim, validation_sims

    def waiting(sim) -> int:
        return sum(s.mode == "thread" and s.kind in ("map", "udf") and s.io_us_per_row >= 0.8 * (s.io_us_per_row + s.cpu_us_per_row)
                   and s.io_us_per_row > 0 for s in sim.spec.stages[1:])

    config = AgentConfig()
    assert sum(waiting(imitation_sim(np.random.default_rng(i), config)) for i in range(20)) == 0
    every = replace(config, imitation_waiting_share=1.0)
    drawn = [imitation_sim(np.random.default_rng(i), every) for i in range(20)]
    with_maps = [s for s in drawn if any(t.kind in ("map", "udf") for t in s.spec.stages[1:])]
    assert len(with_maps) >= 5 and all(waiting(s) >= 1 for s in with_maps)
    assert len(validation_sims(replace(config, imitation_waiting_share=0.25, validation_pipelines=8))) == 8 + 2
    with pytest.raises(ValueError, match="imitation_waiting_share"):
        AgentConfig(imitation_waiting_share=1.5)
    # with the GIL share at 1 (`bench agent`'s every other waiting spec), every waiting stage waits on the
    # GIL instead: all CPU, most of it GIL-held, the costliest stage or cheaper; the first stage (a reader
    # parsing in pure Python) may be the one
    def on_gil(i: int):
        rng = np.random.default_rng(i)
        return with_waiting_stage(rng, training_sim(rng, config, config.imitation_ticks), gil_share=1.0)

    gil_drawn = [on_gil(i) for i in range(40)]
    assert all(waiting(s) == 0 for s in gil_drawn)

    def gil_bound(sim) -> list[int]:
        return [i for i, t in enumerate(sim.spec.stages) if t.mode == "thread" and t.gil_fraction >= 0.8
                and t.io_us_per_row == 0]

    found = [gil_bound(s) for s in gil_drawn]
    assert sum(bool(f) for f in found) >= 30 and any(0 in f for f in found) and any(f and f[0] > 0 for f in found)
    # its CPU per row is 0.25-8x the costliest stage's: the costliest stage, or cheaper than another
    base = Simulator(FETCH, cpus=8, seed=0)
    costliest = max(t.cpu_us_per_row for t in FETCH.stages)
    ratios = []
    for i in range(40):
        drawn = with_waiting_stage(np.random.default_rng(i), base, gil_share=1.0).spec.stages
        ratios += [t.cpu_us_per_row / costliest for t, u in zip(drawn, FETCH.stages, strict=True) if t != u]
    assert len(ratios) == 40 and 0.25 <= min(ratios) < 1.0 < max(ratios) <= 8.0


def test_validation_scores_a_network_as_the_agent_benchmark_scores_a_held_out_spec():
    """The best-validated round is the one kept, so a validation episode is the benchmark's held-out kind:
    a random spec on the paper's resize schedule with 60-tick phases, scored by the same ratio."""
    from dataclasses import replace

    from intune.agent.policy import load_weights
    from intune.agent.pretrain import make_evaluator, validation_sims
    from intune.bench.agent import run_schedule_episode
    from intune.sim import paper_schedule

    q, config = load_weights()
    config = replace(config, validation_pipelines=1, imitation_remote_share=0.0, imitation_waiting_share=0.0)  # the local kind only
    (sim,) = validation_sims(config)
    assert list(sim.schedule.phases()) == list(paper_schedule(period_ticks=60).phases())
    row, error = run_schedule_episode((sim.spec, "held-out", None, "network", {}, 60, 0, None))  # the paper schedule
    assert error is None
    assert make_evaluator(config)(q) == pytest.approx(row["optimum_ratio"], rel=1e-9)


def test_each_phase_is_scored_on_its_own_ticks():
    from intune.policies import make
    from intune.sim.schedule import stepped_schedule

    sim = Simulator(TINY, cpus=stepped_schedule([8, 2], 20), seed=0, noise=0.02)
    score = score_episode(sim, make("none"), seed=0)  # holds the spec's allocation in both phases
    alloc = sim.allocation()
    by_hand = [sim.true_throughput(alloc, cpus) / sim.optimum(cpus, objective="throughput")[1] for cpus in (8, 2)]
    assert score.phase_ratios == pytest.approx(by_hand, rel=1e-9)
    assert by_hand[0] != pytest.approx(by_hand[1], rel=0.01)  # the phases differ, so a mixed-up slice shows
    assert min(by_hand) < score.ratio < max(by_hand)
