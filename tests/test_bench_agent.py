"""``intune bench agent`` on a tiny run (criteo, one held-out and one waiting spec from each default seed,
the live benchmark's pipeline and the waiting specs on small machines of 2 and 4 CPUs, 20-tick phases,
heuristic / autotune / oracle): the rows' fields, the summary against the rows by hand, the oracle at
the optimum, ``--jobs 2`` equal to ``--jobs 1``, the ablation and count checks, the Markdown report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from intune.bench.agent import HELD_OUT_SEEDS, losses, summarize, waiting_specs
from intune.cli import main

TINY = [
    "bench",
    "agent",
    "--workload",
    "criteo",
    "--held-out",
    "1",
    "--waiting",
    "1",
    "--period",
    "20",
    "--policies",
    "heuristic,autotune,oracle,no-such-policy",
    "--oom-episodes",
    "3",
    "--oom-ticks",
    "15",
    "--decision-ticks",
    "15",
    "--small-levels",
    "2,4",
]


def _run(tmp, jobs: int, *extra: str) -> dict:
    out = tmp / f"agent-{jobs}.json"
    assert main([*TINY, "--jobs", str(jobs), "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_agent")
    return _run(tmp, 1, "--md", str(tmp / "agent.md")), tmp


def test_rows_carry_the_episode_fields_for_every_workload_and_policy(tiny):
    payload, _ = tiny
    rows = [r for r in payload["results"] if r["section"] == "episode"]
    waiting = {f"waiting-{s}-0" for s in HELD_OUT_SEEDS}
    names = {(f"held-out-{s}-0", "held-out") for s in HELD_OUT_SEEDS} | {(w, "waiting") for w in waiting} | {
        ("criteo", "shipped")
    }
    small = {(w, "small") for w in {*waiting, "tune-live"}}  # the live pipeline and the waiting specs
    assert {(r["workload"], r["group"], r["policy"]) for r in rows} == {
        (w, g, p) for w, g in names | small for p in ("heuristic", "autotune", "oracle")
    }
    for r in rows:
        assert {"workload", "policy", "period", "cpu_levels", "optimum_ratio", "ooms", "convergence_ticks"} <= set(r)
        assert r["period"] == 20
        assert r["cpu_levels"] == ([2, 4] if r["group"] == "small" else [32, 64, 128, 64, 32])
        assert len(r["convergence_ticks"]) == len(r["cpu_levels"])  # one per phase
    assert "skipped no-such-policy: not in intune.policies.POLICY_NAMES" in payload["notes"]
    assert [r["policy"] for r in payload["results"] if r["section"] == "ooms"] == ["autotune"]
    decision = [r for r in payload["results"] if r["section"] == "decision_time"]
    assert [r["policy"] for r in decision] == ["heuristic", "autotune", "oracle"]
    assert all(r["median_ms"] >= 0 and r["p99_ms"] >= r["median_ms"] for r in decision)


def test_the_oracle_is_at_the_phase_optimum(tiny):
    payload, _ = tiny
    # on the shipped and held-out specs (a waiting stage's hundreds of workers come one a tick past the CPUs)
    oracle = [r for r in payload["results"] if r["section"] == "episode" and r["policy"] == "oracle"
              and r["group"] in ("shipped", "held-out")]
    assert len(oracle) == 3
    for r in oracle:
        assert 0.93 < r["optimum_ratio"] < 1.03, r
        assert r["ooms"] == 0


def _approx(value):
    """The file keeps six significant digits (``results.SIGNIFICANT_DIGITS``)."""
    return pytest.approx(value, rel=1e-5)


def test_summary_is_the_rows_by_hand(tiny):
    payload, _ = tiny
    rows = [r for r in payload["results"] if r["section"] == "episode"]
    summary = {r["policy"]: r for r in payload["results"] if r["section"] == "summary"}
    assert set(summary) == {"heuristic", "autotune", "oracle"}
    for name, s in summary.items():
        mine = [r for r in rows if r["policy"] == name]
        shipped = [r["optimum_ratio"] for r in mine if r["workload"] == "criteo"]
        held = {r["workload"]: r["optimum_ratio"] for r in mine if r["group"] == "held-out"}
        waiting = {r["workload"]: r["optimum_ratio"] for r in mine if r["group"] == "waiting"}
        small = {r["workload"]: r["optimum_ratio"] for r in mine if r["group"] == "small"}
        assert s["period"] == 20 and s["shipped_n"] == 1 and s["held_out_n"] == 2 and s["waiting_n"] == 2
        assert s["waiting_mean"] == _approx(sum(waiting.values()) / 2)
        assert s["waiting_worst"] == _approx(min(waiting.values()))
        assert s["small_n"] == 3 and s["small_mean"] == _approx(sum(small.values()) / 3)
        assert s["small_worst"] == _approx(min(small.values())) and s["small_worst_workload"] == min(small, key=small.get)
        assert s["shipped_mean"] == _approx(shipped[0]) and s["shipped_worst"] == _approx(
            shipped[0]
        )
        assert s["held_out_mean"] == _approx(sum(held.values()) / 2)
        assert s["held_out_worst"] == _approx(min(held.values()))
        assert s["held_out_worst_workload"] == min(held, key=held.get)
        phases = [c for r in mine for c in r["convergence_ticks"]]
        within = sum(c is not None and c <= 30 for c in phases)
        assert s["phases_within_30"] == f"{within}/31"  # 5 workloads of 5 phases, 3 of 2
        assert s["phases_within_30_share"] == _approx(within / 31)
        assert s["ooms"] == sum(r["ooms"] for r in mine)


def _row(workload: str, policy: str, ratio: float, ooms: int = 0) -> dict:
    group = "shipped" if workload == "criteo" else ("waiting" if workload.startswith("w") else "held-out")
    if workload.startswith("s"):
        group = "small"
    return {
        "workload": workload,
        "group": group,
        "policy": policy,
        "period": 60,
        "optimum_ratio": ratio,
        "ooms": ooms,
        "convergence_ticks": [0, 31, None],
    }


def test_intune_against_autotune_counts_only_specs_where_autotune_had_no_oom_and_steer_is_a_mean():
    rows = [
        _row("criteo", "intune", 0.5),
        _row("criteo", "autotune", 1.0),  # shipped: not compared
        _row("h0", "intune", 0.90),
        _row("h0", "autotune", 1.00),
        _row("h0", "steer", 0.90),
        _row("h1", "intune", 0.97),
        _row("h1", "autotune", 0.98),
        _row("h1", "steer", 0.97 / 1.1),
        _row("h2", "intune", 0.50),
        _row("h2", "autotune", 0.90, ooms=2),
        _row("h2", "steer", 0.5),
        _row("h3", "intune", 0.80),
        _row("h3", "autotune", 0.40),
        _row("h4", "intune", 0.30),
        _row("h4", "autotune", 0.0, ooms=3),  # killed: a ratio of 0, no loss to divide by
        _row("h4", "steer", 0.60),
        _row("w0", "intune", 0.80),  # a waiting spec: its own mean against steer, not in the held-out ones
        _row("w0", "steer", 0.40),
        _row("w1", "intune", 0.60),
        _row("w1", "steer", 0.75),
        _row("s0", "intune", 0.60),  # a small machine's run: its own mean against steer
        _row("s0", "steer", 0.90),
    ]
    s = {r["policy"]: r for r in summarize(rows, ["intune", "autotune", "steer"], [60])}
    assert s["intune"]["vs_autotune_specs"] == 3  # h2 left out: autotune was killed there
    assert s["intune"]["vs_autotune_min"] == pytest.approx(0.90)
    assert s["intune"]["vs_autotune_min_workload"] == "h0"
    assert s["intune"]["vs_autotune_below_0.98"] == 1  # h0 (0.90); h1 is 0.9898
    assert s["intune"]["vs_steer_specs"] == 4
    assert s["intune"]["vs_steer_mean"] == pytest.approx(np.mean([1.0, 1.1, 1.0, 0.5]))
    assert s["intune"]["vs_steer_waiting_specs"] == 2
    assert s["intune"]["vs_steer_waiting_mean"] == pytest.approx(np.mean([2.0, 0.8]))
    assert s["intune"]["waiting_mean"] == pytest.approx(0.7) and s["intune"]["waiting_worst_workload"] == "w1"
    assert s["intune"]["vs_steer_small_specs"] == 1 and s["intune"]["vs_steer_small_mean"] == pytest.approx(0.6 / 0.9)
    assert s["intune"]["small_mean"] == pytest.approx(0.6) and s["steer"]["small_n"] == 1
    assert "vs_autotune_min" not in s["autotune"]
    assert s["intune"]["phases_within_30"] == "9/27" and s["intune"]["ooms"] == 0
    assert s["autotune"]["ooms"] == 5 and s["steer"]["shipped_mean"] is None
    lines = losses(rows, [60], name="intune")
    assert (
        lines[0]
        == "- period 60: intune at or above autotune on 2 of 5, at or above steer on 3 of 4 held-out specs."
    )
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["- h4", "- h2", "- h0", "- h1"]  # worst first
    assert "steer 0.600 (0.500x)" in lines[1] and "autotune 0.900 (0.556x)" in lines[2]


def test_jobs_2_gives_the_results_of_jobs_1(tiny):
    payload, tmp = tiny
    again = _run(tmp, 2)

    def stable(p):  # decision times are wall clock
        return [r for r in p["results"] if r["section"] != "decision_time"]

    assert stable(again) == stable(payload)
    assert again["jobs"] == 2


def test_an_ablation_with_a_missing_file_fails_naming_it(tmp_path):
    missing = tmp_path / "nowhere.pt"
    with pytest.raises(SystemExit, match="nowhere.pt"):
        main(["bench", "agent", "--ablation", f"pm1={missing}", "--held-out", "0", "--jobs", "1"])
    with pytest.raises(SystemExit, match="NAME=WEIGHTS"):
        main(["bench", "agent", "--ablation", "pm1", "--jobs", "1"])


def test_an_ablation_row_listed_in_policies_runs_once_and_is_not_reported_skipped():
    from intune.bench.agent import _available

    ok, notes = _available(["steer", "network-a", "nonsense"], {"a": "a.pt"})
    assert ok == ["steer", "network-a"]
    assert notes == ["skipped nonsense: not in intune.policies.POLICY_NAMES"]


def test_the_oom_section_is_skipped_at_0_episodes_and_a_negative_count_refused(tmp_path, capsys):
    base = [
        "bench",
        "agent",
        "--workload",
        "criteo",
        "--held-out",
        "0",
        "--waiting",
        "0",
        "--period",
        "3",
        "--policies",
        "autotune",
        "--decision-ticks",
        "0",
        "--jobs",
        "1",
    ]
    assert main([*base, "--oom-episodes", "0"]) == 0
    assert "tight-memory" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--oom-episodes must be >= 0"):
        main([*base, "--oom-episodes", "-1"])


def test_the_md_report_opens_with_the_summary_table(tiny):
    _, tmp = tiny
    text = (tmp / "agent.md").read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# `intune bench agent")
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Summary"
    assert (
        "## Every shipped workload" in headings
        and "## OOMs over randomised tight-memory episodes" in headings
    )
    header = next(line for line in lines if line.startswith("| policy") and "shipped: mean / worst" in line)
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "policy",
        "period",
        "shipped: mean / worst",
        "held-out: mean / worst",
        "a waiting stage: mean / worst",
        "small machines: mean / worst",
        "phases at 95% within 30 ticks",
        "OOMs",
    ]
    assert "## The live benchmark's pipeline on small machines" in headings
    assert "tune-live (`intune bench tune`'s pipeline as a spec) on 2 -> 4 CPUs." in text
    assert any(line.startswith("| oracle") and "(criteo)" in line for line in lines)
    assert "skipped no-such-policy" in text


def test_the_waiting_specs_each_have_one_map_stage_that_waits_alternately_on_io_and_on_the_gil():
    specs = waiting_specs(777, 6)
    assert [s.name for s in specs] == [f"waiting-777-{i}" for i in range(6)]
    assert [s.name for s in waiting_specs(777, 6)] == [s.name for s in specs]  # deterministic
    for i, spec in enumerate(specs):
        first = 0 if i % 2 else 1
        waits = [
            s for s in spec.stages[first:]
            if s.mode == "thread" and s.kind in ("map", "udf", "read")
            and (s.io_us_per_row >= 0.8 * (s.io_us_per_row + s.cpu_us_per_row) if i % 2 == 0 else s.gil_fraction >= 0.8)
        ]
        assert waits, (spec.name, [(s.name, s.kind, s.io_us_per_row, s.cpu_us_per_row, s.gil_fraction) for s in spec.stages])
        assert max(s.max_workers for s in waits) >= 4 * 128  # room for more workers than the CPUs


def test_small_levels_none_skips_the_small_machines_and_a_bad_value_names_the_flag(tmp_path):
    base = ["bench", "agent", "--workload", "criteo", "--held-out", "0", "--waiting", "0", "--period", "3",
            "--policies", "heuristic", "--oom-episodes", "0", "--decision-ticks", "0", "--jobs", "1"]
    out = tmp_path / "a.json"
    assert main([*base, "--small-levels", "none", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert {r["group"] for r in payload["results"] if r["section"] == "episode"} == {"shipped"}
    assert payload["small_levels"] is None
    for bad in ("2,x", "0,2", ""):
        with pytest.raises(SystemExit, match="--small-levels"):
            main([*base, "--small-levels", bad])
