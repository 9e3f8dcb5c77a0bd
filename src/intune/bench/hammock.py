"""``intune bench hammock``: Hammock against gradient-boosted trees and simple baselines, by repeated CV.

Owns: the model line-up with its fixed configurations, the cross-validation loop (the same folds for
every model), the metrics, the paired per-fold differences to LightGBM, the target verdicts, and the
report (``--md``: the printed table with each paired difference's spread over the folds, and the
verdicts). It must not define models (``intune.hammock``) nor data sets (``intune.hammock.datasets``).

Equal tuning budget: every model gets exactly one configuration fixed before the run (library
defaults for LightGBM, XGBoost, HistGradientBoosting and logistic regression; the documented defaults
for Hammock and the MLP), no per-data-set tuning. Hammock and the MLP share one training loop and its
early stopping on a 15% validation split of the training folds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from intune.bench import md_report
from intune.results import format_table, machine_info, write_json

TARGET_AUC_GAP = 0.005
MODELS = ("hammock", "hammock-gbdt-bins", "hammock-gbdt-init", "hammock-converted", "lightgbm", "xgboost", "hist-gb", "linear", "mlp")
TABLE_COLUMNS = ["dataset", "model", "auc", "auc_diff_vs_lightgbm", "auc_diff_sd", "accuracy", "logloss", "r2",
                 "r2_diff_vs_lightgbm", "fit_s", "diff per fold"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one repeat, 10k-row generated sets (< 10 min)")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    parser.add_argument("--md", metavar="PATH", help="write the table, its per-fold spread and the verdicts as Markdown")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of stratified 5-fold CV (default 3)")
    parser.add_argument("--large-repeats", type=int, default=None,
                        help="repeats for generated sets over 20k rows (default: --repeats)")
    parser.add_argument("--rows", default="10000,100000", help="rows of the generated sets, comma-separated")
    parser.add_argument("--datasets", default=None, help="comma-separated subset of data sets")
    parser.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--criteo-rows", type=int, default=None,
                        help="training rows of generated Criteo data for Hammock vs DLRM (default 400k; quick 100k; 0 skips)")


# ---------------------------------------------------------------- models
class _TorchMLP:
    """Two hidden layers of 256 ReLU units on standardised inputs, trained by Hammock's loop."""

    def __init__(self, task: str, seed: int = 0):
        self.task, self.seed = task, seed

    def fit(self, X: np.ndarray, y: np.ndarray) -> _TorchMLP:
        import torch

        from intune.hammock.training import TrainConfig, split_validation, train

        self.mean_, self.std_ = X.mean(axis=0), X.std(axis=0) + 1e-12
        Xs = torch.from_numpy(((X - self.mean_) / self.std_).astype(np.float32))
        if self.task == "regression":
            self.y_mean_, self.y_std_ = float(y.mean()), float(y.std() or 1.0)
            target, n_out = torch.from_numpy(((y - self.y_mean_) / self.y_std_).astype(np.float32))[:, None], 1
            loss = torch.nn.functional.mse_loss
        else:
            self.classes_, codes = np.unique(y, return_inverse=True)
            n_out = 1 if self.classes_.size == 2 else self.classes_.size
            if n_out == 1:
                target, loss = torch.from_numpy(codes.astype(np.float32))[:, None], torch.nn.functional.binary_cross_entropy_with_logits
            else:
                target, loss = torch.from_numpy(codes), torch.nn.functional.cross_entropy
        torch.manual_seed(self.seed)
        width = 256
        self.net_ = torch.nn.Sequential(
            torch.nn.Linear(X.shape[1], width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
            torch.nn.Linear(width, n_out),
        )
        tr, va = split_validation(y, 0.15, self.seed, stratify=self.task != "regression")
        train(self.net_, loss, Xs[tr], target[tr], Xs[va], target[va], TrainConfig(seed=self.seed))
        return self

    def _out(self, X: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.net_(torch.from_numpy(((X - self.mean_) / self.std_).astype(np.float32))).double().numpy()

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self._out(X)[:, 0] * self.y_std_ + self.y_mean_

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        z = self._out(X)
        if z.shape[1] == 1:
            p = 1.0 / (1.0 + np.exp(-z[:, 0]))
            return np.column_stack([1 - p, p])
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)


def _make(model: str, task: str) -> Any:
    """A fresh, unfitted model with its fixed configuration (one thread everywhere)."""
    reg = task == "regression"
    if model in ("hammock", "hammock-gbdt-bins", "hammock-gbdt-init"):
        from intune.hammock.estimator import HammockClassifier, HammockRegressor

        cls = HammockRegressor if reg else HammockClassifier
        if model == "hammock":
            return cls(n_threads=1)
        if model == "hammock-gbdt-bins":  # a LightGBM's thresholds as bin edges, network from scratch
            return cls(edges="lightgbm", n_threads=1)
        return cls(init="lightgbm", batch_size=1024, patience=4, n_threads=1)
    if model == "lightgbm":
        import lightgbm

        return (lightgbm.LGBMRegressor if reg else lightgbm.LGBMClassifier)(n_jobs=1, verbose=-1, random_state=0)
    if model == "xgboost":
        import xgboost

        return (xgboost.XGBRegressor if reg else xgboost.XGBClassifier)(n_jobs=1, random_state=0)
    if model == "hist-gb":
        from sklearn import ensemble

        return (ensemble.HistGradientBoostingRegressor if reg else ensemble.HistGradientBoostingClassifier)(random_state=0)
    if model == "linear":
        from sklearn.linear_model import LogisticRegression, Ridge
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), Ridge() if reg else LogisticRegression(max_iter=2000))
    if model == "mlp":
        return _TorchMLP(task)
    raise ValueError(f"unknown model {model!r}; known: {MODELS}")


