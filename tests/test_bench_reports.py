"""Every ``intune bench ... --md`` report: the shared header and spread cells, and each command's table
built from a small hand-made results dict (no benchmark runs here)."""

from __future__ import annotations

import argparse

import pytest

from intune.bench import engine, hammock, md_report, real, sim, tune_live

MACHINE = {
    "time_utc": "2026-01-02T03:04:05Z",
    "usable_cpus": 2.0,
    "host_cpus": 4,
    "platform": "Linux-x",
    "python": "3.11.7",
    "numpy": "2.4.6",
}


def _table_row(text: str, first_cell: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is ``first_cell``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r} in:\n{text}")


# ---- md_report -----------------------------------------------------------------------------------------


def test_spread_is_the_median_and_the_range_by_hand() -> None:
    # odd count: the middle value; even count: the mean of the two middle ones
    assert md_report.spread([1.10, 0.92, 0.97], ".2f") == "0.97 (0.92–1.10 over 3 runs)"
    assert md_report.spread([3.0, 1.0, 2.0, 10.0], ".1f") == "2.5 (1.0–10.0 over 4 runs)"
    assert md_report.spread([-0.02, 0.01], "+.3f", "folds") == "-0.005 (-0.020–+0.010 over 2 folds)"
    assert md_report.spread([0.5]) == "0.5 (1 run)"
    assert md_report.spread([0.5], unit="folds") == "0.5 (1 fold)"
    assert md_report.spread([]) == "-"


def test_command_line_is_argv_as_run_or_marked_when_not_ours() -> None:
    argv = ["bench", "real", "--systems", "a b,c", "--md", "x.md"]
    assert md_report.command_line(("bench", "real"), argv) == "intune bench real --systems 'a b,c' --md x.md"
    # pytest's own arguments are not this command's
    assert md_report.command_line(("bench", "real"), ["-q", "tests"]) == (
        "intune bench real (called from Python; options not recorded)"
    )


def test_render_opens_with_command_date_machine_then_context_and_tables() -> None:
    part = md_report.section("Results", ["one line"], [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}])
    text = md_report.render("intune bench x --md y", MACHINE, ["context"], [part])
    lines = text.splitlines()
    assert lines[0] == "# `intune bench x --md y`"
    assert lines[2] == (
        "Date: 2026-01-02T03:04:05Z. Machine: 2.0 usable CPUs of 4, Linux-x, Python 3.11.7, numpy 2.4.6."
    )
    assert lines[4] == "context" and "## Results" in lines and "one line" in lines
    assert _table_row(text, "2") == ["2", "y"] and text.endswith("\n")


def test_write_creates_the_folder(tmp_path) -> None:
    out = md_report.write(tmp_path / "a" / "b.md", "# x\n")
    assert out.read_text() == "# x\n"


@pytest.mark.parametrize("module", [engine, sim, tune_live, real, hammock])
def test_every_bench_command_takes_md(module) -> None:
    parser = argparse.ArgumentParser()
    module.configure(parser)
    assert parser.parse_args(["--md", "out.md"]).md == "out.md"


# ---- each command's report -------------------------------------------------------------------------------


def test_engine_report_has_each_measurement_with_its_repeats() -> None:
    results = [
        engine.result("overhead", 0.97, "ratio", 0.9, True, "best of 3", [0.95, 0.97, 0.90]),
        engine.result("resize", 0.021, "s", 0.5, False, "worst", [0.020, 0.021]),
    ]
    text = engine.markdown_report(results, quick=True, command="intune bench engine --quick")
    assert text.startswith("# `intune bench engine --quick`") and "Quick run" in text
    row = _table_row(text, "overhead")
    assert row[1:6] == ["0.97", "ratio", "0.9", "yes", "0.95 (0.9–0.97 over 3 runs)"]
    assert _table_row(text, "resize")[4:6] == ["yes", "0.0205 (0.02–0.021 over 2 runs)"]


def _tune_rows() -> list[dict]:
    r = tune_live._row
    return [
        r("convergence", "exhaustive", "best_rows_per_s", 40_000.0, "", "rows/s"),
        r("convergence", "intune", "rows_per_s_last_15s", 36_000.0, "", "rows/s"),
        r("convergence", "intune", "fraction_of_best", 0.9, ">= 0.9", "x"),
        r("convergence", "intune", "time_to_90pct_s", 8.0, "<= 60", "s"),
        r("convergence", "intune", "rows_missing", 0, "= 0", "rows"),
        r("convergence", "intune", "rows_repeated", 0, "= 0", "rows"),
        r("convergence", "heuristic", "rows_per_s_last_15s", 12_000.0, "", "rows/s"),
        r("convergence", "heuristic", "time_to_90pct_s", None, "<= 60", "s"),
        r("resize", "intune", "phase0_2cpu_reconverge_s", 12.0, "<= 45", "s"),
        r("resize", "intune", "phase0_2cpu_rows_per_s", 33_000.0, "", "rows/s"),
        r("resize", "intune", "phase1_1cpu_reconverge_s", None, "<= 30", "s"),
        r("resize", "intune", "phase1_1cpu_rows_per_s", 19_000.0, "", "rows/s"),
        r("memory", "intune", "oom_killed", False, "no"),
        r("memory", "intune", "peak_usage_mb", 798.4, "", "MB"),
        r("memory", "intune", "rows_repeated", 2, "= 0", "rows"),
    ]


