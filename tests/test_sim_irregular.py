"""Irregular stages in the simulator: heavy-tailed per-item costs (``cost_tail``), input-dependent costs
and varied read sizes (``size_cv``), the shipped ``irregular-*`` workloads, and default specs unchanged."""

import dataclasses
import math

import numpy as np
import pytest
import yaml

from intune.policies import make
from intune.sim import Simulator, SpecError, list_workloads, load_workload, run_episode, spec_from_dict
from intune.sim.schedule import paper_schedule
from intune.sim.simulator import item_cost_multipliers
from intune.sim.spec import WORKLOAD_DIR

IRREGULAR = ("irregular-tail", "irregular-sizes", "irregular-drift")


def _spec(udf: dict, read: dict | None = None, batch: dict | None = None) -> object:
    return spec_from_dict(
        {
            "name": "tiny-irregular",
            "batch_size": 8192,
            "chunk_rows": 2048,
            "bytes_per_row": 100,
            "machine": {"cpus": 64, "memory_limit_gb": 64, "host_memory_gb": 256, "base_memory_gb": 1},
            "stages": [
                {"name": "read", "kind": "read", "cpu_us_per_row": 1.0, "io_us_per_row": 4.0, **(read or {})},
                {"name": "udf", "kind": "udf", "mode": "process", "cpu_us_per_row": 20.0, **udf},
                {"name": "batch", "kind": "batch", "cpu_us_per_row": 2.0, **(batch or {})},
                {"name": "prefetch", "kind": "prefetch", "cpu_us_per_row": 0.5},
            ],
        }
    )


def _run(spec, workers: dict[str, int], ticks: int, seed: int = 3) -> tuple[Simulator, list]:
    sim = Simulator(spec, cpus=64, seed=seed, noise=0.0)
    sim.reset(seed)
    for stage, w in workers.items():
        sim.knobs[f"{stage}.workers"].set(w)
    return sim, [sim.step() for _ in range(ticks)]


def _multipliers(sim: Simulator, obs: list, stage: str) -> dict[str, np.ndarray]:
    """Per tick: a stage's observed CPU, wall and bytes per item over the model's mean ones (noise 0)."""
    i = sim.spec.stage_names.index(stage)
    p = sim.params
    cpu_mean = p.cpu_s_per_row[i] * p.rows_per_item[i]  # no drift; eta = 1 (workers <= CPUs)
    sts = [o.stage(stage) for o in obs]
    return {
        "cpu": np.array([s.cpu_s_per_item for s in sts]) / cpu_mean,
        "bytes": np.array([s.bytes_per_item for s in sts]) / p.bytes_per_item[i],
        "items": np.array([s.items_per_s for s in sts]),
    }


# ------------------------------------------------------------------------------------ the distributions


@pytest.mark.parametrize("kind", ["lognormal", "pareto"])
def test_item_cost_multipliers_follow_the_stated_family(kind):
    cv, n = 2.0, 400_000
    x = item_cost_multipliers(np.random.default_rng(0), kind, cv, n)
    # mean 1: six standard errors (cv / sqrt(n)); Chebyshev bounds a miss by 1/36 whatever the tail
    assert x.mean() == pytest.approx(1.0, abs=6 * cv / math.sqrt(n))
    if kind == "lognormal":
        s2 = math.log1p(cv**2)
        median, tail = 1 / math.sqrt(1 + cv**2), 0.5 * math.erfc(math.log(10) / math.sqrt(2 * s2))
        assert np.median(x) == pytest.approx(median, rel=0.02)
        assert np.mean(x > 10 * median) == pytest.approx(tail, rel=0.05)  # 3.5%: 10x the median
    else:
        alpha = 1 + math.sqrt(1 + 1 / cv**2)
        x_m = (alpha - 1) / alpha
        assert x.min() >= x_m
        assert np.median(x) == pytest.approx(x_m * 2 ** (1 / alpha), rel=0.02)
        assert np.mean(x > 20 * x_m) == pytest.approx(20.0**-alpha, rel=0.1)  # the power law: (x_m / t)^alpha


# ------------------------------------------------------------------------------------ per-tick sampling


@pytest.mark.parametrize("kind", ["lognormal", "pareto"])
def test_heavy_tailed_stage_cost_jumps_per_tick_and_averages_to_the_spec_mean(kind):
    cv = 2.0
    spec = _spec({"cpu_cv": cv, "cost_tail": {"kind": kind}})
    sim, obs = _run(spec, {"read": 8, "udf": 16, "batch": 4, "prefetch": 2}, ticks=2000)
    assert obs[-1].stage("udf").items_per_s > 0 and sim.last_model_throughput < float("inf")
    m = _multipliers(sim, obs, "udf")
    items = m["items"]  # chunks per second = chunks per tick (dt 1 s)
    n = float(items.mean())
    # the tick's observed cost is the mean over the n items it processed: cv / sqrt(n) across ticks,
    # skewed to the right (most ticks below the mean, a few far above); a regular stage does not move
    tick_cv = m["cpu"].std() / m["cpu"].mean()
    assert 0.6 * cv / math.sqrt(n) < tick_cv < 1.4 * cv / math.sqrt(n)
    assert np.median(m["cpu"]) < m["cpu"].mean() and m["cpu"].max() > 1.5
    batch = _multipliers(sim, obs, "batch")["cpu"]
    np.testing.assert_allclose(batch, 1.0, rtol=1e-12)
    # long run, item-weighted (as a per-element average over the whole run weighs it): the spec's mean,
    # within six standard errors of the mean of sum(items) draws of cv 2 (Chebyshev: 1/36 at worst)
    weighted = float((m["cpu"] * items).sum() / items.sum())
    assert weighted == pytest.approx(1.0, abs=6 * cv / math.sqrt(items.sum()))


