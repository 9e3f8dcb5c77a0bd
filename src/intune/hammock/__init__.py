"""Hammock: tree ensembles as two-layer networks over quantized, one-hot (embedding-bag) inputs.

``from_trees`` converts a fitted LightGBM / XGBoost / scikit-learn ensemble exactly (``convert``);
``HammockClassifier`` / ``HammockRegressor`` train the relaxed network (``estimator``); ``Bucketize``
and ``HammockNet`` put it in the Criteo pipeline and the DLRM training loop (``udf``;
``intune.dlrm.train`` finds ``hammock_module``). See docs/hammock.md.
"""

from intune.hammock.convert import ConversionError, HammockTrees, from_trees
from intune.hammock.estimator import HammockClassifier, HammockRegressor, NotFittedError
from intune.hammock.network import RelaxedHammock
from intune.hammock.quantize import BinEdges, quantile_edges
from intune.hammock.udf import Bucketize, HammockNet, hammock_module

__all__ = [
    "BinEdges", "Bucketize", "ConversionError", "HammockClassifier", "HammockNet", "HammockRegressor",
    "HammockTrees", "NotFittedError", "RelaxedHammock", "from_trees", "hammock_module", "quantile_edges",
]
