"""What ``intune bench dataloader`` runs: the per-row dataset, and one loader run measured in its own process.

Owns the benchmark's dataset, ``CriteoRows``: generated Criteo-format rows stored as memory-mapped
``.npy`` columns (dense counts as float32 with NaN for missing, categorical IDs as 8-hex-digit bytes,
labels), pickled as its directory and reopened in each worker, whose ``__getitem__`` does per-row,
GIL-bound work in Python: log transforms and bucketing of the counts, two hashes of each parsed hex ID,
and hashed feature crosses; and ``CriteoStream``, the same rows as an ``IterableDataset`` that each
worker divides by ``get_worker_info()`` (a contiguous block each, as files are split among workers),
with the same per-row work. Also one run, in a fresh process per run so that memory and CPU figures do
not mix: ``intune.DataLoader`` or ``torch.utils.data.DataLoader`` at a ``num_workers``, built from a
cold start, timed over its first whole epoch (construction, worker start and tuning included) and
then at steady state over a fixed number of rows, with the process tree's peak PSS; and the CPU cost
of ``__getitem__`` and ``collate`` per row in one process, from which the parent computes the CPU
bound. Run as ``python -m intune.bench.dataloader_systems SPEC.json OUT.json``. It must not print
tables or decide which runs to make.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

MASK = (1 << 64) - 1
BOUNDS = tuple(0.5 * k for k in range(1, 40))
"""Bucket boundaries of the log counts."""
CROSSES = ((0, 1), (4, 8), (5, 13), (16, 19), (22, 25))
"""Pairs of categorical features (0-based) whose hashed IDs are crossed."""
TABLE_SIZE = 100_000


def _mix(x: int) -> int:
    """A 64-bit integer mix in pure Python, row by row as user code is written (not intune.hashing)."""
    x = (x * 0x9E3779B97F4A7C15) & MASK
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    return x ^ (x >> 32)


class CriteoRows:
    """Criteo-format rows, one ``__getitem__`` per row: a map-style dataset as DLRM users write them."""

    def __init__(self, root: str | os.PathLike[str], table_size: int = TABLE_SIZE) -> None:
        self.root = str(root)
        self.table_size = table_size
        self._open()

    def _open(self) -> None:
        root = Path(self.root)
        self.dense = np.load(root / "dense.npy", mmap_mode="r")
        self.ids = np.load(root / "ids.npy", mmap_mode="r")
        self.label = np.load(root / "label.npy", mmap_mode="r")
        self.salts = [(f + 1) * 0x51ED270B for f in range(self.ids.shape[1])]

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "table_size": self.table_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, Any]:
        dense, buckets, sparse = row_features(
            self.dense[i].tolist(), self.ids[i].tolist(), self.salts, self.table_size
        )
        return {
            "dense": np.array(dense, dtype=np.float32),
            "buckets": np.array(buckets, dtype=np.int64),
            "sparse": np.array(sparse, dtype=np.int64),
            "label": float(self.label[i]),
        }


class CriteoStream(IterableDataset):
    """The same rows and per-row work as an iterable dataset: each worker reads its own contiguous
    block, chosen by ``get_worker_info()``, in file order (no shuffle)."""

    def __init__(self, root: str | os.PathLike[str], table_size: int = TABLE_SIZE) -> None:
        self.rows = CriteoRows(root, table_size)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Any:
        info = get_worker_info()
        n = len(self.rows)
        part, parts = (info.id, info.num_workers) if info is not None else (0, 1)
        rows = self.rows
        for i in range(n * part // parts, n * (part + 1) // parts):
            yield rows[i]


def row_features(
    counts: list[float], ids: list[bytes], salts: list[int], table_size: int
) -> tuple[list[float], list[int], list[int]]:
    """One row's features: log counts and their buckets, two hashes per ID, hashed crosses."""
    buckets_of, log1p, mix, rows = bisect.bisect_right, math.log1p, _mix, table_size - 1
    dense, buckets = [], []
    for v in counts:
        x = log1p(v) if v > 0.0 else 0.0  # missing (NaN) and negative counts are 0
        dense.append(x)
        buckets.append(buckets_of(BOUNDS, x))
    sparse: list[int] = []
    for salt, text in zip(salts, ids, strict=True):
        if not text:  # missing
            sparse += (0, 0)
            continue
        h = mix(int(text, 16) ^ salt)
        sparse += (1 + h % rows, 1 + (h >> 20) % rows)
    for a, b in CROSSES:
        sparse.append(1 + mix(sparse[2 * a] * 1_000_003 + sparse[2 * b]) % rows)
    return dense, buckets, sparse


