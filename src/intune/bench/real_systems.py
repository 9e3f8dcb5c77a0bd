"""The systems that ``intune bench real`` compares, each run in its own process and measured alike.

Owns one starter per system over the same Parquet row groups, the same read code (``read_group`` with
``fixed_width``: pyarrow row group to numpy, strings as fixed-width bytes) and the same UDF object,
producing the same batches of ``batch_rows``: the PyTorch ``DataLoader`` (persistent workers),
``torchdata.nodes``, tf.data with AUTOTUNE, and the intune engine under a policy or a fixed
allocation. Also the measurement, done the same way for every system: the time to the first batch
and to ``job_rows`` rows from just before the pipeline is built, the steady rate over a fixed number
of rows after warm-up, CPU use and peak PSS/USS of the process tree (``tree_memory``), the
consumer's idle time; the stages' CPU cost per row in a worker process (``stage_costs``), from which
the parent computes the CPU bound; and one epoch saved to a file (``collect``) for the fairness test.
Run as ``python -m intune.bench.real_systems SPEC.json OUT.json``; the parent (``intune.bench.real``)
starts one such process per run so that memory and CPU figures do not mix. It must not print tables
or decide which systems to run.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
    pickles without per-string objects. Every benchmarked system reads with ``fixed_width`` (through
    ``epoch_slices`` or ``RowGroupSource``), so that none converts strings where the others do not.
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
    """Consecutive pieces of ``rows`` rows (the last may be shorter), as views: a row group's batches."""
    n = len(next(iter(chunk.values())))
    for lo in range(0, n, rows):
        yield {k: v[lo : lo + rows] for k, v in chunk.items()}


def epoch_slices(groups: list[tuple[str, int]], rows: int) -> Iterator[Chunk]:
    """One epoch of the shared reader: every row group in order, fixed-width, cut into ``rows`` slices."""
    for path, group in groups:
        yield from slices(read_group(path, group, fixed_width=True), rows)


class Epochs:
    """A re-iterable epoch: each ``iter()`` starts a fresh ``epoch_slices`` (what torchdata resets need)."""

    def __init__(self, groups: list[tuple[str, int]], rows: int) -> None:
        self.groups, self.rows = groups, rows

    def __iter__(self) -> Iterator[Chunk]:
        return epoch_slices(self.groups, self.rows)


def row_group_source(files: list[str], rows: int) -> Any:
    """The shared reader as an engine source: a row group per unit, so ``read.workers`` read in parallel.

    ``Pipeline.from_iterable`` would serialise the reader (one stream, ``read.workers`` fixed at 1);
    this keeps the engine's parallel read stage, as ``from_parquet`` has, while reading with the
    same code as every other system."""
    from intune.pipeline.chunks import Origin, Segment
    from intune.pipeline.sources import Source, split_rows

    class RowGroupSource(Source):
        name = "read"

        def __init__(self) -> None:
            self.groups = row_groups(files)

        def units(self) -> int:
            return len(self.groups)

        def read_unit(self, unit: int) -> list[Any]:
            chunk = read_group(*self.groups[unit], fixed_width=True)
            return split_rows(chunk, lambda lo, hi: Origin((Segment(self, unit, lo, hi),)), rows)

        def describe(self, unit: int, lo: int, hi: int) -> str:
            path, group = self.groups[unit]
            return f"{path} row group {group} rows {lo}-{hi - 1}"

    return RowGroupSource()


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


def tree_memory(root: Any = None) -> dict[str, int]:
    """PSS and USS in bytes, each summed over ``root`` (default: this process) and its live descendants.

    PSS charges every resident page to the processes that map it in equal parts, so a page that
    forked workers share with their parent counts once over the tree, as in spawned workers; summing
    RSS counted it once per process and so charged forked workers for memory they share. USS is the
    pages no other process maps: summed, a floor that leaves shared pages out. Every system is
    measured by this one function. A process that ends while being read is left out.
    """
    import psutil

    root = psutil.Process() if root is None else root
    total = {"pss": 0, "uss": 0}
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        total["pss"] += info.pss
        total["uss"] += info.uss
    return total


class PeakMemory:
    """Samples ``tree_memory`` every ``period_s`` on a daemon thread and keeps each figure's peak.

    Half a second between samples: reading every process's page map costs milliseconds, taken from
    the CPUs the systems share, and memory moves slowly next to it."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.peak = {"pss": 0, "uss": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True, name="peak-memory")
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(period_s)

    def _sample(self) -> None:
        now = tree_memory()
        self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}

    def stop(self) -> dict[str, int]:
        """Stop sampling, take one last sample, and return the peaks in bytes."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        return self.peak


