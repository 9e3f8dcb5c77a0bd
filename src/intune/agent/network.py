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
    """``q(rows [..., K, F], valid [..., K]) -> [..., K, A]``; padded knobs get zeros."""

    def __init__(self, n_features: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Linear(n_features, hidden)
        self.mix = nn.Linear(2 * hidden, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(rows))  # layer 1: per knob
        weights = valid.to(h.dtype).unsqueeze(-1)
        pooled = (h * weights).sum(-2) / weights.sum(-2).clamp_min(1.0)  # pipeline context
        context = pooled.unsqueeze(-2).expand_as(h)
        h = torch.relu(self.mix(torch.cat([h, context], dim=-1)))  # layer 2: knob + pipeline
        return self.head(h) * weights  # layer 3: one Q-value per action, per knob


def parameter_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())
