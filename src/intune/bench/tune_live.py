"""``intune bench tune``: tuning policies on the real engine on this machine.

1. convergence: an exhaustive search over the worker allocations finds the best rows/s of the
   benchmark pipeline (``tune_workload``); then every policy runs live from the even split and we
   report its rows/s over the last 15 s and when it first sustained >= 90% of that best;
2. resize: mid-run the process is restricted to 1 CPU and later given 2 back (``machine_control``:
   affinity of every thread and child process); we report how long each policy takes to reach 90% of
   the per-phase best again and that every row arrived exactly once;
3. memory: the pipeline runs in a child process inside a cgroup-v1 memory cgroup whose limit the even
   split's buffers exceed (the user states a 2 GB ceiling, which the engine would otherwise refuse under
   a 1 GB limit); we report whether each policy got the child OOM-killed, and the shuffle window it
   left. memory-floor: the same, but the user's shuffle window (256 MB, which fits) is the knob's floor,
   so a policy survives by tuning workers and prefetch, not by cutting randomness.

This module owns the three benchmarks, their targets, their settings, the CLI and its report: the
full table the terminal prints, and (``--md``) the per-policy summary the README copies. It must not
change the engine, the tuner or any policy.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from intune.bench import md_report
from intune.bench import tune_workload as wl
from intune.bench.machine_control import MemoryCgroup, memory_cgroup_unavailable
from intune.results import format_table, machine_info, write_json
from intune.units import MB

BENCHMARKS = ("convergence", "resize", "memory", "memory-floor")
DEFAULT_POLICIES = ("intune", "network", "steer", "plumber-adaptive", "autotune-adaptive")
ROW_COLUMNS = ["round", "benchmark", "policy", "metric", "value", "target", "unit", "meets"]


# -- settings -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Durations and grids of one run (``--quick`` shrinks them)."""

    search_grid: dict[str, list[int]]
    warmup_s: float
    measure_s: float
    run_s: float  # each policy's convergence run
    tail_s: float  # the closing window whose rows/s is reported
    phase_s: float  # each phase of the resize run
    window_bins: int  # seconds a rate must hold to count as reached
    memory_s: float
    memory_limit_mb: int
    tick_s: float

    @classmethod
    def make(cls, quick: bool, tick_s: float) -> Settings:
        if quick:
            return cls(
                search_grid={"read.workers": [1, 2], "udf.workers": [1, 2]},
                warmup_s=0.7,
                measure_s=1.2,
                run_s=8.0,
                tail_s=3.0,
                phase_s=6.0,
                window_bins=2,
                memory_s=10.0,
                memory_limit_mb=1024,
                tick_s=tick_s,
            )
        return cls(
            search_grid={"read.workers": [1, 2, 4], "udf.workers": [1, 2, 3]},
            warmup_s=2.0,
            measure_s=3.0,
            run_s=60.0,
            tail_s=15.0,
            phase_s=45.0,
            window_bins=5,
            memory_s=45.0,
            memory_limit_mb=1024,
            tick_s=tick_s,
        )


MEMORY_CEILING_MB = 2048
"""The buffers' ceiling the memory scenarios' user states (the engine's default would be half the
cgroup's limit, and would refuse the 1.5 GB shuffle window up front)."""
SHUFFLE_FLOOR_MB = 256


def memory_workload(floor: bool = False) -> wl.Workload:
    """Big rows and big buffers: the even split's buffers are over the cgroup limit. With ``floor`` the
    shuffle window is 256 MB and may not shrink: only prefetch and workers are left to tune."""
    return wl.Workload(
        chunk_rows=256,
        io_ms=20.0,
        udf_loops=50,
        payload_floats=2048,
        shuffle_rows=1 << 20,
        shuffle_mb=SHUFFLE_FLOOR_MB if floor else 1536,
        shuffle_min_mb=SHUFFLE_FLOOR_MB if floor else 1,
        max_mb=MEMORY_CEILING_MB,
        prefetch_depth=64,
        prefetch_mb=512,
        batch_rows=256,
    )


def _row(
    benchmark: str, policy: str, metric: str, value: Any, target: str = "", unit: str = ""
) -> dict[str, Any]:
    """One result; ``target`` is ``">= x"``, ``"<= x"``, ``"= x"``, ``"no"`` or free text (no verdict)."""
    return {
        "benchmark": benchmark,
        "policy": policy,
        "metric": metric,
        "value": value,
        "target": target,
        "unit": unit,
        "meets": meets(value, target),
    }


