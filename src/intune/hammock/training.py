"""The minibatch Adam loop with early stopping that trains Hammock (and, in the benchmark, the MLP baseline).

Owns: shuffling, minibatching, the optimizer, per-epoch validation loss, patience, and restoring the
best epoch's weights. It must not know about bins, trees or scikit-learn: it takes a torch module,
tensors, and a loss. Sharing it keeps "equal training budget" literal between Hammock and the MLP.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn


@dataclass
class TrainConfig:
    """Optimizer and stopping rule; one place so every model in the benchmark gets the same budget."""

    learning_rate: float = 3e-3  # Adam step size
    weight_decay: float = 0.0  # L2 penalty (Adam's, coupled)
    batch_size: int = 512  # rows per step
    max_epochs: int = 100  # passes over the training split
    patience: int = 8  # epochs without a better validation loss before stopping
    seed: int = 0  # shuffling and initialisation


@dataclass
class TrainResult:
    """What happened: the best epoch, its validation loss, the curve, the wall time."""

    best_epoch: int
    best_val_loss: float
    val_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def split_validation(y: np.ndarray, fraction: float, seed: int, stratify: bool) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, validation); stratified by class when asked, so small classes appear in both."""
    rng = np.random.default_rng(seed)
    n = len(y)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {fraction}")
    if not stratify:
        perm = rng.permutation(n)
        n_val = max(1, int(round(n * fraction)))
        return np.sort(perm[n_val:]), np.sort(perm[:n_val])
    val = []
    for cls in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == cls))
        take = int(round(len(rows) * fraction))
        if len(rows) >= 2:
            take = min(max(take, 1), len(rows) - 1)
        val.append(rows[:take])
    val_idx = np.sort(np.concatenate(val))
    train_idx = np.setdiff1d(np.arange(n), val_idx)
    return train_idx, val_idx


def _mean_loss(module: nn.Module, loss_fn: Callable, X: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    module.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(X), batch):
            out = module(X[start : start + batch])
            total += float(loss_fn(out, y[start : start + batch])) * len(out)
    module.train()
    return total / max(len(X), 1)


def train(
    module: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    X_train: torch.Tensor,
    y_train: torch.Tensor,
    X_val: torch.Tensor,
    y_val: torch.Tensor,
    config: TrainConfig,
) -> TrainResult:
    """Train in place; on return ``module`` holds the weights of the epoch with the lowest validation loss.

    Epoch 0 is the initial weights, so a model initialised from a fitted GBDT never ends worse on the
    validation split than where it started.
    """
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.Adam(module.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    eval_batch = max(config.batch_size, 4096)
    best_loss = _mean_loss(module, loss_fn, X_val, y_val, eval_batch)
    best_state = copy.deepcopy(module.state_dict())
    best_epoch, losses, waited = 0, [best_loss], 0
    module.train()
    for epoch in range(1, config.max_epochs + 1):
        order = torch.randperm(len(X_train), generator=gen)
        for start in range(0, len(order), config.batch_size):
            rows = order[start : start + config.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(module(X_train[rows]), y_train[rows])
            loss.backward()
            opt.step()
        val_loss = _mean_loss(module, loss_fn, X_val, y_val, eval_batch)
        losses.append(val_loss)
        if val_loss < best_loss - 1e-6 * abs(best_loss):
            best_loss, best_epoch, waited = val_loss, epoch, 0
            best_state = copy.deepcopy(module.state_dict())
        else:
            waited += 1
            if waited >= config.patience:
                break
    module.load_state_dict(best_state)
    module.eval()
    return TrainResult(best_epoch, best_loss, losses, time.perf_counter() - started)
