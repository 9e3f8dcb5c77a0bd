"""`intune bench recd` end to end on a tiny run: the JSON schema, the plot, and sane ratios."""

import json

import numpy as np
import pytest

from intune.bench.recd import AUC_TOLERANCE, check_targets, paired_auc_difference
from intune.cli import main


def test_identical_scores_differ_by_exactly_zero_on_every_resample():
    labels = [0, 0, 1, 1, 0, 1]
    scores = [0.1, 0.4, 0.35, 0.8, 0.2, 0.3]
    d = paired_auc_difference(labels, scores, scores, resamples=200)
    assert (d.diff, d.low, d.high) == (0.0, 0.0, 0.0)


def test_a_model_better_on_every_pair_has_a_positive_interval():
    # new ranks every positive above every negative (AUC 1 on any resample), base every positive
    # below (AUC 0): the difference is exactly 1 on every resample
    labels = [0, 1, 0, 1, 1, 0]
    new = [0.1, 0.9, 0.2, 0.8, 0.7, 0.3]
    d = paired_auc_difference(labels, new, [-x for x in new], resamples=200)
    assert (d.diff, d.low, d.high) == (1.0, 1.0, 1.0)
    # base misorders one pair of nine (0.7 below 0.75): AUC 8/9 on all rows; new orders every pair, so
    # no resample can make the difference negative
    base = [0.1, 0.9, 0.75, 0.8, 0.7, 0.3]
    d = paired_auc_difference(labels, new, base, resamples=500, seed=1)
    assert d.diff == pytest.approx(1 - 8 / 9) and 0.0 <= d.low <= d.diff <= d.high


def test_the_difference_of_several_seeds_is_the_mean_of_the_paired_differences():
    labels = np.array([0, 1, 0, 1, 1, 0])
    new = np.array([[0.1, 0.9, 0.2, 0.8, 0.7, 0.3], [0.1, 0.9, 0.2, 0.8, 0.7, 0.3]])
    base = np.array([[0.9, 0.1, 0.8, 0.2, 0.3, 0.7], [0.1, 0.9, 0.2, 0.8, 0.7, 0.3]])  # AUC 0, then 1
    d = paired_auc_difference(labels, new, base, resamples=100)
    assert (d.diff, d.low, d.high) == (0.5, 0.5, 0.5)  # (1 - 0) and (1 - 1), averaged on every resample
    with pytest.raises(ValueError, match="alike with 6 rows"):
        paired_auc_difference(labels, new, base[:, :5])
    with pytest.raises(ValueError, match="resamples >= 1"):
        paired_auc_difference(labels, new, base, resamples=0)


def _scored(seed: int, rows: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    """Labels at a 25% click rate and a model whose score is the label plus unit noise (AUC ~0.76)."""
    rng = np.random.default_rng(seed)
    labels = rng.random(rows) < 0.25
    return labels, labels + rng.normal(size=rows)


def _length_8(labels, dedup, plain) -> dict:
    d = paired_auc_difference(labels, dedup, plain)
    return {"session_len": 8, "storage_ratio": 2.5, "preprocess_ratio": 1.6, "train_ratio": 2.0,
            "auc_diff": d.diff, "auc_diff_low": d.low, "auc_diff_high": d.high}


def test_the_auc_check_passes_the_same_model_and_fails_a_noisier_one():
    labels, plain = _scored(0)
    noise = np.random.default_rng(1).normal(size=labels.size)
    assert check_targets([_length_8(labels, plain + 0.05 * noise, plain)]) == []  # the same ranking, nearly
    worse = _length_8(labels, plain + 0.5 * noise, plain)  # AUC ~0.03 lower
    assert worse["auc_diff_high"] < -AUC_TOLERANCE
    [miss] = check_targets([worse])
    assert "AUC dedup - plain is -0.0" in miss and "95% interval" in miss and "at length 8" in miss


def test_check_targets_names_what_is_missed():
    ok = {"session_len": 8, "storage_ratio": 2.5, "preprocess_ratio": 1.6, "train_ratio": 2.0,
          "auc_diff": 0.0, "auc_diff_low": -0.004, "auc_diff_high": 0.004}
    assert check_targets([ok]) == []
    bad = {**ok, "train_ratio": 1.2, "auc_diff": -0.004, "auc_diff_low": -0.006}
    misses = check_targets([bad, {**ok, "session_len": 1, "preprocess_ratio": 0.9}])
    assert any("train_ratio at length 8 is 1.20" in m for m in misses)
    assert any("AUC dedup - plain is -0.0040, 95% interval [-0.0060, +0.0040]" in m for m in misses)
    assert any("preprocess_ratio at length 1 is 0.90" in m for m in misses)


def test_bench_recd_tiny_run_writes_schema_and_plot(tmp_path, capsys):
    out, png = tmp_path / "recd.json", tmp_path / "recd.png"
    rc = main(["bench", "recd", "--rows", "3000", "--test-rows", "1000", "--session-lens", "1,8",
               "--batch-size", "256", "--window-rows", "2048", "--repeats", "1", "--auc-seeds", "2", "--auc-resamples", "200",
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
        # the mean of paired differences (each figure is kept to six significant digits in the file)
        assert r["auc_diff"] == pytest.approx(r["auc_dedup"] - r["auc_plain"], abs=2e-6)
        assert r["auc_diff_low"] <= r["auc_diff"] <= r["auc_diff_high"]
    control, sessions = rows
    assert control["unique_user_fraction"] == 1.0
    assert sessions["unique_user_fraction"] < 0.3
    assert sessions["storage_ratio"] > 1.2
    assert png.stat().st_size > 10_000
    assert "session length 8" in capsys.readouterr().out