def meets(value: Any, target: str) -> bool | None:
    """Whether ``value`` meets ``target``; ``None`` when the target is not a comparison.

    A missing value (a rate never reached) fails an upper bound.
    """
    if target == "no":
        return value is False
    op, _, number = target.partition(" ")
    try:
        bound = float(number.split()[0])
    except (ValueError, IndexError):
        return None
    if op not in (">=", "<=", "="):
        return None
    if value is None or isinstance(value, (bool, str)):
        return False
    return {">=": value >= bound, "<=": value <= bound, "=": value == bound}[op]


def _fmt_alloc(alloc: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in alloc.items()) or "-"


def _save_history(directory: str | None, name: str, history: list[dict[str, Any]]) -> None:
    if directory:
        out = Path(directory) / f"{name}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(row) + "\n" for row in history))


def _run_rows(benchmark: str, policy: str, run: wl.LiveRun) -> list[dict[str, Any]]:
    """Exactly-once, the tuner's own failures (a failing policy or monitor leaves the knobs alone) and
    its costs: the CPU a decision uses, its wall time (which includes waiting for the GIL), and the
    tuning thread's CPU over the run as a share of one core."""
    failures = ", ".join(f"{k}={v}" for k, v in sorted(run.failures.items()))
    stats = run.tuner_stats
    return [
        *_exactly_once_rows(benchmark, policy, run.check),
        _row(benchmark, policy, "tuner_ticks", len(run.history), "", "ticks"),
        _row(benchmark, policy, "tuner_failures", sum(run.failures.values()), "= 0", failures or "ticks"),
        _row(benchmark, policy, "decision_cpu_ms_median", stats.get("decision_cpu_ms_median"), "<= 1", "ms"),
        _row(benchmark, policy, "decision_cpu_ms_mean", stats.get("decision_cpu_ms_mean"), "<= 1", "ms"),
        _row(benchmark, policy, "decision_wall_ms_p99", stats.get("decision_ms_p99"), "", "ms"),
        _row(benchmark, policy, "tuner_cpu_share", stats.get("cpu_fraction"), "<= 0.02", "of a core"),
    ]


def _exactly_once_rows(benchmark: str, policy: str, check: dict[str, int]) -> list[dict[str, Any]]:
    return [
        _row(
            benchmark, policy, "rows_delivered", check["delivered"], f"= {check['produced']} produced", "rows"
        ),
        _row(benchmark, policy, "rows_missing", check["missing"], "= 0", "rows"),
        _row(benchmark, policy, "rows_repeated", check["repeated"] + check["unexpected"], "= 0", "rows"),
    ]


# -- the three benchmarks --------------------------------------------------------------------------------


def bench_convergence(policies: Sequence[str], s: Settings, history_dir: str | None) -> list[dict[str, Any]]:
    """Every policy from the even split for ``run_s``: its closing rate, final allocation and its rate
    each second (``rates_per_s``), which ``scored_rows`` holds against the searches' best."""
    workload = wl.Workload()
    rows = []
    for policy in policies:
        print(f"convergence: {policy} for {s.run_s:.0f} s", flush=True)
        try:
            run = wl.run_policy(policy, workload, s.run_s, s.tick_s)
        except Exception as exc:  # noqa: BLE001 - one policy failing must not hide the others
            rows.append(_row("convergence", policy, "error", f"{type(exc).__name__}: {exc}"))
            continue
        _save_history(history_dir, f"convergence-{policy}", run.history)
        knobs = run.history[-1]["knobs"] if run.history else {}
        rows += [
            _row(
                "convergence",
                policy,
                f"rows_per_s_last_{s.tail_s:.0f}s",
                run.arrivals.rate(s.run_s - s.tail_s, s.run_s),
                "",
                "rows/s",
            ),
            _row(
                "convergence",
                policy,
                "final_allocation",
                _fmt_alloc({k: v for k, v in knobs.items() if k.endswith("workers")}),
            ),
            _row("convergence", policy, "rates_per_s", _rates(run.arrivals.timeline(s.run_s)), "", "rows/s each second"),
            *_run_rows("convergence", policy, run),
        ]
    return rows


