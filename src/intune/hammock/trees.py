"""Reading fitted tree ensembles into one library-neutral description: leaves, their paths, a base, a link.

Owns: the parsers for LightGBM (booster dump), XGBoost (JSON model), scikit-learn gradient boosting,
histogram gradient boosting and random forests / extra trees, and the per-library split semantics
(which side ``x == threshold`` takes, where NaN goes, float32 rounding). It must not build networks:
``convert.py`` turns an :class:`Ensemble` into a Hammock network.

Every parser refuses what it cannot convert exactly (categorical splits, linear trees, DART,
multi-output trees, custom init estimators) with an error that names the model and the problem.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# LightGBM treats |x| <= 1e-35 (a float literal) as zero for missing_type "Zero"
_LGB_ZERO = float(np.float32(1e-35))


@dataclass(frozen=True)
class Split:
    """One numeric split. ``default_left`` says where a missing value goes."""

    feature: int
    threshold: float
    default_left: bool
    nan_as_zero: bool = False  # LightGBM missing_type None/Zero: NaN is compared as 0.0
    zero_is_missing: bool = False  # LightGBM missing_type Zero: zeros take the default side

    def goes_left(self, x: np.ndarray, right_closed: bool) -> np.ndarray:
        """Decision for an array of values of this split's feature, in the library's own rules."""
        x = np.asarray(x, dtype=np.float64)
        if self.nan_as_zero:
            x = np.where(np.isnan(x), 0.0, x)
        missing = np.isnan(x)
        if self.zero_is_missing:
            missing |= (x > -_LGB_ZERO) & (x <= _LGB_ZERO)
        with np.errstate(invalid="ignore"):
            compare = x <= self.threshold if right_closed else x < self.threshold
        return np.where(missing, self.default_left, compare)

    def edges(self) -> list[float]:
        """The values at which this split's decision can change."""
        out = [self.threshold]
        if self.zero_is_missing:
            out += [-_LGB_ZERO, _LGB_ZERO]
        return out


@dataclass
class Leaf:
    """A leaf: the splits on its path with the side taken, and its contribution to each output."""

    path: list[tuple[Split, bool]]
    value: np.ndarray  # shape (n_outputs,)
    tree: int = 0  # index of the tree the leaf belongs to


@dataclass
class Ensemble:
    """What a Hammock network needs from a fitted ensemble: raw = base + sum of the leaves that fire."""

    source: str
    n_features: int
    n_outputs: int
    leaves: list[Leaf]
    base: np.ndarray
    link: str  # identity | sigmoid | softmax | exp | proba
    right_closed: bool = True
    cast_float32: bool = False
    accepts_nan: bool = True
    accumulate_float32: bool = False  # the library sums tree outputs in float32, tree by tree
    link_scale: float = 1.0
    zero_snap: float = 0.0  # values with |x| <= zero_snap are read as 0.0 (LightGBM's sparse row reader)
    missing_value: float = math.nan
    classes: np.ndarray | None = None
    n_trees: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class ConversionError(ValueError):
    """The model cannot be converted exactly; the message names the model and the reason."""


def _walk(node: tuple, path: list, out: list, to_leaf) -> None:
    """Depth-first walk of a nested tree; ``to_leaf`` makes a Leaf from (payload, path).

    Leaves are tagged with a tree index one higher than the last leaf already in ``out``.
    """
    tree = out[-1].tree + 1 if out else 0
    stack = [(node, path)]
    while stack:
        node, path = stack.pop()
        kind, payload = node
        if kind == "leaf":
            leaf = to_leaf(payload, list(path))
            leaf.tree = tree
            out.append(leaf)
            continue
        split, left, right = payload
        stack.append((right, path + [(split, False)]))
        stack.append((left, path + [(split, True)]))


# ---------------------------------------------------------------- LightGBM
_LGB_LINKS = {
    "binary": "sigmoid", "cross_entropy": "sigmoid", "xentropy": "sigmoid",
    "multiclass": "softmax", "softmax": "softmax",
    "regression": "identity", "regression_l2": "identity", "regression_l1": "identity", "l2": "identity",
    "l1": "identity", "huber": "identity", "fair": "identity", "quantile": "identity", "mape": "identity",
    "poisson": "exp", "gamma": "exp", "tweedie": "exp",
}


