"""The Q-network: a three-layer ReLU MLP shared by every knob, with one 5-way head per knob.

Action branching (Tavakoli et al. 2018): every knob gets its own Q-values over the config's ``action_deltas``, so the
output grows linearly with the knobs instead of exponentially. The weights are shared across knobs
and stages; what tells one knob from another is its feature row and a pipeline context (the mean of
all knobs' first-layer embeddings), so one network serves pipelines of 2 to 8 stages without
retraining. It must not know about observations or knobs, only about feature tensors.
"""

from __future__ import annotations

import numpy as np
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


class NumpyQ:
    """The same forward pass as ``BranchingQNetwork`` in numpy, from a snapshot of its weights.

    Why: the live tuner decides on a background thread while the pipeline saturates the CPUs. There,
    torch's linear layers hand the tiny matrix products to the OpenMP pool of the whole process, and the
    calling thread spins at the pool's barrier until a busy CPU runs the other worker: 1 ms of CPU per
    layer instead of microseconds. numpy does these products on the calling thread. Call ``refresh``
    after every gradient step so the snapshot stays the network's.
    """

    def __init__(self, net: BranchingQNetwork) -> None:
        self.refresh(net)

    def refresh(self, net: BranchingQNetwork) -> None:
        def take(layer: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
            return layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy()

        self._embed, self._mix, self._head, self._value = (take(layer) for layer in (net.embed, net.mix, net.head, net.value))

    def __call__(self, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """``rows [..., K, F]`` float32, ``valid [..., K]`` -> Q-values ``[..., K, A]`` (as the network)."""
        weights = valid.astype(rows.dtype)[..., None]
        count = np.maximum(weights.sum(-2), 1.0)
        h = np.maximum(rows @ self._embed[0] + self._embed[1], 0.0)
        pooled = (h * weights).sum(-2) / count
        both = np.concatenate([h, np.broadcast_to(pooled[..., None, :], h.shape)], axis=-1)
        h = np.maximum(both @ self._mix[0] + self._mix[1], 0.0)
        advantage = h @ self._head[0] + self._head[1]
        value = (((h * weights).sum(-2) / count) @ self._value[0] + self._value[1])[..., None, :]
        return (value + advantage - advantage.mean(-1, keepdims=True)) * weights


def parameter_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())
