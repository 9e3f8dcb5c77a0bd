"""The Bucketize UDF on Criteo-format chunks and HammockNet inside the DLRM training loop."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from intune.hammock.udf import DEFAULT_DENSE_BORDERS, Bucketize, HammockNet  # noqa: E402


def _chunk(rows: int = 6) -> dict[str, np.ndarray]:
    chunk: dict[str, np.ndarray] = {"label": np.arange(rows) % 2}
    dense = np.array([np.nan, -1.0, 0.0, 1.0, 2.0, 1e7])[:rows]
    for i in range(1, 14):
        chunk[f"I{i}"] = dense
    ids = np.array(["68fd1e64", None, "", "68fd1e64", "80e26c9b", "fb936136"], dtype=object)[:rows]
    for i in range(1, 27):
        chunk[f"C{i}"] = ids
    return chunk


def test_bucketize_bins_dense_counts_and_hashes_ids():
    udf = Bucketize()
    out = udf(_chunk())
    n_borders = len(DEFAULT_DENSE_BORDERS)
    # NaN -> missing bin; -1 -> the negatives' bin; 0, 1, 2 -> their own bins; 1e7 -> the top bin
    assert out["sparse"][:, 0].tolist() == [n_borders + 1, 0, 1, 2, 3, n_borders]
    cat = out["sparse"][:, 13:]
    assert (cat[1:3] == 0).all()  # None and "" are missing
    assert (cat[0] == cat[3]).all() and (cat[0] != 0).all()  # same ID, same bucket
    assert out["sparse"].shape == (6, 39) and out["sparse"].dtype == np.int64
    assert (out["sparse"] < np.array(udf.sparse_sizes)).all()
    np.testing.assert_allclose(out["dense"][:, 0], np.log1p([0, 0, 0, 1, 2, 1e7]).astype(np.float32))
    decoded = _chunk()
    for i in range(1, 27):  # the Criteo TSV reader's decoded ints (-1 = missing) give the same buckets
        decoded[f"C{i}"] = np.array([0x68FD1E64, -1, -1, 0x68FD1E64, 0x80E26C9B, 0xFB936136])
    assert (udf(decoded)["sparse"] == out["sparse"]).all()
    with pytest.raises(KeyError, match="lacks the Criteo columns"):
        udf({"label": np.zeros(2)})


def test_bucketize_fit_uses_quantiles_of_the_sample():
    chunk = _chunk()
    for i in range(1, 14):
        chunk[f"I{i}"] = np.arange(100.0)
    udf = Bucketize.fit({k: (v if k.startswith("I") else v) for k, v in chunk.items()}, max_bins=4)
    assert len(udf.dense_borders[0]) == 3 and udf.sparse_sizes[0] == 5


def test_hammock_net_forward_errors_and_learning_in_the_dlrm_loop():
    data = pytest.importorskip("intune.dlrm.data")
    from intune.dlrm.train import train

    udf = Bucketize(table_size=1000)

    def batches(rows: int, seed: int):
        for table in data.iter_chunks(rows, seed=seed, chunk_rows=512):
            yield udf({c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names})

    net = HammockNet(udf.sparse_sizes, num_dense=13, hidden=16)
    first = next(batches(512, 0))
    logits = net(torch.from_numpy(first["dense"]), torch.from_numpy(first["sparse"]))
    assert logits.shape == (512,)
    bad = torch.from_numpy(first["sparse"]).clone()
    bad[3, 20] = udf.sparse_sizes[20]
    with pytest.raises(ValueError, match=r"sparse\[3, 20\]"):
        net(None, bad)
    result = train(list(batches(20_000, 0)), model="hammock", table_sizes=udf.sparse_sizes,
                   eval_batches=list(batches(5_000, 1)), hidden=16)
    assert isinstance(result.model, HammockNet) and result.rows == 20_000
    assert result.auc > 0.65  # the generator's hidden model is learnable from the bins