def from_lightgbm(model: Any) -> Ensemble:
    booster = getattr(model, "booster_", model)
    dump = booster.dump_model()
    objective = str(dump.get("objective", "regression")).split()
    name = objective[0]
    if name not in _LGB_LINKS:
        raise ConversionError(f"LightGBM objective {name!r} is not supported by hammock.from_trees")
    scale = 1.0
    for token in objective[1:]:
        if token.startswith("sigmoid:"):
            scale = float(token.split(":", 1)[1])
    n_out = int(dump.get("num_tree_per_iteration", 1))
    n_features = int(dump["max_feature_idx"]) + 1
    leaves: list[Leaf] = []

    def parse(node: dict, class_id: int):
        if "leaf_value" in node:
            if "leaf_coeff" in node:
                raise ConversionError("LightGBM linear trees are not supported by hammock.from_trees")
            value = np.zeros(n_out)
            value[class_id] = float(node["leaf_value"])
            return ("leaf", value)
        if node.get("decision_type") != "<=":
            raise ConversionError(
                f"LightGBM tree has a {node.get('decision_type')!r} (categorical) split on feature "
                f"{node.get('split_feature')}; only numeric splits convert exactly"
            )
        missing = node.get("missing_type", "None")
        split = Split(
            int(node["split_feature"]), float(node["threshold"]), bool(node["default_left"]),
            nan_as_zero=missing != "NaN", zero_is_missing=missing == "Zero",
        )
        return ("split", (split, parse(node["left_child"], class_id), parse(node["right_child"], class_id)))

    trees = dump["tree_info"]
    for i, tree in enumerate(trees):
        _walk(parse(tree["tree_structure"], i % n_out), [], leaves, lambda v, p: Leaf(p, v))
    average = bool(dump.get("average_output", False))
    if average and trees:
        n_iter = len(trees) // n_out
        for leaf in leaves:
            leaf.value = leaf.value / n_iter
    classes = getattr(model, "classes_", None) if hasattr(model, "booster_") else None
    return Ensemble(
        "lightgbm", n_features, n_out, leaves, np.zeros(n_out), _LGB_LINKS[name], right_closed=True,
        link_scale=scale, zero_snap=_LGB_ZERO, classes=None if classes is None else np.asarray(classes),
        n_trees=len(trees),
    )


# ---------------------------------------------------------------- XGBoost
_XGB_LINKS = {
    "binary:logistic": "sigmoid", "reg:logistic": "sigmoid", "binary:logitraw": "identity",
    "multi:softprob": "softmax", "multi:softmax": "softmax",
    "reg:squarederror": "identity", "reg:squaredlogerror": "identity", "reg:pseudohubererror": "identity",
    "reg:absoluteerror": "identity", "reg:quantileerror": "identity",
    "count:poisson": "exp", "reg:gamma": "exp", "reg:tweedie": "exp",
}


def _xgb_base_margin(base_score: np.ndarray, objective: str) -> np.ndarray:
    """XGBoost stores the intercept in the output's space; turn it back into a margin."""
    base = base_score.astype(np.float64)
    if objective in ("binary:logistic", "reg:logistic"):  # computed in float32, as XGBoost does
        one = np.float32(1.0)
        return (-np.log(one / base_score - one)).astype(np.float64)
    if objective in ("count:poisson", "reg:gamma", "reg:tweedie"):
        return np.log(base)
    return base


def _xgb_node(tree: dict, i: int, output: int, n_out: int) -> tuple:
    """Node ``i`` of an XGBoost JSON tree as a nested (kind, payload) tuple; leaves feed ``output``."""
    if tree["left_children"][i] == -1:
        value = np.zeros(n_out)
        value[output] = float(np.float32(tree["split_conditions"][i]))
        return ("leaf", value)
    split = Split(int(tree["split_indices"][i]), float(np.float32(tree["split_conditions"][i])), bool(tree["default_left"][i]))
    left = _xgb_node(tree, tree["left_children"][i], output, n_out)
    return ("split", (split, left, _xgb_node(tree, tree["right_children"][i], output, n_out)))


