"""Online fine-tuning's DQN step in numpy: the same step as torch's (``dqn.td_loss``, gradient clipping,
Adam), for one network and an ensemble, its checkpoint, and no torch optimizer on the tuner's thread."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from intune.agent.config import AgentConfig
from intune.agent.dqn import new_network, td_loss
from intune.agent.features import MAX_KNOBS, N_FEATURES
from intune.agent.online_learning import OnlineLearner
from intune.agent.replay import ReplayBuffer

ACTIONS = 5


def _buffer(seed: int, size: int = 24) -> ReplayBuffer:
    """Transitions of 2-8 real knobs with random rows, moves, returns and masks (a terminal one too)."""
    rng = np.random.default_rng(seed)
    buffer = ReplayBuffer(64, MAX_KNOBS, N_FEATURES, ACTIONS)
    for i in range(size):
        n, n_next = (int(k) for k in rng.integers(2, 9, size=2))
        rows, next_rows = (np.zeros((MAX_KNOBS, N_FEATURES), dtype=np.float32) for _ in range(2))
        rows[:n] = rng.normal(size=(n, N_FEATURES))
        next_rows[:n_next] = rng.normal(size=(n_next, N_FEATURES))
        valid, next_valid = np.arange(MAX_KNOBS) < n, np.arange(MAX_KNOBS) < n_next
        mask = np.zeros((MAX_KNOBS, ACTIONS), dtype=bool)
        mask[:n_next] = rng.random((n_next, ACTIONS)) < 0.7
        mask[:n_next, 2] = True  # hold is always allowed
        actions = np.where(valid, rng.integers(0, ACTIONS, size=MAX_KNOBS), 2)
        discount = 0.0 if i == 3 else 0.8**3
        buffer.add(rows, valid, actions, float(rng.normal()) * 3, discount, next_rows, next_valid, mask)
    return buffer


@pytest.mark.parametrize("members", [1, 2])
@pytest.mark.parametrize("max_grad_norm", [10.0, 0.05])  # 0.05: the clip acts
def test_a_step_is_torch_s_td_loss_clipped_gradient_and_adam(members, max_grad_norm):
    torch.manual_seed(members)
    q = new_network(AgentConfig(ensemble_members=members, hidden=32))
    target = new_network(AgentConfig(ensemble_members=members, hidden=32))
    target.load_state_dict(q.state_dict())
    learner = OnlineLearner(q, lr=1e-3, max_grad_norm=max_grad_norm)
    adam = torch.optim.Adam(q.parameters(), lr=1e-3)
    buffer = _buffer(members)
    for step in range(4):
        batch = buffer.sample(8, np.random.default_rng(step))
        loss = td_loss(q, target, batch)
        ours = learner.step(batch)
        assert ours == pytest.approx(float(loss.detach()), rel=1e-4)
        adam.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(q.parameters(), max_grad_norm)
        adam.step()
        if step == 1:  # the target follows the online weights when told to
            target.load_state_dict(q.state_dict())
            learner.sync_target()
    for name, p in q.named_parameters():
        np.testing.assert_allclose(learner.params[name], p.detach().numpy(), rtol=1e-4, atol=2e-6, err_msg=name)


def test_its_checkpoint_resumes_the_same_steps_and_a_wrong_shape_is_named():
    torch.manual_seed(0)
    q = new_network(AgentConfig(hidden=16))
    first = OnlineLearner(q, lr=1e-3, max_grad_norm=10.0)
    buffer = _buffer(5)
    for step in range(3):
        first.step(buffer.sample(8, np.random.default_rng(step)))
    first.sync_target()
    first.write_to(q)
    second = OnlineLearner(q, lr=1e-3, max_grad_norm=10.0)
    second.load_state_dict(first.state_dict())
    for learner in (first, second):
        learner.step(buffer.sample(8, np.random.default_rng(9)))
    for name in first.names:
        np.testing.assert_array_equal(first.params[name], second.params[name])
    bad = first.state_dict()
    bad["target"]["embed.weight"] = bad["target"]["embed.weight"][:, :3]
    with pytest.raises(ValueError, match="embed.weight"):
        second.load_state_dict(bad)
    with pytest.raises(ValueError, match="learning rate"):
        OnlineLearner(q, lr=0.0, max_grad_norm=1.0)


def test_online_learning_builds_no_torch_optimizer_and_no_autograd_graph():
    # torch.optim imports torch._dynamo (~3 s of CPU on the live tuner's thread), and torch's products and
    # gradients run on the process's thread pools, which spin when the job's CPUs shrink
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import torch
from _online import fine_tune
from intune.agent.policy import IntunePolicy
from intune.sim import Simulator, load_workload
def refuse(*args, **kwargs):
    raise AssertionError("autograd ran")
torch.autograd.backward = refuse
torch.Tensor.backward = refuse
policy = fine_tune(IntunePolicy(online=True), Simulator(load_workload("criteo"), cpus=8, seed=0), 60)
assert policy._learner is not None and policy._learner.steps > 0, "no gradient step was taken"
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
