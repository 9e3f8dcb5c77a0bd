"""Online fine-tuning's Adam: the same steps as torch's, and no torch.optim import on the tuner thread."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from intune.agent.online_adam import OnlineAdam


def test_it_takes_the_same_steps_as_torch_adam():
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    theirs = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    theirs.load_state_dict(ours.state_dict())
    adam, reference = OnlineAdam(ours.parameters(), lr=1e-2), torch.optim.Adam(theirs.parameters(), lr=1e-2)
    for step in range(20):
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(step))
        for net, opt in ((ours, adam), (theirs, reference)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_bad_learning_rate_is_refused():
    with pytest.raises(ValueError, match="learning rate"):
        OnlineAdam(torch.nn.Linear(2, 2).parameters(), lr=0.0)


def test_online_learning_does_not_import_torch_dynamo():
    # building a torch.optim optimizer imports torch._dynamo: ~3 s of CPU on the live tuner's thread
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from _online import fine_tune
from intune.agent.policy import IntunePolicy
from intune.sim import Simulator, load_workload
policy = fine_tune(IntunePolicy(online=True), Simulator(load_workload("criteo"), cpus=8, seed=0), 60)
assert policy._optimizer is not None and policy._optimizer.steps > 0, "no gradient step was taken"
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