def from_xgboost(model: Any) -> Ensemble:
    booster = model.get_booster() if hasattr(model, "get_booster") else model
    raw = json.loads(booster.save_raw(raw_format="json"))
    learner = raw["learner"]
    objective = learner["objective"]["name"]
    if objective not in _XGB_LINKS:
        raise ConversionError(f"XGBoost objective {objective!r} is not supported by hammock.from_trees")
    gb = learner["gradient_booster"]
    if gb["name"] != "gbtree":
        raise ConversionError(f"XGBoost booster {gb['name']!r} is not supported (only 'gbtree')")
    params = learner["learner_model_param"]
    if int(params.get("num_target", 1)) > 1:
        raise ConversionError("XGBoost multi-target models are not supported by hammock.from_trees")
    n_class = int(params.get("num_class", 0))
    n_out = max(n_class, 1)
    text = str(params["base_score"]).strip("[]")
    base_score = np.array([np.float32(v) for v in text.split(",")], dtype=np.float32)
    base = _xgb_base_margin(base_score, objective)
    base = np.broadcast_to(base, (n_out,)).copy()
    tree_model = gb["model"]
    trees, tree_info = tree_model["trees"], tree_model["tree_info"]
    n_trees = len(trees)
    best = booster.attr("best_iteration")
    indptr = tree_model.get("iteration_indptr")
    if best is not None and indptr is not None:
        n_trees = int(indptr[int(best) + 1])
    n_features = int(params["num_feature"])
    leaves: list[Leaf] = []
    for t in range(n_trees):
        tree = trees[t]
        if any(int(s) != 0 for s in tree["split_type"]):
            raise ConversionError(f"XGBoost tree {t} has categorical splits; only numeric splits convert exactly")
        if int(tree["tree_param"].get("size_leaf_vector", "1")) > 1:
            raise ConversionError(f"XGBoost tree {t} is a multi-output tree; not supported")
        root = _xgb_node(tree, 0, int(tree_info[t]), n_out)
        _walk(root, [], leaves, lambda v, p: Leaf(p, v))
    missing = getattr(model, "missing", math.nan)
    classes = getattr(model, "classes_", None)
    return Ensemble(
        "xgboost", n_features, n_out, leaves, base, _XGB_LINKS[objective], right_closed=False,
        cast_float32=True, accumulate_float32=True, missing_value=math.nan if missing is None else float(missing),
        extra={"tree_output": [int(c) for c in tree_info[:n_trees]]},
        classes=None if classes is None else np.asarray(classes), n_trees=n_trees,
    )


# ---------------------------------------------------------------- scikit-learn
def _sk_tree_leaves(tree: Any, values: np.ndarray, out: list[Leaf]) -> None:
    """Leaves of one fitted ``sklearn.tree._tree.Tree``; ``values[node]`` is the node's output vector."""
    left, right = tree.children_left, tree.children_right
    go_left = getattr(tree, "missing_go_to_left", np.zeros(tree.node_count, dtype=np.uint8))

    def parse(i: int):
        if left[i] == -1:
            return ("leaf", values[i])
        split = Split(int(tree.feature[i]), float(tree.threshold[i]), bool(go_left[i]))
        return ("split", (split, parse(left[i]), parse(right[i])))

    _walk(parse(0), [], out, lambda v, p: Leaf(p, np.array(v, dtype=np.float64)))


def from_sklearn_gb(model: Any) -> Ensemble:
    from sklearn.dummy import DummyClassifier, DummyRegressor

    is_classifier = hasattr(model, "classes_")
    init = model.init_
    if not (init == "zero" or isinstance(init, (DummyClassifier, DummyRegressor))):
        raise ConversionError(
            f"{type(model).__name__} with a custom init estimator ({type(init).__name__}) has no constant base score"
        )
    n_features = int(model.n_features_in_)
    base = np.asarray(model._raw_predict_init(np.zeros((1, n_features), dtype=np.float32))[0], dtype=np.float64)
    estimators = model.estimators_  # shape (n_iter, n_outputs)
    n_out = estimators.shape[1]
    leaves: list[Leaf] = []
    for stage in estimators:
        for k, est in enumerate(stage):
            vals = np.zeros((est.tree_.node_count, n_out))
            vals[:, k] = model.learning_rate * est.tree_.value[:, 0, 0]
            _sk_tree_leaves(est.tree_, vals, leaves)
    link, scale = "identity", 1.0
    if is_classifier:
        link = "softmax" if n_out > 1 else "sigmoid"
        if getattr(model, "loss", "log_loss") == "exponential":
            scale = 2.0
    return Ensemble(
        "sklearn-gb", n_features, n_out, leaves, base, link, right_closed=True, cast_float32=True,
        accepts_nan=False, link_scale=scale, classes=getattr(model, "classes_", None),
        n_trees=estimators.size,
    )