class RowFunction:
    """``CriteoRows.__getitem__``'s work as a row -> row function, for ``Pipeline.map_rows``."""

    def __init__(self, salts: list[int], table_size: int = TABLE_SIZE) -> None:
        self.salts = salts
        self.table_size = table_size

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        dense, buckets, sparse = row_features(
            row["dense"].tolist(), row["ids"].tolist(), self.salts, self.table_size
        )
        return {
            "dense": np.array(dense, dtype=np.float32),
            "buckets": np.array(buckets, dtype=np.int64),
            "sparse": np.array(sparse, dtype=np.int64),
            "label": float(row["label"]),
        }


def prepare_data(rows: int, root: str | os.PathLike[str], seed: int = 0) -> Path:
    """The generated rows as ``.npy`` columns under ``root`` (made once; a marker says complete)."""
    from intune.dlrm import data

    out = Path(root) / f"criteo-rows-{rows}-seed{seed}"
    if (out / "COMPLETE").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    dense, ids, label = [], [], []
    for table in data.iter_chunks(rows, seed=seed):
        dense.append(np.stack([_floats(table.column(c)) for c in data.DENSE_COLUMNS], axis=1))
        ids.append(np.stack([_hex(table.column(c)) for c in data.SPARSE_COLUMNS], axis=1))
        label.append(table.column(data.LABEL).to_numpy().astype(np.int8))
    np.save(out / "dense.npy", np.concatenate(dense))
    np.save(out / "ids.npy", np.concatenate(ids))
    np.save(out / "label.npy", np.concatenate(label))
    (out / "COMPLETE").write_text(f"rows={rows} seed={seed}\n")
    return out


def _floats(column: Any) -> np.ndarray:
    return column.to_numpy(zero_copy_only=False).astype(np.float32)  # nulls come as NaN


def _hex(column: Any) -> np.ndarray:
    values = column.to_pylist()
    return np.array([v.encode() if v else b"" for v in values], dtype="S8")


# ---- measurement ---------------------------------------------------------------------------------
def make_loader(spec: dict[str, Any], dataset: CriteoRows | CriteoStream) -> Any:
    """The spec's loader, iterated once per epoch: ``intune`` (``intune.DataLoader``, its policy),
    ``torch`` (``num_workers``), or one of ``EXTRA_LOADERS`` (the same work through other APIs); a
    system ending in ``-iterable`` reads ``CriteoStream`` (no shuffle: the stream's order)."""
    system, iterable = _system(spec)
    common: dict[str, Any] = {"batch_size": spec["batch_size"]}
    if not iterable:
        common.update(shuffle=True, generator=_generator(spec["seed"]))
    if system == "intune":
        import intune

        return intune.DataLoader(
            dataset, num_workers=spec.get("num_workers", "auto"), tune=spec.get("tune", "intune"), **common
        )
    if spec["system"] in EXTRA_LOADERS:
        return EXTRA_LOADERS[spec["system"]](spec, dataset)
    from torch.utils.data import DataLoader

    workers = int(spec["num_workers"])
    return DataLoader(dataset, num_workers=workers, persistent_workers=workers > 0, **common)


