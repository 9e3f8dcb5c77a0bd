"""``intune bench sim``: every policy on every simulated workload, the paper's Figures 7 and 8 in simulation.

Owns the benchmark's runs and metrics: Figure 7 (each policy over the resize schedule 32 -> 64 -> 128 ->
64 -> 32 on ``criteo`` and ``production``: throughput normalised to ``none``, ratio to ``oracle``, OOMs,
ticks to 95% of the phase optimum after each resize, CPU utilisation), Figure 8 (throughput normalised
to ``autotune`` against pipeline length, CPU count and batch size) and the simulator's own speed.
``--md`` writes every workload's row and a per-policy summary over all of them (``markdown_report``).
A policy whose module does not import is skipped with a note, and a policy that fails mid-run is
reported as failed; neither stops the run. It must not tune anything itself.
"""

from __future__ import annotations

import argparse
import time
import traceback
from typing import Any

import numpy as np

from intune.bench import md_report
from intune.policies import POLICY_NAMES, make
from intune.results import format_table, machine_info, write_json
from intune.sim import (
    Simulator,
    constant_schedule,
    convergence_ticks,
    ladder_workload,
    load_workload,
    paper_schedule,
    run_episode,
)
from intune.sim.episode import EpisodeResult

# criteo and production as in Figure 7; production in a 48 GB cgroup shows Figure 5B's OOMs: memory that
# AUTOTUNE's RAM budget does not count (process workers, the shuffle buffer) fills the limit.
FIG7_WORKLOADS = ("criteo", "production", "production@mem=48")
FIG8_CPUS = (8, 16, 32, 64, 128)
FIG8_BATCHES = (4096, 8192, 16384, 32768, 65536)
FIG8_LADDER = (2, 3, 4, 5, 6, 7)
TIE = 0.01
"""Throughputs within this share of each other count as a tie in the Markdown report (best-policy counts,
intune's losses): the policies share the seed, so their noise is common, and 1% is above what is left."""
PANELS = {
    "fig7": "Fig. 7: resize",
    "fig8a": "Fig. 8a: stages",
    "fig8b": "Fig. 8b: CPUs",
    "fig8c": "Fig. 8c: batch",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload",
        action="append",
        help="a shipped name or a .yaml/.json path (repeatable); "
        "default: criteo, production and production@mem=48, plus the Figure 8 panels",
    )
    parser.add_argument("--quick", action="store_true", help="short phases and fewer variants (< 2 minutes)")
    parser.add_argument("--json", metavar="PATH", help="write {machine, results} here")
    parser.add_argument(
        "--plot", metavar="PATH", help="write the Figure 7 plot here (Figure 8 beside it, *-fig8.png)"
    )
    parser.add_argument(
        "--period",
        type=int,
        default=None,
        help="ticks per phase of the resize schedule (default 600, quick 120)",
    )
    parser.add_argument(
        "--policies", default=None, help="comma-separated subset of " + ",".join(POLICY_NAMES)
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-fig8", action="store_true", help="skip the Figure 8 panels")
    parser.add_argument(
        "--md",
        metavar="PATH",
        help="write Markdown here: every workload's row, a per-policy summary, where intune loses",
    )


def _available(names: list[str]) -> tuple[list[str], list[str]]:
    ok, notes = [], []
    for name in names:
        try:
            make(name)
            ok.append(name)
        except Exception as e:  # a policy another engineer has not finished must not stop the benchmark
            notes.append(f"skipped {name}: {type(e).__name__}: {e}")
    return ok, notes


def _episode(
    spec, schedule, policy_name: str, ticks: int, seed: int
) -> tuple[EpisodeResult | None, str | None]:
    sim = Simulator(spec, cpus=schedule, seed=seed)
    try:
        return run_episode(sim, make(policy_name), ticks), None
    except Exception as e:
        return (
            None,
            f"{policy_name} failed on {spec.name}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}",
        )


def _metrics(spec, schedule, runs: dict[str, EpisodeResult]) -> list[dict[str, Any]]:
    none = runs.get("none")
    oracle = runs.get("oracle")
    rows = []
    for name, r in runs.items():
        conv = (
            convergence_ticks(r.model_throughput, oracle.model_throughput, schedule.phases())
            if oracle is not None
            else None
        )
        mean = float(r.throughput.mean())
        rows.append(
            {
                "workload": spec.name,
                "policy": name,
                "throughput_norm": mean / float(none.throughput.mean()) if none is not None else None,
                "oracle_ratio": mean / float(oracle.throughput.mean()) if oracle is not None else None,
                "ooms": r.oom_count,
                "convergence_ticks": conv,
                "cpu_util": r.cpu_util,
                "rows_per_s": mean,
            }
        )
    return rows


def _conv_cell(conv: list[int | None] | None) -> str:
    if conv is None:
        return "-"
    done = [c for c in conv if c is not None]
    mean = f"{np.mean(done):.0f}" if done else "never"
    return f"{mean} ({len(done)}/{len(conv)})"


def simulator_speed(seconds: float = 1.0) -> tuple[float, float]:
    """Ticks per wall second and per CPU second of ``Simulator.step`` on criteo (5 stages), no policy.

    The CPU-second rate is what one core does, whatever else shares the machine.
    """
    sim = Simulator("criteo", cpus=64)
    sim.reset()
    for knob in sim.knobs.values():
        if knob.unit == "cpu":
            knob.set(12)
    n, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for _ in range(500):
            sim.step()
        n += 500
    return n / (time.perf_counter() - start), n / max(time.process_time() - cpu0, 1e-9)


def written_files(args: argparse.Namespace) -> list[str]:
    """Files this command writes besides ``--json``, ``--md`` and ``--plot`` (``intune.bench.files``)."""
    from intune.sim.plots import figure8_path

    with_figure8 = args.plot and not args.workload and not args.no_fig8
    return [str(figure8_path(args.plot))] if with_figure8 else []


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    period = args.period or (120 if args.quick else 600)
    wanted = args.policies.split(",") if args.policies else list(POLICY_NAMES)
    policies, notes = _available(wanted)
    for note in notes:
        print(note)
    results: list[dict[str, Any]] = []
    traces: dict[str, dict[str, EpisodeResult]] = {}
    schedule = paper_schedule(period)
    for workload in args.workload or FIG7_WORKLOADS:
        spec = load_workload(workload)
        runs: dict[str, EpisodeResult] = {}
        for name in policies:
            r, err = _episode(spec, schedule, name, schedule.length_ticks, args.seed)
            if err:
                print(err)
            else:
                runs[name] = r
        traces[spec.name] = runs
        rows = _metrics(spec, schedule, runs)
        for row in rows:
            row["panel"] = "fig7"
        results += rows
        print(f"\n{spec.name}: schedule {'->'.join(map(str, schedule.levels))} CPUs, {period} ticks each")
        print(
            format_table(
                [{**r, "convergence_ticks": _conv_cell(r["convergence_ticks"])} for r in rows],
                [
                    "policy",
                    "throughput_norm",
                    "oracle_ratio",
                    "ooms",
                    "convergence_ticks",
                    "cpu_util",
                    "rows_per_s",
                ],
            )
        )
    fig8: dict[str, list[dict[str, Any]]] = {}
    if not args.workload and not args.no_fig8:
        fig8 = _figure8(policies, args.quick, args.seed)
        for panel, rows in fig8.items():
            results += rows
            _print_panel(panel, rows, policies)
    speed, speed_cpu = simulator_speed(1.0 if args.quick else 3.0)
    print(
        f"\nsimulator speed: {speed:,.0f} ticks per wall second, {speed_cpu:,.0f} per CPU second "
        "(criteo, 5 stages, one process)"
    )
    print(f"machine: {machine_info().get('usable_cpus')} CPUs; wall time {time.perf_counter() - t0:.0f} s")
    if args.json:
        write_json(
            args.json,
            results,
            simulator_ticks_per_s=speed,
            simulator_ticks_per_cpu_s=speed_cpu,
            period_ticks=period,
            notes=notes,
        )
        print(f"wrote {args.json}")
    if args.md:
        context = _context_lines(
            period, None if args.workload or args.no_fig8 else fig8_ticks(args.quick), notes
        )
        report = markdown_report(results, policies, machine_info(), _command_line(args), context)
        print(f"wrote {md_report.write(args.md, report)}")
    if args.plot:
        from intune.sim.plots import plot_figure7, plot_figure8

        print(f"wrote {plot_figure7(args.plot, traces)}")
        if fig8:
            print(f"wrote {plot_figure8(args.plot, fig8)}")
    return 0


def _figure8(policies: list[str], quick: bool, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Constant-CPU runs of the drill-downs (model latency 0), normalised to autotune."""
    ticks = fig8_ticks(quick)
    panels = {
        "fig8a": [
            ("stages", k, ladder_workload(k)) for k in (FIG8_LADDER[::2] + (7,) if quick else FIG8_LADDER)
        ],
        "fig8b": [
            ("cpus", c, load_workload("production", cpus=c, model_latency_s=0.0))
            for c in ((8, 32, 128) if quick else FIG8_CPUS)
        ],
        "fig8c": [
            ("batch_size", b, load_workload("production", batch_size=b, model_latency_s=0.0))
            for b in ((4096, 32768) if quick else FIG8_BATCHES)
        ],
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for panel, variants in panels.items():
        rows = []
        for param, value, spec in variants:
            schedule = constant_schedule(spec.machine.cpus, ticks)
            runs = {}
            for name in policies:
                r, err = _episode(spec, schedule, name, ticks, seed)
                if err:
                    print(err)
                else:
                    runs[name] = r
            auto = runs.get("autotune")
            for row in _metrics(spec, schedule, runs):
                row.update(
                    panel=panel,
                    param=param,
                    value=value,
                    autotune_ratio=row["rows_per_s"] / float(auto.throughput.mean()) if auto else None,
                )
                rows.append(row)
        out[panel] = rows
    return out


def _print_panel(panel: str, rows: list[dict[str, Any]], policies: list[str]) -> None:
    if not rows:
        return
    param = rows[0]["param"]
    values = sorted({r["value"] for r in rows})
    table = []
    for name in policies:
        line: dict[str, Any] = {"policy": name}
        for v in values:
            hit = [r for r in rows if r["policy"] == name and r["value"] == v]
            line[f"{param}={v}"] = hit[0]["autotune_ratio"] if hit else None
        table.append(line)
    print(f"\n{panel}: throughput / autotune's, by {param} (model latency 0)")
    print(format_table(table))


def fig8_ticks(quick: bool) -> int:
    """Ticks of each Figure 8 run (constant CPUs)."""
    return 150 if quick else 600


# ------------------------------------------------------------------------------------ the Markdown report


def _command_line(args: argparse.Namespace) -> str:
    """The command as typed, rebuilt from the parsed options (``sys.argv`` is not ours under a test)."""
    parts = ["intune bench sim"]
    parts += [f"--workload {w}" for w in args.workload or ()]
    parts += ["--quick"] if args.quick else []
    for flag in ("json", "plot", "md", "period", "policies"):
        value = getattr(args, flag)
        parts += [f"--{flag} {value}"] if value is not None else []
    parts += [f"--seed {args.seed}"] if args.seed else []
    parts += ["--no-fig8"] if args.no_fig8 else []
    return " ".join(parts)


def _context_lines(period: int, fig8: int | None, notes: list[str]) -> list[str]:
    """How the runs were made: the schedules, and any policy that was skipped."""
    lines = [
        f"Figure 7 panels: CPUs 32 -> 64 -> 128 -> 64 -> 32, {period} ticks per phase, the workload's trainer."
    ]
    if fig8 is not None:
        lines.append(
            f"Figure 8 panels: the panel's CPUs for {fig8} ticks, model latency 0 (unbounded demand)."
        )
    return lines + [f"Note: {n}" for n in notes]


def _workloads(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(panel, workload)`` pairs in the order they ran."""
    return list(dict.fromkeys((r["panel"], r["workload"]) for r in results))


def _rows_of(results: list[dict[str, Any]], panel: str, workload: str) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in results if r["panel"] == panel and r["workload"] == workload}


def best_policies(rows: dict[str, dict[str, Any]]) -> set[str]:
    """Non-oracle policies within ``TIE`` of the highest non-oracle throughput (each tied one counts)."""
    rival = {p: r["rows_per_s"] for p, r in rows.items() if p != "oracle"}
    top = max(rival.values(), default=0.0)
    return {p for p, v in rival.items() if top > 0 and v >= (1.0 - TIE) * top}


def summary_rows(results: list[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """Per policy over every workload: mean and worst ratio to the oracle, workloads where it is best
    among the non-oracle policies, total OOMs. The mean weighs each workload alike."""
    keys = _workloads(results)
    tables = [_rows_of(results, *k) for k in keys]
    out = []
    for name in policies:
        mine = [(k, t[name]) for k, t in zip(keys, tables, strict=True) if name in t]
        ratios = [(r["oracle_ratio"], k[1]) for k, r in mine if r["oracle_ratio"] is not None]
        worst = min(ratios, default=None)
        out.append(
            {
                "policy": name,
                "workloads": len(mine),
                "mean / oracle": f"{np.mean([v for v, _ in ratios]):.3f}" if ratios else None,
                "worst / oracle": f"{worst[0]:.2f} ({worst[1]})" if worst else None,
                "best": "-" if name == "oracle" else sum(name in best_policies(t) for t in tables),
                "OOMs": sum(r["ooms"] for _, r in mine),
            }
        )
    return out


def ties_or_beats(results: list[dict[str, Any]], policy: str = "intune") -> list[str]:
    """One line per workload where another non-oracle policy's throughput is at least ``1 - TIE`` of
    ``policy``'s: its losses and ties, to read beside its wins."""
    lines = []
    for key in _workloads(results):
        rows = _rows_of(results, *key)
        if policy not in rows:
            continue
        mine = rows[policy]["rows_per_s"]
        rivals = sorted(
            (
                (r["rows_per_s"] / mine, p)
                for p, r in rows.items()
                if p not in (policy, "oracle") and mine > 0
            ),
            reverse=True,
        )
        hits = [f"{p} {v:.3f}x" for v, p in rivals if v >= 1.0 - TIE]
        if hits:
            ratio = rows[policy]["oracle_ratio"]
            mark = f"{ratio:.2f} of the oracle" if ratio is not None else "no oracle"
            lines.append(f"- {key[1]} ({PANELS.get(key[0], key[0])}): {policy} {mark}; " + ", ".join(hits))
    return lines


def _cell(row: dict[str, Any] | None) -> str:
    """``throughput / none · ratio to the oracle · OOMs · convergence``."""
    if row is None:
        return "-"
    norm = "-" if row["throughput_norm"] is None else f"{row['throughput_norm']:.1f}"
    ratio = "-" if row["oracle_ratio"] is None else f"{row['oracle_ratio']:.2f}"
    return f"{norm} · {ratio} · {row['ooms']} · {_conv_cell(row['convergence_ticks'])}"


def workload_rows(results: list[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """One row per workload, one cell per policy (``_cell``)."""
    out = []
    for panel, workload in _workloads(results):
        rows = _rows_of(results, panel, workload)
        out.append(
            {
                "panel": PANELS.get(panel, panel),
                "workload": workload,
                **{p: _cell(rows.get(p)) for p in policies},
            }
        )
    return out


def markdown_report(
    results: list[dict[str, Any]],
    policies: list[str],
    machine: dict[str, Any],
    command: str,
    context: list[str],
) -> str:
    """The command, date and machine; the per-policy summary; intune's losses and ties; every workload.

    The layout is ``md_report``'s, shared by every ``intune bench ... --md``."""
    n = len(_workloads(results))
    summary = md_report.section(
        f"Summary over all {n} workloads",
        [
            "Ratio to the oracle's mean throughput, the mean weighing each workload alike (most workloads are",
            f"variants of production); best: within {TIE:.0%} of the highest non-oracle throughput (ties count for",
            "each); OOMs: kills over all workloads.",
        ],
        summary_rows(results, policies),
    )
    losses: list[str] = []
    if "intune" in policies:
        losses = md_report.section(
            f"Where intune loses or ties (another policy within {TIE:.0%} of it, or above)",
            ties_or_beats(results) or ["- nowhere"],
        )
    every = md_report.section(
        "Every workload",
        [
            "Cell: throughput / none's · ratio to the oracle · OOMs · convergence (mean ticks to 95% of the",
            "phase optimum after the start and each resize, over the phases that reached it; reached / phases).",
        ],
        workload_rows(results, policies),
    )
    return md_report.render(command, machine, context, [summary, losses, every])