def resize_phases(s: Settings, full: int) -> list[tuple[float, int]]:
    """(start s, CPUs) of the resize run's three phases: all CPUs, one, all again."""
    return [(0.0, full), (s.phase_s, 1), (2 * s.phase_s, full)]


def bench_resize(policies: Sequence[str], s: Settings, full: int, history_dir: str | None) -> list[dict[str, Any]]:
    """Every policy through ``resize_phases``: each phase's rate, the CPUs the monitor saw, and its rate
    each second (``rates_per_s``), which ``scored_rows`` holds against each phase's best."""
    workload = wl.Workload()
    phases = resize_phases(s, full)
    rows = []
    for policy in policies:
        print(f"resize: {policy} for {3 * s.phase_s:.0f} s ({full} -> 1 -> {full} CPUs)", flush=True)
        try:
            run = wl.run_policy(policy, workload, 3 * s.phase_s, s.tick_s, phases=phases[1:])
        except Exception as exc:  # noqa: BLE001 - one policy failing must not hide the others
            rows.append(_row("resize", policy, "error", f"{type(exc).__name__}: {exc}"))
            continue
        _save_history(history_dir, f"resize-{policy}", run.history)
        for i, (start, cpus) in enumerate(phases):
            seen = next(
                (e["monitor_cpus"] for e in run.events if e["cpus"] == cpus and e["time_s"] >= start - 1),
                None,
            )
            rows.append(
                _row(
                    "resize",
                    policy,
                    f"phase{i}_{cpus}cpu_rows_per_s",
                    run.arrivals.rate(start, start + s.phase_s),
                    "",
                    "rows/s",
                )
            )
            if i:
                rows.append(_row("resize", policy, f"phase{i}_monitor_cpus", seen, f"= {cpus}", "cpus"))
        rows.append(_row("resize", policy, "rates_per_s", _rates(run.arrivals.timeline(3 * s.phase_s)), "", "rows/s each second"))
        rows += _run_rows("resize", policy, run)
    return rows


def _rates(timeline: Any) -> list[float]:
    return [round(float(x), 1) for x in timeline]


def scored_rows(
    rows: Sequence[dict[str, Any]], reference: dict[int, wl.SearchResult], s: Settings, full: int
) -> list[dict[str, Any]]:
    """The rows measured against the searches' best (``reference``, one per CPU count, each
    ``wl.median_search`` over every round's search): the convergence runs' share of the best and
    their time to 90% of it; each resize phase's time to 90% of that phase's best.

    Scored after every round, so that every run is held against the same best, measured in every
    round beside the runs (the machine's spells fall on both alike)."""
    out: list[dict[str, Any]] = []
    if full in reference:
        search = reference[full]
        best = search.best_rows_per_s
        within, within_rate = search.best_within(wl.grid_cpu_budget(wl.Workload(), s.search_grid, full))
        out += [
            _row("convergence", "exhaustive", "best_rows_per_s", best, _fmt_alloc(search.best), "rows/s"),
            _row("convergence", "exhaustive", "best_within_cpu_budget_rows_per_s", within_rate, _fmt_alloc(within), "rows/s"),
        ]
    phase_best: dict[int, float] = {}
    if 1 in reference and full in reference:
        # fewer CPUs can never truly do better: a 1-CPU best above the full best is noise, so cap it
        phase_best = {full: reference[full].best_rows_per_s}
        phase_best[1] = min(reference[1].best_rows_per_s, phase_best[full])
        out.append(
            _row("resize", "exhaustive", "best_rows_per_s_1cpu", phase_best[1], _fmt_alloc(reference[1].best), "rows/s")
        )
    for r in rows:
        if r["metric"] != "rates_per_s" or r["policy"] == "exhaustive":
            continue
        tagged = {"round": r["round"]} if "round" in r else {}
        rates, policy = r["value"], r["policy"]
        if r["benchmark"] == "convergence" and full in reference:
            best = reference[full].best_rows_per_s
            tail = float(np.mean(rates[-int(s.tail_s) :])) if rates else 0.0
            out += [
                {**tagged, **_row("convergence", policy, "fraction_of_best", tail / best if best else 0.0, ">= 0.9", "x")},
                {
                    **tagged,
                    **_row(
                        "convergence",
                        policy,
                        "fraction_of_cpu_budget_best",
                        tail / within_rate if within_rate else 0.0,
                        ">= 0.9",
                        "x",
                    ),
                },
                {
                    **tagged,
                    **_row("convergence", policy, "time_to_90pct_s", wl.first_sustained(rates, 0.9 * best, s.window_bins), "<= 20", "s"),
                },
            ]
        if r["benchmark"] == "resize" and phase_best:
            for i, (start, cpus) in enumerate(resize_phases(s, full)):
                end = int(start + s.phase_s)
                t = wl.first_sustained(rates[:end], 0.9 * phase_best[cpus], s.window_bins, start=int(start))
                target = f"<= {min(30.0 if i else 20.0, s.phase_s):.0f}"
                out.append({**tagged, **_row("resize", policy, f"phase{i}_{cpus}cpu_reconverge_s", t, target, "s")})
    return out


