"""``intune report HISTORY.jsonl --out PNG``: plot a tuner's history over time.

Owns reading the JSON lines that ``Tuner.save`` writes, summarising them and drawing them (throughput,
the allocation per knob: workers against the CPUs available, buffers in MB; memory used against its
limit; the reward), for the ``intune report`` command and for ``intune demo``. It must not run a
pipeline or a policy.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from intune.results import format_table, save_figure


def load_history(path: str | Path) -> list[dict[str, Any]]:
    """The ticks of a history file; a malformed line raises ``ValueError`` naming the file and line."""
    rows: list[dict[str, Any]] = []
    with Path(path).open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {number} is not JSON ({exc.msg})") from None
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One line of figures: ticks, mean and last-quarter throughput, final knobs, decision time."""
    if not rows:
        return {"ticks": 0}
    tail = rows[-max(1, len(rows) // 4) :]
    ms = [r["decision_ms"] for r in rows if r.get("decision_ms") is not None]
    return {
        "ticks": len(rows),
        "mean_rows_per_s": sum(r["throughput"] for r in rows) / len(rows),
        "last_quarter_rows_per_s": sum(r["throughput"] for r in tail) / len(tail),
        "peak_memory_fraction": max(
            (r["memory_used"] / r["memory_limit"] for r in rows if r.get("memory_limit")), default=0.0
        ),
        "mean_decision_ms": sum(ms) / len(ms) if ms else None,
        "errors": sum(1 for r in rows if r.get("error")),
        "final_knobs": " ".join(f"{k}={v}" for k, v in rows[-1].get("knobs", {}).items()),
    }


def plot_history(rows: Sequence[dict[str, Any]], out: str | Path, title: str = "") -> Path:
    """Four panels over time: throughput, allocation, memory, reward. Writes a PNG to ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not rows:
        raise ValueError("the history is empty: nothing to plot")
    x = [r.get("elapsed_s", r["tick"]) for r in rows]
    xlabel = "time (s)" if "elapsed_s" in rows[0] else "tick"
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    ax_tp, ax_alloc, ax_mem, ax_rew = axes

    ax_tp.plot(x, [r["throughput"] for r in rows], color="tab:blue")
    ax_tp.set_ylabel("rows/s")
    ax_tp.set_title(title or "tuner history")

    knob_names = list(rows[-1].get("knobs", {}))
    cpu_knobs = [k for k in knob_names if k.endswith(".workers")]
    mb_knobs = [k for k in knob_names if k not in cpu_knobs]
    for name in cpu_knobs:
        ax_alloc.step(x, [r["knobs"].get(name, 0) for r in rows], where="post", label=name)
    ax_alloc.step(x, [r["cpus"] for r in rows], where="post", color="black", ls="--", label="CPUs available")
    ax_alloc.set_ylabel("workers")
    ax_alloc.yaxis.set_major_locator(MaxNLocator(integer=True))
    if mb_knobs:
        ax_mb = ax_alloc.twinx()
        for name in mb_knobs:
            ax_mb.step(x, [r["knobs"].get(name, 0) for r in rows], where="post", ls=":", label=name)
        ax_mb.set_ylabel("buffer MB (dotted)")
        ax_mb.legend(loc="upper right", fontsize="small")
    ax_alloc.legend(loc="upper left", fontsize="small")

    gib = float(1 << 30)
    ax_mem.plot(x, [r["memory_used"] / gib for r in rows], label="used")
    ax_mem.plot(x, [r["memory_limit"] / gib for r in rows], color="tab:red", ls="--", label="limit")
    ax_mem.set_ylabel("memory GiB")
    ax_mem.legend(loc="upper left", fontsize="small")

    ax_rew.plot(x, [r["reward"] for r in rows], color="tab:green")
    errors = [xi for xi, r in zip(x, rows, strict=True) if r.get("error")]
    if errors:
        ax_rew.plot(errors, [0.0] * len(errors), "x", color="tab:red", label="failed tick")
        ax_rew.legend(loc="upper left", fontsize="small")
    ax_rew.set_ylabel("reward")
    ax_rew.set_xlabel(xlabel)

    return save_figure(fig, out, dpi=100)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("history", help="JSON lines written by Tuner.save()")
    parser.add_argument("--out", default=None, help="PNG to write (default: HISTORY with .png)")
    parser.add_argument("--title", default="", help="plot title")


def run(args: argparse.Namespace) -> int:
    rows = load_history(args.history)
    out = args.out or str(Path(args.history).with_suffix(".png"))
    print(format_table([summarize(rows)]))
    if not rows:
        print(f"{args.history}: no ticks recorded; nothing plotted")
        return 1
    print(f"wrote {plot_history(rows, out, title=args.title or Path(args.history).name)}")
    return 0