def test_tune_report_has_one_row_per_policy_the_search_and_every_row() -> None:
    searches = {"2": [{"allocation": {"read.workers": 4, "udf.workers": 2}, "rows_per_s": 40_000.0}]}
    settings = {
        "run_s": 60.0,
        "tail_s": 15.0,
        "phase_s": 45.0,
        "memory_s": 45.0,
        "memory_limit_mb": 1024,
        "tick_s": 1.0,
    }
    text = tune_live.markdown_report(_tune_rows(), searches, settings, "intune bench tune", MACHINE)
    intune = _table_row(text, "intune")
    assert intune == [
        "intune",
        "36,000",
        "0.90",
        "8",
        "2 / 1",
        "33,000 / 19,000",
        "12 / never",
        "no",
        "-",
        "798",
        "-",
        "-",
        "-",
        "-",
        "2",
    ]
    heuristic = _table_row(text, "heuristic")
    assert heuristic[1:4] == ["12,000", "-", "never"] and heuristic[-4:] == ["-", "-", "-", "-"]
    assert _table_row(text, "read.workers=4 udf.workers=2") == ["read.workers=4 udf.workers=2", "40,000"]
    assert "## Every row" in text and f"The {len(_tune_rows())} measured rows" in text
    assert "| resize      | intune" not in text  # the rows themselves are in the JSON file only


def test_tune_report_gives_the_median_and_range_of_several_rounds() -> None:
    r = tune_live._row
    rows = [
        {"round": k, **row}
        for k, (fraction, reached, killed) in enumerate([(0.9, 8.0, False), (0.5, None, True), (0.7, 20.0, False)], 1)
        for row in (
            r("convergence", "intune", "fraction_of_best", fraction, ">= 0.9", "x"),
            r("convergence", "intune", "time_to_90pct_s", reached, "<= 60", "s"),
            r("memory", "intune", "oom_killed", killed, "no"),
        )
    ]
    settings = {"run_s": 60.0, "tail_s": 15.0, "phase_s": 45.0, "memory_s": 45.0, "memory_limit_mb": 1024, "tick_s": 1.0}
    text = tune_live.markdown_report(rows, {}, settings, "intune bench tune --rounds 3", MACHINE)
    intune = _table_row(text, "intune")
    assert intune[2:4] == ["0.70 (0.50–0.90 over 3 runs)", "20 (8–never over 3 runs)"]  # a round that never got there is the latest
    assert intune[7] == "yes in 1 of 3"
    assert tune_live._rounds_cell([None, None], ".0f") == "never (2 runs)"
    assert "ran 3 times per benchmark, interleaved" in text
    with pytest.raises(SystemExit, match="--rounds must be at least 1"):
        tune_live.run(argparse.Namespace(policies="heuristic", only="convergence", quick=True, tick=1.0, rounds=0,
                                         history=None, json=None, md=None))


def test_real_report_opens_with_the_shared_header() -> None:
    results = [
        {"system": "tf.data", "policy": "AUTOTUNE", "rows_per_s": 100.0},
        {"system": "intune-engine", "policy": "intune", "rows_per_s": 180.0},
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
    payload = {"machine": MACHINE, "results": results, "cpu_bound": bound, "config": config}
    text = real.markdown_report(payload, "intune bench real --quick")
    assert text.splitlines()[:3] == ["# `intune bench real --quick`", "", md_report.machine_line(MACHINE)]
    assert _table_row(text, "intune-engine")[1:5] == ["intune", "180", "1.80", "0.90"]


def _fold(dataset: str, model: str, fold: int, auc: float) -> dict:
    return {
        "dataset": dataset,
        "model": model,
        "fold": fold,
        "auc": auc,
        "accuracy": 0.5,
        "logloss": 0.7,
        "r2": None,
        "fit_s": 1.0,
    }


def test_hammock_report_shows_the_paired_differences_spread_over_folds() -> None:
    per_fold = []
    for fold, (lgb, ham) in enumerate([(0.90, 0.89), (0.92, 0.90), (0.91, 0.92)]):
        per_fold += [
            _fold("random_trees_10k", "hammock", fold, ham),
            _fold("random_trees_10k", "lightgbm", fold, lgb),
        ]
    summary = hammock.summarise(per_fold)
    verdict = hammock.verdicts(summary)
    config = {
        "quick": True,
        "repeats": 1,
        "large_repeats": 1,
        "rows": [10_000],
        "models": ["hammock", "lightgbm"],
        "threads": 1,
    }
    text = hammock.markdown_report(summary, per_fold, verdict, config, "intune bench hammock --quick")
    # differences -0.01, -0.02, +0.01: median -0.01, range -0.02 to +0.01
    assert _table_row(text, "random_trees_10k")[1] == "hammock"
    assert _table_row(text, "random_trees_10k")[-1] == "-0.0100 (-0.0200–+0.0100 over 3 folds)"
    mean = (-0.01 - 0.02 + 0.01) / 3
    assert _table_row(text, "hammock")[1:3] == [f"{mean:+.4f}", "no"]


def test_sim_report_uses_the_shared_header() -> None:
    row = {
        "workload": "criteo",
        "panel": "fig7",
        "throughput_norm": 1.0,
        "oracle_ratio": 0.5,
        "ooms": 0,
        "convergence_ticks": [3, None],
        "cpu_util": 0.5,
        "rows_per_s": 10.0,
    }
    results = [
        {**row, "policy": "none"},
        {**row, "policy": "oracle", "oracle_ratio": 1.0, "rows_per_s": 20.0},
    ]
    text = sim.markdown_report(results, ["none", "oracle"], MACHINE, "intune bench sim", ["ctx"])
    assert text.splitlines()[:5] == ["# `intune bench sim`", "", md_report.machine_line(MACHINE), "", "ctx"]
    assert _table_row(text, "none")[1:4] == ["1", "0.500", "0.50 (criteo)"]