def memory_child(config_path: str) -> None:
    """Entry point of the memory benchmark's child (already inside its cgroup): run, write results."""
    config = json.loads(Path(config_path).read_text())
    workload = wl.Workload(**config["workload"])
    run = wl.run_policy(
        config["policy"], workload, config["seconds"], config["tick_s"], history_path=config["history"]
    )
    peak = max((row.get("memory_used") or 0 for row in run.history), default=0)
    Path(config["out"]).write_text(
        json.dumps(
            {
                "rows_per_s": sum(run.arrivals.rows) / max(1e-9, config["seconds"]),
                "check": run.check,
                "peak_memory_used": peak,
                "failures": run.failures,
            }
        )
    )
    Path(config["history"]).write_text("".join(json.dumps(row) + "\n" for row in run.history))


def bench_memory(
    policies: Sequence[str], s: Settings, history_dir: str | None, bench: str = "memory"
) -> list[dict[str, Any]]:
    """``bench`` is ``memory`` (the window may be cut) or ``memory-floor`` (it may not)."""
    reason = memory_cgroup_unavailable()
    if reason:
        print(f"{bench}: skipped, cannot create a memory cgroup here: {reason}", flush=True)
        return [_row(bench, "-", "skipped", f"no writable memory cgroup: {reason}")]
    workload = memory_workload(floor=bench == "memory-floor")
    limit = s.memory_limit_mb * MB
    rows = [
        _row(
            bench,
            "-",
            "limit_mb",
            s.memory_limit_mb,
            f"< shuffle {workload.shuffle_mb} (floor {workload.shuffle_min_mb}) + prefetch {workload.prefetch_mb} MB",
            "MB",
        )
    ]
    for policy in policies:
        print(f"{bench}: {policy} for {s.memory_s:.0f} s under {s.memory_limit_mb} MB", flush=True)
        group = MemoryCgroup(limit)
        with tempfile.TemporaryDirectory(prefix="intune-bench-mem-") as tmp:
            cfg, out = Path(tmp) / "config.json", Path(tmp) / "result.json"
            cfg.write_text(
                json.dumps(
                    {
                        "policy": policy,
                        "seconds": s.memory_s,
                        "tick_s": s.tick_s,
                        "workload": asdict(workload),
                        "out": str(out),
                        "history": str(Path(tmp) / "history.jsonl"),
                    }
                )
            )
            code = (
                "import os, sys; open(sys.argv[2], 'w').write(str(os.getpid())); "
                "from intune.bench.tune_live import memory_child; memory_child(sys.argv[1])"
            )
            try:
                started = time.monotonic()
                child = subprocess.Popen([sys.executable, "-c", code, str(cfg), str(group.procs_file)])
                try:
                    rc = child.wait(timeout=s.memory_s + 120)
                except subprocess.TimeoutExpired:
                    child.kill()
                    rc = child.wait()
                lived = time.monotonic() - started
                stats = group.stats()
            finally:
                group.cleanup()
            result = json.loads(out.read_text()) if out.exists() else None
            saved = Path(tmp) / "history.jsonl"
            history = [json.loads(line) for line in saved.read_text().splitlines()] if saved.exists() else []
        killed = rc == -signal.SIGKILL or stats["oom_kill"] > 0
        rows += [
            _row(bench, policy, "oom_killed", killed, "no"),
            _row(bench, policy, "oom_kill_events", stats["oom_kill"], "= 0"),
            _row(bench, policy, "limit_hits_failcnt", stats["failcnt"], "", "count"),
            _row(bench, policy, "peak_usage_mb", stats["max_usage_bytes"] / MB, "", "MB"),
            _row(bench, policy, "child_exit", rc, "= 0"),
            _row(bench, policy, "child_lived_s", lived, "", "s"),
        ]
        _save_history(history_dir, f"{bench}-{policy}", history)
        if history:
            last = history[-1]["knobs"]
            buffers = {k: v for k, v in last.items() if k.endswith("buffer_mb")}
            rows.append(_row(bench, policy, "last_seen_buffers", _fmt_alloc(buffers), "", "MB"))
            window = last.get("shuffle.buffer_mb")
            rows.append(_row(bench, policy, "final_shuffle_mb", window, f">= {workload.shuffle_min_mb}", "MB"))
        if result is not None:
            rows.append(_row(bench, policy, "rows_per_s", result["rows_per_s"], "", "rows/s"))
            rows += _exactly_once_rows(bench, policy, result["check"])
            rows.append(_row(bench, policy, "tuner_failures", sum(result["failures"].values()), "= 0"))
    return rows