# ---- the same work through other APIs (``intune bench dataloader --extra``) ----------------------------
class Tuned:
    """A pipeline (or its ``tf.data`` view) under a tuner: iterated once per epoch, closed at the end."""

    def __init__(self, pipe: Any, batches: Any, policy: str | None) -> None:
        import intune

        self.pipe = pipe
        self.batches = batches
        self.tuner = intune.tune(pipe, policy=policy).start() if policy else None
        self.num_workers = pipe.knobs["map_rows.workers"].value

    def __iter__(self) -> Any:
        return iter(self.batches)

    def close(self) -> None:
        if self.tuner is not None:
            self.tuner.stop()
        self.pipe.close()


def shuffled_chunks(dataset: CriteoRows, rows: int, seed: int) -> Any:
    """Every epoch, the dataset's columns in a new random order, ``rows`` rows a chunk (a gather from
    the memory-mapped columns, in the pipeline's reading thread)."""
    epoch = [0]

    def chunks() -> Any:
        order = np.random.default_rng([seed, epoch[0]]).permutation(len(dataset))
        epoch[0] += 1
        for lo in range(0, len(order), rows):
            take = np.sort(order[lo : lo + rows])
            yield {"dense": dataset.dense[take], "ids": dataset.ids[take], "label": dataset.label[take]}

    return chunks


def map_rows_pipeline(spec: dict[str, Any], dataset: CriteoRows) -> Any:
    """``Pipeline.map_rows`` on the same per-row work: shuffled chunks -> rows in process workers -> batches."""
    from intune.monitor import available_cpus
    from intune.pipeline import Pipeline

    size = spec["batch_size"]
    workers = max(1, round(available_cpus()))
    return (
        Pipeline.from_iterable(shuffled_chunks(dataset, size, spec["seed"]))
        .map_rows(RowFunction(dataset.salts, dataset.table_size), mode="process", workers=workers)
        .batch(size)
        .prefetch(depth=2)
    )


def make_map_rows(spec: dict[str, Any], dataset: CriteoRows) -> Tuned:
    pipe = map_rows_pipeline(spec, dataset)
    return Tuned(pipe, pipe, spec.get("tune", "intune"))


def make_to_tf_dataset(spec: dict[str, Any], dataset: CriteoRows) -> Tuned:
    pipe = map_rows_pipeline(spec, dataset)
    return Tuned(pipe, pipe.to_tf_dataset(close_on_exit=False), spec.get("tune", "intune"))


