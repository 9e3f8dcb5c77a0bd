"""``intune bench engine``: the engine's five figures, each a ratio or rate against its target.

1. overhead: Parquet -> shuffle -> identity map -> batch -> prefetch at the ``none`` allocation, rows/s
   relative to a plain sequential loop doing the same read / shuffle / batch work with the same code
   (pyarrow, ``ShuffleBuffer``, ``Batcher``) but none of the engine's bookkeeping;
2. speed-up: a GIL-bound pure-Python UDF in process mode, ``udf.workers`` 2 vs 1;
3. transport: GB/s of 8 MB chunks through one process worker to the consumer;
4. resize latency: seconds from raising a process pool 1 -> 2 (a parked worker exists) to the parked
   worker's first output at the consumer;
5. memory: relative gap between the engine's buffered-bytes figure and the measured growth of the
   process tree's memory (PSS, children included, shared memory counted once) with large buffers;
6. buffer cut: ``shuffle.buffer_mb`` cut 256 -> 10 MB mid-epoch, the fall of the memory cgroup's usage
   over the bytes the buffer let go (``cgroup_memory.buffer_cut``);
7. drain peak: the memory cgroup's peak from the end of input to the drain's last row, over the
   buffer's bytes: the ``ShuffleBuffer`` alone, and through a ``Pipeline`` (``cgroup_memory.drain_peak``).

6 and 7 run in a child process inside a child memory cgroup of their own; where none can be made they
are reported as skipped, with the reason. ``--only cut drain`` runs just these two (about a minute).

Ratios are measured side by side in one run. Each result keeps the per-repeat figures it was taken
from (``runs``), so that ``--md`` can show their spread beside the best. This module must not change
engine behaviour.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from intune.bench import md_report
from intune.monitor import process_tree_rss
from intune.results import format_table, machine_info, write_json


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer repeats (a smoke run)")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="run only these measurements: overhead speedup transport resize memory cut drain",
    )
    parser.add_argument(
        "--md", metavar="PATH", help="write the table as Markdown, with command, date and machine"
    )


def run(args: argparse.Namespace) -> int:
    quick = bool(getattr(args, "quick", False))
    wanted = set(args.only) if getattr(args, "only", None) else set(MEASUREMENTS)
    results = []
    for name, fn in MEASUREMENTS.items():
        if name in wanted:
            for result in _as_list(fn(quick)):
                results.append(result)
                value = "skipped" if result["value"] is None else f"{result['value']:.3g}"
                print(f"{result['name']}: {value} {result['unit']} (target {result['target']})", flush=True)
    print(format_table(table_rows(results), TABLE_COLUMNS))
    if getattr(args, "json", None):
        write_json(args.json, results, quick=quick)
    if getattr(args, "md", None):
        report = markdown_report(results, quick, md_report.command_line(("bench", "engine")))
        print(f"wrote {md_report.write(args.md, report)}")
    return 0


TABLE_COLUMNS = ["name", "value", "unit", "target", "meets target", "repeats", "detail"]


def _as_list(measured: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return measured if isinstance(measured, list) else [measured]


def table_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measurement: its value against its target, and the spread of its repeats."""
    return [
        {
            **r,
            "meets target": "skipped"
            if r["value"] is None
            else (r["value"] >= r["target"])
            if r["higher_is_better"]
            else (r["value"] <= r["target"]),
            "repeats": md_report.spread(r.get("runs") or ()),
        }
        for r in results
    ]


def markdown_report(results: Sequence[dict[str, Any]], quick: bool, command: str) -> str:
    """The terminal's table under the command, date and machine, with how value and repeats relate."""
    context = [
        md_report.load_line(),
        "Quick run (smaller data, fewer repeats)." if quick else "Full run.",
        "Value: what the target is checked on (overhead, speed-up and transport: each side at its best",
        "repeat; resize: the slowest raise; buffer cut: the least freed; drain: the highest peak).",
        "Repeats: the same figure for each repeat, median (min–max). Buffer cut and drain are read from",
        "a child memory cgroup's own files (memory.usage_in_bytes, memory.max_usage_in_bytes).",
    ]
    table = md_report.section("Measurements", rows=table_rows(results), columns=TABLE_COLUMNS)
    return md_report.render(command, machine_info(), context, [table])


def result(
    name: str, value: float | None, unit: str, target: float, higher: bool, detail: str, runs: Sequence[float] = ()
) -> dict[str, Any]:
    """One measurement; ``runs`` holds the per-repeat figures ``value`` was taken from; ``value`` None:
    skipped (``detail`` says why)."""
    return {
        "name": name,
        "value": None if value is None else float(value),
        "unit": unit,
        "target": target,
        "higher_is_better": higher,
        "detail": detail,
        "runs": [float(v) for v in runs],
    }


