"""`intune bench real`: the CPU bound, ratios, skipping, and one measured system end to end."""

from __future__ import annotations

import importlib.util

import pytest

from intune.bench import real
from intune.dlrm import data, pipelines


def test_ratio_to_tf_and_share_of_the_cpu_bound() -> None:
    results = [
        {"system": "tf.data", "policy": "AUTOTUNE", "rows_per_s": 100.0},
        {"system": "intune-engine", "policy": "plumber", "rows_per_s": 150.0},
        {"system": "torchdata-nodes", "policy": None, "skipped": "torchdata not installed"},
    ]
    real.finish(results, {"rows_per_s": 200.0})
    assert results[0]["ratio_vs_tf_autotune"] == 1.0 and results[0]["cpu_bound_share"] == 0.5
    assert results[1]["ratio_vs_tf_autotune"] == 1.5 and results[1]["cpu_bound_share"] == 0.75
    assert results[2]["rows_per_s"] is None and results[2]["ratio_vs_tf_autotune"] is None
    without_tf = [{"system": "pytorch-dataloader", "policy": None, "rows_per_s": 10.0}]
    real.finish(without_tf, {"rows_per_s": 20.0})
    assert without_tf[0]["ratio_vs_tf_autotune"] is None


def test_cpu_bound_is_cpus_over_cpu_seconds_per_row(tmp_path) -> None:
    files = data.generate(70_000, tmp_path, seed=0, row_group_rows=20_000)
    bound = real.cpu_bound(files, pipelines.dlrm_standard(1000), batch_rows=4096, cpus=2.0)
    per_row = (bound["read_us_per_row"] + bound["udf_us_per_row"] + bound["batch_us_per_row"]) / 1e6
    assert bound["rows_per_s"] == pytest.approx(2.0 / per_row)
    assert bound["udf_us_per_row"] > 0 and bound["read_us_per_row"] > 0


def test_plan_lists_every_system_and_skips_what_is_missing() -> None:
    plan = real.available_systems(None)
    systems = [(s, p) for s, p, _ in plan]
    assert systems[:3] == [("pytorch-dataloader", None), ("torchdata-nodes", None), ("tf.data", "AUTOTUNE")]
    assert [p for s, p in systems[3:]] == list(real.ENGINE_POLICIES)
    reasons = {(s, p): why for s, p, why in plan}
    assert (reasons[("tf.data", "AUTOTUNE")] is None) == (importlib.util.find_spec("tensorflow") is not None)
    assert reasons[("intune-engine", "none")] is None
    only = real.available_systems(["intune-engine:none", "pytorch-dataloader"])
    assert [(s, p) for s, p, _ in only] == [("pytorch-dataloader", None), ("intune-engine", "none")]


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
    assert out["peak_rss_mb"] > 50
    assert out["config"]["knobs"]["udf.workers"] == 1


def test_a_tuned_run_keeps_its_history(tmp_path) -> None:
    history = tmp_path / "hist" / "heuristic.jsonl"
    spec = _engine_spec(
        tmp_path, 20_000, "heuristic", model_latency_ms=0.0, warmup_rows=2048, warmup_s=1.5,
        measure_rows=8192, tick_s=0.25, history=str(history),
    )
    out = real.run_child(spec, timeout_s=120)
    assert "error" not in out, out
    ticks = history.read_text().splitlines()
    assert len(ticks) >= 2
    assert abs(len(out["config"]["knob_trace"]["udf.workers"]) - len(ticks)) <= 1  # the tuner still ticks


def test_markdown_report_carries_the_context() -> None:
    results = [
        {
            "system": "tf.data",
            "policy": "AUTOTUNE",
            "rows_per_s": 100.0,
            "config": {"autotune_chosen": {"Prefetch": {"buffer_size": 2.0}}},
        },
        {
            "system": "intune-engine",
            "policy": "plumber",
            "rows_per_s": 150.0,
            "config": {"knobs": {"udf.workers": 1}, "knob_trace": {"udf.workers": [1, 2, 2, 1]}},
        },
    ]
    bound = {
        "rows_per_s": 200.0,
        "cpus": 2.0,
        "read_us_per_row": 1.0,
        "udf_us_per_row": 8.0,
        "batch_us_per_row": 1.0,
    }
    real.finish(results, bound)
    config = {
        "measure_rows": 1000,
        "warmup_s": 5.0,
        "warmup_rows": 100,
        "udf": "heavy",
        "batch_rows": 64,
        "model_latency_ms": 0,
    }
    text = real.markdown_report(
        {"machine": {"usable_cpus": 2.0}, "results": results, "cpu_bound": bound, "config": config},
        "intune bench real",
    )
    assert "CPU bound: 200 rows/s = 2 CPUs / (1.0 read + 8.0 UDF + 1.0 batch)" in text
    row = next(line for line in text.splitlines() if line.startswith("| intune-engine"))
    assert [c.strip() for c in row.strip("|").split("|")][:5] == [
        "intune-engine",
        "plumber",
        "150",
        "1.50",
        "0.75",
    ]
    assert "- plumber: {'udf.workers': 1}" in text and "'buffer_size': 2.0" in text
    assert "- plumber: udf.workers 1x1 2x2 1x1" in text  # the tuner's trajectory, run-length coded


def test_hand_set_engine_allocations_only_on_request() -> None:
    from intune.bench.real_systems import fixed_allocation

    assert fixed_allocation("plumber") is None
    assert fixed_allocation("fixed:udf.workers=2+prefetch.buffer_mb=64") == {
        "udf.workers": 2,
        "prefetch.buffer_mb": 64,
    }
    with pytest.raises(ValueError, match="is not knob=integer"):
        fixed_allocation("fixed:udf.workers=two")
    plan = real.available_systems(["intune-engine:none", "intune-engine:fixed:udf.workers=2"])
    assert [(s, p) for s, p, _ in plan] == [
        ("intune-engine", "none"),
        ("intune-engine", "fixed:udf.workers=2"),
    ]
    assert all(("fixed" in (p or "")) is False for _, p, _ in real.available_systems(None))
