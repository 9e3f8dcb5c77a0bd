"""`intune bench real`: the plan and its rotating rounds, the CPU bound by hand and measured in a worker,
PSS over a process tree, summaries from medians, the report, and systems measured end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from intune.bench import real
from intune.dlrm import data, pipelines


def _run(system: str, policy: str | None, r: int, rate: float | None, **more) -> dict:
    """A per-run row as ``run_rounds`` makes it (a failed run has an error and no rate)."""
    role = "dataloader-sweep" if system == "pytorch-dataloader" else more.pop("role", "system")
    row = {"system": system, "policy": policy, "role": role, "round": r, "position": 0, **more}
    return {**row, "rows_per_s": rate} if rate is not None else {**row, "error": "exit 1: boom"}


def test_summaries_are_medians_over_rounds_and_ratios_come_from_medians() -> None:
    results = [
        *[_run("tf.data", "AUTOTUNE", r, rate) for r, rate in enumerate([90.0, 100.0, 130.0])],
        *[_run("intune-engine", "plumber", r, rate) for r, rate in enumerate([100.0, 160.0, 150.0])],
        _run("intune-engine", "intune", 0, 300.0),
        _run("intune-engine", "intune", 1, None),  # a failed run: listed, not counted
        {"system": "torchdata-nodes", "policy": None, "role": "system", "skipped": "torchdata not installed"},
    ]
    summary = {
        (s["system"], s["policy"]): s for s in real.finish(results, {"rows_per_s": 200.0, "cpus": 2.0})
    }
    tf, plumber, intune = (
        summary[("tf.data", "AUTOTUNE")],
        summary[("intune-engine", "plumber")],
        summary[("intune-engine", "intune")],
    )
    assert tf["rows_per_s"] == 100.0 and tf["rows_per_s_values"] == [90.0, 100.0, 130.0]
    assert tf["ratio_vs_tf_autotune"] == 1.0 and tf["cpu_bound_share"] == 0.5
    # medians 150 / 100, not the mean (136.7) nor a single round's ratio
    assert plumber["ratio_vs_tf_autotune"] == 1.5 and plumber["cpu_bound_share"] == 0.75
    assert intune["rounds"] == 1 and intune["rows_per_s"] == 300.0 and intune["errors"] == ["exit 1: boom"]
    missing = summary[("torchdata-nodes", None)]
    assert missing["rows_per_s"] is None and missing["ratio_vs_tf_autotune"] is None and missing["skipped"]
    without_tf = real.finish([_run("intune-engine", "none", 0, 10.0)], {"rows_per_s": 20.0, "cpus": 2.0})
    assert without_tf[0]["ratio_vs_tf_autotune"] is None and without_tf[0]["cpu_bound_share"] == 0.5


def test_dataloader_default_and_best_of_sweep_are_separate_rows() -> None:
    results = [
        _run("pytorch-dataloader", f"num_workers={n}", r, rate)
        for n, rates in ((2, [80.0, 82.0, 81.0]), (3, [90.0, 70.0, 91.0]), (4, [85.0, 86.0, 84.0]))
        for r, rate in enumerate(rates)
    ]
    summary = real.finish(results, {"rows_per_s": 100.0, "cpus": 2.0})
    systems = [(s["policy"], s["rows_per_s"]) for s in summary if s["role"] == "system"]
    # the default is num_workers = CPUs; the best is by median (90 for 3 workers beats 85 for 4)
    assert systems == [("default: num_workers=2", 81.0), ("best of sweep: num_workers=3", 90.0)]
    assert [s["policy"] for s in summary if s["role"] == "dataloader-sweep"] == [
        "num_workers=2",
        "num_workers=3",
        "num_workers=4",
    ]


def test_cpu_bound_by_hand_from_fake_costs() -> None:
    costs = [
        {"read_us_per_row": 2.0, "udf_us_per_row": 14.0, "batch_us_per_row": 0.1},
        {"read_us_per_row": 3.0, "udf_us_per_row": 12.0, "batch_us_per_row": 0.0},
        {"read_us_per_row": 2.5, "udf_us_per_row": 20.0, "batch_us_per_row": 0.2},
    ]
    bound = real.cpu_bound(costs, cpus=2.0)
    # each stage's median (2.5, 14.0, 0.1 us), summed: 16.6 us per row, so 2 CPUs give 120,482 rows/s
    assert (bound["read_us_per_row"], bound["udf_us_per_row"], bound["batch_us_per_row"]) == (2.5, 14.0, 0.1)
    assert bound["rows_per_s"] == pytest.approx(2.0 / 16.6e-6)
    # per-round bounds: 2 / 16.1 us, 2 / 15.0 us, 2 / 22.7 us
    assert bound["rows_per_s_values"] == pytest.approx([2e6 / 16.1, 2e6 / 15.0, 2e6 / 22.7])
    assert bound["rounds"] == 3 and real.cpu_bound([], cpus=2.0) is None


def test_stage_costs_are_measured_over_at_least_20_chunks_after_warmup(tmp_path) -> None:
    from intune.bench.real_systems import stage_costs

    files = data.generate(30_000, tmp_path, seed=0, row_group_rows=8_192)
    spec = {"files": [str(f) for f in files], "batch_rows": 1024, "cost_chunks": 5}  # raised to 20
    costs = stage_costs(spec, pipelines.dlrm_standard(1000))
    # whole row groups are read and all their chunks go through the UDF: 3 groups of 8 chunks
    assert costs["chunks"] == 24 and costs["udf_rows"] == costs["read_rows"] == 3 * 8_192
    assert costs["udf_us_per_row"] > 0 and costs["read_us_per_row"] > 0 and costs["batch_us_per_row"] >= 0


def test_pss_and_uss_are_summed_over_a_fake_process_tree() -> None:
    import psutil

    from intune.bench.real_systems import tree_memory

    class Info:
        def __init__(self, pss: int, uss: int) -> None:
            self.pss, self.uss, self.rss = pss, uss, 10 * pss  # rss is never summed

    class Proc:
        def __init__(self, pss: int, uss: int, kids: list | None = None, gone: bool = False) -> None:
            self.info, self.kids, self.gone = Info(pss, uss), kids or [], gone

        def memory_full_info(self) -> Info:
            if self.gone:
                raise psutil.NoSuchProcess(1)
            return self.info

        def children(self, recursive: bool = False) -> list:
            assert recursive
            out = []
            for kid in self.kids:
                out += [kid, *kid.children(recursive=True)]
            return out

    grandchild = Proc(5, 1)
    root = Proc(100, 60, [Proc(30, 10, [grandchild]), Proc(20, 8), Proc(999, 999, gone=True)])
    # the parent, two workers, one worker's child; a process that ended while being read is left out
    assert tree_memory(root) == {"pss": 155, "uss": 79}
    me = tree_memory()
    assert 0 < me["uss"] <= me["pss"]


def test_rounds_interleave_in_the_rotating_order() -> None:
    plan = [real.Entry("a", None), real.Entry("b", None), real.Entry("c", "x", role="static-sweep")]
    ran: list[tuple[int, str]] = []

    def fake(entry: real.Entry, r: int) -> dict:
        ran.append((r, entry.system))
        return {"rows_per_s": 1.0}

    rows = real.run_rounds(plan, 4, fake)
    assert [s for _, s in ran] == list("abc" + "bca" + "cab" + "abc")
    assert [(row["round"], row["position"], row["system"]) for row in rows[3:6]] == [
        (1, 0, "b"),
        (1, 1, "c"),
        (1, 2, "a"),
    ]
    assert rows[2]["role"] == "static-sweep" and rows[2]["policy"] == "x"
    assert real.round_order([], 3) == []


def test_plan_lists_every_system_and_skips_what_is_missing() -> None:
    plan = real.available_systems(None, cpus=2.0)
    systems = [(e.system, e.policy) for e in plan]
    assert systems[:5] == [
        ("pytorch-dataloader", "num_workers=2"),
        ("pytorch-dataloader", "num_workers=3"),
        ("pytorch-dataloader", "num_workers=4"),
        ("torchdata-nodes", None),
        ("tf.data", "AUTOTUNE"),
    ]
    assert [p for _, p in systems[5:]] == list(real.ENGINE_POLICIES)
    reasons = {(e.system, e.policy): e.skip for e in plan}
    assert (reasons[("tf.data", "AUTOTUNE")] is None) == (importlib.util.find_spec("tensorflow") is not None)
    assert (reasons[("torchdata-nodes", None)] is None) == (importlib.util.find_spec("torchdata") is not None)
    assert reasons[("intune-engine", "none")] is None
    only = real.available_systems(["intune-engine:none", "pytorch-dataloader:num_workers=3"], cpus=2.0)
    assert [(e.system, e.policy) for e in only] == [
        ("pytorch-dataloader", "num_workers=3"),
        ("intune-engine", "none"),
    ]
    # any live policy may be asked for by name; a name that is no system is refused, never left out silently
    asked = real.available_systems(["intune-engine:intune", "intune-engine:planner+agent", "intune-engine:steer"])
    assert [(e.system, e.policy) for e in asked] == [
        ("intune-engine", "intune"), ("intune-engine", "planner+agent"), ("intune-engine", "steer"),
    ]
    for bad in ("intune-engine:planner-agent", "intune-engine:oracle", "tfdata"):
        with pytest.raises(SystemExit, match=f"unknown system '{bad}'.*intune-engine:POLICY"):
            real.available_systems([bad])
    # a round: the costs, the systems, then the static sweep (udf 1..3, the reader at 1..2; 1 in quick)
    full = real.plan_runs(["intune-engine:none"], cpus=2.0, quick=False)
    assert [e.role for e in full] == ["costs", "system", *["static-sweep"] * 6]
    assert full[-1].policy == "fixed:read.workers=2+udf.workers=3"
    assert len(real.plan_runs(None, cpus=2.0, quick=True, sweep=False)) == 1 + len(plan)
    assert [e.policy for e in real.plan_runs([], 2.0, quick=True)][-3:] == [
        f"fixed:read.workers=1+udf.workers={u}" for u in (1, 2, 3)
    ]


def _engine_spec(tmp_path, rows: int, policy: str, **overrides) -> dict:
    """A small ``intune-engine`` run of the standard UDF over freshly generated data."""
    files = data.generate(rows, tmp_path, seed=0, row_group_rows=8_192)
    spec = {
        "system": "intune-engine",
        "policy": policy,
        "files": [str(f) for f in files],
        "udf": "standard",
        "table_size": 1000,
        "batch_rows": 2048,
        "cpus": 2.0,
        "model_latency_ms": 5.0,
        "warmup_rows": 4096,
        "warmup_s": 0.0,
        "measure_rows": 16_384,
    }
    return {**spec, **overrides}


def test_one_system_measured_in_its_own_process(tmp_path) -> None:
    spec = _engine_spec(tmp_path, 40_000, "none")
    out = real.run_child(spec, timeout_s=120)
    assert "error" not in out, out
    # 16,384 rows = 8 batches of 2048, after 2 warm-up batches; the 5 ms model step sleeps after each
    assert out["rows"] == 16_384 and out["seconds"] >= 8 * 0.005 and out["warmup_s"] >= 2 * 0.005
    assert out["rows_per_s"] == pytest.approx(16_384 / out["seconds"])
    assert out["cpu_s"] > 0 and out["cpu_util"] == pytest.approx(out["cpu_s"] / out["seconds"] / 2.0)
    # idle is the share of the measured time spent waiting for a batch: never the model's sleeps
    assert 0 <= out["idle_pct"] <= 100 * (1 - 8 * 0.005 / out["seconds"])
    assert out["peak_pss_mb"] > 50 and 0 < out["peak_uss_mb"] <= out["peak_pss_mb"]
    assert out["config"]["knobs"]["udf.workers"] == 1
    # no job size asked: no job time; the stream stopped after the warm-up and measured batches
    assert out["job_s"] is None and out["rows_delivered"] == 4096 + 16_384
    assert 0 < out["first_batch_s"] <= out["warmup_s"]


def test_the_job_time_counts_rows_from_the_cold_start_across_epochs(tmp_path) -> None:
    # 20,000 rows a epoch: the job (30,000 rows) ends in the 2nd epoch, after the measured window
    spec = _engine_spec(tmp_path, 20_000, "none", model_latency_ms=0.0, measure_rows=4096, job_rows=30_000)
    out = real.run_child(spec, timeout_s=120)
    assert "error" not in out, out
    assert out["rows_delivered"] >= 30_000 and out["job_rows"] == 30_000
    assert 0 < out["first_batch_s"] < out["job_s"]


def test_dataloader_keeps_its_workers_across_epochs(tmp_path) -> None:
    # 3 epochs of 12,000 rows through persistent workers, two per CPU as the sweep's top setting
    spec = _engine_spec(
        tmp_path,
        12_000,
        "num_workers=4",
        system="pytorch-dataloader",
        model_latency_ms=0.0,
        warmup_rows=2048,
        measure_rows=24_000,
        job_rows=12_000,
    )
    out = real.run_child(spec, timeout_s=120)
    assert "error" not in out, out
    assert out["config"] == {"num_workers": 4, "persistent_workers": True, "prefetch_factor": 2}
    assert out["rows"] >= 24_000 and out["rows_delivered"] >= 26_048 and out["job_s"] is not None
    assert out["peak_pss_mb"] > 50 and out["peak_uss_mb"] <= out["peak_pss_mb"]


def test_a_tuned_run_keeps_its_history(tmp_path) -> None:
    history = tmp_path / "hist" / "heuristic.jsonl"
    spec = _engine_spec(
        tmp_path,
        20_000,
        "heuristic",
        model_latency_ms=0.0,
        warmup_rows=2048,
        warmup_s=1.5,
        measure_rows=8192,
        tick_s=0.25,
        history=str(history),
    )
    out = real.run_child(spec, timeout_s=120)
    assert "error" not in out, out
    ticks = history.read_text().splitlines()
    assert len(ticks) >= 2
    assert abs(len(out["config"]["knob_trace"]["udf.workers"]) - len(ticks)) <= 1  # the tuner still ticks


def test_markdown_report_carries_the_context() -> None:
    plumber = {"knobs": {"udf.workers": 1}, "knob_trace": {"udf.workers": [1, 2, 2, 1]}}
    results = [
        _run("stage-costs", None, 0, None, role="costs") | {"error": "timed out after 9 s"},
        *[_run("tf.data", "AUTOTUNE", r, rate) for r, rate in enumerate([100.0, 90.0, 110.0])],
        *[
            _run("intune-engine", "plumber", r, rate, config=plumber, peak_pss_mb=pss, job_s=job)
            for r, (rate, pss, job) in enumerate(
                [(150.0, 300.0, 9.0), (140.0, 320.0, 8.0), (160.0, 310.0, 7.5)]
            )
        ],
        *[_run("pytorch-dataloader", f"num_workers={n}", 0, 80.0 + n) for n in (2, 3)],
        _run("intune-engine", "fixed:read.workers=1+udf.workers=2", 0, 180.0, role="static-sweep"),
        _run("intune-engine", "fixed:read.workers=1+udf.workers=3", 0, 210.0, role="static-sweep"),
    ]
    for position, row in enumerate(results):
        row["position"] = position
    bound = real.cpu_bound(
        [{"read_us_per_row": 1.0, "udf_us_per_row": 8.0, "batch_us_per_row": 1.0}] * 2, cpus=0.002
    )
    summary = real.finish(results, bound)
    config = {
        "measure_rows": 1000,
        "warmup_s": 5.0,
        "warmup_rows": 100,
        "udf": "heavy",
        "batch_rows": 64,
        "model_latency_ms": 0,
        "rounds": 3,
        "job_rows": 5000,
    }
    payload = {
        "machine": {"usable_cpus": 2.0},
        "results": results,
        "cpu_bound": bound,
        "config": config,
        "summary": summary,
        "cross_check": real.cross_check(summary, bound),
    }
    text = real.markdown_report(payload, "intune bench real")
    assert "CPU bound: 200 rows/s = 0.002 CPUs / (1.0 read + 8.0 UDF + 1.0 batch)" in text
    rows = [
        [c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")
    ]
    systems, memory = [cells for cells in rows if cells[:2] == ["intune-engine", "plumber"]]
    # median 150 over three rounds; x tf.data from medians (150 / 100); share of the bound 150 / 200
    assert systems[:6] == ["intune-engine", "plumber", "150", "1.50", "0.75", "150 (140–160 over 3 runs)"]
    # peak PSS and the time to the job's 5,000 rows, median and range
    assert memory[2] == "310 (300–320 over 3 runs)" and memory[5] == "8.0 (7.5–9.0 over 3 runs)"
    assert "5,000 rows, s" in text
    assert "default: num_workers=2" in text and "best of sweep: num_workers=3" in text
    # the fixed allocation at 210 rows/s beats the bound: the cross-check says so
    assert "read.workers=1+udf.workers=3, ran at 210 (1 run) rows/s, 1.05 of the bound" in text
    assert "medians above the bound: intune-engine (fixed:read.workers=1+udf.workers=3)" in text
    assert "- plumber, round 1: {'udf.workers': 1}" in text
    assert "- plumber, round 2: udf.workers 1x1 2x2 1x1" in text  # the tuner's trajectory, run-length coded
    assert "## Every run" in text and "timed out after 9 s" in text


def test_hand_set_engine_allocations_only_on_request() -> None:
    from intune.bench.real_systems import dataloader_workers, fixed_allocation

    assert fixed_allocation("plumber") is None
    assert fixed_allocation("fixed:udf.workers=2+prefetch.buffer_mb=64") == {
        "udf.workers": 2,
        "prefetch.buffer_mb": 64,
    }
    with pytest.raises(ValueError, match="is not knob=integer"):
        fixed_allocation("fixed:udf.workers=two")
    plan = real.available_systems(["intune-engine:none", "intune-engine:fixed:udf.workers=2"])
    assert [(e.system, e.policy) for e in plan] == [
        ("intune-engine", "none"),
        ("intune-engine", "fixed:udf.workers=2"),
    ]
    assert all(("fixed" in (e.policy or "")) is False for e in real.available_systems(None))
    assert dataloader_workers("num_workers=3", 2.0) == 3 and dataloader_workers(None, 2.0) == 2


def test_the_command_runs_rounds_and_writes_runs_summaries_and_report(tmp_path, monkeypatch) -> None:
    """``run`` end to end with the children faked: the order, the specs, the JSON and the report."""
    import argparse
    import json

    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(real.QUICK, "rows", 20_000)
    specs: list[dict] = []

    def fake_child(spec: dict, timeout_s: float) -> dict:
        specs.append(spec)
        assert Path(spec["udf_path"]).exists()  # one pickled UDF for every run
        if spec["system"] == "stage-costs":
            return {"read_us_per_row": 2.0, "udf_us_per_row": 14.0, "batch_us_per_row": 0.0, "chunks": 20}
        rate = 1000.0 * (1 + len(specs) % 3)
        return {
            "rows_per_s": rate,
            "cpu_util": 0.5,
            "peak_pss_mb": 100.0,
            "peak_uss_mb": 50.0,
            "first_batch_s": 0.5,
            "job_rows": spec["job_rows"] or None,
            "job_s": 2.0 if spec["job_rows"] else None,
        }

    monkeypatch.setattr(real, "run_child", fake_child)
    parser = argparse.ArgumentParser()
    real.configure(parser)
    args = parser.parse_args(
        [
            "--quick",
            "--systems",
            "intune-engine:none,tf.data",
            "--json",
            str(tmp_path / "r.json"),
            "--md",
            str(tmp_path / "r.md"),
        ]
    )
    assert real.run(args) == 0
    payload = json.loads((tmp_path / "r.json").read_text())
    runs = [r for r in payload["results"] if "round" in r]
    per_round = 1 + 2 + 3  # costs, tf.data and intune-engine:none, the quick static sweep
    if importlib.util.find_spec("tensorflow") is None:
        per_round -= 1
        assert any(r.get("skipped") for r in payload["results"])
    assert len(runs) == 3 * per_round and {r["round"] for r in runs} == {0, 1, 2}
    order = [[(r["system"], r["policy"]) for r in runs if r["round"] == k] for k in range(3)]
    assert order[1] == order[0][1:] + order[0][:1] and order[2] == order[0][2:] + order[0][:2]
    sweep = [s for s in specs if (s["policy"] or "").startswith("fixed:")]
    assert len(sweep) == 9 and all(
        s["warmup_s"] == real.QUICK["sweep_warmup_s"] and s["job_rows"] == 0 for s in sweep
    )
    assert payload["cpu_bound"]["rows_per_s"] == pytest.approx(payload["cpu_bound"]["cpus"] / 16e-6)
    engine = next(s for s in payload["summary"] if s["policy"] == "none")
    assert engine["rounds"] == 3 and len(engine["rows_per_s_values"]) == 3 and engine["job_s"] == 2.0
    assert payload["cross_check"]["allocations"] == 3
    text = (tmp_path / "r.md").read_text()
    for heading in (
        "## CPU bound",
        "## Systems",
        "## Memory and time to data",
        "## Fixed engine allocations",
        "## Every run",
    ):
        assert heading in text