def test_realised_throughput_follows_the_ticks_cost_while_the_model_keeps_the_mean():
    tail = _spec({"cpu_cv": 2.0, "cost_tail": {"kind": "lognormal"}})
    plain = _spec({"cpu_cv": 2.0})
    workers = {"read": 8, "udf": 4, "batch": 4, "prefetch": 2}  # the udf is the bottleneck
    sim, obs = _run(tail, workers, ticks=1500)
    ref, ref_obs = _run(plain, workers, ticks=5)
    model = sim.last_model_throughput
    assert model == ref.last_model_throughput  # scoring sees the model at the mean cost
    realised = np.array([o.throughput for o in obs])
    cost = _multipliers(sim, obs, "udf")["cpu"]
    assert realised.std() / realised.mean() > 0.1  # bursty, where the regular spec is flat without noise
    assert np.ptp([o.throughput for o in ref_obs]) == 0.0
    ranks = [np.argsort(np.argsort(x)) for x in (realised, cost)]  # rank correlation: one giant item
    assert np.corrcoef(*ranks)[0, 1] < -0.8  # in hand for ticks would swamp a linear one; expensive ticks
    # deliver fewer rows
    assert realised.mean() == pytest.approx(model, rel=0.06)  # the bursts cost what the buffer cannot absorb
    busy = np.array([o.stage("udf").busy for o in obs])
    assert busy.min() < busy.max() <= 1.0


# ---------------------------------------------------------------------------------- sizes of the items


def test_input_dependent_cost_scales_with_the_item_size():
    spec = _spec({"cpu_cv": 1.2, "size_cv": 1.2}, read={"size_cv": 0.8, "cpu_cv": 0.8})
    sim, obs = _run(spec, {"read": 8, "udf": 16, "batch": 4, "prefetch": 2}, ticks=600)
    hash_m, read_m = _multipliers(sim, obs, "udf"), _multipliers(sim, obs, "read")
    # an item's cost follows its size: CPU per item and bytes per item move together, tick by tick
    np.testing.assert_allclose(hash_m["cpu"], hash_m["bytes"], rtol=1e-12)
    np.testing.assert_allclose(read_m["cpu"], read_m["bytes"], rtol=1e-12)
    # read sizes vary (bytes per item), and I/O scales with them as CPU does (wall time per item)
    i = sim.spec.stage_names.index("read")
    wall_mean = sim.params.rows_per_item[i] * (sim.params.cpu_s_per_row[i] + sim.params.io_s_per_row[i])
    read_wall = np.array([o.stage("read").wall_s_per_item for o in obs]) / wall_mean
    np.testing.assert_allclose(read_wall, read_m["bytes"], rtol=1e-9)
    chunks = float(read_m["items"].mean())  # per tick: the sizes' mean over this many chunks
    assert 0.6 * 0.8 / math.sqrt(chunks) < read_m["bytes"].std() < 1.4 * 0.8 / math.sqrt(chunks)
    # one stream of sizes: the rows that are long in the reader are long in the hashing UDF
    assert np.corrcoef(np.log(read_m["cpu"]), np.log(hash_m["cpu"]))[0, 1] > 0.95
    assert hash_m["cpu"].std() > read_m["cpu"].std()  # the UDF's cost varies more (cv 1.2 vs 0.8)
    np.testing.assert_allclose(_multipliers(sim, obs, "batch")["cpu"], 1.0, rtol=1e-12)
    items = hash_m["items"]
    assert float((hash_m["cpu"] * items).sum() / items.sum()) == pytest.approx(
        1.0, abs=6 * 1.2 / math.sqrt(items.sum())
    )


def test_irregular_fields_are_validated():
    with pytest.raises(SpecError, match=r"udf\)\.cost_tail: needs cpu_cv > 0"):
        _spec({"cost_tail": {"kind": "lognormal"}})
    with pytest.raises(SpecError, match=r"cost_tail\.kind: must be one of"):
        _spec({"cpu_cv": 1.0, "cost_tail": {"kind": "cauchy"}})
    with pytest.raises(SpecError, match="exclusive"):
        _spec({"cpu_cv": 1.0, "cost_tail": {"kind": "pareto"}, "size_cv": 0.5})
    with pytest.raises(SpecError, match=r"size_cv: must be >= 0"):
        _spec({"size_cv": -1})


