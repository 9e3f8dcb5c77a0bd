"""Exact conversion: converted networks reproduce each library's raw scores and predictions."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from intune.hammock import from_trees  # noqa: E402
from intune.hammock.convert import ConversionError  # noqa: E402


def _data(seed: int = 0, n: int = 900, nan: bool = True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = ((X[:, 0] + X[:, 1] * X[:, 2] + 0.5 * rng.normal(size=n)) > 0).astype(int)
    y3 = np.digitize(X[:, 0] + 0.3 * rng.normal(size=n), [-0.5, 0.5])
    yr = 2.0 * X[:, 0] + np.sin(X[:, 3]) + 0.1 * rng.normal(size=n)
    if nan:
        X[rng.random(X.shape) < 0.1] = np.nan
        X[rng.random(X.shape) < 0.05] = 0.0  # exact zeros exercise LightGBM's zero handling
    # duplicate some training thresholds exactly in the test rows: ties must go the library's way
    return X[:600], X[600:], y[:600], y3[:600], yr[:600]


def _held_out_with_ties(model_X: np.ndarray, X_test: np.ndarray, net) -> np.ndarray:
    """Held-out rows plus rows sitting exactly on every threshold the ensemble uses."""
    edges = net.binning.edges
    k = max(e.size for e in edges)
    ties = np.zeros((k, len(edges)))
    for f, e in enumerate(edges):
        ties[:, f] = np.resize(e[np.isfinite(e)], k) if np.isfinite(e).any() else 0.0
    return np.vstack([X_test, ties, np.full((1, len(edges)), np.inf), np.full((1, len(edges)), -np.inf)])


def test_lightgbm_binary_multiclass_regression_match_to_1e6():
    lgb = pytest.importorskip("lightgbm")
    Xtr, Xte, y, y3, yr = _data()
    for model, raw_of in [
        (lgb.LGBMClassifier(n_estimators=40, verbose=-1, n_jobs=1).fit(Xtr, y), lambda m, X: m.predict(X, raw_score=True)),
        (lgb.LGBMClassifier(n_estimators=20, verbose=-1, n_jobs=1).fit(Xtr, y3), lambda m, X: m.predict(X, raw_score=True)),
        (lgb.LGBMRegressor(n_estimators=40, verbose=-1, n_jobs=1).fit(Xtr, yr), lambda m, X: m.predict(X)),
    ]:
        net = from_trees(model)
        X = _held_out_with_ties(Xtr, Xte, net)
        np.testing.assert_allclose(net.predict_raw(X), raw_of(model, X), rtol=0, atol=1e-6)
        if not hasattr(model, "classes_"):
            np.testing.assert_allclose(net.predict(X), model.predict(X), rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(net.predict(X), model.predict(X))
            np.testing.assert_allclose(net.predict_proba(X), model.predict_proba(X), rtol=0, atol=1e-6)


def test_lightgbm_zero_as_missing_and_booster():
    lgb = pytest.importorskip("lightgbm")
    Xtr, Xte, y, _, _ = _data(1)
    booster = lgb.train(
        {"objective": "binary", "zero_as_missing": True, "verbose": -1, "num_threads": 1},
        lgb.Dataset(Xtr, y), num_boost_round=30,
    )
    net = from_trees(booster)
    X = np.vstack([_held_out_with_ties(Xtr, Xte, net), np.full((1, 5), 1e-36), np.full((1, 5), -1e-36)])
    np.testing.assert_allclose(net.predict_raw(X), booster.predict(X, raw_score=True), rtol=0, atol=1e-6)
    np.testing.assert_allclose(net.predict(X), booster.predict(X), rtol=0, atol=1e-6)


def test_xgboost_matches_including_float32_rounding():
    xgb = pytest.importorskip("xgboost")
    Xtr, Xte, y, y3, yr = _data(2)
    for model in [
        xgb.XGBClassifier(n_estimators=40, n_jobs=1).fit(Xtr, y),
        xgb.XGBClassifier(n_estimators=15, n_jobs=1).fit(Xtr, y3),
        xgb.XGBRegressor(n_estimators=40, n_jobs=1).fit(Xtr, yr),
    ]:
        net = from_trees(model)
        X = _held_out_with_ties(Xtr, Xte, net)[:-2]  # xgboost rejects inf
        np.testing.assert_allclose(net.predict_raw(X), model.predict(X, output_margin=True), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(net.predict(X), model.predict(X)) if hasattr(model, "classes_") else None
        if hasattr(model, "classes_"):
            np.testing.assert_allclose(net.predict_proba(X), model.predict_proba(X), rtol=0, atol=1e-6)
        else:
            np.testing.assert_allclose(net.predict(X), model.predict(X), rtol=0, atol=1e-6)


def test_early_stopped_boosters_convert_up_to_their_best_iteration():
    xgb = pytest.importorskip("xgboost")
    lgb = pytest.importorskip("lightgbm")
    Xtr, Xte, y, _, _ = _data(7)
    model = xgb.XGBClassifier(n_estimators=300, learning_rate=0.5, early_stopping_rounds=3, n_jobs=1)
    model.fit(Xtr[:400], y[:400], eval_set=[(Xtr[400:], y[400:])], verbose=False)
    assert model.best_iteration < 299
    net = from_trees(model)
    np.testing.assert_allclose(net.predict_raw(Xte), model.predict(Xte, output_margin=True), rtol=0, atol=1e-6)
    gbm = lgb.LGBMClassifier(n_estimators=300, learning_rate=0.5, verbose=-1, n_jobs=1)
    gbm.fit(Xtr[:400], y[:400], eval_set=[(Xtr[400:], y[400:])], callbacks=[lgb.early_stopping(3, verbose=False)])
    assert gbm.best_iteration_ < 300
    np.testing.assert_allclose(from_trees(gbm).predict_raw(Xte), gbm.predict(Xte, raw_score=True), rtol=0, atol=1e-6)


def test_sklearn_hist_gradient_boosting_and_forests_match():
    ens = pytest.importorskip("sklearn.ensemble")
    Xtr, Xte, y, y3, yr = _data(3)
    cases = [
        (ens.HistGradientBoostingClassifier(max_iter=30).fit(Xtr, y), "decision_function"),
        (ens.HistGradientBoostingClassifier(max_iter=10).fit(Xtr, y3), "decision_function"),
        (ens.HistGradientBoostingRegressor(max_iter=30).fit(Xtr, yr), "predict"),
        (ens.RandomForestClassifier(n_estimators=10, max_leaf_nodes=40, random_state=0).fit(Xtr, y3), None),
        (ens.RandomForestRegressor(n_estimators=10, max_depth=6, random_state=0).fit(Xtr, yr), "predict"),
    ]
    for model, raw_name in cases:
        net = from_trees(model)
        X = _held_out_with_ties(Xtr, Xte, net)[:-2]
        expected = model.predict_proba(X) if raw_name is None else getattr(model, raw_name)(X)
        np.testing.assert_allclose(net.predict_raw(X), expected, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(net.predict(X), model.predict(X)) if raw_name != "predict" else None
        if hasattr(model, "predict_proba"):
            np.testing.assert_allclose(net.predict_proba(X), model.predict_proba(X), rtol=0, atol=1e-6)


def test_sklearn_gradient_boosting_matches_and_refuses_nan_like_the_original():
    ens = pytest.importorskip("sklearn.ensemble")
    Xtr, Xte, y, y3, yr = _data(4, nan=False)
    for model in [
        ens.GradientBoostingClassifier(n_estimators=30).fit(Xtr, y),
        ens.GradientBoostingClassifier(n_estimators=10, loss="exponential").fit(Xtr, y),
        ens.GradientBoostingClassifier(n_estimators=10).fit(Xtr, y3),
        ens.GradientBoostingRegressor(n_estimators=30).fit(Xtr, yr),
    ]:
        net = from_trees(model)
        X = _held_out_with_ties(Xtr, Xte, net)[:-2]
        expected = model.decision_function(X) if hasattr(model, "classes_") else model.predict(X)
        np.testing.assert_allclose(net.predict_raw(X), expected, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(net.predict(X), model.predict(X)) if hasattr(model, "classes_") else None
        if hasattr(model, "classes_"):
            np.testing.assert_allclose(net.predict_proba(X), model.predict_proba(X), rtol=0, atol=1e-6)
    bad = Xte.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="row 3, feature 2"):
        net.predict_raw(bad)


def test_one_hidden_unit_per_leaf_and_one_fires_per_tree():
    lgb = pytest.importorskip("lightgbm")
    Xtr, Xte, y, _, _ = _data(5)
    model = lgb.LGBMClassifier(n_estimators=7, num_leaves=5, verbose=-1, n_jobs=1).fit(Xtr, y)
    net = from_trees(model)
    assert isinstance(net.bag, torch.nn.EmbeddingBag) and net.bag.mode == "sum"
    assert net.n_leaves == sum(t["num_leaves"] for t in model.booster_.dump_model()["tree_info"])
    fired = net.hidden(torch.from_numpy(net.binning.global_index(Xte))).numpy()
    assert fired.sum(axis=1).tolist() == [7.0] * len(Xte)


def test_hand_built_stump():
    """A single stump x0 <= 0.5 -> -1 else +2, NaN left: bins, weights and outputs by hand."""
    ens = pytest.importorskip("sklearn.ensemble")
    X = np.array([[0.0], [0.2], [0.8], [1.0]])
    model = ens.HistGradientBoostingRegressor(max_iter=1, learning_rate=1.0, min_samples_leaf=1, max_leaf_nodes=2)
    model.fit(X, np.array([-1.0, -1.0, 2.0, 2.0]))
    net = from_trees(model)
    (edges,) = net.binning.edges
    assert edges.size == 1 and 0.2 <= edges[0] < 0.8
    # bins: (-inf, t], (t, inf], NaN -> 3 rows; two leaves
    assert net.bag.weight.shape == (3, 2)
    np.testing.assert_allclose(net.predict_raw(np.array([[0.1], [0.9], [edges[0]]])), [-1.0, 2.0, -1.0], atol=1e-12)


def test_unsupported_models_raise_clear_errors():
    lm = pytest.importorskip("sklearn.linear_model")
    ens = pytest.importorskip("sklearn.ensemble")
    lgb = pytest.importorskip("lightgbm")
    Xtr, _, y, _, yr = _data(6, nan=False)
    with pytest.raises(ConversionError, match="does not support .*LogisticRegression"):
        from_trees(lm.LogisticRegression().fit(Xtr, y))
    with pytest.raises(ConversionError, match="not fitted"):
        from_trees(lgb.LGBMClassifier())
    with pytest.raises(ConversionError, match="multi-output"):
        from_trees(ens.RandomForestRegressor(n_estimators=2).fit(Xtr, np.column_stack([yr, yr])))
    with pytest.raises(ConversionError, match="categorical"):
        Xc = Xtr.copy()
        Xc[:, 0] = np.arange(len(Xc)) % 4
        yc = (Xc[:, 0] % 2).astype(int)
        from_trees(lgb.LGBMClassifier(n_estimators=3, verbose=-1).fit(Xc, yc, categorical_feature=[0]))
    with pytest.raises(ValueError, match="expects shape"):
        from_trees(lgb.LGBMClassifier(n_estimators=2, verbose=-1).fit(Xtr, y)).predict_raw(Xtr[:, :3])
