"""The Q-network: shapes for 2-8 stages, padding, knob-order equivariance, size; replay n-step returns."""

import numpy as np
import pytest
import torch

from intune.agent.config import AgentConfig
from intune.agent.dqn import linear_schedule, new_network
from intune.agent.features import MAX_KNOBS, N_FEATURES
from intune.agent.replay import NStepAccumulator, ReplayBuffer


@pytest.mark.parametrize("n_stages", range(2, 9))
def test_one_network_serves_every_pipeline_length(n_stages):
    torch.manual_seed(0)
    q = new_network(AgentConfig())
    knobs = 2 * n_stages
    rows = torch.randn(3, MAX_KNOBS, N_FEATURES)
    valid = torch.zeros(3, MAX_KNOBS, dtype=torch.bool)
    valid[:, :knobs] = True
    out = q(rows, valid)
    assert out.shape == (3, MAX_KNOBS, 5)
    assert torch.all(out[:, knobs:] == 0)  # padded knobs carry no Q-values
    # unbatched: one pipeline's knobs only, same values as the padded batch entry
    single = q(rows[0, :knobs], valid[0, :knobs])
    assert single.shape == (knobs, 5)
    torch.testing.assert_close(single, out[0, :knobs])


def test_swapping_knobs_swaps_their_q_values():
    torch.manual_seed(1)
    q = new_network(AgentConfig())
    rows = torch.randn(6, N_FEATURES)
    valid = torch.ones(6, dtype=torch.bool)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    torch.testing.assert_close(q(rows[perm], valid), q(rows, valid)[perm])


def test_weights_are_small():
    q = new_network(AgentConfig())
    assert sum(p.numel() for p in q.parameters()) * 4 < 1_000_000


def test_epsilon_schedule_is_linear_then_flat():
    assert linear_schedule(1.0, 0.1, 100, 0) == 1.0
    assert linear_schedule(1.0, 0.1, 100, 50) == pytest.approx(0.55)
    assert linear_schedule(1.0, 0.1, 100, 100) == pytest.approx(0.1)
    assert linear_schedule(1.0, 0.1, 100, 10_000) == pytest.approx(0.1)


def _push(acc, buf, reward, terminal=False):
    z = np.zeros((MAX_KNOBS, N_FEATURES), np.float32)
    acc.push(buf, z + reward, np.ones(MAX_KNOBS, bool), np.zeros(MAX_KNOBS, np.int64), reward, z, np.ones(MAX_KNOBS, bool),
             np.ones((MAX_KNOBS, 5), bool), terminal)


def test_n_step_returns_match_hand_computed_values():
    buf = ReplayBuffer(16, MAX_KNOBS, N_FEATURES, 5)
    acc = NStepAccumulator(n=3, gamma=0.5)
    for r in (1.0, 2.0):
        _push(acc, buf, r)
    assert buf.size == 0  # nothing complete yet
    _push(acc, buf, 3.0)
    assert buf.size == 1
    assert buf.returns[0] == pytest.approx(1 + 0.5 * 2 + 0.25 * 3)
    assert buf.discount[0] == pytest.approx(0.125)
    _push(acc, buf, -10.0, terminal=True)  # an OOM: flush the rest, no bootstrap
    assert buf.size == 4
    np.testing.assert_allclose(buf.returns[1:4], [2 + 0.5 * 3 + 0.25 * -10, 3 + 0.5 * -10, -10])
    np.testing.assert_allclose(buf.discount[1:4], 0.0)
    assert buf.rows[1, 0, 0] == 2.0  # each transition starts at its own tick


@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize("knobs", [2, 5, 16])
def test_the_numpy_forward_gives_the_networks_q_values(knobs, members):
    from intune.agent.network import NumpyQ

    torch.manual_seed(knobs)
    q = new_network(AgentConfig(ensemble_members=members))
    rows = torch.randn(4, MAX_KNOBS, N_FEATURES)
    valid = torch.zeros(4, MAX_KNOBS, dtype=torch.bool)
    valid[:, :knobs] = True
    valid[1, 0] = False  # a hole in the middle of the valid knobs
    with torch.no_grad():
        expected = q(rows, valid).numpy()
    np.testing.assert_allclose(NumpyQ(q)(rows.numpy(), valid.numpy()), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(NumpyQ(q)(rows[0].numpy(), valid[0].numpy()), expected[0], rtol=1e-5, atol=1e-5)


def test_an_ensemble_decides_by_its_members_mean_q_values():
    torch.manual_seed(0)
    q = new_network(AgentConfig(ensemble_members=3))
    rows = torch.randn(2, MAX_KNOBS, N_FEATURES)
    valid = torch.ones(2, MAX_KNOBS, dtype=torch.bool)
    with torch.no_grad():
        each = [member(rows, valid) for member in q.members]
        torch.testing.assert_close(q(rows, valid), (each[0] + each[1] + each[2]) / 3)
    assert not torch.allclose(each[0], each[1])  # members start apart
    with pytest.raises(ValueError, match="ensemble_members"):
        new_network(AgentConfig(ensemble_members=0))
