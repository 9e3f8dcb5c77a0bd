"""intune bench resume: registered on the command line; its pure parts compute what the report says."""

from __future__ import annotations

from intune.bench import resume as bench
from intune.cli import build_parser


def test_bench_resume_is_a_command():
    args = build_parser().parse_args(["bench", "resume"])
    assert args._module == "intune.bench.resume"


def test_replay_depth_reports_the_log_size_and_the_refill():
    (row,) = bench.replay_depth([80 * bench.CHUNK_ROWS])  # the replay from an anchor is checked inside
    assert row["position_rows"] == 80 * bench.CHUNK_ROWS
    assert row["log_bytes_without_anchor"] == 16 * 80 and 0 < row["log_bytes_with_anchor"] <= 16 * 80
    assert row["anchor_bytes"] == 4 * bench.BUFFER_ROWS
    # the buffer's rows lie in the chunks read so far, so the refill reads at most all of them
    assert bench.BUFFER_ROWS <= row["refill_rows_to_read"] <= 80 * bench.CHUNK_ROWS
    assert row["replay_s"] >= 0 and row["replay_from_anchor_s"] >= 0


def test_summary_ratios_are_per_round():
    rounds = [
        {
            "state_dict_ms": [0.1, 0.3], "file_bytes": 3000, "replay_s": 0.1, "refill_s": 1.0,
            "refill_rows": 5, "refill_units": 2, "straight_rows_per_s": s, "resumed_rows_per_s": r,
            "straight_second_half_rows_per_s": s, "resumed_second_half_rows_per_s": r,
            "straight_rows_per_cpu_s": s, "resumed_rows_per_cpu_s": r,
        }
        for s, r in ((100.0, 90.0), (200.0, 210.0))
    ]
    summary = bench.summarize(rounds)
    assert summary["resumed_over_straight"] == [0.9, 1.05]
    assert summary["resume_to_first_batch_s"] == [1.1, 1.1]
    assert summary["saved_buffer_bytes"] == 0
    figures = [row["figure"] for row in bench.summary_rows(summary)]
    assert "state_dict() time, ms (median per round)" in figures
