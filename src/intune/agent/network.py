"""The Q-network: a three-layer ReLU MLP shared by every knob, with one 5-way head per knob.

Action branching (Tavakoli et al. 2018): every knob gets its own Q-values over ``config.ACTION_DELTAS``, so the
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


class EnsembleQNetwork(nn.Module):
    """``BranchingQNetwork``s pretrained apart (each from its own seed), deciding by their mean Q-values.

    Why: imitation leaves each network wrong in its own places. Networks made alike from different
    seeds score alike on average but up to 0.65 of the optimum apart on one pipeline, each stalling
    where it alone learned to hold; averaging their Q-values keeps the moves they agree on. Online
    fine-tuning trains the mean, so every member learns from the live reward.
    """

    def __init__(self, members: list[BranchingQNetwork]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member network")
        self.members = nn.ModuleList(members)

    def forward(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return torch.stack([member(rows, valid) for member in self.members]).mean(0)


QNetwork = BranchingQNetwork | EnsembleQNetwork


def members_of(net: QNetwork) -> list[BranchingQNetwork]:
    """The branching networks that decide: the ensemble's members, or the network itself."""
    return list(net.members) if isinstance(net, EnsembleQNetwork) else [net]


class NumpyQ:
    """The same forward pass as ``BranchingQNetwork`` in numpy, from a snapshot of its weights.

    Why: the live tuner decides on a background thread while the pipeline saturates the CPUs. There,
    torch's linear layers hand the tiny matrix products to the OpenMP pool of the whole process, and the
    calling thread spins at the pool's barrier until a busy CPU runs the other worker: 1 ms of CPU per
    layer instead of microseconds. numpy does these products on the calling thread while each stays
    under OpenBLAS's threading threshold (M x N x K <= 262,144: up to 16 knobs at ``hidden`` 128, with
    the mix layer split; wider networks wake its threads). Call ``refresh``
    after every gradient step so the snapshot stays the network's. An ensemble's members are stacked,
    so its forward pass takes as many numpy calls as one network's.
    """

    def __init__(self, net: QNetwork) -> None:
        self.refresh(net)

    def refresh(self, net: QNetwork) -> None:
        members = members_of(net)

        def take(name: str) -> tuple[np.ndarray, np.ndarray]:  # [M, in, out] and [M, 1, out]
            layers = [getattr(m, name) for m in members]
            return (np.stack([layer.weight.detach().numpy().T for layer in layers]),
                    np.stack([layer.bias.detach().numpy()[None, :] for layer in layers]))

        self._embed, mix, self._head, self._value = (take(name) for name in ("embed", "mix", "head", "value"))
        hidden = mix[0].shape[-1]
        # the mix layer reads [knob, pooled]: split, so the K-row product is K x H x H and the pooled row
        # is multiplied once (a K x 2H x H product past OpenBLAS's threshold wakes its threads to spin)
        self._mix_knob, self._mix_pooled, self._mix_bias = mix[0][:, :hidden], mix[0][:, hidden:], mix[1]
        # one network: its weights as plain matrices, for the one-state decision (no member axis to broadcast)
        self._single = None if len(members) > 1 else tuple(
            w[0] for w in (*self._embed, self._mix_knob, self._mix_pooled, self._mix_bias, *self._head, *self._value))

    def __call__(self, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """``rows [..., K, F]`` float32, ``valid [..., K]`` -> Q-values ``[..., K, A]`` (as the network)."""
        if self._single is not None and rows.ndim == 2:
            return self._one_state(rows, valid)
        lead = (slice(None),) + (None,) * (rows.ndim - 2)  # members first, then the caller's batch axes

        def layer(x: np.ndarray, weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
            return x @ weights[0][lead] + weights[1][lead]

        weights = valid.astype(rows.dtype)[..., None]
        count = np.maximum(weights.sum(-2, keepdims=True), 1.0)
        h = np.maximum(layer(rows, self._embed), 0.0)  # [M, ..., K, H]
        pooled = (h * weights).sum(-2, keepdims=True) / count
        h = np.maximum(h @ self._mix_knob[lead] + pooled @ self._mix_pooled[lead] + self._mix_bias[lead], 0.0)
        advantage = layer(h, self._head)  # [M, ..., K, A]
        value = layer((h * weights).sum(-2, keepdims=True) / count, self._value)  # [M, ..., 1, 1]
        return ((value + advantage - advantage.mean(-1, keepdims=True)) * weights).mean(0)

    def _one_state(self, rows: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """``__call__`` for one network and one state (``rows [K, F]``): the same products in the same
        order, so the same bits, without the member axis (a decision takes ~15 us less)."""
        embed, embed_bias, mix_knob, mix_pooled, mix_bias, head, head_bias, value_w, value_bias = self._single
        # every row a knob (the decision's case): the weights would be ones, and multiplying by them changes
        # no bit, so they are left out
        every = bool(len(rows)) and bool(valid.all())
        weights = None if every else valid.astype(rows.dtype)[:, None]
        count = np.float32(len(rows)) if every else np.maximum(weights.sum(-2, keepdims=True), 1.0)

        def pool(x: np.ndarray) -> np.ndarray:
            return (x if weights is None else x * weights).sum(-2, keepdims=True) / count

        h = np.maximum(rows @ embed + embed_bias, 0.0)
        h = np.maximum(h @ mix_knob + pool(h) @ mix_pooled + mix_bias, 0.0)
        advantage = h @ head + head_bias
        q = pool(h) @ value_w + value_bias + advantage - advantage.mean(-1, keepdims=True)
        return q if weights is None else q * weights


def parameter_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())
