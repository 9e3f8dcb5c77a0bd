"""The Hammock benchmark's bookkeeping: same folds for all, paired differences, target verdicts."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")
from intune.bench import hammock as bench  # noqa: E402


def _row(dataset, model, fold, auc):
    return {"dataset": dataset, "model": model, "fold": fold, "auc": auc, "accuracy": 0.5, "logloss": 0.7,
            "r2": None, "fit_s": 1.0}


def test_paired_differences_and_verdicts_by_hand():
    rows = []
    for fold, (lgb, ham, lin) in enumerate([(0.90, 0.89, 0.80), (0.92, 0.90, 0.81)]):
        rows += [_row("random_trees_10k", "lightgbm", fold, lgb), _row("random_trees_10k", "hammock", fold, ham),
                 _row("random_trees_10k", "linear", fold, lin)]
        rows += [_row("easy", "lightgbm", fold, 0.99), _row("easy", "hammock", fold, 0.99),
                 _row("easy", "linear", fold, 0.988)]
    summary = {(r["dataset"], r["model"]): r for r in bench.summarise(rows)}
    trees = summary[("random_trees_10k", "hammock")]
    assert trees["auc"] == pytest.approx(0.895)
    assert trees["auc_diff_vs_lightgbm"] == pytest.approx(-0.015)  # mean of -0.01 and -0.02
    assert trees["auc_diff_sd"] == pytest.approx(np.std([-0.01, -0.02], ddof=1))
    verdict = bench.verdicts(list(summary.values()))
    assert verdict["too_easy_linear_within_margin"] == ["easy"]
    assert verdict["hammock"]["mean_auc_diff"] == pytest.approx(-0.0075)
    assert verdict["hammock"]["meets_average"] is False and verdict["hammock"]["meets_tree_data"] is False


def test_every_model_sees_the_same_folds_and_the_conversion_is_exact():
    pytest.importorskip("lightgbm")
    from intune.hammock.datasets import load

    X, y, task = load("random_trees", 250)
    rows = bench._run_dataset("t", X, y, task, ["lightgbm", "hammock-converted", "linear"], 1, lambda m: None)
    assert [r["fold"] for r in rows] == [f for f in range(5) for _ in range(3)]
    by_fold = {}
    for r in rows:
        by_fold.setdefault(r["fold"], {})[r["model"]] = r
    for fold in by_fold.values():
        assert fold["hammock-converted"]["auc"] == fold["lightgbm"]["auc"]
        assert fold["hammock-converted"]["max_raw_diff"] < 1e-6


def test_cli_writes_the_issue_schema(tmp_path):
    pytest.importorskip("lightgbm")
    import json

    from intune.cli import main

    out = tmp_path / "h.json"
    assert main(["bench", "hammock", "--quick", "--datasets", "wine", "--models", "lightgbm,hammock-converted,linear",
                 "--criteo-rows", "0", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload) >= {"machine", "results", "verdicts"} and payload["partial"] is False
    assert [r["model"] for r in payload["results"]] == ["lightgbm", "hammock-converted", "linear"]
    for row in payload["results"]:
        assert {"dataset", "model", "auc", "accuracy", "logloss", "r2", "fit_s"} <= set(row)
        assert row["dataset"] == "wine" and row["r2"] is None and 0.5 < row["auc"] <= 1.0