def from_sklearn_hgb(model: Any) -> Ensemble:
    is_classifier = hasattr(model, "classes_")
    n_features = int(model.n_features_in_)
    baseline = np.asarray(model._baseline_prediction, dtype=np.float64).ravel()
    n_out = baseline.size
    leaves: list[Leaf] = []
    for stage in model._predictors:
        for k, predictor in enumerate(stage):
            nodes = predictor.nodes
            if nodes["is_categorical"].any():
                raise ConversionError(
                    f"{type(model).__name__} has categorical splits; only numeric splits convert exactly"
                )

            def parse(i: int, k: int = k, nodes: np.ndarray = nodes):
                node = nodes[i]
                if node["is_leaf"]:
                    value = np.zeros(n_out)
                    value[k] = float(node["value"])
                    return ("leaf", value)
                split = Split(int(node["feature_idx"]), float(node["num_threshold"]), bool(node["missing_go_to_left"]))
                return ("split", (split, parse(int(node["left"])), parse(int(node["right"]))))

            _walk(parse(0), [], leaves, lambda v, p: Leaf(p, v))
    loss = str(getattr(model, "loss", "squared_error"))
    link = "identity"
    if is_classifier:
        link = "softmax" if n_out > 1 else "sigmoid"
    elif loss in ("poisson", "gamma"):
        link = "exp"
    return Ensemble(
        "sklearn-hgb", n_features, n_out, leaves, baseline, link, right_closed=True,
        classes=getattr(model, "classes_", None), n_trees=sum(len(s) for s in model._predictors),
    )


def from_sklearn_forest(model: Any) -> Ensemble:
    if getattr(model, "n_outputs_", 1) != 1:
        raise ConversionError(f"{type(model).__name__} with {model.n_outputs_} outputs (multi-output) is not supported")
    is_classifier = hasattr(model, "classes_")
    n_features = int(model.n_features_in_)
    trees = model.estimators_
    n_trees = len(trees)
    leaves: list[Leaf] = []
    for est in trees:
        value = est.tree_.value[:, 0, :].astype(np.float64)
        if is_classifier:
            total = value.sum(axis=1, keepdims=True)
            value = np.divide(value, total, out=np.zeros_like(value), where=total > 0)
            if value.shape[1] == 2:
                value = value[:, 1:]
        _sk_tree_leaves(est.tree_, value / n_trees, leaves)
    n_out = leaves[0].value.size if leaves else 1
    return Ensemble(
        "sklearn-forest", n_features, n_out, leaves, np.zeros(n_out), "proba" if is_classifier else "identity",
        right_closed=True, cast_float32=True, classes=getattr(model, "classes_", None), n_trees=n_trees,
    )


def describe(model: Any) -> Ensemble:
    """Dispatch on the model's type; unsupported types get an error listing what is supported."""
    mod = type(model).__module__
    name = type(model).__name__
    if mod.startswith("lightgbm"):
        if name != "Booster" and not getattr(model, "fitted_", False):
            raise ConversionError(f"{name} is not fitted; fit it before hammock.from_trees")
        return from_lightgbm(model)
    if mod.startswith("xgboost"):
        if name != "Booster":
            try:
                model.get_booster()
            except Exception as exc:  # xgboost raises NotFittedError here
                raise ConversionError(f"{name} is not fitted; fit it before hammock.from_trees") from exc
        return from_xgboost(model)
    if mod.startswith("sklearn.ensemble"):
        if not hasattr(model, "n_features_in_"):
            raise ConversionError(f"{name} is not fitted; fit it before hammock.from_trees")
        if name in ("GradientBoostingClassifier", "GradientBoostingRegressor"):
            return from_sklearn_gb(model)
        if name in ("HistGradientBoostingClassifier", "HistGradientBoostingRegressor"):
            return from_sklearn_hgb(model)
        if name in ("RandomForestClassifier", "RandomForestRegressor", "ExtraTreesClassifier", "ExtraTreesRegressor"):
            return from_sklearn_forest(model)
    raise ConversionError(
        f"hammock.from_trees does not support {mod}.{name}; supported: LightGBM and XGBoost models "
        "(sklearn API or Booster), scikit-learn GradientBoosting*, HistGradientBoosting*, RandomForest*, "
        "ExtraTrees*"
    )
