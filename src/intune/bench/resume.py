"""``intune bench resume``: what a checkpoint costs and what a resume costs, at a 200k-row shuffle buffer.

On generated Criteo-like Parquet data (label, 13 float32 dense, 26 int64 categorical features, an id):
Parquet -> shuffle(200,000 rows) -> map -> batch(4096) -> prefetch, at a fixed allocation.

1. ``state_dict()``: its time between two batches (median and range over repeats) and the size of the
   checkpoint file ``save_checkpoint`` writes. No row data is saved (the buffer is rebuilt by reading
   its rows again), so there is no "saved buffer contents" figure: it is 0 bytes.
2. resume to the first batch, split into the replay (``load_state_dict``: the shuffle replayed on row
   ids, no data read) and the refill plus restart (from ``iter`` to the first batch: reading the
   buffer's rows again and the source from the checkpoint on). Also the replay alone on synthetic logs
   deeper into an epoch, since its cost grows with the position.
3. rows/s after a resume vs the uninterrupted pipeline over the same batches at the same knob values,
   counted from the resumed run's first batch, interleaved rounds.

This module must not change engine behaviour.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from intune.bench import md_report
from intune.results import format_table, machine_info, write_json

BUFFER_ROWS, BATCH, CHUNK_ROWS = 200_000, 4096, 8192


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--md", metavar="PATH", help="write the tables as Markdown, with command, date and machine")
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer repeats (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, quick 2)")


def write_data(folder: str, rows: int, files: int = 4) -> str:
    """Criteo-like Parquet files: ``id``, ``label``, ``I1..I13`` (float32), ``C1..C26`` (int64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    per = rows // files
    for f in range(files):
        cols: dict[str, Any] = {"id": np.arange(f * per, (f + 1) * per, dtype=np.int64)}
        cols["label"] = rng.integers(0, 2, per)
        for i in range(1, 14):
            cols[f"I{i}"] = rng.random(per, dtype=np.float32)
        for i in range(1, 27):
            cols[f"C{i}"] = rng.integers(0, 1 << 32, per)
        pq.write_table(pa.table(cols), os.path.join(folder, f"part-{f}.parquet"), row_group_size=65536)
    return os.path.join(folder, "*.parquet")


def log1p_dense(chunk: dict) -> dict:
    """A row-wise preprocessing map (the resume contract): log1p of the dense features."""
    out = dict(chunk)
    for i in range(1, 14):
        out[f"I{i}"] = np.log1p(chunk[f"I{i}"])
    return out


def build(pattern: str) -> Any:
    from intune.pipeline import Pipeline

    pipe = (
        Pipeline.from_parquet(pattern, chunk_rows=CHUNK_ROWS)
        .shuffle(buffer_rows=BUFFER_ROWS, seed=0, buffer_mb=256)
        .map(log1p_dense, name="prep", workers=2)
        .batch(BATCH)
        .prefetch(4)
    )
    pipe.set_knob("read.workers", 2)  # a fixed allocation: the resumed run gets it from the state
    return pipe


def _rates(it: Any, batches: int) -> tuple[float, float, int, float]:
    """Over the next ``batches`` batches of ``it``: rows/s, rows/s over their second half only (once the
    queues a fresh pipeline fills are full), the rows counted, and rows per CPU second of this process
    (all its threads; less sensitive than wall time to other load on a shared machine)."""
    t0, c0, rows, half_t, half_rows = time.perf_counter(), time.process_time(), 0, 0.0, 0
    for n in range(batches):
        if n == batches // 2:
            half_t, half_rows = time.perf_counter(), rows
        rows += len(next(it)["id"])
    t1, c1 = time.perf_counter(), time.process_time()
    return rows / (t1 - t0), (rows - half_rows) / (t1 - half_t), rows, rows / max(c1 - c0, 1e-9)


def one_round(pattern: str, folder: str, at: int, measure: int, state_repeats: int, resumed_first: bool) -> dict[str, Any]:
    """Run a pipeline to batch ``at``, time ``state_dict()`` there and save it; then measure ``measure``
    batches on, in that pipeline (the uninterrupted run) and in a new one resumed from the file, in the
    order ``resumed_first`` says (alternated across rounds, so that drift in a shared machine's load
    does not favour one side)."""
    from intune.checkpoint import load_checkpoint, save_checkpoint
    from intune.pipeline.resume import replay

    path = os.path.join(folder, "ck.intune")
    pipe = build(pattern)
    it = iter(pipe)
    for _ in range(at):
        next(it)
    times = []
    for _ in range(state_repeats):
        t0 = time.perf_counter()
        state = pipe.state_dict()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    save_checkpoint(path, state, kind="pipeline")
    save_s = time.perf_counter() - t0
    refill = replay(state["shuffle"], 0, state["epoch"], state["rows"], "bench").read.refill  # counted, not timed
    out: dict[str, Any] = {}

    def straight() -> None:
        next(it)  # the first batch after the checkpoint, as the resumed side's first batch
        out["straight"] = _rates(it, measure)
        pipe.close()

    def resumed() -> None:
        other = build(pattern)
        t0 = time.perf_counter()
        other.load_state_dict(load_checkpoint(path, kind="pipeline"))
        t1 = time.perf_counter()
        again = iter(other)
        next(again)
        out["first_batch"] = (t1 - t0, time.perf_counter() - t1)
        out["resumed"] = _rates(again, measure)
        other.close()

    for side in (resumed, straight) if resumed_first else (straight, resumed):
        side()
    assert out["straight"][2] == out["resumed"][2]
    return {
        "state_dict_ms": [1e3 * t for t in times],
        "save_ms": 1e3 * save_s,
        "file_bytes": os.path.getsize(path),
        "log_chunks": len(state["shuffle"]["rows"]),
        "replay_s": out["first_batch"][0],
        "refill_s": out["first_batch"][1],
        "refill_rows": int(sum(len(v[1]) for unit in refill.values() for v in unit.values())),
        "refill_units": len(refill),
        "resumed_first": resumed_first,
        "straight_rows_per_s": out["straight"][0],
        "resumed_rows_per_s": out["resumed"][0],
        "straight_second_half_rows_per_s": out["straight"][1],
        "resumed_second_half_rows_per_s": out["resumed"][1],
        "measured_rows": out["straight"][2],
        "straight_rows_per_cpu_s": out["straight"][3],
        "resumed_rows_per_cpu_s": out["resumed"][3],
    }


def replay_depth(positions: Sequence[int]) -> list[dict[str, Any]]:
    """The replay alone on synthetic logs (8192-row chunks, 200k buffer) that deep into an epoch: from
    the epoch's start, and from an anchor a buffer's worth of input before the position (what a state
    that deep carries, ``resume.ANCHOR_MIN_CHUNKS``; built here by an untimed replay to it)."""
    from intune.pipeline.resume import replay
    from intune.rng import rng_state

    out = []
    for rows in positions:
        k = rows // CHUNK_ROWS
        log = {
            "units": np.arange(k) // 8,
            "items": np.arange(k) % 8,
            "rows": np.full(k, CHUNK_ROWS, np.int32),
            "events": np.array([[0, 0, BUFFER_ROWS, 0]]),
            "row_bytes": 284,
        }
        delivered = k * CHUNK_ROWS - BUFFER_ROWS
        t0 = time.perf_counter()
        plan = replay(log, 0, 0, delivered, "bench")
        from_start = time.perf_counter() - t0
        at = replay(log, 0, 0, delivered - BUFFER_ROWS, "bench")  # the anchor: the buffer one buffer back
        assert at.buffer_ids is not None
        anchored = {
            **log,
            "anchor": {
                "k": len(at.log.rows), "e": len(at.log.events), "emitted": at.delivered + len(at.straddle_ids),
                "rng": rng_state(at.rng), "capacity": at.capacity, "base": 0, "ids": at.buffer_ids,
            },
        }
        t0 = time.perf_counter()
        again = replay(anchored, 0, 0, delivered, "bench")
        from_anchor = time.perf_counter() - t0
        assert np.array_equal(again.buffer_ids, plan.buffer_ids)
        kept = k - int(at.buffer_ids.min()) // CHUNK_ROWS  # a state with the anchor keeps the chunks from its oldest row
        out.append({
            "position_rows": k * CHUNK_ROWS,
            "replay_s": from_start,
            "replay_from_anchor_s": from_anchor,
            "refill_rows_to_read": int(sum(CHUNK_ROWS * len(v) for v in plan.read.refill.values())),
            "log_bytes_without_anchor": 16 * k,
            "log_bytes_with_anchor": 16 * kept,
            "anchor_bytes": 4 * len(at.buffer_ids),
        })
    return out


def run(args: argparse.Namespace) -> int:
    quick = bool(getattr(args, "quick", False))
    rounds = args.rounds or (2 if quick else 7)
    rows = 700_000 if quick else 4_000_000
    at = 60 if quick else 120  # batches before the checkpoint (past the buffer's fill)
    measure = 40 if quick else 600
    with tempfile.TemporaryDirectory() as folder:
        pattern = write_data(folder, rows)
        results = []
        for r in range(rounds):
            got = one_round(pattern, folder, at, measure, 10 if quick else 30, resumed_first=r % 2 == 1)
            results.append(got)
            print(
                f"round {r + 1}/{rounds}: state_dict {statistics.median(got['state_dict_ms']):.2f} ms, "
                f"{got['file_bytes']} bytes; replay {got['replay_s']:.3f} s, refill to first batch "
                f"{got['refill_s']:.3f} s; rows/s resumed {got['resumed_rows_per_s']:,.0f} vs "
                f"{got['straight_rows_per_s']:,.0f}",
                flush=True,
            )
    depth = replay_depth([1_000_000, 10_000_000, 100_000_000] if not quick else [1_000_000, 10_000_000])
    summary = summarize(results)
    print(format_table(summary_rows(summary)))
    print(format_table(depth))
    settings = {
        "rows": rows, "buffer_rows": BUFFER_ROWS, "batch": BATCH, "chunk_rows": CHUNK_ROWS,
        "checkpoint_at_batch": at, "measured_batches": measure, "rounds": rounds,
    }
    if getattr(args, "json", None):
        write_json(args.json, results, quick=quick, settings=settings, summary=summary, replay_depth=depth)
    if getattr(args, "md", None):
        report = markdown_report(summary, depth, settings, quick, md_report.command_line(("bench", "resume")))
        print(f"wrote {md_report.write(args.md, report)}")
    return 0


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ratio = [r["resumed_rows_per_s"] / r["straight_rows_per_s"] for r in results]
    steady = [r["resumed_second_half_rows_per_s"] / r["straight_second_half_rows_per_s"] for r in results]
    return {
        "state_dict_ms": [statistics.median(r["state_dict_ms"]) for r in results],
        "state_dict_max_ms": max(max(r["state_dict_ms"]) for r in results),
        "file_bytes": [r["file_bytes"] for r in results],
        "saved_buffer_bytes": 0,
        "replay_s": [r["replay_s"] for r in results],
        "refill_s": [r["refill_s"] for r in results],
        "resume_to_first_batch_s": [r["replay_s"] + r["refill_s"] for r in results],
        "refill_rows": [r["refill_rows"] for r in results],
        "refill_units": [r["refill_units"] for r in results],
        "straight_rows_per_s": [r["straight_rows_per_s"] for r in results],
        "resumed_rows_per_s": [r["resumed_rows_per_s"] for r in results],
        "resumed_over_straight": ratio,
        "resumed_over_straight_second_half": steady,
        "resumed_over_straight_per_cpu_s": [
            r["resumed_rows_per_cpu_s"] / r["straight_rows_per_cpu_s"] for r in results
        ],
    }


def summary_rows(s: dict[str, Any]) -> list[dict[str, Any]]:
    spread = md_report.spread
    return [
        {"figure": "state_dict() time, ms (median per round)", "value": spread(s["state_dict_ms"], ".3g", "rounds"),
         "target": "< 50 ms", "note": f"slowest single call {s['state_dict_max_ms']:.3g} ms"},
        {"figure": "checkpoint file, bytes", "value": spread(s["file_bytes"], ".0f", "rounds"), "target": "< 1 MB",
         "note": "saved buffer contents: 0 bytes (the buffer is re-read)"},
        {"figure": "replay (load_state_dict), s", "value": spread(s["replay_s"], ".3g", "rounds"), "target": "-",
         "note": "row ids only, no data"},
        {"figure": "refill + restart to first batch, s", "value": spread(s["refill_s"], ".3g", "rounds"),
         "target": "-", "note": f"{spread(s['refill_rows'], '.0f', 'rounds')} rows taken from "
         f"{spread(s['refill_units'], '.0f', 'rounds')} row groups of 65,536 read again"},
        {"figure": "resume to first batch, s", "value": spread(s["resume_to_first_batch_s"], ".3g", "rounds"),
         "target": "< 2 s + refill", "note": ""},
        {"figure": "rows/s after resume / uninterrupted", "value": spread(s["resumed_over_straight"], ".3f", "rounds"),
         "target": ">= 0.95", "note": f"resumed {spread(s['resumed_rows_per_s'], ',.0f', 'rounds')} vs "
         f"{spread(s['straight_rows_per_s'], ',.0f', 'rounds')} rows/s, from the resumed run's first batch"},
        {"figure": "same, second half of the measured batches", "value":
         spread(s["resumed_over_straight_second_half"], ".3f", "rounds"), "target": ">= 0.95",
         "note": "once the queues a fresh pipeline fills are full"},
        {"figure": "rows per CPU second after resume / uninterrupted", "value":
         spread(s["resumed_over_straight_per_cpu_s"], ".3f", "rounds"), "target": "-",
         "note": "the work per row, whatever the machine's other load"},
    ]


def markdown_report(summary: dict, depth: list, settings: dict, quick: bool, command: str) -> str:
    context = [
        md_report.load_line(),
        "Quick run (smaller data, fewer rounds)." if quick else "Full run.",
        f"Settings: {settings}.",
        "Pipeline: Parquet (Criteo-like: label, 13 float32, 26 int64, id) -> shuffle(200,000 rows) -> "
        "map(log1p, 2 threads) -> batch(4096) -> prefetch(4), read.workers=2. Each round runs one pipeline "
        "to the checkpoint, times state_dict() between two batches, saves it, measures the next batches; "
        "then a new pipeline loads the file and measures the same batches from its first one.",
    ]
    sections = [
        md_report.section("Checkpoint and resume", rows=summary_rows(summary)),
        md_report.section(
            "Replay cost against the position in the epoch (synthetic logs, 8192-row chunks)",
            text=["The replay runs every shuffle step since the epoch's start on row ids, or since the anchor a "
                  "state carries from 2048 chunks into an epoch on (the buffer's ids and generator about a "
                  "buffer's worth of input back: anchor_bytes more in the state); the refill reads the chunks "
                  "that hold the buffer's rows (the oldest are about ln(200k) buffers back)."],
            rows=depth,
        ),
    ]
    return md_report.render(command, machine_info(), context, sections)