def measure(
    batches: Iterator[Chunk], spec: dict[str, Any], started: float, memory: PeakMemory
) -> dict[str, Any]:
    """The job as a user feels it and the steady rate, from one stream of batches.

    ``started`` is the clock just before the pipeline was built (the process's start and its imports
    are not in it). From it: the first batch's time, and the time until ``job_rows`` rows have come
    (construction, warm-up and tuning included). The steady rate: ``measure_rows`` rows once at
    least ``warmup_rows`` rows and ``warmup_s`` seconds have passed since ``started``. The stream
    runs until both are done. A simulated model step of ``model_latency_ms`` sleeps after each batch;
    idle % is the share of the measured window spent waiting for batches.
    """
    latency = float(spec.get("model_latency_ms") or 0.0) / 1000.0
    job_rows = int(spec.get("job_rows") or 0)
    clock = time.perf_counter
    rows = measured = 0
    wait = 0.0
    first_s = job_s = None
    window: tuple[float, float] | None = None  # (time, tree CPU seconds) when measuring began
    end: tuple[float, float] | None = None
    while end is None or (job_rows and job_s is None):
        asked = clock()
        got_batch = len(next(batches)["label"])
        got = clock()
        rows += got_batch
        first_s = got - started if first_s is None else first_s
        if job_s is None and job_rows and rows >= job_rows:
            job_s = got - started
        if window is not None and end is None:
            wait += got - asked
            measured += got_batch
        if latency:
            time.sleep(latency)
        if window is None and rows >= spec["warmup_rows"] and clock() - started >= spec["warmup_s"]:
            window = (clock(), tree_cpu_s())
        elif window is not None and end is None and measured >= spec["measure_rows"]:
            end = (clock(), tree_cpu_s())
    assert window is not None and end is not None
    elapsed, cpu_s = end[0] - window[0], end[1] - window[1]
    peak = memory.stop()
    return {
        "rows": measured,
        "seconds": elapsed,
        "warmup_s": window[0] - started,
        "rows_per_s": measured / elapsed,
        "cpu_s": cpu_s,
        "cpu_util": cpu_s / elapsed / spec["cpus"],
        "peak_pss_mb": peak["pss"] / 2**20,
        "peak_uss_mb": peak["uss"] / 2**20,
        "idle_pct": 100.0 * wait / elapsed if latency else None,
        "first_batch_s": first_s,
        "job_rows": job_rows or None,
        "job_s": job_s,
        "rows_delivered": rows,
    }


def collect(batches: Iterator[Chunk], rows: int, path: str) -> dict[str, Any]:
    """Batches until at least ``rows`` rows came, saved to ``path`` (.npz): the columns concatenated
    and ``batch_rows``, each batch's rows. With ``rows`` the data's rows that is one epoch."""
    got: list[Chunk] = []
    total = 0
    while total < rows:
        batch = next(batches)
        got.append({k: np.asarray(v) for k, v in batch.items()})
        total += len(got[-1]["label"])
    columns = {k: np.concatenate([b[k] for b in got]) for k in got[0]}
    columns["batch_rows"] = np.array([len(b["label"]) for b in got])
    np.savez(path, **columns)  # type: ignore[arg-type]  # numpy stubs: a key could be allow_pickle
    return {"rows": total, "batches": len(got)}


def _forever(make: Callable[[], Any]) -> Iterator[Chunk]:
    """Batches over as many epochs as the measurement needs."""
    while True:
        yield from make()


# ---- the stages' CPU costs -----------------------------------------------------------------------
COST_STAGES = ("read", "udf", "batch")


def stage_costs(spec: dict[str, Any], udf: Any) -> dict[str, Any]:
    """CPU seconds per row of read, UDF and batch, each alone, at steady state in this worker process.

    The rule: as a pipeline's workers do, in a fresh process with the same inputs (fixed-width
    chunks from ``read_group``), after ``cost_warmup_chunks`` chunks of warm-up (imports, caches,
    the allocator), over at least ``cost_chunks`` chunks (never fewer than 20) of ``batch_rows`` rows
    timed with ``time.process_time``; read is timed per row group over the row groups those chunks
    came from, batch as the copy that assembles each UDF output into a batch. Measured in the
    parent on two row groups, the UDF's first calls and the parent's own state inflated the cost.
    """
    groups = row_groups(spec["files"])
    rows = spec["batch_rows"]
    warm = int(spec.get("cost_warmup_chunks", 4))
    need = max(20, int(spec.get("cost_chunks", 20)))
    for piece in list(slices(read_group(*groups[0], fixed_width=True), rows))[:warm]:
        _assemble([udf(piece)])
    cpu = {stage: 0.0 for stage in COST_STAGES}
    read_rows = udf_rows = chunks = 0
    k = 0
    while chunks < need:
        path, group = groups[k % len(groups)]
        k += 1
        c0 = time.process_time()
        chunk = read_group(path, group, fixed_width=True)
        cpu["read"] += time.process_time() - c0
        read_rows += len(chunk["label"])
        for piece in slices(chunk, rows):
            c1 = time.process_time()
            out = udf(piece)
            c2 = time.process_time()
            _assemble([out])
            cpu["batch"] += time.process_time() - c2
            cpu["udf"] += c2 - c1
            udf_rows += len(piece["label"])
            chunks += 1
    per_row = {
        "read": cpu["read"] / read_rows,
        "udf": cpu["udf"] / udf_rows,
        "batch": cpu["batch"] / udf_rows,
    }
    return {
        **{f"{stage}_us_per_row": per_row[stage] * 1e6 for stage in COST_STAGES},
        "chunks": chunks,
        "udf_rows": udf_rows,
        "read_rows": read_rows,
        "warmup_chunks": warm,
    }


