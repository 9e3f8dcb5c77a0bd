"""The Q-network: a three-layer ReLU MLP shared by every knob, with one 5-way head per knob.

Action branching (Tavakoli et al. 2018): every knob gets its own Q-values over ACTION_DELTAS, so the
output grows linearly with the knobs instead of exponentially. The weights are shared across knobs
and stages; what tells one knob from another is its feature row and a pipeline context (the mean of
all knobs' first-layer embeddings), so one network serves pipelines of 2 to 8 stages without
retraining. It must not know about observations or knobs, only about feature tensors.
"""

from __future__ import annotations

import torch
from torch import nn


class BranchingQNetwork(nn.Module):
    """``q(rows [..., K, F], valid [..., K]) -> [..., K, A]``; padded knobs get zeros.

    Dueling branches (as in BDQ): ``Q_k(a) = V + A_k(a) - mean_a A_k(a)``, with one state value ``V``
    from the pooled pipeline context, so each knob's head only learns how its moves differ.
    """

    def __init__(self, n_features: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Linear(n_features, hidden)
        self.mix = nn.Linear(2 * hidden, hidden)
        self.head = nn.Linear(hidden, n_actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        weights = valid.to(rows.dtype).unsqueeze(-1)
        h = torch.relu(self.embed(rows))  # layer 1: per knob
        pooled = (h * weights).sum(-2) / weights.sum(-2).clamp_min(1.0)  # pipeline context
        h = torch.relu(self.mix(torch.cat([h, pooled.unsqueeze(-2).expand_as(h)], dim=-1)))  # layer 2
        advantage = self.head(h)  # layer 3: per knob, per action
        value = self.value((h * weights).sum(-2) / weights.sum(-2).clamp_min(1.0)).unsqueeze(-2)
        return (value + advantage - advantage.mean(-1, keepdim=True)) * weights


def parameter_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())
