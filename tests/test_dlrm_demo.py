"""`intune demo` end to end on a tiny data set: it trains, tunes, and writes its report."""

from __future__ import annotations

import json

import pytest

from intune.cli import main
from intune.dlrm import demo


def test_demo_writes_history_plot_and_summary(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["demo", "--seconds", "3", "--rows", "20000", "--table-size", "2000", "--batch", "1024"]
    assert main([*args, "--out", str(out), "--no-live", "--policy", "heuristic"]) == 0
    printed = capsys.readouterr().out
    assert "policy: heuristic" in printed and "held-out AUC" in printed
    summary = json.loads((out / "demo-summary.json").read_text())
    assert summary["policy"] == "heuristic"
    assert summary["train"]["rows"] > 0 and 0.0 < summary["train"]["auc"] < 1.0
    assert summary["train"]["eval_rows"] == 10_000
    assert (out / "demo.png").stat().st_size > 10_000
    ticks = (out / "demo-history.jsonl").read_text().splitlines()
    assert ticks and "udf.workers" in json.loads(ticks[0])["knobs"]
    # a second run finds the data set in the cache
    from intune.dlrm import workload

    assert workload.ensure_dataset(20_000, heldout_rows=10_000).generated_s == 0.0

def test_policy_choice_falls_back_to_plumber_and_says_why() -> None:
    name, why = demo.choose_policy(None)
    assert name in ("intune", "plumber")
    if name == "plumber":
        assert "not available" in why
    assert demo.choose_policy("heuristic") == ("heuristic", "chosen with --policy")


def test_bad_seconds() -> None:
    with pytest.raises(SystemExit, match="--seconds must be positive"):
        main(["demo", "--seconds", "0"])
