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

from intune.bench.results import format_table

Rows = Sequence[Mapping[str, Any]]


def command_line(path: Sequence[str], argv: Sequence[str] | None = None) -> str:
    """``intune`` and the arguments this process was started with, quoted as a shell needs them.

    ``sys.argv[0]`` is whatever launched us (the ``intune`` script, ``python -m intune.cli``), so it
    is replaced by ``intune``. When the arguments do not start with ``path`` (``cli.main`` called
    from Python, as tests do), they are not this command's and only ``intune <path>`` is written,
    marked as such, rather than another program's arguments.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[: len(path)] != list(path):
        return shlex.join(["intune", *path]) + " (called from Python; options not recorded)"
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


def write(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path``, creating its folder; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out