# ---------------------------------------------------------------------------- default specs unchanged

_FIELDS = (
    "items_per_s",
    "rows_per_s",
    "cpu_s_per_item",
    "wall_s_per_item",
    "bytes_per_item",
    "busy",
    "buffered_bytes",
)  # queue_fill, starved and blocked come from the queue model, not touched here


def _trace(spec, seed: int = 7, ticks: int = 160) -> np.ndarray:
    """Observations of a fixed run: knobs changed at ticks 5 (workers), 90 and 120 (buffers), resizes."""
    sim = Simulator(spec, cpus=paper_schedule(period_ticks=40), seed=seed)
    obs = sim.reset()
    rows = []
    for t in range(ticks):
        if t == 5:
            for name, k in sim.knobs.items():
                if name.endswith(".workers"):
                    k.set(max(k.min, min(k.max, 32 // len(spec.stages))))
        if t in (90, 120):
            for name, k in sim.knobs.items():
                if name.endswith(".buffer_mb"):
                    k.set(k.max if t == 90 else k.min)
        row = [obs.throughput, obs.memory_used_bytes, float(obs.oom), sim.last_model_throughput]
        for s in obs.stages:
            row += [float(getattr(s, f)) for f in _FIELDS]
        rows.append(row)
        obs = sim.step()
    return np.array(rows, dtype=np.float64)


def _default_specs() -> dict:
    crit = load_workload("criteo")
    stalls = dataclasses.replace(
        crit,
        name="criteo-stalls",
        consumer=dataclasses.replace(crit.consumer, model_latency_s=0.05, stall_every_s=30, stall_s=5),
    )
    names = ("criteo", "production", "ladder-2", "ladder-7", "criteo@mem=17.5")  # the last one OOMs
    return {**{n: load_workload(n) for n in names}, "criteo-stalls": stalls}


# recorded before irregular stages existed: (sum of realised throughput, sum of the trace with each
# column scaled to its largest magnitude, OOM ticks); the digests re-recorded when busy, wall and CPU
# per item began to be reported as the engine counts them on saturated CPUs (5604.91863398247,
# 5583.622747963752, 2364.114771954515, 7606.856053018993, 1083.0308045105367, 5048.194827893771 before:
# the throughput, memory and OOMs, the first and third figures, are unchanged)
_RECORDED = {
    "criteo": (36330985.72522498, 5615.939308504232, 0),
    "production": (31117986.522032835, 5591.788807328521, 0),
    "ladder-2": (88163248.87042171, 2369.7792028389413, 0),
    "ladder-7": (26518964.38905942, 7614.330124011467, 0),
    "criteo@mem=17.5": (235571.8516316917, 1083.1565290672534, 3),
    "criteo-stalls": (30484469.482063726, 5059.215502415533, 0),
}


def test_default_specs_observe_exactly_what_they_did():
    for name, spec in _default_specs().items():
        a = _trace(spec)
        digest = float((a / (np.abs(a).max(axis=0) + 1e-300)).sum())
        throughput, recorded, ooms = _RECORDED[name]
        assert float(a[:, 0].sum()) == pytest.approx(throughput, rel=1e-12), name
        assert digest == pytest.approx(recorded, rel=1e-12), name
        assert int(a[:, 2].sum()) == ooms, name
    # the new fields at their defaults, spelt out, change nothing, bit for bit
    data = yaml.safe_load((WORKLOAD_DIR / "criteo.yaml").read_text())
    for stage in data["stages"]:
        stage.update(cost_tail=None, size_cv=0.0)
    explicit = spec_from_dict(data, "criteo-explicit")
    assert np.array_equal(_trace(explicit), _trace(load_workload("criteo")))


# ------------------------------------------------------------------------------------ shipped workloads


@pytest.mark.parametrize("name", IRREGULAR)
def test_irregular_workloads_load_run_and_have_a_finite_optimum(name):
    assert name in list_workloads()
    spec = load_workload(name)
    assert 4 <= len(spec.stages) <= 6 and 32 <= spec.machine.cpus <= 128
    assert any(s.cost_tail is not None or s.size_cv > 0 for s in spec.stages)
    sim = Simulator(spec, cpus=paper_schedule(period_ticks=20), seed=1)
    for cpus in (32, 128):
        alloc, rows = sim.optimum(cpus)
        assert math.isfinite(rows) and rows > 0 and alloc
    for policy in ("none", "heuristic", "autotune", "autotune-adaptive", "plumber", "plumber-adaptive"):
        result = run_episode(sim, make(policy), 100, seed=1)
        assert result.throughput.min() >= 0 and result.model_throughput.max() > 0, policy
        assert np.isfinite(result.throughput).all(), policy
    first = [o.stage(spec.stages[1].name).cpu_s_per_item for o in (sim.reset(5), sim.step(), sim.step())]
    again = [o.stage(spec.stages[1].name).cpu_s_per_item for o in (sim.reset(5), sim.step(), sim.step())]
    assert first == again  # a seed replays the items too
