"""DLRM: shapes, the interaction layout, sparse gradients, and that it learns generated data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from intune.dlrm import data, pipelines
from intune.dlrm.model import DLRM
from intune.dlrm.train import evaluate, heldout_batches, log_loss, roc_auc, train


def test_forward_backward_shapes_and_sparse_embedding_gradients() -> None:
    torch.manual_seed(0)
    model = DLRM([10, 20, 5], num_dense=4, embedding_dim=8, bottom=(16,), top=(16,))
    dense = torch.randn(6, 4)
    sparse = torch.tensor([[0, 19, 4]] * 6)
    logits = model(dense, sparse)
    assert logits.shape == (6,)
    # 1 bottom vector + 3 tables = 4 vectors -> 6 pairs; top MLP input = 8 + 6
    assert model.top[0].in_features == 8 + 6
    loss = model.loss(dense, sparse, torch.ones(6))
    loss.backward()
    grad = model.embeddings[1].weight.grad
    assert grad.is_sparse and set(grad.coalesce().indices()[0].tolist()) == {19}
    assert model.bottom[0].weight.grad.shape == (16, 4)


def test_interaction_is_the_pairwise_dot_products() -> None:
    model = DLRM([3, 3], num_dense=2, embedding_dim=2, bottom=(), top=())
    with torch.no_grad():
        model.embeddings[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 3.0]]))
        model.embeddings[1].weight.copy_(torch.tensor([[1.0, 1.0], [5.0, 0.0], [0.0, 0.0]]))
        linear = model.bottom[0]  # with no hidden layers: dense (2) -> dim (2), then ReLU
        linear.weight.copy_(torch.eye(2))
        linear.bias.zero_()
        top = model.top[0]  # input: x (2) + 3 pairs
        top.weight.copy_(torch.tensor([[0.0, 0.0, 1.0, 10.0, 100.0]]))
        top.bias.zero_()
    # x = (1, 2); e0 = row 2 = (2, 3); e1 = row 1 = (5, 0)
    out = model(torch.tensor([[1.0, 2.0]]), torch.tensor([[2, 1]]))
    x_e0, x_e1, e0_e1 = 1 * 2 + 2 * 3, 1 * 5 + 0, 2 * 5 + 3 * 0
    assert out.item() == pytest.approx(x_e0 + 10 * x_e1 + 100 * e0_e1)


def test_bad_shapes_are_named() -> None:
    model = DLRM([4, 4])
    with pytest.raises(ValueError, match=r"dense must be \(batch, 13\)"):
        model(torch.zeros(2, 12), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"sparse must be \(batch, 2\)"):
        model(torch.zeros(2, 13), torch.zeros(2, 3, dtype=torch.long))


def test_auc_and_log_loss_by_hand() -> None:
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert roc_auc(np.array([0, 1]), np.array([0.5, 0.5])) == pytest.approx(0.5)
    assert log_loss(np.array([1, 0]), np.array([0.5, 0.5])) == pytest.approx(np.log(2))
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(np.array([1, 1]), np.array([0.2, 0.3]))


@pytest.mark.parametrize("heavy", [False, True])
def test_training_on_generated_data_learns(tmp_path, heavy: bool) -> None:
    torch.set_num_threads(1)
    paths = data.generate(40_000, tmp_path / "train", seed=1)
    held = data.generate(8_000, tmp_path / "held", seed=2)
    udf = (
        pipelines.dlrm_heavy(next(data.read_chunks(paths, 20_000)), table_size=5_000)
        if heavy
        else pipelines.dlrm_standard(table_size=5_000)
    )
    batches = [udf(c) for c in data.read_chunks(paths, 1024)]
    result = train(
        batches, table_sizes=udf.sparse_sizes, eval_batches=heldout_batches(held, udf, 4096), max_seconds=20
    )
    assert result.rows == 40_000 and result.steps == len(batches)
    assert result.auc is not None and result.auc > 0.6, result.summary()
    assert (
        result.logloss < 0.6
    )  # the constant 25% predictor scores 0.562 on this data; learning must do better
    # waiting and computing are disjoint parts of the training loop's time
    assert 0 < result.wait_s and 0 < result.compute_s and result.wait_s + result.compute_s <= result.seconds
    again = evaluate(result.model, heldout_batches(held, udf, 4096))
    assert again[0] == pytest.approx(result.auc)


def test_model_latency_counts_as_compute() -> None:
    batch = {
        "dense": np.zeros((8, 13), np.float32),
        "sparse": np.zeros((8, 2), np.int64),
        "label": np.ones(8, np.float32),
    }
    result = train([batch] * 3, table_sizes=[4, 4], model_latency_s=0.02)
    assert result.steps == 3 and result.compute_s >= 0.06  # three 20 ms sleeps, all counted as compute
    assert result.wait_s + result.compute_s <= result.seconds  # and not counted as waiting as well
    assert result.idle_pct == pytest.approx(100 * result.wait_s / (result.wait_s + result.compute_s))


def test_unknown_model_and_missing_sizes() -> None:
    batch = {
        "dense": np.zeros((2, 13), np.float32),
        "sparse": np.zeros((2, 2), np.int64),
        "label": np.ones(2, np.float32),
    }
    with pytest.raises(ValueError, match="unknown model 'gbdt'"):
        train([batch], model="gbdt", table_sizes=[4, 4])
    with pytest.raises(ValueError, match="needs table_sizes"):
        train([batch])


def test_train_can_run_hammock_instead_of_dlrm(tmp_path) -> None:
    """model='hammock' trains the Hammock module on bucketized inputs through the same loop."""
    udf_module = pytest.importorskip("intune.hammock.udf")
    torch.set_num_threads(1)
    paths = data.generate(30_000, tmp_path / "train", seed=1)
    held = data.generate(8_000, tmp_path / "held", seed=2)
    bucketize = udf_module.Bucketize.fit(next(data.read_chunks(paths, 20_000)), table_size=2_000)
    batches = [bucketize(c) for c in data.read_chunks(paths, 1024)]
    result = train(
        batches,
        model="hammock",
        table_sizes=bucketize.sparse_sizes,
        eval_batches=heldout_batches(held, bucketize, 4096),
    )
    assert result.rows == 30_000 and result.auc > 0.6, result.summary()
