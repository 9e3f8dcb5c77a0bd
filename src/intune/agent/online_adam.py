"""Adam for online fine-tuning, on plain tensors, without ``torch.optim``.

Why not ``torch.optim.Adam``: building any ``torch.optim`` optimizer imports ``torch._dynamo`` the
first time, about 3 s of CPU on this 2-core machine. Live, that lands on the tuner thread at the first
gradient step, in the middle of the user's job, and alone costs the tuner its CPU budget of a minute.
This is Kingma & Ba's update with bias correction, as ``torch.optim.Adam`` computes it with default
options. It must not know about networks or losses: it updates the parameters it was given from their
``.grad``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch


class OnlineAdam:
    """``step()`` moves each parameter by Adam's bias-corrected first over second moment of its gradient."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        if lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = lr, betas, eps
        self.steps = 0
        self._m = [torch.zeros_like(p) for p in self.params]
        self._v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        b1, b2 = self.betas
        correction1 = 1 - b1**self.steps
        root_correction2 = math.sqrt(1 - b2**self.steps)
        for p, m, v in zip(self.params, self._m, self._v, strict=True):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, (v.sqrt() / root_correction2).add_(self.eps), value=-self.lr / correction1)

    def state_dict(self) -> dict[str, Any]:
        """The step count and each parameter's moments as numpy arrays (for a checkpoint)."""
        return {
            "steps": self.steps,
            "m": [m.detach().cpu().numpy().copy() for m in self._m],
            "v": [v.detach().cpu().numpy().copy() for v in self._v],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict()`` of an optimizer over parameters of the same shapes."""
        if len(state["m"]) != len(self._m) or len(state["v"]) != len(self._v):
            raise ValueError(f"OnlineAdam state: {len(state['m'])} parameters saved, {len(self._m)} here")
        for mine, saved in zip([*self._m, *self._v], [*state["m"], *state["v"]], strict=True):
            if tuple(mine.shape) != tuple(np.shape(saved)):
                raise ValueError(f"OnlineAdam state: a moment of shape {np.shape(saved)}, the parameter's is {tuple(mine.shape)}")
            mine.copy_(torch.from_numpy(np.asarray(saved, dtype=np.float32)))
        self.steps = int(state["steps"])