# -- CLI ----------------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="short phases (a few seconds each): a CI smoke run"
    )
    parser.add_argument(
        "--policies",
        default=None,
        help=f"comma-separated policies (default: {','.join(DEFAULT_POLICIES)}; intune only if it loads)",
    )
    parser.add_argument(
        "--only", default=None, help=f"comma-separated benchmarks among {','.join(BENCHMARKS)}"
    )
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument(
        "--md", metavar="PATH", help="write the per-policy summary and every row as Markdown to PATH"
    )
    parser.add_argument(
        "--history", metavar="DIR", help="write each run's tuner history as JSON lines under DIR"
    )
    parser.add_argument(
        "--tick", type=float, default=1.0, help="seconds between the tuner's decisions (default 1)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every benchmark this many times, interleaved (every policy once, then again, the order "
        "rotated by one place a round); the summary gives each figure's median and range (default 1)",
    )


def _split(text: str | None, valid: Sequence[str] | None, what: str) -> list[str] | None:
    if not text:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if valid is not None and n not in valid]
    if bad:
        raise SystemExit(f"unknown {what} {bad}; choose from {list(valid or [])}")
    return names


def default_policies() -> list[str]:
    """The default policy, the network (when its weights load) and the baselines they are compared with."""
    from intune.policies import make

    names = list(DEFAULT_POLICIES)
    try:
        make("network")
    except Exception as exc:  # noqa: BLE001 - missing weights or torch: compare the others
        print(f"network policy unavailable ({type(exc).__name__}: {exc}); comparing the others", flush=True)
        names.remove("network")
    return names


def rotated(policies: Sequence[str], turn: int) -> list[str]:
    """The policies in the order of round ``turn + 1``: moved along by one place a round, so that no policy
    always runs first after the searches (which end on one CPU) or last before the next round's."""
    k = turn % len(policies) if policies else 0
    return [*policies[k:], *policies[:k]]


