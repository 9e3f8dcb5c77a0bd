"""``intune sim calibrate``: fit the simulator to the real engine on this machine and check its predictions.

Owns the calibration experiment: one ``intune.Pipeline`` (read -> ``burn`` (pure-Python CPU work in
process workers) -> ``wait`` (I/O-like sleeps in thread workers)) is run under many allocations, set live
through its knobs. From a few *fitting* allocations it fits the stages' CPU seconds and I/O seconds per
row from the engine's own metrics (``cpu_s`` and ``busy_s`` per row), and the machine's contention and
oversubscription cost by least squares on the log error; it then predicts rows/s for the *held-out*
allocations with ``intune.sim.model`` and prints predicted vs measured. It must not change the model
to fit the held-out points.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from intune.results import format_table, write_json
from intune.sim import model, spec_from_dict

CHUNK_ROWS = 1000
FIT = [(1, 1), (2, 8), (1, 8), (3, 4)]
HELD_OUT = [(1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (3, 1), (3, 2), (3, 8), (4, 4), (4, 8)]


def burn(chunk: dict[str, np.ndarray], loops: int = 150_000) -> dict[str, np.ndarray]:
    """Pure-Python CPU work (holds the GIL, so it belongs in process workers)."""
    x = 0
    for i in range(loops):
        x += i * i % 7
    return chunk


def wait(chunk: dict[str, np.ndarray], seconds: float = 0.008) -> dict[str, np.ndarray]:
    """An I/O wait: no CPU, hidden by more workers."""
    time.sleep(seconds)
    return chunk


def _source():
    col = np.arange(CHUNK_ROWS, dtype=np.int64)
    while True:
        yield {"x": col}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement window per allocation")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds after a resize before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="passes over all allocations (median rows/s)")
    parser.add_argument("--json", metavar="PATH", help="write the table here")
    parser.add_argument("--spec", metavar="PATH", help="write the fitted pipeline as a workload spec (YAML)")


def _measure(pipe, it, seconds: float, warmup: float) -> dict[str, Any]:
    """Consume for warmup + seconds; return rows/s and per-stage deltas of the engine's counters."""
    end_warm = time.monotonic() + warmup
    while time.monotonic() < end_warm:
        next(it)
    m0 = pipe.metrics()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        next(it)
    m1 = pipe.metrics()
    elapsed = m1.time_s - m0.time_s
    stages = {}
    for name, s1 in m1.stages.items():
        s0 = m0.stages[name]
        rows = max(1, s1.rows - s0.rows)
        stages[name] = {
            "cpu_s_per_row": (s1.cpu_s - s0.cpu_s) / rows,
            "busy_s_per_row": (s1.busy_s - s0.busy_s) / rows,
        }
    return {"rows_per_s": (m1.rows_out - m0.rows_out) / elapsed, "stages": stages}


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rows/s (its stage counters come with it)."""
    return sorted(runs, key=lambda r: r["rows_per_s"])[len(runs) // 2]


def _spec(fit: dict[str, dict[str, float]], contention: float, oversub: float, cpus: int):
    return spec_from_dict(_spec_dict(fit, contention, oversub, cpus), source="calibration")


def _spec_dict(
    fit: dict[str, dict[str, float]], contention: float, oversub: float, cpus: int
) -> dict[str, Any]:
    stages = []
    for name, mode in (("read", "thread"), ("burn", "process"), ("wait", "thread")):
        f = fit[name]
        stages.append(
            {
                "name": name,
                "mode": mode,
                "cpu_us_per_row": float(f["cpu"] * 1e6),
                "io_us_per_row": float(f["io"] * 1e6),
                "contention": float(contention) if name == "burn" else 0.0,
                "max_workers": 64,
            }
        )
    return {
        "name": "calibration",
        "description": "the calibration pipeline as fitted on this machine by `intune sim calibrate`",
        "chunk_rows": CHUNK_ROWS,
        "batch_size": CHUNK_ROWS,
        "machine": {"cpus": int(cpus), "oversubscription_cost": float(oversub)},
        "stages": stages,
    }


def predict(fit, contention: float, oversub: float, cpus: int, alloc: tuple[int, int]) -> float:
    p = model.params_from_spec(_spec(fit, contention, oversub, cpus))
    return model.throughput(p, [1, alloc[0], alloc[1]], [0, 0, 0], cpus)


def run(args: argparse.Namespace) -> int:
    from intune import Pipeline

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pipe = (
        Pipeline.from_iterable(_source, max_workers=16)
        .map(burn, name="burn", mode="process")
        .map(wait, name="wait", mode="thread")
    )
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {a: [] for a in FIT + HELD_OUT}
    try:
        it = iter(pipe)
        for _ in range(max(1, args.rounds)):  # rounds interleave, so a burst of load elsewhere hits all alike
            for alloc in FIT + HELD_OUT:
                pipe.set_knob("burn.workers", alloc[0])
                pipe.set_knob("wait.workers", alloc[1])
                runs[alloc].append(_measure(pipe, it, args.seconds, args.warmup))
                print(
                    f"measured burn={alloc[0]} wait={alloc[1]}: {runs[alloc][-1]['rows_per_s']:,.0f} rows/s",
                    flush=True,
                )
    finally:
        pipe.close()
    measured = {a: _median_run(r) for a, r in runs.items()}
    # per-row CPU and I/O seconds (I/O here includes time descheduled by other load on the machine): medians over the fitting runs of the engine's own counters
    fit = {}
    for name in ("read", "burn", "wait"):
        cpu = np.median([measured[a]["stages"][name]["cpu_s_per_row"] for a in FIT])
        busy = np.median([measured[a]["stages"][name]["busy_s_per_row"] for a in FIT])
        fit[name] = {"cpu": max(float(cpu), 1e-9), "io": max(0.0, float(busy - cpu))}
    # burn's wall time in a 1-worker run is its cost without contention
    grid = itertools.product(np.linspace(0.0, 0.5, 26), np.linspace(0.0, 1.0, 11))
    best = min(
        grid,
        key=lambda g: sum(
            np.log(predict(fit, g[0], g[1], cpus, a) / measured[a]["rows_per_s"]) ** 2 for a in FIT
        ),
    )
    rows = []
    for alloc in HELD_OUT:
        pred = predict(fit, best[0], best[1], cpus, alloc)
        meas = measured[alloc]["rows_per_s"]
        rows.append(
            {
                "burn.workers": alloc[0],
                "wait.workers": alloc[1],
                "predicted": pred,
                "measured": meas,
                "error": pred / meas - 1,
                "within_20pct": bool(abs(pred / meas - 1) <= 0.2),
            }
        )
    print(
        f"\nfitted on {FIT} with {cpus} CPUs: "
        + ", ".join(
            f"{n} cpu {f['cpu'] * 1e6:.2f} us/row io {f['io'] * 1e6:.2f} us/row" for n, f in fit.items()
        )
        + f"; contention {best[0]:.2f}, oversubscription cost {best[1]:.2f}"
    )
    print(format_table(rows))
    ok = sum(r["within_20pct"] for r in rows)
    print(f"\n{ok}/{len(rows)} held-out configurations within +-20% (target: >= 8/10)")
    if args.json:
        write_json(args.json, rows, fit=fit, contention=best[0], oversubscription_cost=best[1], cpus=cpus)
    if args.spec:
        import yaml

        Path(args.spec).write_text(yaml.safe_dump(_spec_dict(fit, best[0], best[1], cpus), sort_keys=False))
        print(f"wrote {args.spec} (simulate it: intune bench sim --workload {args.spec})")
    return 0 if ok >= 8 else 1
