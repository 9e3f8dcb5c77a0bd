"""The systems that ``intune bench real`` compares, each run in its own process and measured alike.

Owns one runner per system over the same Parquet row groups, the same read code (``read_group``:
pyarrow row group to numpy, as the engine's Parquet reader does) and the same UDF object, producing
batches of ``batch_rows``: the PyTorch ``DataLoader`` as users write it, ``torchdata.nodes``, tf.data
with AUTOTUNE, and the intune engine under a policy. Also the measurement (rows/s over a fixed number
of rows after warm-up, CPU use and peak memory of the process tree, the consumer's idle time).
Run as ``python -m intune.bench.real_systems SPEC.json OUT.json``; the parent (``intune.bench.real``)
starts one such process per system so that memory and CPU figures do not mix. It must not print
tables or decide which systems to run.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

Chunk = dict[str, np.ndarray]


# ---- the shared reader ---------------------------------------------------------------------------
def row_groups(files: list[str]) -> list[tuple[str, int]]:
    """Every (file, row group) of the data set, in order: the unit of parallel reading everywhere."""
    import pyarrow.parquet as pq

    return [(f, g) for f in files for g in range(pq.ParquetFile(f).metadata.num_row_groups)]


def read_group(path: str, group: int, fixed_width: bool = False) -> Chunk:
    """One row group as numpy columns (nulls: NaN in counts), as the engine's Parquet reader does.

    Strings become object arrays (None = missing), or with ``fixed_width`` numpy ``S`` arrays (empty =
    missing): the form to send across processes, since raw bytes travel through shared memory and
    pickles without per-string objects. Systems that hand raw rows to worker processes use it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path).read_row_group(group)
    out: Chunk = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if fixed_width and pa.types.is_string(column.type):
            values = column.fill_null("").cast(pa.binary()).to_numpy(zero_copy_only=False)
            out[name] = values.astype(bytes)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def slices(chunk: Chunk, rows: int) -> Iterator[Chunk]:
    n = len(next(iter(chunk.values())))
    for lo in range(0, n, rows):
        yield {k: v[lo : lo + rows] for k, v in chunk.items()}


# ---- process-tree accounting ---------------------------------------------------------------------
def tree_cpu_s() -> float:
    """CPU seconds of this process, its live descendants and its reaped children."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + reaped.ru_utime + reaped.ru_stime


def tree_rss_bytes() -> int:
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRss:
    """Samples the process tree's resident memory every ``period_s`` on a daemon thread."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True, name="peak-rss")
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes())
            self._stop.wait(period_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=2)
        return self.peak


def measure(batches: Iterator[Chunk], spec: dict[str, Any]) -> dict[str, Any]:
    """Rows/s over ``measure_rows`` rows after ``warmup_rows`` rows and ``warmup_s`` seconds."""
    latency = float(spec.get("model_latency_ms") or 0.0) / 1000.0
    peak = PeakRss()
    start = time.perf_counter()
    rows = 0
    while rows < spec["warmup_rows"] or time.perf_counter() - start < spec["warmup_s"]:
        rows += len(next(batches)["label"])
        if latency:
            time.sleep(latency)
    t0, cpu0 = time.perf_counter(), tree_cpu_s()
    measured = 0
    wait = 0.0
    while measured < spec["measure_rows"]:
        w0 = time.perf_counter()
        batch = next(batches)
        wait += time.perf_counter() - w0
        measured += len(batch["label"])
        if latency:
            time.sleep(latency)
    t1, cpu1 = time.perf_counter(), tree_cpu_s()
    elapsed = t1 - t0
    return {
        "rows": measured,
        "seconds": elapsed,
        "warmup_s": t0 - start,
        "rows_per_s": measured / elapsed,
        "cpu_s": cpu1 - cpu0,
        "cpu_util": (cpu1 - cpu0) / elapsed / spec["cpus"],
        "peak_rss_mb": peak.stop() / 2**20,
        "idle_pct": 100.0 * wait / elapsed if latency else None,
    }


