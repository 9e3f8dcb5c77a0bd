"""``intune bench tune``: the search, the rate rules, the exactly-once counter, the CPU and cgroup
helpers, and a short live run of a policy on the real engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from intune.bench import machine_control as machine
from intune.bench import tune_live as tl
from intune.bench import tune_workload as wl


def test_exhaustive_search_keeps_the_best_of_every_allocation() -> None:
    grid = {"read.workers": [1, 2, 4], "udf.workers": [1, 2, 3]}
    calls: list[dict[str, int]] = []

    def fake(alloc: dict[str, int]) -> float:
        calls.append(dict(alloc))
        return 100.0 - (alloc["read.workers"] - 2) ** 2 * 10 - (alloc["udf.workers"] - 3) ** 2

    result = wl.exhaustive_search(grid, fake)
    assert len(calls) == 9 and calls[0] == {"read.workers": 1, "udf.workers": 1}
    assert result.best == {"read.workers": 2, "udf.workers": 3}
    assert result.best_rows_per_s == 100.0
    # within 3 workers: (1,2)=89, (2,1)=96 -> (2,1)
    assert result.best_within(3) == ({"read.workers": 2, "udf.workers": 1}, 96.0)
    assert result.best_within(1) == ({}, 0.0)
    with pytest.raises(ValueError, match="grid is empty"):
        wl.exhaustive_search({"read.workers": []}, fake)


def test_a_repeated_search_starts_further_along_the_grid_and_lists_it_in_grid_order() -> None:
    grid = {"read.workers": [1, 2], "udf.workers": [1, 2, 3]}
    calls: list[tuple[int, int]] = []

    def fake(alloc: dict[str, int]) -> float:
        calls.append((alloc["read.workers"], alloc["udf.workers"]))
        return float(10 * alloc["read.workers"] + alloc["udf.workers"])

    result = wl.exhaustive_search(grid, fake, rotate=8)  # 8 mod 6 = 2 places along
    assert calls == [(1, 3), (2, 1), (2, 2), (2, 3), (1, 1), (1, 2)]
    assert [(a["read.workers"], a["udf.workers"]) for a, _ in result.measured] == [
        (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)
    ]
    assert [r for _, r in result.measured] == [11.0, 12.0, 13.0, 21.0, 22.0, 23.0]


def test_the_best_of_repeated_searches_is_the_highest_median_not_the_luckiest_run() -> None:
    def search(a: float, b: float) -> wl.SearchResult:
        measured = [({"udf.workers": 1}, a), ({"udf.workers": 2}, b)]
        best = max(measured, key=lambda m: m[1])
        return wl.SearchResult(best=best[0], best_rows_per_s=best[1], measured=measured)

    # udf=2 had one fast spell (30k); udf=1 sustains more
    merged = wl.median_search([search(21.0, 30.0), search(20.0, 18.0), search(22.0, 19.0)])
    assert merged.best == {"udf.workers": 1} and merged.best_rows_per_s == 21.0
    assert [r for _, r in merged.measured] == [21.0, 19.0]
    other = wl.SearchResult(best={"read.workers": 1}, best_rows_per_s=1.0, measured=[({"read.workers": 1}, 1.0)])
    with pytest.raises(ValueError, match="different grids"):
        wl.median_search([search(1.0, 2.0), other])
    with pytest.raises(ValueError, match="no searches"):
        wl.median_search([])


def test_runs_are_scored_against_the_best_of_every_round_by_hand() -> None:
    s = tl.Settings.make(quick=False, tick_s=1.0)  # 15 s tail, 5 s window, 45 s phases
    ref = {
        2: wl.SearchResult(
            best={"read.workers": 2, "udf.workers": 3},
            best_rows_per_s=20_000.0,
            measured=[({"read.workers": 1, "udf.workers": 1}, 10_000.0), ({"read.workers": 2, "udf.workers": 3}, 20_000.0)],
        ),
        1: wl.SearchResult(best={"read.workers": 1, "udf.workers": 1}, best_rows_per_s=25_000.0, measured=[]),
    }
    converge = [10_000.0] * 10 + [18_000.0] * 50  # 90% of 20k from second 10
    resize = [18_000.0] * 45 + [12_000.0] * 45 + [9_000.0] * 20 + [19_000.0] * 25
    rows = [
        {"round": 1, **tl._row("convergence", "intune", "rates_per_s", converge)},
        {"round": 2, **tl._row("resize", "intune", "rates_per_s", resize)},
    ]
    got = {(r["benchmark"], r["policy"], r["metric"]): r for r in tl.scored_rows(rows, ref, s, full=2)}
    assert got[("convergence", "intune", "fraction_of_best")]["value"] == pytest.approx(0.9)
    assert got[("convergence", "intune", "fraction_of_best")]["round"] == 1
    assert got[("convergence", "intune", "time_to_90pct_s")]["value"] == 10.0
    assert got[("convergence", "intune", "time_to_90pct_s")]["meets"] is True  # within 20 s
    # the cpu-budget best: read 2 + udf 3 + the id source's worker is past 2 CPUs' grant, so 10k
    assert got[("convergence", "exhaustive", "best_within_cpu_budget_rows_per_s")]["value"] == 10_000.0
    # the 1-CPU best is capped at the 2-CPU one (fewer CPUs can never truly do better)
    assert got[("resize", "exhaustive", "best_rows_per_s_1cpu")]["value"] == 20_000.0
    assert got[("resize", "intune", "phase0_2cpu_reconverge_s")]["value"] == 0.0
    assert got[("resize", "intune", "phase1_1cpu_reconverge_s")]["value"] is None  # 12k < 18k
    assert got[("resize", "intune", "phase2_2cpu_reconverge_s")]["value"] == 20.0
    assert got[("resize", "intune", "phase2_2cpu_reconverge_s")]["round"] == 2


def test_first_sustained_needs_the_whole_window_above_the_threshold() -> None:
    rates = [0, 5, 9, 10, 8, 10, 10, 10, 2]
    assert wl.first_sustained(rates, 9.0, 1) == 2.0
    assert wl.first_sustained(rates, 9.0, 2) == 2.0  # (9+10)/2
    assert wl.first_sustained(rates, 9.5, 3) == 5.0  # bins 5,6,7
    assert wl.first_sustained(rates, 9.5, 3, start=6) is None  # 6,7,8 averages 7.3
    assert wl.first_sustained(rates, 9.0, 1, start=4) == 1.0  # measured from the phase start


def test_row_counter_finds_missing_repeated_and_unexpected_rows() -> None:
    counter = wl.RowCounter()
    counter.add(np.array([0, 1, 2, 2]))
    counter.add(np.array([70_000, 4]))  # grows past its first size
    assert counter.check(5) == {"produced": 5, "delivered": 6, "missing": 1, "repeated": 1, "unexpected": 1}
    with pytest.raises(ValueError, match="negative row id"):
        counter.add(np.array([-1]))


def test_arrivals_rate_and_timeline() -> None:
    arrivals = wl.Arrivals(start=0.0, times=[0.5, 1.2, 1.8, 2.5], rows=[10, 20, 30, 40])
    assert arrivals.rate(1.0, 2.0) == 50.0
    assert arrivals.timeline(3.0).tolist() == [10.0, 50.0, 40.0]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to take one away")
def test_cpu_restriction_reaches_threads_and_children_and_restores() -> None:
    from intune import monitor

    original = set(os.sched_getaffinity(0))
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with machine.CpuRestriction() as restriction:
            chosen = restriction.limit(1)
            assert len(chosen) == 1
            assert os.sched_getaffinity(thread.native_id) == chosen
            assert os.sched_getaffinity(child.pid) == chosen
            assert monitor.available_cpus() == 1.0
            late = threading.Thread(target=stop.wait, daemon=True)  # inherits the restriction
            late.start()
            assert os.sched_getaffinity(late.native_id) == chosen
        assert os.sched_getaffinity(thread.native_id) == original
        assert os.sched_getaffinity(child.pid) == original
        assert os.sched_getaffinity(late.native_id) == original
        with pytest.raises(ValueError, match="cannot restrict to 0 CPUs"):
            restriction.limit(0)
    finally:
        stop.set()
        child.kill()
        child.wait()


def test_memory_cgroup_oom_kills_a_child_over_its_limit_and_is_removed() -> None:
    reason = machine.memory_cgroup_unavailable()
    if reason:
        pytest.skip(f"no writable memory cgroup: {reason}")
    group = machine.MemoryCgroup(64 << 20)
    try:
        assert group.limit_bytes == 64 << 20
        code = (
            "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "import numpy; a = numpy.ones(256 << 20, dtype=numpy.uint8); print(a.sum())"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(group.procs_file)], stdout=subprocess.DEVNULL
        )
        assert child.wait(timeout=60) == -signal.SIGKILL
        stats = group.stats()
        assert stats["oom_kill"] >= 1 and stats["failcnt"] > 0
    finally:
        group.cleanup()
    assert not group.path.exists()


def _small() -> wl.Workload:
    return wl.Workload(
        chunk_rows=128, io_ms=2.0, udf_loops=20, payload_floats=4, shuffle_rows=512, batch_rows=100
    )


def test_a_policy_runs_live_and_every_row_arrives_exactly_once() -> None:
    run = wl.run_policy("heuristic", _small(), seconds=2.0, tick_s=0.5)
    check = run.check
    assert check["produced"] > 0
    assert check == {
        "produced": check["produced"],
        "delivered": check["produced"],
        "missing": 0,
        "repeated": 0,
        "unexpected": 0,
    }
    assert run.history, "the tuner recorded no tick"
    assert 0 < sum(run.arrivals.rows) <= check["delivered"]  # the rest arrived while draining
    assert run.tuner_stats["decisions"] >= 1 and 0 <= run.tuner_stats["cpu_fraction"] < 1


def test_an_unknown_policy_fails_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        wl.run_policy("fastest", _small(), seconds=1.0, tick_s=0.5)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to take one away")
def test_a_live_resize_is_seen_by_the_monitor_loses_nothing_and_is_undone() -> None:
    original = set(os.sched_getaffinity(0))
    run = wl.run_policy("heuristic", _small(), seconds=2.5, tick_s=0.5, phases=[(1.0, 1)])
    assert [(e["cpus"], e["monitor_cpus"]) for e in run.events] == [(1, 1.0)]
    assert run.check["missing"] == 0 and run.check["repeated"] == 0 and run.check["delivered"] > 0
    assert set(os.sched_getaffinity(0)) == original
    assert any(row["cpus"] == 1.0 for row in run.history), "no tick saw 1 CPU"


def test_meets_reads_the_target_text() -> None:
    assert tl.meets(0.95, ">= 0.9") is True and tl.meets(0.85, ">= 0.9") is False
    assert tl.meets(12.0, "<= 30") is True and tl.meets(None, "<= 30") is False  # never reached
    assert tl.meets(0, "= 0") is True and tl.meets(3, "= 0") is False
    assert tl.meets(False, "no") is True and tl.meets(True, "no") is False
    assert tl.meets(5.0, "read.workers=1 udf.workers=1") is None and tl.meets(5.0, "") is None


def test_unknown_policy_or_benchmark_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="unknown policies \\['fastest'\\]"):
        tl._split("heuristic,fastest", ("heuristic", "none"), "policies")
    assert tl._split(None, None, "x") is None


@pytest.mark.slow
def test_quick_benchmark_command_writes_json(tmp_path) -> None:
    import json

    from intune.cli import main

    out = tmp_path / "tune.json"
    assert (
        main(
            [
                "bench",
                "tune",
                "--quick",
                "--policies",
                "heuristic",
                "--only",
                "convergence",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    payload = json.loads(out.read_text())
    assert {"benchmark", "policy", "metric", "value", "target", "unit"} <= set(payload["results"][0])
    assert any(r["metric"] == "best_allocation" for r in payload["results"])


def test_the_memory_scenarios_state_their_ceiling_and_the_floor_variant_its_window() -> None:
    from intune.bench import tune_live

    for floor in (False, True):
        workload = tune_live.memory_workload(floor=floor)
        source = wl.RowSource(workload.chunk_rows, max_chunks=1)
        pipe = wl.build_pipeline(workload, source)
        with pipe:
            knob = pipe.knobs["shuffle.buffer_mb"]
            assert knob.max == tune_live.MEMORY_CEILING_MB
            assert (knob.min, knob.value) == ((256, 256) if floor else (1, 1536))


def test_the_pipeline_as_a_spec_has_the_engines_knobs_and_the_workloads_costs() -> None:
    from intune.sim import Simulator

    workload = wl.Workload(chunk_rows=256, io_ms=20.0, udf_loops=300)
    sim = Simulator(wl.simulated_spec(workload), cpus=2, seed=0)
    pipe = wl.build_pipeline(workload, wl.RowSource(workload.chunk_rows, max_chunks=1))
    try:
        live = set(pipe.knobs)
    finally:
        pipe.close()
    # every knob the engine gives the pipeline, and worker knobs held at 1 where the engine has none
    assert live <= set(sim.knobs)
    assert {n: (sim.knobs[n].min, sim.knobs[n].max) for n in set(sim.knobs) - live} == {
        "shuffle.workers": (1, 1),
        "prefetch.workers": (1, 1),
    }
    assert (sim.knobs["ids.workers"].min, sim.knobs["ids.workers"].max) == (1, 1)
    read, udf = (next(s for s in sim.spec.stages if s.name == n) for n in ("read", "udf"))
    assert read.io_us_per_row == pytest.approx(20_000 / 256) and read.mode == "thread"
    assert udf.cpu_us_per_row == pytest.approx(300 * wl.UDF_US_PER_LOOP) and udf.mode == "process"
    assert sim.spec.stages[2].buffer.min == workload.shuffle_min_mb  # the user's shuffle floor
    # the default pipeline's optimum on 2 CPUs: two readers beside two UDF workers, as the live search finds
    default = Simulator(wl.simulated_spec(), cpus=2, seed=0)
    best, _ = default.optimum(2, objective="throughput")
    assert (best["read.workers"], best["udf.workers"]) == (2, 2)


def test_each_round_runs_the_policies_one_place_further_along(monkeypatch) -> None:
    # the first policy of a round runs just after the searches, which end on one CPU: no policy may
    # always take that place, in any benchmark
    from intune import monitor
    from intune.cli import main

    orders: dict[str, list[list[str]]] = {"convergence": [], "resize": []}
    search = wl.SearchResult({"read.workers": 1}, 1.0, [({"read.workers": 1}, 1.0)])
    monkeypatch.setattr(tl.wl, "search_best", lambda *a, **k: search)
    monkeypatch.setattr(monitor, "available_cpus", lambda: 2.0)
    monkeypatch.setattr(tl, "bench_convergence", lambda policies, *a: orders["convergence"].append(list(policies)) or [])
    monkeypatch.setattr(tl, "bench_resize", lambda policies, *a: orders["resize"].append(list(policies)) or [])
    assert main(["bench", "tune", "--rounds", "4", "--only", "convergence,resize", "--policies", "heuristic,steer,network"]) == 0
    assert orders["convergence"] == [
        ["heuristic", "steer", "network"], ["steer", "network", "heuristic"],
        ["network", "heuristic", "steer"], ["heuristic", "steer", "network"],
    ]
    assert orders["resize"] == orders["convergence"]
