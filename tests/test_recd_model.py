"""The dedup-aware DLRM equals the plain model on the same batch: outputs and every gradient."""

import numpy as np
import pytest
import torch

from intune.recd import dedup_transform
from intune.recd.model import SessionDLRM, SessionDLRMConfig, batch_from_chunk, pad_jagged
from intune.recd.preprocess import preprocess_udfs
from intune.recd.sessions import USER_COLUMNS, SessionSpec, generate_sessions

CONFIG = SessionDLRMConfig(dim=8, user_table=1000, item_table=5003, bottom=(16,), top=(32, 16))


def _chunk(rows=300, mean=5.0, seed=0):
    data = generate_sessions(rows, seed, SessionSpec(mean_session_len=mean))
    data.pop("_time")
    return data


def _batches(chunk):
    plain, deduped = dict(chunk), dedup_transform({"user": list(USER_COLUMNS)})(chunk)
    for udf in preprocess_udfs(CONFIG):
        plain, deduped = udf(plain), udf(deduped)
    return batch_from_chunk(plain), batch_from_chunk(deduped)


def _grads(model, batch):
    model.zero_grad()
    out = model(batch)
    torch.nn.functional.binary_cross_entropy_with_logits(out, batch.label).backward()
    grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone() for n, p in model.named_parameters()}
    return out.detach(), grads


@pytest.mark.parametrize("mean", [1.0, 5.0])
def test_outputs_and_gradients_equal_plain_model(mean):
    torch.manual_seed(0)
    model = SessionDLRM(CONFIG).double()
    plain, deduped = _batches(_chunk(mean=mean))
    for b in (plain, deduped):
        b.user_dense = b.user_dense.double()
        b.label = b.label.double()
    if mean > 1:
        assert deduped.num_user_rows < plain.num_user_rows / 2
    out_p, g_p = _grads(model, plain)
    out_d, g_d = _grads(model, deduped)
    torch.testing.assert_close(out_d, out_p, rtol=1e-9, atol=1e-10)
    assert g_p.keys() == g_d.keys()
    for name in g_p:
        torch.testing.assert_close(g_d[name], g_p[name], rtol=1e-8, atol=1e-10, msg=name)
    assert any(g.abs().sum() > 0 for g in g_p.values())


def test_float32_equal_to_tolerance():
    torch.manual_seed(1)
    model = SessionDLRM(CONFIG)
    plain, deduped = _batches(_chunk(rows=400, mean=8.0, seed=4))
    out_p, g_p = _grads(model, plain)
    out_d, g_d = _grads(model, deduped)
    torch.testing.assert_close(out_d, out_p, rtol=1e-5, atol=1e-5)
    for name in g_p:
        torch.testing.assert_close(g_d[name], g_p[name], rtol=1e-4, atol=1e-6, msg=name)


def test_dedup_batch_without_repeats_takes_the_plain_path():
    _, deduped = _batches(_chunk(rows=50, mean=1.0))
    assert deduped.inverse is None and deduped.num_user_rows == 50


def test_empty_history_pools_to_zero_not_nan():
    torch.manual_seed(0)
    model = SessionDLRM(CONFIG)
    padded, mask = pad_jagged(np.array([4, 5]), np.array([0, 2]))
    emb = model.item_table(torch.from_numpy(padded))
    out = model.history_pool(emb, torch.from_numpy(mask))
    assert torch.isfinite(out).all()
    assert torch.equal(out[0], torch.relu(model.history_pool.out.bias))


def test_missing_model_inputs_named():
    with pytest.raises(ValueError, match="batch lacks model inputs"):
        batch_from_chunk({"label": np.zeros(2)})
