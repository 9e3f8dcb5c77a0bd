"""`intune bench recd` end to end on a tiny run: the JSON schema, the plot, and sane ratios."""

import json

import pytest

from intune.bench.recd import auc, check_targets
from intune.cli import main


def test_auc_by_rank_sum_on_hand_computed_cases():
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auc([0, 1], [0.5, 0.5]) == pytest.approx(0.5)


def test_check_targets_names_what_is_missed():
    ok = {"session_len": 8, "storage_ratio": 2.5, "preprocess_ratio": 1.6, "train_ratio": 2.0,
          "auc_dedup": 0.7, "auc_plain": 0.7}
    assert check_targets([ok]) == []
    bad = {**ok, "train_ratio": 1.2, "auc_dedup": 0.6}
    misses = check_targets([bad, {**ok, "session_len": 1, "preprocess_ratio": 0.9}])
    assert any("train_ratio at length 8 is 1.20" in m for m in misses)
    assert any("AUC with dedup 0.6000" in m for m in misses)
    assert any("preprocess_ratio at length 1 is 0.90" in m for m in misses)


def test_bench_recd_tiny_run_writes_schema_and_plot(tmp_path, capsys):
    out, png = tmp_path / "recd.json", tmp_path / "recd.png"
    rc = main(["bench", "recd", "--rows", "3000", "--test-rows", "1000", "--session-lens", "1,8",
               "--batch-size", "256", "--window-rows", "2048", "--repeats", "1", "--auc-seeds", "2",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert "machine" in payload
    rows = payload["results"]
    assert [r["session_len"] for r in rows] == [1, 8]
    for r in rows:
        for key in ("session_len", "storage_ratio", "preprocess_ratio", "train_ratio", "auc_dedup", "auc_plain"):
            assert isinstance(r[key], (int, float)), key
        assert 0.0 <= r["auc_plain"] <= 1.0 and len(r["auc_dedup_per_seed"]) == 2
    control, sessions = rows
    assert control["unique_user_fraction"] == 1.0
    assert sessions["unique_user_fraction"] < 0.3
    assert sessions["storage_ratio"] > 1.2
    assert png.stat().st_size > 10_000
    assert "session length 8" in capsys.readouterr().out