def _forever(make: Callable[[], Any]) -> Iterator[Chunk]:
    """Batches over as many epochs as the measurement needs."""
    while True:
        yield from make()


# ---- the systems ---------------------------------------------------------------------------------
def run_dataloader(spec: dict[str, Any], udf: Any) -> dict[str, Any]:
    """An IterableDataset sharding row groups over workers; num_workers = CPUs, default prefetch."""
    import torch.utils.data as tud

    groups = row_groups(spec["files"])
    rows = spec["batch_rows"]

    class RowGroupDataset(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            for k, (path, group) in enumerate(groups):
                if k % workers == worker:
                    for piece in slices(read_group(path, group), rows):
                        yield udf(piece)

    workers = max(1, int(round(spec["cpus"])))
    loader = tud.DataLoader(RowGroupDataset(), batch_size=None, num_workers=workers)
    result = measure(_forever(lambda: loader), spec)
    result["config"] = {"num_workers": workers, "prefetch_factor": 2}
    return result


def run_torchdata(spec: dict[str, Any], udf: Any) -> dict[str, Any]:
    """torchdata.nodes: the reader in the main process -> ParallelMapper (processes) -> Prefetcher."""
    from torchdata import nodes

    groups = row_groups(spec["files"])
    workers = max(1, int(round(spec["cpus"])))
    rows = spec["batch_rows"]

    def raw_slices() -> Iterator[Chunk]:
        for path, group in groups:
            yield from slices(read_group(path, group, fixed_width=True), rows)

    def make() -> Any:
        node = nodes.IterableWrapper(raw_slices())
        node = nodes.ParallelMapper(
            node,
            map_fn=udf,
            num_workers=workers,
            method="process",
            in_order=True,
            multiprocessing_context="spawn",
        )
        node = nodes.Prefetcher(node, prefetch_factor=2)
        return nodes.Loader(node)

    result = measure(_forever(make), spec)
    result["config"] = {"num_workers": workers, "method": "process", "context": "spawn", "prefetch_factor": 2}
    return result


def run_tf_autotune(spec: dict[str, Any], udf: Any) -> dict[str, Any]:
    """tf.data: from_generator over the same reader, the UDF via tf.numpy_function, AUTOTUNE everywhere."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    groups = row_groups(spec["files"])
    rows = spec["batch_rows"]
    names = list(read_group(*groups[0]).keys())
    text = {n for n, v in read_group(*groups[0]).items() if v.dtype.kind == "O"}

    def generate():
        for path, group in groups:
            chunk = read_group(path, group)
            for piece in slices(chunk, rows):
                yield tuple(
                    np.where(np.equal(piece[n], None), b"", piece[n]).astype(bytes) if n in text else piece[n]
                    for n in names
                )

    first = read_group(*groups[0])
    signature = tuple(
        tf.TensorSpec([None], tf.string if n in text else tf.as_dtype(first[n].dtype)) for n in names
    )

    def apply_udf(*columns: np.ndarray):
        out = udf(dict(zip(names, columns, strict=True)))
        return out["dense"], out["sparse"], out["label"]

    @tf.autograph.experimental.do_not_convert
    def as_tf(*columns):
        return tuple(tf.numpy_function(apply_udf, list(columns), [tf.float32, tf.int64, tf.float32]))

    dataset = (
        tf.data.Dataset.from_generator(generate, output_signature=signature)
        .map(as_tf, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
        .repeat()
    )
    iterator = iter(dataset)

    def batches() -> Iterator[Chunk]:
        for dense, sparse, label in iterator:
            yield {"dense": dense.numpy(), "sparse": sparse.numpy(), "label": label.numpy()}

    result = measure(batches(), spec)
    chosen: dict[str, Any] = {}
    try:
        proto = tf.data.experimental.get_model_proto(iterator)
        for node in proto.nodes.values():
            params = {p.name: p.value for p in node.parameters if p.tunable}
            if params:
                chosen[node.name] = params
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        chosen["error"] = f"{type(exc).__name__}: {exc}"
    result["config"] = {"autotune_chosen": chosen}
    return result


def run_engine(spec: dict[str, Any], udf: Any) -> dict[str, Any]:
    """The intune engine (read -> udf in processes -> batch -> prefetch) under a tuner policy.

    The source is the shared reader (one thread is plenty: reading costs ~1/8 of the UDF), so every
    system reads with the same code; the engine's own ``from_parquet`` reader turns strings into
    object arrays, which cross to process workers pickled (about 4 us per row here).
    """
    from intune.pipeline import Pipeline
    from intune.tuner import tune

    groups = row_groups(spec["files"])
    rows = spec["batch_rows"]

    def raw_slices() -> Iterator[Chunk]:  # the shared reader, raw strings as fixed-width bytes
        for path, group in groups:
            yield from slices(read_group(path, group, fixed_width=True), rows)

    pipe = (
        Pipeline.from_iterable(raw_slices, name="read")
        .map(udf, name="udf", mode="process")
        .batch(spec["batch_rows"])
        .prefetch(depth=4)
    )
    fixed = fixed_allocation(spec["policy"])
    if fixed is not None:  # a hand-set allocation, no tuner: what the engine does when allowed
        for name, value in fixed.items():
            pipe.set_knob(name, value)
        tuner = None
        source: Any = pipe
    else:
        tuner = source = tune(pipe, policy=spec["policy"], tick_s=spec.get("tick_s", 1.0))
    try:
        result = measure(_forever(lambda: source), spec)
        metrics = pipe.metrics()
        result["config"] = {
            "knobs": {name: knob.value for name, knob in pipe.knobs.items()},
            "stage_cpu_s": {name: s.cpu_s for name, s in metrics.stages.items()},
            "tuner_errors": sum(1 for row in tuner.history() if row.get("error")) if tuner else 0,
        }
        if tuner is not None:
            result["config"]["knob_trace"] = knob_trace(tuner.history())
            if spec.get("history"):
                tuner.save(spec["history"])
    finally:
        (tuner or pipe).close()
    return result


def knob_trace(history: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Each CPU knob's value per tick (what the policy did over the run, for the report)."""
    trace: dict[str, list[int]] = {}
    for row in history:
        for name, value in row.get("knobs", {}).items():
            if name.endswith(".workers"):
                trace.setdefault(name, []).append(int(value))
    return trace


def fixed_allocation(policy: str) -> dict[str, int] | None:
    """``fixed:udf.workers=2+prefetch.buffer_mb=64`` as knob values; None for a policy name."""
    if not policy.startswith("fixed:"):
        return None
    values = {}
    for part in policy[len("fixed:") :].split("+"):
        name, _, value = part.partition("=")
        if not value.strip().isdigit():
            raise ValueError(f"fixed allocation {policy!r}: {part!r} is not knob=integer")
        values[name.strip()] = int(value)
    return values


RUNNERS: dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]] = {
    "pytorch-dataloader": run_dataloader,
    "torchdata-nodes": run_torchdata,
    "tf.data": run_tf_autotune,
    "intune-engine": run_engine,
}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    from intune.dlrm.workload import make_udf

    udf = make_udf(spec["udf"], [Path(f) for f in spec["files"]], table_size=spec["table_size"])
    result = RUNNERS[spec["system"]](spec, udf)
    Path(argv[1]).write_text(json.dumps(result, default=float))
    return 0


def _end_process_tree(code: int) -> None:
    """Exit without waiting on other libraries' finalizers (torchdata's queues can block exit forever)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        exit_code = main(sys.argv[1:])
    except BaseException:  # noqa: BLE001 - reported on stderr for the parent, then the tree ends
        import traceback

        traceback.print_exc()
        exit_code = 1
    _end_process_tree(exit_code)