def _assemble(outputs: list[Chunk]) -> Chunk:
    """UDF outputs copied into one batch: the batch stage's work, as a batcher that copies does it."""
    return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}


# ---- the systems ---------------------------------------------------------------------------------
@dataclass
class Running:
    """A started system: its endless stream of batches, its settings (read after the run), its stop."""

    batches: Iterator[Chunk]
    settings: Callable[[], dict[str, Any]]
    close: Callable[[], None] = lambda: None


def dataloader_workers(policy: str | None, cpus: float) -> int:
    """``num_workers=3`` as 3; no policy: one worker per CPU, the usual default."""
    if policy and policy.startswith("num_workers="):
        return int(policy.split("=", 1)[1])
    return max(1, int(round(cpus)))


def start_dataloader(spec: dict[str, Any], udf: Any) -> Running:
    """An IterableDataset sharding row groups over workers; persistent workers, default prefetch.

    ``persistent_workers=True`` keeps the workers across epochs: without it they are forked again at
    every epoch boundary, inside the timed window, which users avoid. ``num_workers`` comes from the
    policy (``num_workers=N``, swept by the parent), else one per CPU."""
    import torch.utils.data as tud

    groups = row_groups(spec["files"])
    rows = spec["batch_rows"]

    class RowGroupDataset(tud.IterableDataset):
        def __iter__(self) -> Iterator[Chunk]:
            info = tud.get_worker_info()
            worker, workers = (info.id, info.num_workers) if info else (0, 1)
            for piece in epoch_slices(groups[worker::workers], rows):
                yield udf(piece)

    workers = dataloader_workers(spec.get("policy"), spec["cpus"])
    loader = tud.DataLoader(RowGroupDataset(), batch_size=None, num_workers=workers, persistent_workers=True)
    settings = {
        "num_workers": loader.num_workers,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
    }
    return Running(_forever(lambda: loader), lambda: settings)


def start_torchdata(spec: dict[str, Any], udf: Any) -> Running:
    """torchdata.nodes: the reader in the main process -> ParallelMapper (processes) -> Prefetcher.

    The graph is built once and its ``Loader`` re-iterated each epoch, as users write it; torchdata
    itself starts new mapper processes at every reset (it has no persistent workers)."""
    from torchdata import nodes

    workers = max(1, int(round(spec["cpus"])))
    node = nodes.IterableWrapper(Epochs(row_groups(spec["files"]), spec["batch_rows"]))
    node = nodes.ParallelMapper(
        node,
        map_fn=udf,
        num_workers=workers,
        method="process",
        in_order=True,
        multiprocessing_context="spawn",
    )
    loader = nodes.Loader(nodes.Prefetcher(node, prefetch_factor=2))
    settings = {"num_workers": workers, "method": "process", "context": "spawn", "prefetch_factor": 2}
    return Running(_forever(lambda: loader), lambda: settings)


def start_tf_autotune(spec: dict[str, Any], udf: Any) -> Running:
    """tf.data: from_generator over the shared reader's fixed-width chunks as they are, the UDF via
    tf.numpy_function, AUTOTUNE everywhere; the values AUTOTUNE chose are read after the run."""
    import tensorflow as tf

    groups = row_groups(spec["files"])
    first = read_group(*groups[0], fixed_width=True)
    names = list(first)
    signature = tuple(
        tf.TensorSpec([None], tf.string if first[n].dtype.kind == "S" else tf.as_dtype(first[n].dtype))
        for n in names
    )

    def generate() -> Iterator[tuple[np.ndarray, ...]]:
        for piece in epoch_slices(groups, spec["batch_rows"]):
            yield tuple(piece[n] for n in names)

    def apply_udf(*columns: np.ndarray) -> tuple[np.ndarray, ...]:
        out = udf(dict(zip(names, columns, strict=True)))
        return out["dense"], out["sparse"], out["label"]

    @tf.autograph.experimental.do_not_convert
    def as_tf(*columns: Any) -> tuple[Any, ...]:
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

    return Running(batches(), lambda: {"autotune_chosen": autotune_chosen(tf, iterator)})


