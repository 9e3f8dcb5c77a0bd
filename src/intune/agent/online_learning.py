"""Online fine-tuning's DQN step in numpy, on the tuner's thread, one state at a time.

The step ``dqn.td_loss`` defines (Huber loss of the taken moves' Q-values against the n-step return
plus the discounted value of the online network's best allowed next moves under the target network,
averaged over the real knobs), then clipping of the gradient's global norm, then Adam (Kingma & Ba,
bias-corrected, as ``torch.optim.Adam`` with its defaults). A test compares each part with torch's.

Why not torch: the live tuner learns on a background thread of the user's process while the pipeline
keeps the CPUs busy. torch hands a batch's products and their gradients to the process's OpenMP and BLAS
thread pools, and when the job's CPUs shrink (an affinity change, a smaller cgroup) those pools' threads
share a CPU with the caller and spin at every barrier: one gradient step took 230 ms of the tuner
thread's CPU on ``intune bench tune``'s pipeline restricted to 1 CPU (7 ms on 2), 3.4% of a core over the
resize benchmark. Here every product is one state's (at most 16 knobs x 128 x 128 at the shipped sizes),
under OpenBLAS's threading threshold, so it runs on the calling thread; building no ``torch.optim``
optimizer also keeps ``torch._dynamo`` (3 s of CPU to import) out of the live process.

It must not choose moves or know about observations: it learns from batches of the replay buffer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from intune.agent.network import QNetwork
from intune.agent.replay import Batch

LAYERS = ("embed", "mix", "head", "value")


class OnlineLearner:
    """The online and target networks' weights as numpy arrays, Adam's moments, and ``step(batch)``.

    Weights are keyed by the torch network's parameter names (``embed.weight`` ..., or
    ``members.<i>.embed.weight`` ... for an ensemble, whose members decide by their mean Q-values and
    so each receive the mean's gradient over their count). ``write_to(q)`` copies the online weights into
    a torch network of the same shape (for checkpoints and the decision's snapshot).
    """

    def __init__(self, q: QNetwork, lr: float, max_grad_norm: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        if lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        self.lr, self.max_grad_norm, self.betas, self.eps = lr, max_grad_norm, betas, eps
        self.names = [name for name, p in q.named_parameters() if p.requires_grad]
        self.params = {name: p.detach().cpu().numpy().astype(np.float32, copy=True) for name, p in q.named_parameters()}
        self.target = {name: a.copy() for name, a in self.params.items()}
        self.m = {name: np.zeros_like(self.params[name]) for name in self.names}
        self.v = {name: np.zeros_like(self.params[name]) for name in self.names}
        self.steps = 0
        self.prefixes = sorted({name[: -len(f"{layer}.weight")] for name in self.names for layer in LAYERS
                                if name.endswith(f"{layer}.weight")})

    # -- the step ----------------------------------------------------------------------------------
    def step(self, batch: Batch) -> float:
        """One gradient step on ``batch``; returns the loss before it."""
        rows, valid, actions = batch.rows.numpy(), batch.valid.numpy(), batch.actions.numpy()
        next_rows, next_valid, next_mask = batch.next_rows.numpy(), batch.next_valid.numpy(), batch.next_mask.numpy()
        returns, discount = batch.returns.numpy(), batch.discount.numpy()
        knobs = max(int(valid.sum()), 1)
        grads = {name: np.zeros_like(self.params[name]) for name in self.names}
        loss = 0.0
        for i in range(len(rows)):
            y = returns[i] + discount[i] * self._next_value(next_rows[i], next_valid[i], next_mask[i])
            n = int(valid[i].sum())
            if n == 0:
                continue
            x = rows[i, :n]
            caches = [self._forward(self.params, prefix, x) for prefix in self.prefixes]
            q = np.mean([c["q"] for c in caches], axis=0)
            taken = q[np.arange(n), actions[i, :n]]
            diff = taken - np.float32(y)
            loss += float(np.where(np.abs(diff) < 1.0, 0.5 * diff * diff, np.abs(diff) - 0.5).sum())
            dq = np.zeros_like(q)
            dq[np.arange(n), actions[i, :n]] = np.clip(diff, -1.0, 1.0) / knobs / len(self.prefixes)
            for prefix, cache in zip(self.prefixes, caches, strict=True):
                self._backward(prefix, cache, dq, grads)
        norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
        scale = self.max_grad_norm / (norm + 1e-6)
        if scale < 1.0:
            for g in grads.values():
                g *= np.float32(scale)
        self._adam(grads)
        return loss / knobs

    def sync_target(self) -> None:
        """The target network takes the online network's weights (every few dozen steps)."""
        self.target = {name: a.copy() for name, a in self.params.items()}

    def q_values(self, rows: np.ndarray, target: bool = False) -> np.ndarray:
        """``[n, A]`` Q-values of one state's real knobs' rows (``[n, F]``), online or target."""
        params = self.target if target else self.params
        return np.mean([self._forward(params, prefix, rows)["q"] for prefix in self.prefixes], axis=0)

    def _next_value(self, rows: np.ndarray, valid: np.ndarray, mask: np.ndarray) -> float:
        """Mean over the real knobs of the target's Q at the online network's best allowed next move."""
        n = int(valid.sum())
        if n == 0:
            return 0.0
        best = np.where(mask[:n], self.q_values(rows[:n]), -1e9).argmax(axis=1)
        return float(self.q_values(rows[:n], target=True)[np.arange(n), best].mean())

    def _forward(self, params: Mapping[str, np.ndarray], prefix: str, x: np.ndarray) -> dict[str, np.ndarray]:
        """``BranchingQNetwork.forward`` on one state's real knobs, keeping what the backward pass needs."""
        embed, mix = params[f"{prefix}embed.weight"], params[f"{prefix}mix.weight"]
        hidden = embed.shape[0]
        z1 = x @ embed.T + params[f"{prefix}embed.bias"]
        h1 = np.maximum(z1, 0.0)
        p1 = h1.mean(axis=0)
        z2 = h1 @ mix[:, :hidden].T + (p1 @ mix[:, hidden:].T + params[f"{prefix}mix.bias"])
        h2 = np.maximum(z2, 0.0)
        advantage = h2 @ params[f"{prefix}head.weight"].T + params[f"{prefix}head.bias"]
        p2 = h2.mean(axis=0)
        value = p2 @ params[f"{prefix}value.weight"].T + params[f"{prefix}value.bias"]
        q = value + advantage - advantage.mean(axis=1, keepdims=True)
        return {"x": x, "z1": z1, "h1": h1, "p1": p1, "z2": z2, "h2": h2, "p2": p2, "q": q}

    def _backward(self, prefix: str, c: Mapping[str, np.ndarray], dq: np.ndarray, grads: dict[str, np.ndarray]) -> None:
        """Add the gradient of ``sum(dq * q)`` with respect to the member ``prefix``'s weights to ``grads``."""
        params = self.params
        embed, mix = params[f"{prefix}embed.weight"], params[f"{prefix}mix.weight"]
        head, value_w = params[f"{prefix}head.weight"], params[f"{prefix}value.weight"]
        hidden, n = embed.shape[0], len(c["x"])
        d_advantage = dq - dq.mean(axis=1, keepdims=True)
        d_value = dq.sum()
        grads[f"{prefix}value.weight"] += d_value * c["p2"][None, :]
        grads[f"{prefix}value.bias"] += d_value
        grads[f"{prefix}head.weight"] += d_advantage.T @ c["h2"]
        grads[f"{prefix}head.bias"] += d_advantage.sum(axis=0)
        dh2 = d_advantage @ head + (d_value * value_w[0] / n)[None, :]
        dz2 = dh2 * (c["z2"] > 0)
        grads[f"{prefix}mix.weight"][:, :hidden] += dz2.T @ c["h1"]
        grads[f"{prefix}mix.weight"][:, hidden:] += np.outer(dz2.sum(axis=0), c["p1"])
        grads[f"{prefix}mix.bias"] += dz2.sum(axis=0)
        dh1 = dz2 @ mix[:, :hidden] + (dz2.sum(axis=0) @ mix[:, hidden:] / n)[None, :]
        dz1 = dh1 * (c["z1"] > 0)
        grads[f"{prefix}embed.weight"] += dz1.T @ c["x"]
        grads[f"{prefix}embed.bias"] += dz1.sum(axis=0)

    def _adam(self, grads: Mapping[str, np.ndarray]) -> None:
        self.steps += 1
        b1, b2 = self.betas
        correction1 = 1 - b1**self.steps
        root_correction2 = math.sqrt(1 - b2**self.steps)
        for name in self.names:
            m, v, g = self.m[name], self.v[name], grads[name]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            self.params[name] -= (self.lr / correction1) * m / (np.sqrt(v) / root_correction2 + self.eps)

    # -- the torch network and checkpoints ----------------------------------------------------------
    def write_to(self, q: QNetwork) -> None:
        """Copy the online weights into ``q`` (same parameter names and shapes)."""
        import torch

        with torch.no_grad():
            for name, p in q.named_parameters():
                p.copy_(torch.from_numpy(self.params[name]))

    def state_dict(self) -> dict[str, Any]:
        """The target network's weights and Adam's state (step count, moments in the parameters' order)."""
        return {
            "target": {name: a.copy() for name, a in self.target.items()},
            "optimizer": {"steps": self.steps, "m": [self.m[n].copy() for n in self.names],
                          "v": [self.v[n].copy() for n in self.names]},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()`` of a learner over a network of the same shapes; a missing or
        reshaped array raises, naming it."""
        target, optimizer = state["target"], state["optimizer"]
        if set(target) != set(self.target):
            raise ValueError(f"online learner state: target weights {sorted(target)}, the network's {sorted(self.target)}")
        if len(optimizer["m"]) != len(self.names) or len(optimizer["v"]) != len(self.names):
            raise ValueError(f"online learner state: {len(optimizer['m'])} parameters' moments, {len(self.names)} here")
        moments = [*zip(self.names, optimizer["m"], strict=True), *zip(self.names, optimizer["v"], strict=True)]
        for name, saved in [*target.items(), *moments]:
            if tuple(np.shape(saved)) != self.params[name].shape:
                raise ValueError(f"online learner state: {name!r} has shape {np.shape(saved)}, "
                                 f"the network's is {self.params[name].shape}")
        self.target = {name: np.asarray(a, dtype=np.float32).copy() for name, a in target.items()}
        self.m = {name: np.asarray(a, dtype=np.float32).copy() for name, a in zip(self.names, optimizer["m"], strict=True)}
        self.v = {name: np.asarray(a, dtype=np.float32).copy() for name, a in zip(self.names, optimizer["v"], strict=True)}
        self.steps = int(optimizer["steps"])
