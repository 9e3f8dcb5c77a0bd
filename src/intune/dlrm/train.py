"""The training loop: DLRM (or Hammock) on batches from the engine, with the trainer's idle time.

Owns one loop that pulls batches (``dense``, ``sparse``, ``label``, as the UDFs of
``intune.dlrm.pipelines`` produce them) as torch tensors, steps the model, and measures how long the
trainer waited for data versus computed: the figure that says whether the input pipeline keeps up.
Also the held-out evaluation (AUC and log-loss). It must not build pipelines or choose knob values.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from intune.dlrm.model import DLRM
from intune.integrations.torch import TorchBatches

HAMMOCK_MODULE = "intune.hammock"


@dataclass
class TrainResult:
    """What a training run did and how well the input pipeline fed it."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0  # wall time of the loop
    wait_s: float = 0.0  # time the trainer waited for the next batch (idle)
    compute_s: float = 0.0  # time in forward / backward / optimizer (and simulated model latency)
    loss: float = float("nan")  # mean training loss over the last 50 steps
    auc: float | None = None  # held-out
    logloss: float | None = None  # held-out
    eval_rows: int = 0
    model: nn.Module | None = field(default=None, repr=False)

    @property
    def idle_pct(self) -> float:
        total = self.wait_s + self.compute_s
        return 100.0 * self.wait_s / total if total > 0 else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.rows_per_s, 1),
            "idle_pct": round(self.idle_pct, 2),
            "loss": self.loss,
            "auc": self.auc,
            "logloss": self.logloss,
            "eval_rows": self.eval_rows,
        }


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula, ties given average ranks."""
    from scipy.stats import rankdata

    labels = np.asarray(labels).astype(bool)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        raise ValueError(f"AUC needs both classes; got {positives} positives and {negatives} negatives")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1 - eps)
    y = np.asarray(labels, dtype=np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def build_model(
    model: str | nn.Module, table_sizes: Sequence[int] | None, num_dense: int = 13, **kwargs: Any
) -> nn.Module:
    """A ready module: ``"dlrm"`` (needs the table sizes), ``"hammock"``, or a module passed through."""
    if isinstance(model, nn.Module):
        return model
    if model == "dlrm":
        if table_sizes is None:
            raise ValueError("train: model='dlrm' needs table_sizes (the UDF's .sparse_sizes)")
        return DLRM(table_sizes, num_dense=num_dense, **kwargs)
    if model == "hammock":
        return _hammock_model(table_sizes, num_dense, **kwargs)
    raise ValueError(f"train: unknown model {model!r}; use 'dlrm', 'hammock' or an nn.Module")


def _hammock_model(table_sizes: Sequence[int] | None, num_dense: int, **kwargs: Any) -> nn.Module:
    try:
        hammock = importlib.import_module(HAMMOCK_MODULE)
    except ImportError as exc:
        raise NotImplementedError(
            f"train: model='hammock' needs {HAMMOCK_MODULE}, which is missing ({exc})"
        ) from exc
    factory = getattr(hammock, "HammockModule", None) or getattr(hammock, "hammock_module", None)
    if factory is None:
        raise NotImplementedError(
            f"train: model='hammock' needs a torch module over bucketized bin indices from {HAMMOCK_MODULE} "
            "(HammockModule(table_sizes, ...) with forward(dense, sparse) -> logits); it is not there yet"
        )
    return factory(table_sizes=table_sizes, num_dense=num_dense, **kwargs)


def _optimizers(model: nn.Module, lr: float) -> list[torch.optim.Optimizer]:
    if hasattr(model, "optimizers"):
        return list(model.optimizers(lr=lr))
    return [torch.optim.Adam(model.parameters(), lr=lr)]


def _forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return model(batch["dense"], batch["sparse"])


def train(
    batches: Iterable[Mapping[str, np.ndarray]],
    model: str | nn.Module = "dlrm",
    table_sizes: Sequence[int] | None = None,
    max_steps: int | None = None,
    max_seconds: float | None = None,
    eval_batches: Iterable[Mapping[str, np.ndarray]] | None = None,
    device: str = "cpu",
    lr: float = 1e-3,
    model_latency_s: float = 0.0,
    on_step: Callable[[TrainResult], None] | None = None,
    seed: int = 0,
    **model_kwargs: Any,
) -> TrainResult:
    """Train on ``batches`` until they end, ``max_steps`` or ``max_seconds``; evaluate on ``eval_batches``.

    ``model_latency_s`` adds a simulated step (sleep) on top of the real one, to model a heavier
    trainer; it counts as compute time. ``on_step`` is called after each step with the running result.
    """
    torch.manual_seed(seed)
    dev = torch.device(device)
    result = TrainResult()
    net: nn.Module | None = None
    optimizers: list[torch.optim.Optimizer] = []
    recent: list[float] = []
    source = iter(TorchBatches(batches, device=dev))
    start = time.perf_counter()
    while max_steps is None or result.steps < max_steps:
        if max_seconds is not None and time.perf_counter() - start >= max_seconds:
            break
        t0 = time.perf_counter()
        try:
            batch = next(source)
        except StopIteration:
            break
        t1 = time.perf_counter()
        if net is None:
            net = build_model(model, table_sizes, num_dense=int(batch["dense"].shape[1]), **model_kwargs).to(
                dev
            )
            optimizers = _optimizers(net, lr)
            net.train()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss = nn.functional.binary_cross_entropy_with_logits(_forward(net, batch), batch["label"].float())
        loss.backward()
        for opt in optimizers:
            opt.step()
        recent.append(float(loss.detach()))
        if model_latency_s > 0:
            time.sleep(model_latency_s)
        t2 = time.perf_counter()
        result.wait_s += t1 - t0
        result.compute_s += t2 - t1
        result.steps += 1
        result.rows += int(batch["label"].shape[0])
        result.seconds = t2 - start
        del recent[:-50]
        result.loss = sum(recent) / len(recent)
        if on_step is not None:
            on_step(result)
    result.seconds = time.perf_counter() - start
    result.model = net
    if eval_batches is not None and net is not None:
        result.auc, result.logloss, result.eval_rows = evaluate(net, eval_batches, device)
    return result


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[Mapping[str, np.ndarray]], device: str = "cpu"
) -> tuple[float, float, int]:
    """AUC, log-loss and row count of ``model`` on held-out batches."""
    was_training = model.training
    model.eval()
    labels: list[np.ndarray] = []
    scores: list[np.ndarray] = []
    for batch in TorchBatches(batches, device=device):
        scores.append(torch.sigmoid(_forward(model, batch)).cpu().numpy())
        labels.append(batch["label"].cpu().numpy())
    model.train(was_training)
    if not labels:
        raise ValueError("evaluate: the held-out set is empty")
    y, p = np.concatenate(labels), np.concatenate(scores)
    return roc_auc(y, p), log_loss(y, p), len(y)


def heldout_batches(
    paths: Sequence[Any],
    udf: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
    batch_rows: int = 8192,
    max_rows: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """Preprocessed held-out batches read sequentially (outside any tuned pipeline)."""
    from intune.dlrm.data import read_chunks

    out: list[dict[str, np.ndarray]] = []
    rows = 0
    for chunk in read_chunks(paths, batch_rows):
        out.append(udf(chunk))
        rows += len(out[-1]["label"])
        if max_rows is not None and rows >= max_rows:
            break
    return out
