"""The relaxed network and the scikit-learn estimators: encodings, initialisation, API and errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from intune.hammock.estimator import HammockClassifier, HammockRegressor, NotFittedError  # noqa: E402
from intune.hammock.network import RelaxedHammock  # noqa: E402
from intune.hammock.quantize import BinEdges, one_hot, thermometer  # noqa: E402


def _step_data(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = ((X[:, 0] > 0.3) ^ (X[:, 1] > -0.2)).astype(int)
    return X, y


@pytest.mark.parametrize("encoding,dense", [("thermometer", thermometer), ("onehot", one_hot)])
def test_embedding_bag_equals_dense_encoding_times_table(encoding, dense):
    binning = BinEdges((np.array([-1.0, 0.0, 1.0]), np.array([0.5])))
    net = RelaxedHammock(binning.n_bins, 5, 1, encoding=encoding, seed=3)
    X = np.array([[-2.0, 0.0], [0.5, 1.0], [3.0, np.nan], [np.nan, 0.5]])
    local = binning.bin_index(X)
    expected = dense(local, binning) @ net.table.detach().double().numpy() + net.hidden_bias.detach().numpy()
    got = net.pre_activation(torch.from_numpy(binning.global_index(X))).detach().double().numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_classifier_learns_an_axis_aligned_rule_and_api():
    X, y = _step_data()
    labels = np.where(y == 1, "yes", "no")
    clf = HammockClassifier(max_epochs=40, random_state=1, n_threads=1).fit(X[:450], labels[:450])
    proba = clf.predict_proba(X[450:])
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-9)
    assert set(clf.predict(X[450:])) <= {"no", "yes"} and clf.score(X[450:], labels[450:]) > 0.85
    params = clf.get_params()
    assert params["encoding"] == "thermometer" and params["max_epochs"] == 40
    sklearn_base = pytest.importorskip("sklearn.base")
    clone = sklearn_base.clone(clf)
    assert clone.get_params() == params and not hasattr(clone, "network_")
    with pytest.raises(ValueError, match="no parameter 'depth'"):
        clf.set_params(depth=3)


def test_multiclass_and_regressor():
    X, _ = _step_data(seed=2)
    y3 = np.digitize(X[:, 0], [-0.5, 0.5])
    clf = HammockClassifier(max_epochs=30, n_threads=1).fit(X[:450], y3[:450])
    assert clf.predict_proba(X[450:]).shape == (150, 3) and clf.score(X[450:], y3[450:]) > 0.85
    yr = np.where(X[:, 0] > 0, 3.0, -1.0) + 0.1 * X[:, 2]
    reg = HammockRegressor(max_epochs=40, n_threads=1).fit(X[:450], yr[:450])
    assert reg.score(X[450:], yr[450:]) > 0.8


def test_errors_name_the_problem():
    X, y = _step_data(n=100)
    with pytest.raises(NotFittedError, match="predict_proba called before fit"):
        HammockClassifier().predict_proba(X)
    bad = X.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match="NaN at row 7, feature 2"):
        HammockClassifier().fit(bad, y)
    clf = HammockClassifier(max_epochs=1, n_threads=1).fit(X, y)
    bad[7, 2] = np.inf
    with pytest.raises(ValueError, match="infinite value at row 7, feature 2"):
        clf.predict(bad)
    with pytest.raises(ValueError, match="3 features, the model was fitted with 3|has 2 features"):
        clf.predict(X[:, :2])
    with pytest.raises(ValueError, match="single class"):
        HammockClassifier().fit(X, np.zeros(len(X)))
    with pytest.raises(ValueError, match="init must be"):
        HammockClassifier(init="forest").fit(X, y)
    with pytest.raises(ValueError, match="edges must be"):
        HammockClassifier(edges="uniform").fit(X, y)


def test_lightgbm_init_starts_at_the_gbdt():
    lgb = pytest.importorskip("lightgbm")
    from intune.hammock.training import split_validation

    X, y = _step_data(n=500, seed=4)
    clf = HammockClassifier(init="lightgbm", init_trees=20, init_temperature=40.0, max_epochs=0, n_threads=1)
    clf.fit(X, y)
    rows, _ = split_validation(y, clf.validation_fraction, clf.random_state, stratify=True)
    gbdt = lgb.LGBMClassifier(n_estimators=20, num_leaves=15, n_jobs=1, random_state=0, verbose=-1).fit(X[rows], y[rows])
    np.testing.assert_allclose(clf.decision_function(X), gbdt.predict(X, raw_score=True), atol=1e-3)
    n_leaves = sum(t["num_leaves"] for t in gbdt.booster_.dump_model()["tree_info"])
    assert clf.network_.activation == "sigmoid" and clf.network_.out.in_features == n_leaves


def test_gbdt_edges_are_the_thresholds_of_a_gbdt_fitted_on_the_training_split():
    lgb = pytest.importorskip("lightgbm")
    from intune.hammock import from_trees
    from intune.hammock.training import split_validation

    X, y = _step_data(n=400, seed=5)
    clf = HammockClassifier(edges="lightgbm", init_trees=10, max_epochs=2, n_threads=1).fit(X, y)
    rows, _ = split_validation(y, clf.validation_fraction, clf.random_state, stratify=True)
    gbdt = lgb.LGBMClassifier(n_estimators=10, num_leaves=15, n_jobs=1, random_state=0, verbose=-1).fit(X[rows], y[rows])
    for mine, theirs in zip(clf.binning_.edges, from_trees(gbdt).binning.edges, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert clf.network_.activation == "relu"  # bins from the GBDT, network from scratch
