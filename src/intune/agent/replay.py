"""Replay buffer of padded branching transitions, and the n-step accumulator that feeds it.

A transition is (rows, valid knobs, actions per knob, n-step return, discount to bootstrap with,
next rows, next valid knobs, next action mask). Ring storage in numpy; sampling returns torch
tensors. It must not compute targets or know about the network.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    rows: torch.Tensor  # [B, K, F]
    valid: torch.Tensor  # [B, K] bool
    actions: torch.Tensor  # [B, K] int64
    returns: torch.Tensor  # [B] n-step discounted reward
    discount: torch.Tensor  # [B] gamma**n, or 0 after a terminal tick
    next_rows: torch.Tensor
    next_valid: torch.Tensor
    next_mask: torch.Tensor  # [B, K, A] bool: actions the safety layer allows next


class ReplayBuffer:
    def __init__(self, capacity: int, max_knobs: int, n_features: int, n_actions: int) -> None:
        self.capacity = capacity
        self.rows = np.zeros((capacity, max_knobs, n_features), dtype=np.float32)
        self.valid = np.zeros((capacity, max_knobs), dtype=bool)
        self.actions = np.zeros((capacity, max_knobs), dtype=np.int64)
        self.returns = np.zeros(capacity, dtype=np.float32)
        self.discount = np.zeros(capacity, dtype=np.float32)
        self.next_rows = np.zeros_like(self.rows)
        self.next_valid = np.zeros_like(self.valid)
        self.next_mask = np.zeros((capacity, max_knobs, n_actions), dtype=bool)
        self.size = 0
        self._pos = 0

    def add(
        self,
        rows: np.ndarray,
        valid: np.ndarray,
        actions: np.ndarray,
        ret: float,
        discount: float,
        next_rows: np.ndarray,
        next_valid: np.ndarray,
        next_mask: np.ndarray,
    ) -> None:
        i = self._pos
        self.rows[i], self.valid[i], self.actions[i] = rows, valid, actions
        self.returns[i], self.discount[i] = ret, discount
        self.next_rows[i], self.next_valid[i], self.next_mask[i] = next_rows, next_valid, next_mask
        self._pos = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> Batch:
        idx = rng.integers(0, self.size, size=batch_size)
        t = torch.from_numpy
        return Batch(
            t(self.rows[idx]),
            t(self.valid[idx]),
            t(self.actions[idx]),
            t(self.returns[idx]),
            t(self.discount[idx]),
            t(self.next_rows[idx]),
            t(self.next_valid[idx]),
            t(self.next_mask[idx]),
        )


class NStepAccumulator:
    """Per pipeline: turns one-step transitions into n-step ones (cut short at a terminal tick)."""

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.pending: deque[tuple[np.ndarray, np.ndarray, np.ndarray, float]] = deque()

    def push(
        self,
        buffer: ReplayBuffer,
        rows: np.ndarray,
        valid: np.ndarray,
        actions: np.ndarray,
        reward: float,
        next_rows: np.ndarray,
        next_valid: np.ndarray,
        next_mask: np.ndarray,
        terminal: bool,
    ) -> None:
        """Add this tick's transition; emit every n-step transition that is now complete."""
        self.pending.append((rows, valid, actions, reward))
        if terminal:
            while self.pending:
                self._emit(buffer, next_rows, next_valid, next_mask, terminal=True)
        elif len(self.pending) == self.n:
            self._emit(buffer, next_rows, next_valid, next_mask, terminal=False)

    def clear(self) -> None:
        """Drop unfinished transitions (the pipeline was replaced, not ended)."""
        self.pending.clear()

    def _emit(self, buffer, next_rows, next_valid, next_mask, terminal: bool) -> None:
        ret = sum(self.gamma**j * step[3] for j, step in enumerate(self.pending))
        discount = 0.0 if terminal else self.gamma ** len(self.pending)
        rows, valid, actions, _ = self.pending.popleft()
        buffer.add(rows, valid, actions, ret, discount, next_rows, next_valid, next_mask)