def autotune_chosen(tf: Any, iterator: Any) -> dict[str, Any]:
    """The tunable parameters' values in tf.data's model of the running iterator (an error, recorded)."""
    chosen: dict[str, Any] = {}
    try:
        proto = tf.data.experimental.get_model_proto(iterator)
        for node in proto.nodes.values():
            params = {p.name: p.value for p in node.parameters if p.tunable}
            if params:
                chosen[node.name] = params
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        chosen["error"] = f"{type(exc).__name__}: {exc}"
    return chosen


def start_engine(spec: dict[str, Any], udf: Any) -> Running:
    """The intune engine (read -> udf in processes -> batch -> prefetch) under a tuner policy, or with
    a fixed allocation (``fixed:read.workers=2+udf.workers=3``) and no tuner.

    The source is the shared reader (``row_group_source``): the same read code as every system, with
    the engine's parallel read stage."""
    from intune.pipeline import Pipeline
    from intune.tuner import tune

    pipe = (
        Pipeline(row_group_source(spec["files"], spec["batch_rows"]), name="read")
        .map(udf, name="udf", mode="process")
        .batch(spec["batch_rows"])
        .prefetch(depth=4)
    )
    fixed = fixed_allocation(spec["policy"])
    tuner = None
    if fixed is not None:
        for name, value in fixed.items():
            pipe.set_knob(name, value)
    else:
        tuner = tune(pipe, policy=spec["policy"], tick_s=spec.get("tick_s", 1.0))
    source: Any = tuner or pipe

    def settings() -> dict[str, Any]:
        out: dict[str, Any] = {
            "knobs": {name: knob.value for name, knob in pipe.knobs.items()},
            "stage_cpu_s": {name: s.cpu_s for name, s in pipe.metrics().stages.items()},
            "tuner_errors": sum(1 for row in tuner.history() if row.get("error")) if tuner else 0,
        }
        if tuner is not None:
            out["knob_trace"] = knob_trace(tuner.history())
            if spec.get("history"):
                tuner.save(spec["history"])
        return out

    return Running(_forever(lambda: source), settings, source.close)


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


STARTERS: dict[str, Callable[[dict[str, Any], Any], Running]] = {
    "pytorch-dataloader": start_dataloader,
    "torchdata-nodes": start_torchdata,
    "tf.data": start_tf_autotune,
    "intune-engine": start_engine,
}
IMPORTS: dict[str, tuple[str, ...]] = {
    "pytorch-dataloader": ("torch.utils.data",),
    "torchdata-nodes": ("torchdata.nodes",),
    "tf.data": ("tensorflow",),
    "intune-engine": ("intune.pipeline", "intune.tuner"),
}
COSTS = "stage-costs"
"""The ``system`` of a spec that measures ``stage_costs`` instead of running a system."""


def run_system(spec: dict[str, Any], udf: Any) -> dict[str, Any]:
    """Start the spec's system and measure it (or save one epoch with ``collect_to``), then stop it.

    The system's package is imported before the clock starts: that is the process's start, the same
    for every run of the system, and not the pipeline's doing."""
    import importlib

    for module in IMPORTS[spec["system"]]:
        importlib.import_module(module)
    memory = PeakMemory()
    started = time.perf_counter()
    running = STARTERS[spec["system"]](spec, udf)
    try:
        if spec.get("collect_to"):
            memory.stop()
            result = collect(running.batches, int(spec["collect_rows"]), spec["collect_to"])
        else:
            result = measure(running.batches, spec, started, memory)
        result["config"] = running.settings()
    finally:
        running.close()
    return result


def load_udf(spec: dict[str, Any]) -> Any:
    """The UDF the parent pickled once (``udf_path``: every run gets the same object), else built here."""
    if spec.get("udf_path"):
        import pickle

        return pickle.loads(Path(spec["udf_path"]).read_bytes())
    from intune.dlrm.workload import make_udf

    return make_udf(spec["udf"], [Path(f) for f in spec["files"]], table_size=spec["table_size"])


def main(argv: list[str]) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = json.loads(Path(argv[0]).read_text())
    udf = load_udf(spec)
    result = stage_costs(spec, udf) if spec["system"] == COSTS else run_system(spec, udf)
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
