"""The relaxed (trainable) Hammock network: embedding-bag sums over bins, a smooth activation, a linear output.

Owns: the torch module that the scikit-learn estimators and the pipeline's ``HammockNet`` train, the
one-hot and thermometer encodings expressed as embedding-bag lookups, and its initialisation, either
random or from an exactly converted tree ensemble. It must not quantize raw values (``quantize.py``)
nor run the training loop (``training.py``).

Encodings, for a feature whose bins are ``0..n-1``:

* one-hot: bin ``b`` looks up row ``b`` of the feature's block of the table;
* thermometer (``x > e_j`` for every cut ``e_j``, plus a constant): bin ``b`` looks up the sum of rows
  ``0..b``. Computing the block's cumulative sum once per step and then looking up one row gives the
  same product as the dense thermometer vector times the table, at one-hot cost. Neighbouring bins
  then share all but one row, which is what makes it train better: a bin that is rare in training
  still inherits its neighbours' weights. A feature's last bin (NaN) and unordered (categorical)
  features always use one-hot rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": F.gelu}


class RelaxedHammock(nn.Module):
    """``out(act(sum_f table[bin_f] + bias))`` with the table read through the chosen encoding.

    ``forward(bin_idx)``: ``bin_idx`` is a LongTensor ``(batch, n_features)`` of *global* bin indices
    (feature ``f``'s bin ``b`` is ``offsets[f] + b``); returns logits ``(batch, n_outputs)``.
    """

    def __init__(
        self,
        bins_per_feature: Sequence[int],
        hidden: int,
        n_outputs: int,
        *,
        encoding: str = "thermometer",
        ordered: Sequence[bool] | None = None,
        activation: str = "relu",
        seed: int = 0,
    ):
        super().__init__()
        if encoding not in ("thermometer", "onehot"):
            raise ValueError(f"encoding must be 'thermometer' or 'onehot', got {encoding!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        sizes = np.asarray(bins_per_feature, dtype=np.int64)
        if sizes.ndim != 1 or sizes.size == 0 or (sizes < 1).any():
            raise ValueError(f"bins_per_feature must be positive counts, got {list(bins_per_feature)}")
        ordered = np.ones(sizes.size, dtype=bool) if ordered is None else np.asarray(ordered, dtype=bool)
        self.encoding = encoding
        self.activation = activation
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        total = int(sizes.sum())
        # for each table row: where its feature's block starts, and whether it accumulates (thermometer)
        start = np.repeat(offsets, sizes)
        last = np.repeat(offsets + sizes - 1, sizes)
        rows = np.arange(total)
        accumulate = np.repeat(ordered, sizes) & (rows != last) & (encoding == "thermometer")
        self.register_buffer("offsets", torch.from_numpy(offsets))
        self.register_buffer("_block_start", torch.from_numpy(start))
        self.register_buffer("_accumulate", torch.from_numpy(accumulate))
        gen = torch.Generator().manual_seed(seed)
        n_features = sizes.size
        # pre-activations start at unit variance: F looked-up rows (thermometer: ~n/2 summed increments)
        depth = np.where(accumulate, np.repeat(np.maximum(sizes - 1, 1), sizes) / 2.0, 1.0)
        std = torch.from_numpy(1.0 / np.sqrt(n_features * depth)).float()
        self.table = nn.Parameter(torch.randn(total, hidden, generator=gen) * std[:, None])
        self.hidden_bias = nn.Parameter(torch.zeros(hidden))
        self.out = nn.Linear(hidden, n_outputs)
        with torch.no_grad():
            bound = 1.0 / np.sqrt(hidden)
            self.out.weight.uniform_(-bound, bound, generator=gen)
            self.out.bias.zero_()

    @property
    def n_features(self) -> int:
        return int(self.offsets.numel())

    def embedding_table(self) -> torch.Tensor:
        """The table one-hot bins read: the parameters, or their per-feature cumulative sums (thermometer)."""
        if self.encoding == "onehot" or not bool(self._accumulate.any()):
            return self.table
        masked = self.table * self._accumulate[:, None]
        csum = torch.cumsum(masked, dim=0)
        padded = torch.cat([csum.new_zeros(1, csum.shape[1]), csum])
        block = padded[1:] - padded[self._block_start]  # sum of this feature's rows up to and including r
        return torch.where(self._accumulate[:, None], block, self.table)

    def pre_activation(self, bin_idx: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(bin_idx, self.embedding_table(), mode="sum") + self.hidden_bias

    def forward(self, bin_idx: torch.Tensor) -> torch.Tensor:
        return self.out(ACTIVATIONS[self.activation](self.pre_activation(bin_idx)))

    @classmethod
    def from_trees(cls, trees, *, encoding: str = "thermometer", temperature: float = 10.0) -> RelaxedHammock:
        """Start from an exactly converted ensemble (``convert.HammockTrees``), step relaxed to a sigmoid.

        Each leaf unit gets ``sigmoid(temperature * (count - need))``: with integer counts it is within
        ``sigmoid(-temperature / 2)`` of the step, so the network starts where the GBDT is.
        """
        sizes = trees.binning.n_bins
        table = trees.bag.weight.detach().numpy().astype(np.float64)
        net = cls(sizes, table.shape[1], trees.n_outputs, encoding=encoding, activation="sigmoid")
        rows = table * temperature
        if encoding == "thermometer":  # increments whose per-feature cumulative sums give the table
            acc = net._accumulate.numpy()
            shifted = np.vstack([np.zeros((1, rows.shape[1])), rows[:-1]])
            is_first = np.arange(len(rows)) == net._block_start.numpy()
            rows = np.where((acc & ~is_first)[:, None], rows - shifted, rows)
        with torch.no_grad():
            net.table.copy_(torch.from_numpy(rows).float())
            net.hidden_bias.copy_(-temperature * trees.need.float())
            net.out.weight.copy_(trees.out.weight.float())
            net.out.bias.copy_(trees.out.bias.float())
        return net
