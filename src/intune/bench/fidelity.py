"""``intune bench fidelity``: the simulator's Observation against the engine's, field by field.

Owns one comparison: ``intune bench tune``'s pipeline (``tune_workload``: a reader waiting on storage
in thread workers, a pure-Python UDF in process workers) is run live at each allocation of a small grid,
and its simulated twin (``tune_workload.simulated_spec``) at the same allocation and CPUs. Every field a
policy reads (throughput, CPU budget, and per stage busy / starved / blocked, CPU, busy wall and
waiting-for-a-CPU seconds per row, the CPU share of a busy worker, the measured memory of one worker) is averaged over the same
number of ticks and printed side by side with their ratio.

Why: a policy pretrained in the simulator acts on what it learned the signals mean; a field the engine
reports otherwise (a busy fraction under oversubscription, a share above one) is a signal the engine never
gives. The fix belongs in the simulator; this command is how it is found and how it is checked.
It must not fit or change the model (``intune sim calibrate`` fits rates). Beside the fields, the cost
of surplus thread workers live and simulated (``fidelity_threads``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from intune.bench import fidelity_threads, md_report
from intune.bench import tune_workload as wl
from intune.bench.machine_control import CpuRestriction
from intune.monitor import Monitor
from intune.monitor.live import observe
from intune.monitor.observation import Observation
from intune.results import format_table, machine_info, write_json

GRID = {"read.workers": (1, 2, 4), "udf.workers": (1, 2, 3)}
STAGES = ("read", "udf")
STAGE_FIELDS = ("busy", "starved", "blocked", "cpu_s_per_row", "wall_s_per_row", "cpu_wait_s_per_row", "cpu_share", "worker_mb")


def fields(obs: Observation) -> dict[str, float]:
    """The compared fields of one tick, per row where the engine counts per chunk (chunks differ in rows
    between the engine and the twin's spec, rows do not)."""
    out = {"rows_per_s": obs.throughput, "cpu_slack": obs.cpu_slack, "free_cpus": obs.free_cpus}
    for s in obs.stages:
        if s.name not in STAGES:
            continue
        rows_per_item = s.rows_per_s / s.items_per_s if s.items_per_s > 0 else 0.0
        per_row = 1.0 / rows_per_item if rows_per_item > 0 else 0.0
        values = {
            "busy": s.busy,
            "starved": s.starved,
            "blocked": s.blocked,
            "cpu_s_per_row": s.cpu_s_per_item * per_row,
            "wall_s_per_row": s.wall_s_per_item * per_row,
            "cpu_wait_s_per_row": (s.cpu_wait_s_per_item or 0.0) * per_row,
            "cpu_share": s.cpu_share or 0.0,
            "worker_mb": s.worker_bytes / (1 << 20),
        }
        out.update({f"{s.name}.{k}": v for k, v in values.items()})
    return out


def mean_fields(ticks: list[Observation]) -> dict[str, float]:
    rows = [fields(o) for o in ticks]
    return {k: float(np.mean([r.get(k, 0.0) for r in rows])) for k in rows[0]}


def live_ticks(alloc: dict[str, int], cpus: int, warmup_s: float, ticks: int, workload: wl.Workload) -> list[Observation]:
    """``ticks`` one-second Observations of the live pipeline at ``alloc`` on ``cpus`` CPUs, after a warm-up."""
    restriction = CpuRestriction()
    restriction.limit(cpus)
    source = wl.RowSource(workload.chunk_rows)
    pipe = wl.build_pipeline(workload, source)
    monitor = Monitor()
    out: list[Observation] = []
    try:
        for name, value in alloc.items():
            pipe.knobs[name].set(value)
        batches = iter(pipe)
        wl.consume(batches, warmup_s, None, wl.Arrivals())
        prev = pipe.metrics()
        state = {"prev": prev, "due": time.monotonic() + 1.0}

        def on_tick(_: float) -> None:
            if time.monotonic() < state["due"]:
                return
            cur = pipe.metrics()
            sample = monitor.sample()
            out.append(observe(state["prev"], cur, pipe.knobs, len(out), sample.cpus, sample.memory_used_bytes,
                               sample.memory_limit_bytes))
            state["prev"], state["due"] = cur, time.monotonic() + 1.0

        wl.consume(batches, float(ticks) + 0.5, None, wl.Arrivals(), on_tick=on_tick)
    finally:
        source.stop()
        pipe.close()
        restriction.restore()
    return out[:ticks]


def simulated_ticks(alloc: dict[str, int], cpus: int, ticks: int, workload: wl.Workload) -> list[Observation]:
    """``ticks`` Observations of the twin at ``alloc`` on ``cpus`` CPUs, without measurement noise,
    after as many ticks of warm-up (its queues settle)."""
    from intune.sim import Simulator

    sim = Simulator(wl.simulated_spec(workload), cpus=cpus, seed=0, noise=0.0)
    sim.reset()
    for name, value in alloc.items():
        sim.knobs[name].set(value)
    observed = [sim.step() for _ in range(2 * ticks)]
    return observed[ticks:]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpus", type=int, default=2, help="CPUs for both (default 2)")
    parser.add_argument("--ticks", type=int, default=5, help="one-second ticks averaged per allocation")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after setting an allocation")
    parser.add_argument("--quick", action="store_true", help="two allocations, 2 ticks each (a smoke run)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--md", metavar="PATH")


def run(args: argparse.Namespace) -> int:
    workload = wl.Workload()
    grid = wl.allocations(GRID)
    ticks, warmup = args.ticks, args.warmup
    if args.quick:
        grid, ticks, warmup = grid[:2], 2, 1.0
    results: list[dict[str, Any]] = []
    for alloc in grid:
        live = mean_fields(live_ticks(alloc, args.cpus, warmup, ticks, workload))
        sim = mean_fields(simulated_ticks(alloc, args.cpus, ticks, workload))
        label = " ".join(f"{k}={v}" for k, v in alloc.items())
        for key in live:
            ratio = sim[key] / live[key] if live[key] else None
            results.append({"allocation": label, "field": key, "live": live[key], "simulated": sim.get(key, 0.0),
                            "sim/live": ratio})
    table = format_table([{**r, "sim/live": "-" if r["sim/live"] is None else f"{r['sim/live']:.2f}"} for r in results])
    print(table)
    twin = wl.simulated_spec(workload).machine
    cost, switch_share = twin.oversubscription_cost, twin.thread_switch_share
    cases = fidelity_threads.CASES[:1] if args.quick else fidelity_threads.CASES
    threads = fidelity_threads.compare(args.cpus, cost, switch_share, warmup, float(ticks), cases)
    print(format_table(_thread_rows(threads)))
    if args.json:
        write_json(args.json, results, surplus_threads=threads, oversubscription_cost=cost,
                   thread_switch_share=switch_share)
    if args.md:
        text = markdown_report(results, md_report.command_line(("bench", "fidelity")), machine_info(), ticks, warmup,
                               threads, cost, switch_share)
        print(f"wrote {md_report.write(args.md, text)}")
    return 0


def _thread_rows(threads: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The surplus-thread rows as printed: rows/s and each side's ratio to its rate at the fewest threads."""
    return [{
        "GIL share": f"{r['gil_share']:.2f}", "threads": str(r["threads"]),
        "live rows/s": f"{r['live_rows_per_s']:,.0f}", "simulated rows/s": f"{r['simulated_rows_per_s']:,.0f}",
        "live x fewest": f"{r['live_x_fewest']:.2f}", "simulated x fewest": f"{r['simulated_x_fewest']:.2f}",
    } for r in threads]


def markdown_report(results: list[dict[str, Any]], command: str, machine: dict[str, Any], ticks: int,
                    warmup: float, threads: Sequence[dict[str, Any]], cost: float, switch_share: float) -> str:
    """The report: what each figure is, one row per allocation and field, then the surplus threads."""
    context = [
        f"Each figure: the mean over {ticks} one-second ticks after {warmup:g} s at the allocation (live) or "
        f"over {ticks} ticks after as many of warm-up (simulated, no noise); sim/live is their ratio.",
        md_report.load_line(),
    ]
    rows = [{**r, "sim/live": "-" if r["sim/live"] is None else f"{r['sim/live']:.2f}"} for r in results]
    sections = [md_report.section("Fields", rows=rows)]
    if threads:
        sections.append(md_report.section("Surplus threads", [
            "A thread stage whose function holds the GIL for the share given (a Python loop) and releases it for "
            "the rest (`np.sort`), behind a cheap source, at "
            + " and ".join(str(w) for w in fidelity_threads.THREADS)
            + f" threads on the same CPUs: live over {ticks} s after {warmup:g} s, and the simulator's model of the "
            f"same CPU per chunk and GIL share at the twin's oversubscription cost ({cost:g}), a thread weighing "
            f"{switch_share:g} of a process in its count (`thread_switch_share`).",
        ], rows=_thread_rows(list(threads))))
    return md_report.render(command, machine, context, sections)
