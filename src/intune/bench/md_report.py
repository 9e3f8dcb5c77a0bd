"""The Markdown report every ``intune bench ... --md PATH`` writes: command, date, machine, tables.

A benchmark's figures are only evidence when a reader can see how they were made, so every report
opens the same way: the exact command line, the date (UTC, ISO 8601) and the machine, as
``results.machine_info`` describes it in the JSON files. Then come the benchmark's own context lines
and its sections, each a heading, a few lines of text and a table given as rows (printed with
``results.format_table``, the same table the terminal shows). Where a figure has repeats (runs,
folds, raises), ``spread`` writes it as "median (min–max over N runs)", so that no single repeat
stands for the rest. This module owns the layout only: it must not run or judge anything.
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from intune.results import format_table

Rows = Sequence[Mapping[str, Any]]
NOT_RECORDED = " (called from Python; options not recorded)"


def command_line(path: Sequence[str], argv: Sequence[str] | None = None) -> str:
    """``intune`` and the arguments this process was started with, quoted as a shell needs them.

    ``sys.argv[0]`` is whatever launched us (the ``intune`` script, ``python -m intune.cli``), so it
    is replaced by ``intune``. When the arguments do not start with ``path`` (``cli.main`` called
    from Python, as tests do), they are not this command's and only ``intune <path>`` is written,
    marked as such, rather than another program's arguments.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[: len(path)] != list(path):
        return shlex.join(["intune", *path]) + NOT_RECORDED
    return shlex.join(["intune", *args])


def machine_line(machine: Mapping[str, Any]) -> str:
    """The date and the machine in one line, from a ``machine_info()`` dict (missing keys: None)."""
    return (
        f"Date: {machine.get('time_utc')}. Machine: {machine.get('usable_cpus')} usable CPUs of "
        f"{machine.get('host_cpus')}, {machine.get('platform')}, Python {machine.get('python')}, "
        f"numpy {machine.get('numpy')}."
    )


def load_line() -> str:
    """The 1-minute load average as the report is written: how busy a shared machine was."""
    try:
        return f"Load average (1 min) when this was written: {os.getloadavg()[0]:.1f}."
    except OSError:  # not every platform has one
        return "Load average: not available on this platform."


def spread(values: Sequence[float], fmt: str = ".3g", unit: str = "runs") -> str:
    """``median (min–max over N runs)``; one value alone is marked ``(1 run)``; none is ``-``.

    The median, not the best or the mean, stands for the repeats: one lucky or unlucky repeat on a
    shared machine moves it least. The range beside it says how far the repeats disagree.
    """
    if not values:
        return "-"
    median = format(statistics.median(values), fmt)
    if len(values) == 1:
        return f"{median} (1 {unit.removesuffix('s')})"
    return f"{median} ({format(min(values), fmt)}–{format(max(values), fmt)} over {len(values)} {unit})"


def section(
    title: str, text: Sequence[str] = (), rows: Rows | None = None, columns: Sequence[str] | None = None
) -> list[str]:
    """``## title``, the text lines, then the table of ``rows`` (in ``columns`` order), blank-separated."""
    lines = [f"## {title}", ""]
    if text:
        lines += [*text, ""]
    if rows is not None:
        lines += [format_table(rows, columns), ""]
    return lines


def render(
    command: str, machine: Mapping[str, Any], context: Sequence[str], sections: Sequence[Sequence[str]]
) -> str:
    """The whole report: ``# `command```, the date and machine line, the context lines, the sections."""
    lines = [f"# `{command}`", "", machine_line(machine), ""]
    if context:
        lines += [*context, ""]
    for part in sections:
        lines += part
    return "\n".join(lines)


def recorded_command(text: str) -> list[str] | None:
    """The arguments after ``intune`` of the command a report written by ``render`` records on its first
    line; None where the report records none (a command called from Python, or not a report)."""
    first = text.partition("\n")[0]
    if not (first.startswith("# `intune ") and first.endswith("`")) or first.endswith(NOT_RECORDED + "`"):
        return None
    args = shlex.split(first[len("# `") : -1])
    return args[1:]


