"""``intune bench sim`` end to end on a short schedule: the table's metrics and the JSON schema."""

import json

from intune.cli import main


def test_bench_sim_writes_the_issue_schema(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = main(
        [
            "bench",
            "sim",
            "--quick",
            "--workload",
            "criteo",
            "--period",
            "15",
            "--policies",
            "none,heuristic,oracle",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "sim.png"),
        ]
    )
    assert code == 0
    payload = json.loads(out.read_text())
    assert {"machine", "results", "simulator_ticks_per_s"} <= set(payload)
    rows = {r["policy"]: r for r in payload["results"]}
    assert set(rows) == {"none", "heuristic", "oracle"}
    for row in rows.values():
        assert {
            "workload",
            "policy",
            "throughput_norm",
            "oracle_ratio",
            "ooms",
            "convergence_ticks",
            "cpu_util",
        } <= set(row)
    assert rows["none"]["throughput_norm"] == 1.0 and rows["oracle"]["oracle_ratio"] == 1.0
    assert rows["oracle"]["throughput_norm"] > rows["heuristic"]["throughput_norm"] > 1.0
    assert len(rows["oracle"]["convergence_ticks"]) == 5 and all(
        c is not None for c in rows["oracle"]["convergence_ticks"]
    )
    assert (tmp_path / "sim.png").exists()
    assert "simulator speed" in capsys.readouterr().out


def test_bench_sim_notes_a_policy_that_cannot_be_built(tmp_path, capsys):
    code = main(
        ["bench", "sim", "--quick", "--workload", "criteo", "--period", "5", "--policies", "none,oracle,nope"]
    )
    assert code == 0
    assert "skipped nope" in capsys.readouterr().out


def test_bench_sim_md_has_a_row_per_workload_and_a_summary_per_policy(tmp_path):
    out, md = tmp_path / "sim.json", tmp_path / "sim.md"
    policies = ["none", "heuristic", "oracle"]
    argv = ["bench", "sim", "--quick", "--period", "5", "--policies", ",".join(policies)]
    assert main([*argv, "--json", str(out), "--md", str(md)]) == 0
    payload = json.loads(out.read_text())
    workloads = list(dict.fromkeys(r["workload"] for r in payload["results"]))
    assert len(workloads) == 12  # quick: criteo, production, production@mem=48 and 9 Figure 8 variants
    text = md.read_text()
    assert text.startswith("# `intune bench sim --quick") and payload["machine"]["time_utc"][:10] in text
    summary, every = text.split("## Summary over all 12 workloads")[1].split("## Every workload")
    table_rows = [line for line in every.splitlines() if line.startswith("| Fig.")]
    assert [line.split("|")[2].strip() for line in table_rows] == workloads
    assert all(len(line.split("|")) == 2 + 2 + len(policies) for line in table_rows)  # panel, workload, cells
    summary_rows = [line.split("|")[1].strip() for line in summary.splitlines() if line.startswith("| ")]
    assert summary_rows == ["policy", *policies]