def run(args: argparse.Namespace) -> int:
    from intune import monitor
    from intune.policies import POLICY_NAMES

    policies = _split(args.policies, POLICY_NAMES, "policies") or default_policies()
    only = _split(args.only, BENCHMARKS, "benchmarks") or list(BENCHMARKS)
    rounds = int(args.rounds)
    if rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {rounds}")
    settings = Settings.make(bool(args.quick), float(args.tick))
    full = int(monitor.available_cpus())
    resize = "resize" in only and full >= 2
    searched = ([full] if "convergence" in only or resize else []) + ([1] if resize else [])
    searches: dict[int, list[wl.SearchResult]] = {c: [] for c in searched}
    rows: list[dict[str, Any]] = []
    print(f"policies compared: {', '.join(policies)}", flush=True)
    for r in range(1, rounds + 1):
        # rounds outermost: the policies' repeats and the searches share the machine's slow and fast spells alike
        history = str(Path(args.history) / f"round{r}") if args.history and rounds > 1 else args.history
        found: list[dict[str, Any]] = []
        for cpus in searched:
            print(f"search: {len(wl.allocations(settings.search_grid))} allocations at {cpus} CPUs", flush=True)
            searches[cpus].append(
                wl.search_best(
                    wl.Workload(), settings.search_grid, settings.warmup_s, settings.measure_s,
                    cpus if cpus != full else None, rotate=r - 1,
                )
            )
        turn = rotated(policies, r - 1)
        if "convergence" in only:
            found += bench_convergence(turn, settings, history)
        if "resize" in only:
            if resize:
                found += bench_resize(turn, settings, full, history)
            else:
                found.append(_row("resize", "-", "skipped", f"needs 2 CPUs, this process has {full}"))
        for bench in ("memory", "memory-floor"):
            if bench in only:
                found += bench_memory(turn, settings, history, bench)
        rows += [{"round": r, **row} for row in found]
    reference = {c: wl.median_search(found_searches) for c, found_searches in searches.items()}
    rows += scored_rows(rows, reference, settings, full)
    print(format_table([r for r in rows if r["metric"] != "rates_per_s"], ROW_COLUMNS))
    search_rows = {
        str(c): [
            {
                "allocation": alloc,
                "rows_per_s": rate,
                "rounds": [found_search.measured[i][1] for found_search in searches[c]],
            }
            for i, (alloc, rate) in enumerate(res.measured)
        ]
        for c, res in reference.items()
    }
    if args.json:
        write_json(
            args.json,
            rows,
            benchmark="tune",
            policies=policies,
            quick=bool(args.quick),
            rounds=rounds,
            settings=asdict(replace(settings)),
            searches=search_rows,
        )
    if args.md:
        command = md_report.command_line(("bench", "tune"))
        report = markdown_report(rows, search_rows, asdict(settings), command, machine_info())
        print(f"wrote {md_report.write(args.md, report)}")
    return 0


# -- the Markdown report ------------------------------------------------------------------------------


def markdown_report(
    rows: Sequence[dict[str, Any]],
    searches: dict[str, list[dict[str, Any]]],
    settings: dict[str, Any],
    command: str,
    machine: dict[str, Any],
) -> str:
    """Command, date and machine; one row per policy (the README's table); the searches; where every row is.

    Takes what ``--json`` writes (results, searches, settings), so the report and the file agree.
    """
    rounds = max((int(r.get("round", 1)) for r in rows), default=1)
    runs = (
        "once per benchmark: one run each, so no spread"
        if rounds == 1
        else f"{rounds} times per benchmark, interleaved (every policy once, then again, the order rotated "
        "by one place a round); a figure of several runs is their median (range over the runs); the search "
        "is measured in every round, beside the runs, and the best is the allocation whose median over the "
        "rounds is highest"
    )
    context = [
        md_report.load_line(),
        f"Each policy ran {runs} ({settings['run_s']:.0f} s convergence runs, "
        f"{settings['phase_s']:.0f} s resize phases, {settings['memory_s']:.0f} s under a "
        f"{settings['memory_limit_mb']} MB memory cgroup, a decision every {settings['tick_s']:g} s).",
    ]
    sections = [
        md_report.section("Per policy", rows=summary_rows(rows, settings["tail_s"])),
        md_report.section(
            "Exhaustive search",
            ["Rows/s of every allocation of the grid, measured live, by the CPUs the process had: the median "
             "(range) over the rounds, each round's search starting one allocation further along the grid."],
            search_table(searches),
        ),
        md_report.section(
            "Every row",
            [f"The {len(rows)} measured rows ({', '.join(ROW_COLUMNS)}) are in the `--json` file this command "
             "wrote beside this page: a table of them would be most of the page."],
        ),
    ]
    return md_report.render(command, machine, context, sections)


def summary_rows(rows: Sequence[dict[str, Any]], tail_s: float) -> list[dict[str, str]]:
    """One row per policy: convergence, resize phases, memory limit, exactly-once (a dash: not run)."""
    policies = [p for p in dict.fromkeys(r["policy"] for r in rows) if p not in ("exhaustive", "-")]
    return [_policy_summary(p, [r for r in rows if r["policy"] == p], tail_s) for p in policies]