# ---------------------------------------------------------------- metrics and CV
def _scores(task: str, y: np.ndarray, pred: np.ndarray, classes: np.ndarray | None) -> dict[str, float | None]:
    from sklearn import metrics

    if task == "regression":
        return {"r2": float(metrics.r2_score(y, pred)), "auc": None, "accuracy": None, "logloss": None}
    proba = np.clip(pred, 1e-15, 1.0)
    proba = proba / proba.sum(axis=1, keepdims=True)
    labels = classes[np.argmax(proba, axis=1)]
    auc = metrics.roc_auc_score(y, proba[:, 1]) if task == "binary" else metrics.roc_auc_score(
        y, proba, multi_class="ovr", average="macro", labels=classes
    )
    return {
        "auc": float(auc), "accuracy": float(np.mean(labels == y)),
        "logloss": float(metrics.log_loss(y, proba, labels=classes)), "r2": None,
    }


def _folds(task: str, y: np.ndarray, repeats: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import RepeatedKFold, RepeatedStratifiedKFold

    splitter = (RepeatedKFold if task == "regression" else RepeatedStratifiedKFold)(
        n_splits=5, n_repeats=repeats, random_state=0
    )
    return list(splitter.split(np.zeros(len(y)), y))


def _run_dataset(name: str, X: np.ndarray, y: np.ndarray, task: str, models: list[str], repeats: int,
                 log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Per-fold scores of every model on the same folds; the converted model reuses the fold's LightGBM."""
    from intune.hammock import from_trees

    rows: list[dict[str, Any]] = []
    classes = None if task == "regression" else np.unique(y)
    for fold, (tr, te) in enumerate(_folds(task, y, repeats)):
        fitted_lgb, lgb_seconds = None, 0.0
        for model in models:
            started = time.perf_counter()
            if model == "hammock-converted":
                if fitted_lgb is None:
                    fitted_lgb = _make("lightgbm", task).fit(X[tr], y[tr])
                    lgb_seconds = time.perf_counter() - started
                started = time.perf_counter()
                est = from_trees(fitted_lgb)
                seconds = time.perf_counter() - started + lgb_seconds
            else:
                est = _make(model, task).fit(X[tr], y[tr])
                seconds = time.perf_counter() - started
                if model == "lightgbm":
                    fitted_lgb, lgb_seconds = est, seconds
            pred = est.predict(X[te]) if task == "regression" else est.predict_proba(X[te])
            row = {"dataset": name, "model": model, "fold": fold, "fit_s": seconds, **_scores(task, y[te], pred, classes)}
            if model == "hammock-converted":
                raw = fitted_lgb.predict(X[te], raw_score=True) if task != "regression" else fitted_lgb.predict(X[te])
                row["max_raw_diff"] = float(np.max(np.abs(est.predict_raw(X[te]) - raw)))
            rows.append(row)
        log(f"  {name} fold {fold + 1}: " + ", ".join(
            f"{r['model']}={r['auc'] if r['auc'] is not None else r['r2']:.4f}" for r in rows if r["fold"] == fold
        ))
    return rows


def criteo_comparison(train_rows: int, log: Callable[[str], None], batch_rows: int = 1024) -> list[dict[str, Any]]:
    """HammockNet vs DLRM on generated Criteo-format data: same rows, same batches, one pass each."""
    from intune.dlrm.data import iter_chunks
    from intune.dlrm.pipelines import dlrm_standard
    from intune.dlrm.train import train
    from intune.hammock.udf import Bucketize

    def chunks(rows: int, seed: int):
        for table in iter_chunks(rows, seed=seed, chunk_rows=batch_rows):
            yield {c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names}

    train_chunks = list(chunks(train_rows, 0))
    test_chunks = list(chunks(max(train_rows // 4, 10_000), 1))  # another seed: same hidden model, new rows
    out = []
    for model, udf in (("hammock-net", Bucketize()), ("dlrm", dlrm_standard())):
        started = time.perf_counter()
        batches = [udf(c) for c in train_chunks]
        prep = time.perf_counter() - started
        result = train(batches, model="hammock" if model == "hammock-net" else "dlrm", table_sizes=udf.sparse_sizes,
                       eval_batches=[udf(c) for c in test_chunks])
        out.append({"dataset": f"criteo_generated_{train_rows // 1000}k", "model": model, "auc": result.auc,
                    "logloss": result.logloss, "accuracy": None, "r2": None, "fit_s": result.compute_s,
                    "preprocess_s": prep, "train_rows": result.rows, "eval_rows": result.eval_rows})
        log(f"  criteo {model}: auc={result.auc:.4f} after {result.rows} rows, {result.compute_s:.1f} s compute")
    return out


def summarise(per_fold: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Means over folds per (data set, model), plus paired per-fold differences to LightGBM."""
    out = []
    keys = list(dict.fromkeys((r["dataset"], r["model"]) for r in per_fold))
    for dataset, model in keys:
        mine = sorted((r for r in per_fold if r["dataset"] == dataset and r["model"] == model), key=lambda r: r["fold"])
        ref = {r["fold"]: r for r in per_fold if r["dataset"] == dataset and r["model"] == "lightgbm"}
        row: dict[str, Any] = {"dataset": dataset, "model": model, "n_folds": len(mine)}
        for metric in ("auc", "accuracy", "logloss", "r2", "fit_s"):
            vals = [r[metric] for r in mine if r[metric] is not None]
            row[metric] = float(np.mean(vals)) if vals else None
            if metric != "fit_s" and vals and ref:
                diffs = np.array([r[metric] - ref[r["fold"]][metric] for r in mine if r["fold"] in ref])
                row[f"{metric}_diff_vs_lightgbm"] = float(diffs.mean())
                row[f"{metric}_diff_sd"] = float(diffs.std(ddof=1)) if diffs.size > 1 else 0.0
        if "max_raw_diff" in mine[0]:
            row["max_raw_diff"] = max(r["max_raw_diff"] for r in mine)
        out.append(row)
    return out


def verdicts(summary: list[dict[str, Any]]) -> dict[str, Any]:
    """The fixed target: Hammock's AUC at most 0.005 below LightGBM's, on average and on the tree data."""
    auc_rows = [r for r in summary if r["auc"] is not None]
    too_easy = sorted({r["dataset"] for r in auc_rows if r["model"] == "linear"
                       and r.get("auc_diff_vs_lightgbm", -1) >= -TARGET_AUC_GAP})
    out: dict[str, Any] = {"target_auc_gap": TARGET_AUC_GAP, "too_easy_linear_within_margin": too_easy}
    for model in ("hammock", "hammock-gbdt-bins", "hammock-gbdt-init"):
        diffs = {r["dataset"]: r["auc_diff_vs_lightgbm"] for r in auc_rows if r["model"] == model}
        if not diffs:
            continue
        mean = float(np.mean(list(diffs.values())))
        trees = {d: v for d, v in diffs.items() if d.startswith("random_trees")}
        out[model] = {
            "mean_auc_diff": mean, "meets_average": mean >= -TARGET_AUC_GAP,
            "tree_data_auc_diff": trees, "meets_tree_data": all(v >= -TARGET_AUC_GAP for v in trees.values()) if trees else None,
        }
    return out


def run(args: argparse.Namespace) -> int:
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    repeats = 1 if args.quick else args.repeats
    large_repeats = repeats if args.large_repeats is None or args.quick else args.large_repeats
    sizes = [10_000] if args.quick else [int(s) for s in args.rows.split(",") if s]
    models = list(MODELS) if not args.models else args.models.split(",")
    from intune.hammock import datasets

    plan: list[tuple[str, str, int | None]] = [(d, d, None) for d in datasets.SMALL]
    plan += [(f"{d}_{n // 1000}k", d, n) for n in sizes for d in datasets.SYNTHETIC]
    if args.datasets:
        wanted = set(args.datasets.split(","))
        plan = [p for p in plan if p[0] in wanted or p[1] in wanted]
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    per_fold: list[dict[str, Any]] = []
    started = time.perf_counter()
    with threadpool_limits(1):
        for label, name, n_rows in plan:
            X, y, task = datasets.load(name, n_rows)
            reps = large_repeats if n_rows and n_rows > 20_000 else repeats
            log(f"{label}: {X.shape[0]} rows x {X.shape[1]} features, {task}, {reps}x5-fold")
            per_fold += _run_dataset(label, X, y, task, models, reps, log)
            if args.json:  # keep what is done if a long run is cut short
                write_json(args.json, summarise(per_fold), per_fold=per_fold, partial=True)
    summary = summarise(per_fold)
    verdict = verdicts(summary)
    criteo_rows = args.criteo_rows if args.criteo_rows is not None else (100_000 if args.quick else 400_000)
    if criteo_rows > 0:
        log(f"criteo_generated: {criteo_rows} training rows, batches of 1024, one pass")
        try:
            with threadpool_limits(1):
                summary += criteo_comparison(criteo_rows, log)
        except ImportError as exc:  # the DLRM side lives in intune.dlrm
            verdict["criteo"] = f"not run: {exc}"
    print(format_table(table_rows(summary, per_fold), TABLE_COLUMNS))
    print(f"\ntarget (Hammock AUC >= LightGBM - {TARGET_AUC_GAP}):")
    for key, value in verdict.items():
        print(f"  {key}: {value}")
    print(f"total {time.perf_counter() - started:.0f} s")
    config = {"quick": args.quick, "repeats": repeats, "large_repeats": large_repeats, "rows": sizes,
              "models": models, "threads": 1}
    if args.json:
        write_json(args.json, summary, per_fold=per_fold, verdicts=verdict, partial=False, config=config)
    if args.md:
        report = markdown_report(summary, per_fold, verdict, config, md_report.command_line(("bench", "hammock")))
        print(f"wrote {md_report.write(args.md, report)}")
    return 0


# ---------------------------------------------------------------- the Markdown report
def fold_differences(per_fold: list[dict[str, Any]], dataset: str, model: str) -> list[float]:
    """The model's per-fold AUC (R2 for regression) minus LightGBM's on the same fold."""
    mine = [r for r in per_fold if r["dataset"] == dataset and r["model"] == model]
    ref = {r["fold"]: r for r in per_fold if r["dataset"] == dataset and r["model"] == "lightgbm"}
    metric = "auc" if mine and mine[0]["auc"] is not None else "r2"
    return [r[metric] - ref[r["fold"]][metric] for r in mine
            if r["fold"] in ref and r[metric] is not None and ref[r["fold"]][metric] is not None]


def table_rows(summary: list[dict[str, Any]], per_fold: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary, plus each paired difference's median (min–max) over the folds: a mean over 5 or
    15 folds alone hides whether one fold carried it."""
    return [{**r, "diff per fold": md_report.spread(fold_differences(per_fold, r["dataset"], r["model"]), "+.4f", "folds")}
            for r in summary]


def verdict_rows(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per Hammock variant: the mean AUC difference and the tree-data ones, each against the target."""
    return [{"model": model, "mean auc diff": f"{v['mean_auc_diff']:+.4f}", "meets average": v["meets_average"],
             "tree data auc diff": ", ".join(f"{d} {x:+.4f}" for d, x in v["tree_data_auc_diff"].items()) or "-",
             "meets tree data": v["meets_tree_data"]}
            for model, v in verdict.items() if isinstance(v, dict) and "mean_auc_diff" in v]


def markdown_report(summary: list[dict[str, Any]], per_fold: list[dict[str, Any]], verdict: dict[str, Any],
                    config: dict[str, Any], command: str) -> str:
    """Command, date and machine; how the folds were drawn; the verdicts; every (data set, model) row."""
    context = [
        md_report.load_line(),
        f"Repeated 5-fold CV, the same folds for every model: {config['repeats']} repeat(s), {config['large_repeats']} "
        f"on generated sets over 20k rows; generated sets of {', '.join(f'{n:,}' for n in config['rows'])} rows; "
        f"models {', '.join(config['models'])}; {config['threads']} thread each.",
    ]
    too_easy = ", ".join(verdict.get("too_easy_linear_within_margin", [])) or "none"
    sections = [
        md_report.section(
            f"Verdicts: Hammock's AUC at most {verdict.get('target_auc_gap', TARGET_AUC_GAP)} below LightGBM's",
            [f"Too easy to tell models apart (logistic regression within the margin of LightGBM): {too_easy}."]
            + ([f"Criteo comparison: {verdict['criteo']}"] if "criteo" in verdict else []),
            verdict_rows(verdict),
        ),
        md_report.section(
            "Every data set and model",
            ["Means over folds; `*_diff_vs_lightgbm`: mean paired per-fold difference to LightGBM, `*_sd` its",
             "standard deviation; diff per fold: the paired differences' median (min–max over the folds)."],
            table_rows(summary, per_fold),
            TABLE_COLUMNS,
        ),
    ]
    return md_report.render(command, machine_info(), context, sections)
