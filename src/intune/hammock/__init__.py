"""Hammock: tree ensembles as two-layer networks over quantized, one-hot (embedding-bag) inputs.

``from_trees`` converts a fitted LightGBM / XGBoost / scikit-learn ensemble exactly;
``HammockClassifier`` / ``HammockRegressor`` train the relaxed network; ``udf`` holds the pipeline
Bucketize UDF and ``HammockNet`` for the DLRM training loop. See docs/hammock.md.
"""

from intune.hammock.convert import ConversionError, HammockTrees, from_trees
from intune.hammock.quantize import BinEdges, quantile_edges

__all__ = ["BinEdges", "ConversionError", "HammockTrees", "from_trees", "quantile_edges"]