# ---- 1. overhead -------------------------------------------------------------------------------------
def _write_parquet(folder: str, rows: int, files: int = 4) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    per = rows // files
    for f in range(files):
        cols = {"id": np.arange(f * per, (f + 1) * per, dtype=np.int64), "label": rng.integers(0, 2, per)}
        for i in range(4):
            cols[f"dense{i}"] = rng.random(per, dtype=np.float32)
        for i in range(4):
            cols[f"cat{i}"] = rng.integers(0, 1 << 20, per)
        pq.write_table(pa.table(cols), os.path.join(folder, f"part-{f}.parquet"), row_group_size=65536)
    return os.path.join(folder, "*.parquet")


def _sequential_loop(pattern: str, chunk_rows: int, capacity: int, seed: int, batch: int) -> Iterable[dict]:
    """The same read / shuffle / batch work as the engine, in one plain loop (no provenance kept)."""
    import glob

    import pyarrow.parquet as pq

    from intune.pipeline.batcher import Batcher
    from intune.pipeline.shuffle import ShuffleBuffer

    shuffler = ShuffleBuffer(np.random.default_rng([seed, 0]), capacity)
    batcher = Batcher(batch, False)
    for path in sorted(glob.glob(pattern)):
        handle = pq.ParquetFile(path)
        for g in range(handle.metadata.num_row_groups):
            table = handle.read_row_group(g)
            cols = {n: table.column(n).to_numpy() for n in table.column_names}
            rows = len(cols["id"])
            for lo in range(0, rows, chunk_rows):
                chunk = {n: c[lo : lo + chunk_rows] for n, c in cols.items()}
                for out in shuffler.add(chunk):
                    yield from (b for b, _ in batcher.add(out, None))
    for out in shuffler.drain(chunk_rows):
        yield from (b for b, _ in batcher.add(out, None))
    yield from (b for b, _ in batcher.flush())


def _rows_per_s(batches: Iterable[dict]) -> float:
    t0 = time.perf_counter()
    rows = 0
    for b in batches:
        rows += len(b["id"])
    return rows / (time.perf_counter() - t0)


def measure_overhead(quick: bool) -> dict[str, Any]:
    from intune.pipeline import Pipeline

    rows = 400_000 if quick else 2_000_000
    repeats = 2 if quick else 3
    with tempfile.TemporaryDirectory() as folder:
        pattern = _write_parquet(folder, rows)
        pipe = (
            Pipeline.from_parquet(pattern, chunk_rows=8192)
            .shuffle(buffer_rows=200_000, seed=0)
            .map(lambda c: c, name="udf")
            .batch(4096)
            .prefetch(depth=4)
        )
        for knob in pipe.knobs.values():  # the `none` allocation: one worker, smallest buffers
            knob.set(knob.clamp(1) if knob.unit == "cpu" else knob.min)
        row_bytes = 8 * 2 + 4 * 4 + 8 * 4 + 8  # the columns plus the engine's row ids (provenance)
        capacity = pipe.stage("shuffle").capacity(row_bytes)  # type: ignore[attr-defined]
        # the plain loop shuffles with the same capacity in rows but keeps no row ids: the engine's
        # provenance bookkeeping counts as overhead
        engine, plain = [], []
        with pipe:
            for _ in range(repeats):
                plain.append(_rows_per_s(_sequential_loop(pattern, 8192, capacity, 0, 4096)))
                engine.append(_rows_per_s(iter(pipe)))
    e, p = max(engine), max(plain)
    detail = f"engine {e:,.0f} rows/s vs plain loop {p:,.0f} rows/s (best of {repeats}; shuffle capacity {capacity} rows)"
    ratios = [a / b for a, b in zip(engine, plain, strict=True)]
    return result("engine overhead (engine / plain loop rows/s)", e / p, "ratio", 0.9, True, detail, ratios)


