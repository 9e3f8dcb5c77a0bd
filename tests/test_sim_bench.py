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