def make_tf_data(spec: dict[str, Any], dataset: CriteoRows) -> Any:
    """A hand-written tf.data pipeline of the same work: shuffled indices, batched, each batch's rows
    fetched by the dataset's ``__getitem__`` in ``tf.numpy_function`` (parallel calls, AUTOTUNE)."""
    import tensorflow as tf

    def fetch(indices: np.ndarray) -> tuple[np.ndarray, ...]:
        rows = [dataset[int(i)] for i in indices]
        return tuple(np.stack([r[k] for r in rows]) for k in ("dense", "buckets", "sparse")) + (
            np.array([r["label"] for r in rows], dtype=np.float64),
        )

    def as_dict(indices: Any) -> dict[str, Any]:
        dense, buckets, sparse, label = tf.numpy_function(
            fetch, [indices], (tf.float32, tf.int64, tf.int64, tf.float64)
        )
        return {"dense": dense, "buckets": buckets, "sparse": sparse, "label": label}

    return (
        tf.data.Dataset.range(len(dataset))
        .shuffle(len(dataset), seed=spec["seed"], reshuffle_each_iteration=True)
        .batch(spec["batch_size"])
        .map(as_dict, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def _system(spec: dict[str, Any]) -> tuple[str, bool]:
    """The spec's loader (``intune``, ``torch``, ...) and whether it reads the iterable dataset."""
    system = spec["system"]
    return system.removesuffix(ITERABLE), system.endswith(ITERABLE)


ITERABLE = "-iterable"
"""The suffix of a system that reads ``CriteoStream`` (``intune-iterable``, ``torch-iterable``)."""

IMPORTS = {
    "intune": ("torch", "intune.dataloader"),
    "intune-iterable": ("torch", "intune.dataloader"),
    "map_rows": ("torch", "intune.pipeline"),
    "to_tf_dataset": ("torch", "intune.pipeline", "tensorflow"),
    "tf.data": ("torch", "tensorflow"),
}
"""What each system's process imports before the clock starts (torch for all: the dataset's collate)."""
EXTRA_LOADERS = {"map_rows": make_map_rows, "to_tf_dataset": make_to_tf_dataset, "tf.data": make_tf_data}


def _generator(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed)


def measure(spec: dict[str, Any], dataset: CriteoRows) -> dict[str, Any]:
    """From just before the loader is built: the first epoch's wall time, then the steady rate over
    ``measure_rows`` rows (later epochs, back to back), CPU use and the tree's peak PSS."""
    from intune.bench.real_systems import PeakMemory, tree_cpu_s

    memory = PeakMemory()
    started = time.perf_counter()
    loader = make_loader(spec, dataset)
    rows = 0
    first_batch_s = None
    for batch in loader:
        rows += len(batch["label"])
        first_batch_s = first_batch_s or time.perf_counter() - started
    epoch_s = time.perf_counter() - started
    window = (time.perf_counter(), tree_cpu_s())
    measured = 0
    while measured < spec["measure_rows"]:
        for batch in loader:
            measured += len(batch["label"])
            if measured >= spec["measure_rows"]:
                break
    elapsed, cpu_s = time.perf_counter() - window[0], tree_cpu_s() - window[1]
    peak = memory.stop()
    result = {
        "epoch_rows": rows,
        "epoch_s": epoch_s,
        "first_batch_s": first_batch_s,
        "rows_per_s": measured / elapsed,
        "measured_rows": measured,
        "cpu_util": cpu_s / elapsed / spec["cpus"],
        "peak_pss_mb": peak["pss"] / 2**20,
        "peak_uss_mb": peak["uss"] / 2**20,
        "config": _config(loader),
    }
    _close(loader)
    return result


def _config(loader: Any) -> dict[str, Any]:
    tuner = getattr(loader, "tuner", None)
    workers = getattr(loader, "num_workers", None)
    if tuner is None:
        return {"num_workers": workers}
    knob = "fetch.workers" if "fetch.workers" in tuner.knobs else "map_rows.workers"
    trace = [row["knobs"].get(knob) for row in tuner.history()]
    return {"num_workers": trace[-1] if trace else workers, "workers_per_tick": trace}


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def costs(spec: dict[str, Any], dataset: CriteoRows) -> dict[str, Any]:
    """CPU seconds per row of ``__getitem__`` and of ``default_collate``, in this one process, after
    a warm-up batch, over ``cost_batches`` batches of random indices (``time.process_time``)."""
    from torch.utils.data import default_collate

    rng = np.random.default_rng(spec["seed"])
    size = spec["batch_size"]
    fetch = collate = 0.0
    rows = 0
    for b in range(1 + spec["cost_batches"]):
        indices = rng.integers(0, len(dataset), size).tolist()
        c0 = time.process_time()
        samples = [dataset[i] for i in indices]
        c1 = time.process_time()
        default_collate(samples)
        c2 = time.process_time()
        if b:  # the first batch warms up imports and caches
            fetch, collate, rows = fetch + c1 - c0, collate + c2 - c1, rows + size
    return {
        "getitem_us_per_row": fetch / rows * 1e6,
        "collate_us_per_row": collate / rows * 1e6,
        "rows": rows,
    }


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    import importlib

    # a training script has its libraries loaded before it builds a loader: not the loader's time
    for module in IMPORTS.get(spec["system"], ("torch",)):
        importlib.import_module(module)
    dataset = CriteoStream(spec["data"]) if _system(spec)[1] else CriteoRows(spec["data"])
    result = costs(spec, dataset) if spec["system"] == "costs" else measure(spec, dataset)
    Path(argv[1]).write_text(json.dumps(result, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
