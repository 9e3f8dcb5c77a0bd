"""Plots of simulated runs: throughput over time per policy (Figure 7A) and the Figure 8 scaling panels.

Owns only drawing (matplotlib, Agg backend) from results that ``intune.bench.sim`` computed; it must
not run simulations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from intune.results import save_figure


def _line_style(i: int) -> dict[str, Any]:
    """The i-th policy's colour and dash: ten colours, then the same ten dashed, so 20 lines differ."""
    import matplotlib

    colors = matplotlib.colormaps["tab10"].colors
    return {"color": colors[i % len(colors)], "ls": "-" if i < len(colors) else "--"}


def _smooth(x: np.ndarray, k: int) -> np.ndarray:
    if k <= 1 or len(x) < k:
        return x
    return np.convolve(x, np.ones(k) / k, mode="same")


def plot_figure7(path: str | Path, traces: dict[str, dict[str, Any]]) -> Path:
    """One panel per workload: each policy's rows/s over ticks, normalised to ``none``'s mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 3.6 * len(traces)), squeeze=False)
    for ax, (workload, runs) in zip(axes[:, 0], traces.items(), strict=True):
        none = runs.get("none")
        scale = float(none.throughput.mean()) if none is not None else 1.0
        for i, (name, r) in enumerate(runs.items()):
            ax.plot(
                np.arange(1, r.ticks + 1), _smooth(r.throughput / scale, 9), label=name, lw=1.2, **_line_style(i)
            )
        any_run = next(iter(runs.values()), None)
        if any_run is not None:
            ax2 = ax.twinx()
            ax2.step(np.arange(1, any_run.ticks + 1), any_run.cpus, color="grey", ls=":", lw=1)
            ax2.set_ylabel("CPUs", color="grey")
        ax.set_title(f"{workload}: throughput over the resize schedule (normalised to none)")
        ax.set_xlabel("tick (s)")
        ax.set_ylabel("throughput / none")
        ax.legend(fontsize=7, ncol=4, loc="upper left")
    return save_figure(fig, path, dpi=110)


def plot_figure8(path: str | Path, panels: dict[str, list[dict[str, Any]]]) -> Path:
    """Three panels: throughput / autotune's against stages, CPUs and batch size, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (panel, rows) in zip(axes[0], panels.items(), strict=True):
        if not rows:
            continue
        param = rows[0]["param"]
        for i, name in enumerate(dict.fromkeys(r["policy"] for r in rows)):
            pts = sorted(
                (r["value"], r["autotune_ratio"])
                for r in rows
                if r["policy"] == name and r["autotune_ratio"] is not None
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name, lw=1.2, **_line_style(i))
        if param in ("cpus", "batch_size"):
            ax.set_xscale("log", base=2)
        ax.set_title(f"{panel}: by {param}")
        ax.set_xlabel(param)
        ax.set_ylabel("throughput / autotune")
        ax.legend(fontsize=7)
    return save_figure(fig, figure8_path(path), dpi=110)


def figure8_path(path: str | Path) -> Path:
    """Where ``plot_figure8`` writes beside the Figure 7 plot at ``path``: ``sim.png`` -> ``sim-fig8.png``."""
    p = Path(path)
    return p.with_name(p.stem + "-fig8" + (p.suffix or ".png"))