# ---- 2. parallel speed-up ----------------------------------------------------------------------------
def python_heavy(chunk: dict) -> dict:
    """A GIL-bound UDF: a pure-Python loop over every row."""
    ids = chunk["id"].tolist()
    out = []
    for v in ids:
        h = v
        for _ in range(60):
            h = (h * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(h)
    return {"id": chunk["id"], "h": np.asarray(out, dtype=np.int64)}


def _chunks(n_chunks: int, rows: int) -> Callable[[], Iterable[dict]]:
    made = [{"id": np.arange(i * rows, (i + 1) * rows)} for i in range(n_chunks)]
    return lambda: iter(made)


def measure_speedup(quick: bool) -> dict[str, Any]:
    from intune.pipeline import Pipeline

    n_chunks = 60 if quick else 200
    pipe = (
        Pipeline.from_iterable(_chunks(n_chunks, 1000))
        .map(python_heavy, name="udf", mode="process", workers=2)
        .prefetch(4)
    )
    rates = {1: [], 2: []}
    with pipe:
        list(pipe)  # start both workers
        for _ in range(1 if quick else 2):
            for w in (1, 2):
                pipe.knobs["udf.workers"].set(w)
                rates[w].append(_rows_per_s(iter(pipe)))
    r1, r2 = max(rates[1]), max(rates[2])
    detail = f"1 worker {r1:,.0f} rows/s, 2 workers {r2:,.0f} rows/s; usable CPUs {_cpus()}"
    ratios = [b / a for a, b in zip(rates[1], rates[2], strict=True)]
    return result(
        "parallel speed-up (udf.workers 2 / 1, process)", r2 / r1, "ratio", 1.7, True, detail, ratios
    )


def _cpus() -> Any:
    try:
        from intune import monitor

        return monitor.available_cpus()
    except Exception:
        return len(os.sched_getaffinity(0))


# ---- 3. transport ------------------------------------------------------------------------------------
def identity(chunk: dict) -> dict:
    return chunk


def measure_transport(quick: bool) -> dict[str, Any]:
    from intune.pipeline import Pipeline

    n_chunks = 40 if quick else 150
    made = [{"x": np.full(1 << 20, float(i))} for i in range(8)]  # 8 MB chunks
    pipe = Pipeline.from_iterable(lambda: (made[i % 8] for i in range(n_chunks))).map(
        identity, name="udf", mode="process"
    )
    with pipe:
        list(pipe)  # warm up: the worker, its segments
        rates = []
        for _ in range(2):
            t0 = time.perf_counter()
            moved = 0
            for b in pipe:
                moved += b["x"].nbytes
            rates.append(moved / (time.perf_counter() - t0) / 1e9)
    detail = f"{n_chunks} chunks of 8 MB, parent -> worker -> consumer through /dev/shm, 1 worker"
    return result("shared-memory transport", max(rates), "GB/s", 1.0, True, detail, rates)


# ---- 4. resize latency -------------------------------------------------------------------------------
def tagged(chunk: dict) -> dict:
    time.sleep(0.01)
    return {"id": chunk["id"], "pid": np.full(len(chunk["id"]), os.getpid())}


def measure_resize(quick: bool) -> dict[str, Any]:
    from intune.pipeline import Pipeline

    latencies = []
    pipe = Pipeline.from_iterable(_chunks(100_000, 100)).map(tagged, name="udf", mode="process", workers=2)
    with pipe:
        it = iter(pipe)
        for _ in range(20):
            next(it)  # both workers started
        for _ in range(3 if quick else 10):
            pipe.knobs["udf.workers"].set(1)
            for _ in range(10):
                next(it)  # worker 1 parks
            parked = set(pipe.stage("udf").worker_pids()) - {int(next(it)["pid"][0])}  # type: ignore[attr-defined]
            seen = set()
            for _ in range(10):
                seen.add(int(next(it)["pid"][0]))
            parked -= seen
            t0 = time.perf_counter()
            pipe.knobs["udf.workers"].set(2)
            while True:
                pid = int(next(it)["pid"][0])
                if pid in parked:
                    latencies.append(time.perf_counter() - t0)
                    break
    worst, median = max(latencies), statistics.median(latencies)
    detail = f"median {median * 1000:.1f} ms, worst {worst * 1000:.1f} ms over {len(latencies)} raises (UDF 10 ms/chunk)"
    return result("resize latency (parked worker's first output)", worst, "s", 0.5, False, detail, latencies)


# ---- 5. memory accounting ----------------------------------------------------------------------------
def measure_memory(quick: bool) -> dict[str, Any]:
    from intune.pipeline import Pipeline

    shuffle_mb, prefetch_mb = (128, 64) if quick else (512, 256)
    rows = 4096

    def source() -> Iterable[dict]:
        for i in range(10**9):
            yield {
                "id": np.arange(i * rows, (i + 1) * rows),
                **{f"f{k}": np.full(rows, float(k)) for k in range(15)},
            }

    gc.collect()
    pipe = (
        Pipeline.from_iterable(source)
        .shuffle(buffer_rows=10**9, seed=0, buffer_mb=shuffle_mb)
        .batch(rows)
        .prefetch(depth=10**6, buffer_mb=prefetch_mb)
    )
    with pipe:
        list(Pipeline.from_iterable([{"x": np.zeros(rows)}] * 4).batch(rows))  # warm the code paths up
        gc.collect()
        base = process_tree_rss()  # before any buffer exists (PSS: shared memory counted once)
        it = iter(pipe)
        next(it)
        deadline = time.monotonic() + (30 if quick else 90)
        previous = -1
        while time.monotonic() < deadline:  # the consumer stalls while the buffers fill
            time.sleep(0.5)
            held = pipe.metrics().buffered_bytes
            if held == previous:
                break
            previous = held
        held = pipe.metrics().buffered_bytes
        growth = process_tree_rss() - base
    gap = abs(growth - held) / max(1, growth)
    detail = f"engine says {held / 2**20:.0f} MiB buffered, process tree grew {growth / 2**20:.0f} MiB"
    return result(
        "memory accounting gap |buffered - PSS growth| / growth", gap, "ratio", 0.15, False, detail, [gap]
    )


# ---- 6, 7. memory as the cgroup sees it -----------------------------------------------------------------
CUT_NAME = "buffer cut 256 -> 10 MB: cgroup usage fall / bytes cut"
DRAIN_NAMES = {
    "buffer": "drain peak / buffer (ShuffleBuffer alone, 200 MB)",
    "pipeline": "drain peak / buffer (through a Pipeline, 200 MB)",
}


def _cgroup_runs(workload: str, repeats: int, **params: Any) -> list[dict[str, Any]]:
    from intune.bench import cgroup_memory

    runs = []
    for _ in range(repeats):
        measured = cgroup_memory.run(workload, limit_mb=1024, **params)
        if "error" in measured:
            raise RuntimeError(f"bench engine: the {workload} workload failed in its cgroup: {measured['error']}")
        runs.append(measured)
    return runs


def measure_cut(quick: bool) -> dict[str, Any]:
    from intune.bench import cgroup_memory

    reason = cgroup_memory.unavailable()
    if reason:
        return result(CUT_NAME, None, "ratio", 0.8, True, f"skipped: no child memory cgroup ({reason})")
    runs = _cgroup_runs("buffer_cut", 1 if quick else 3, from_mb=256, to_mb=10)
    fractions = [r["freed_fraction"] for r in runs]
    worst = runs[fractions.index(min(fractions))]
    mb = lambda v: f"{v / 2**20:.0f}"  # noqa: E731
    detail = (
        f"usage {mb(worst['usage_before'])} -> {mb(worst['usage_after'])} MB for a buffer of "
        f"{mb(worst['held_before'])} -> {mb(worst['held_after'])} MB (the least freed of {len(runs)})"
    )
    return result(CUT_NAME, min(fractions), "ratio", 0.8, True, detail, fractions)


def measure_drain(quick: bool) -> list[dict[str, Any]]:
    from intune.bench import cgroup_memory

    reason = cgroup_memory.unavailable()
    if reason:
        return [
            result(name, None, "ratio", 1.1, False, f"skipped: no child memory cgroup ({reason})")
            for name in DRAIN_NAMES.values()
        ]
    out = []
    for through, name in DRAIN_NAMES.items():
        runs = _cgroup_runs("drain_peak", 1 if quick else 3, buffer_mb=200, through=through)
        ratios = [r["peak_ratio"] for r in runs]
        worst = runs[ratios.index(max(ratios))]
        detail = (
            f"peak {(worst['peak'] - worst['usage_before']) / 2**20:.0f} MB over the usage before the epoch, "
            f"{(worst['usage_at_drain'] - worst['usage_before']) / 2**20:.0f} MB held when the input ended, "
            f"buffer {worst['held'] / 2**20:.0f} MB; the drain itself added {worst['drain_rise']:.3f}x the buffer"
        )
        if through == "pipeline":
            detail += " (with a resume anchor, a copy of the buffer's row ids: 8 B a row of 136)"
        out.append(result(name, max(ratios), "ratio", 1.1, False, detail, ratios))
    return out


MEASUREMENTS: dict[str, Callable[[bool], dict[str, Any] | list[dict[str, Any]]]] = {
    "overhead": measure_overhead,
    "speedup": measure_speedup,
    "transport": measure_transport,
    "resize": measure_resize,
    "memory": measure_memory,
    "cut": measure_cut,
    "drain": measure_drain,
}