def _policy_summary(policy: str, rows: list[dict[str, Any]], tail_s: float) -> dict[str, str]:
    """A metric never reached (``None``) reads ``never``; a metric not measured reads ``-``; one
    measured in several rounds reads its median and range (``_rounds_cell``)."""
    got: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        got.setdefault((r["benchmark"], r["metric"]), []).append(r["value"])

    def cell(benchmark: str, metric: str, fmt: str) -> str:
        if (benchmark, metric) not in got:
            return "-"
        return _rounds_cell(got[(benchmark, metric)], fmt)

    phases = sorted(
        {m for b, m in got if b == "resize" and m.startswith("phase") and m.endswith("_rows_per_s")}
    )
    checked = [r["value"] for r in rows if r["metric"] in ("rows_missing", "rows_repeated")]
    return {
        "policy": policy,
        f"rows/s, last {tail_s:.0f} s": cell("convergence", f"rows_per_s_last_{tail_s:.0f}s", ",.0f"),
        "x search best": cell("convergence", "fraction_of_best", ".2f"),
        "s to 90%": cell("convergence", "time_to_90pct_s", ".0f"),
        "resize CPUs": " / ".join(m.split("_")[1].removesuffix("cpu") for m in phases) or "-",
        "resize rows/s": " / ".join(cell("resize", m, ",.0f") for m in phases) or "-",
        "resize s to 90%": " / ".join(
            cell("resize", m.replace("_rows_per_s", "_reconverge_s"), ".0f") for m in phases
        )
        or "-",
        "memory: OOM-killed": cell("memory", "oom_killed", ""),
        "memory: rows/s": cell("memory", "rows_per_s", ",.0f"),
        "memory: peak MB": cell("memory", "peak_usage_mb", ",.0f"),
        "memory: final shuffle MB": cell("memory", "final_shuffle_mb", ",.0f"),
        f"floor {SHUFFLE_FLOOR_MB} MB: OOM-killed": cell("memory-floor", "oom_killed", ""),
        "floor: rows/s": cell("memory-floor", "rows_per_s", ",.0f"),
        "floor: peak MB": cell("memory-floor", "peak_usage_mb", ",.0f"),
        "rows lost or repeated": _fmt(sum(checked), ",.0f") if checked else "-",
    }


def _rounds_cell(values: Sequence[Any], fmt: str) -> str:
    """One round's value as it is (``None``: ``never``); several rounds' numbers as ``median (min–max
    over N runs)``, a never-reached round counting as later than any time (so a median may be
    ``never``); flags as ``yes`` / ``no``, or ``yes in K of N`` where the rounds disagree."""
    if len(values) == 1:
        return "never" if values[0] is None else _fmt(values[0], fmt)
    if all(isinstance(v, bool) for v in values):
        hits = sum(values)
        return _fmt(hits == len(values), fmt) if hits in (0, len(values)) else f"yes in {hits} of {len(values)}"
    if not all(v is None or isinstance(v, (int, float)) for v in values):
        return " / ".join("never" if v is None else _fmt(v, fmt) for v in values)
    if all(v is None for v in values):
        return f"never ({len(values)} runs)"
    numbers = sorted(float("inf") if v is None else float(v) for v in values)
    median = statistics.median(numbers)

    def show(x: float) -> str:
        return "never" if math.isinf(x) else _fmt(x, fmt)

    return f"{show(median)} ({show(numbers[0])}–{show(numbers[-1])} over {len(numbers)} runs)"


def search_table(searches: dict[str, list[dict[str, Any]]]) -> list[dict[str, str]]:
    """One row per allocation, one column per CPU count searched: its measured rows/s."""
    cells: dict[str, dict[str, str]] = {}
    for cpus, measured in searches.items():
        for m in measured:
            row = cells.setdefault(_fmt_alloc(m["allocation"]), {"allocation": _fmt_alloc(m["allocation"])})
            rounds = m.get("rounds") or [m["rows_per_s"]]
            row[f"rows/s, {cpus} CPUs"] = (
                _fmt(m["rows_per_s"], ",.0f")
                if len(rounds) == 1
                else f"{_fmt(m['rows_per_s'], ',.0f')} ({_fmt(min(rounds), ',.0f')}–{_fmt(max(rounds), ',.0f')})"
            )
    return list(cells.values())


def _fmt(value: Any, fmt: str) -> str:
    """``value`` in ``fmt``; booleans as yes / no, text as it is."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str) or not fmt:
        return str(value)
    return format(value, fmt)