def write(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path``, creating its folder; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


# ------------------------------------------------------------------------------- intune bench agent


def _num(value: Any, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _mean_worst_cell(mean: Any, worst: Any, where: Any) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f} / {worst:.3f} ({where})"


def _per_workload(rows: Rows) -> tuple[list[dict[str, Any]], list[str]]:
    """One line per (workload, period), a cell per policy: ratio · OOMs · phases within 30 ticks."""
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        line = cells.setdefault((r["workload"], r["period"]), {"workload": r["workload"], "period": r["period"]})
        conv = r["convergence_ticks"]
        done = sum(c is not None and c <= 30 for c in conv)
        line[r["policy"]] = f"{r['optimum_ratio']:.3f} · {r['ooms']} · {done}/{len(conv)}"
    return list(cells.values()), ["workload", "period", *policies]


def agent_report(
    command: str,
    machine: Mapping[str, Any],
    context: Sequence[str],
    summary: Rows,
    losses: Sequence[str],
    episodes: Rows,
    ooms: Rows,
    decision: Rows,
) -> str:
    """``intune bench agent --md``: the per-policy summary, intune against autotune and steer on the
    held-out specs, its losses beside its wins, every shipped workload, the OOMs, the decision time.

    Every figure is already computed by ``intune.bench.agent``; this only lays them out."""
    table = [
        {
            "policy": r["policy"],
            "period": r["period"],
            "shipped: mean / worst": _mean_worst_cell(
                r["shipped_mean"], r["shipped_worst"], r["shipped_worst_workload"]
            ),
            "held-out: mean / worst": _mean_worst_cell(
                r["held_out_mean"], r["held_out_worst"], r["held_out_worst_workload"]
            ),
            "a waiting stage: mean / worst": _mean_worst_cell(
                r.get("waiting_mean"), r.get("waiting_worst"), r.get("waiting_worst_workload")
            ),
            "small machines: mean / worst": _mean_worst_cell(
                r.get("small_mean"), r.get("small_worst"), r.get("small_worst_workload")
            ),
            "phases at 95% within 30 ticks": (
                f"{r['phases_within_30']} ({r['phases_within_30_share']:.0%})"
                if r["phases_within_30_share"] is not None
                else "-"
            ),
            "OOMs": r["ooms"],
        }
        for r in summary
    ]
    parts = [
        section(
            "Summary",
            [
                "Ratio to the phase optimum (mean model throughput / mean optimum), the mean weighing each workload",
                "alike; worst with its workload. Held-out and waiting specs: random ones (the waiting ones with a map",
                "stage that waits on I/O or the GIL). Small machines: the live benchmark's pipeline (tune-live) and the",
                "waiting specs on the small machines' schedule. Phases: those reaching 95% of their optimum within 30",
                "ticks of their start, over every workload. OOMs: ticks killed, over every workload.",
            ],
            table,
        )
    ]
    agents = [r for r in summary if "vs_autotune_specs" in r]
    if agents:
        parts.append(
            section(
                "The agent against autotune and steer on the held-out specs",
                [
                    "Per held-out spec where autotune had no OOM: the agent's ratio / autotune's, the worst and how many",
                    "are below 0.98; and the mean of its ratio / steer's over the held-out specs, over the waiting ones and",
                    "over the small machines' runs (- where steer did not run). `oracle-safe`, the clairvoyant optimum within the",
                    "memory margins every policy's safety layer keeps, bounds what any policy held to them can reach.",
                ],
                [
                    {
                        "policy": r["policy"],
                        "period": r["period"],
                        "/ autotune: worst": (
                            f"{r['vs_autotune_min']:.3f} ({r['vs_autotune_min_workload']})"
                            if r["vs_autotune_min"] is not None
                            else "-"
                        ),
                        "below 0.98": f"{r['vs_autotune_below_0.98']} of {r['vs_autotune_specs']}",
                        "/ steer: mean": _num(r["vs_steer_mean"]),
                        "/ steer on the waiting specs: mean": _num(r.get("vs_steer_waiting_mean")),
                        "/ steer on small machines: mean": _num(r.get("vs_steer_small_mean")),
                    }
                    for r in agents
                ],
            )
        )
    if losses:
        parts.append(
            section("Where intune is below autotune or steer (held-out specs, beside its wins)", losses)
        )
    shipped = [r for r in episodes if r["group"] == "shipped"]
    if shipped:
        parts.append(
            section(
                "Every shipped workload",
                [
                    "Cell: ratio to the phase optimum · OOMs · phases at 95% within 30 ticks. Held-out specs: the JSON."
                ],
                *_per_workload(shipped),
            )
        )
    live = [r for r in episodes if r["group"] == "small" and r["workload"] == "tune-live"]
    if live:
        levels = " -> ".join(map(str, live[0].get("cpu_levels", [])))
        parts.append(
            section(
                "The live benchmark's pipeline on small machines",
                [
                    f"tune-live (`intune bench tune`'s pipeline as a spec) on {levels} CPUs. Cell: ratio to the phase",
                    "optimum · OOMs · phases at 95% within 30 ticks. The waiting specs' small-machine rows: the JSON.",
                ],
                *_per_workload(live),
            )
        )
    if ooms:
        parts.append(
            section(
                "OOMs over randomised tight-memory episodes",
                [
                    "The same episodes for each policy: random specs with a tight memory limit, random resizes."
                ],
                [
                    {
                        "policy": r["policy"],
                        "episodes": r["episodes"],
                        "ticks each": r["ticks"],
                        "OOM ticks": r["ooms"],
                        "episodes with an OOM": f"{r['episodes_with_oom']} ({r['oom_rate']:.1%})",
                    }
                    for r in ooms
                ],
            )
        )
    if decision:
        parts.append(
            section(
                "Decision time (criteo, 128 CPUs)",
                ["Wall ms per tick of `policy.step`, and of the runner's clamp and apply of its request."],
                [
                    {
                        "policy": r["policy"],
                        "step median ms": _num(r["median_ms"], ".3g"),
                        "step p99 ms": _num(r["p99_ms"], ".3g"),
                        "clamp median ms": _num(r["clamp_median_ms"], ".3g"),
                        "clamp p99 ms": _num(r["clamp_p99_ms"], ".3g"),
                    }
                    for r in decision
                ],
            )
        )
    return render(command, machine, context, parts)
