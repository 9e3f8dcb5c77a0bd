"""The agent benchmark's decision time, this tree against another, interleaved.

Runs ``intune bench agent``'s decision-time section (criteo at 128 CPUs, 300 ticks of ``policy.step``
after the start; wall ms per tick) for ``intune`` and ``steer``, ROUNDS times on each tree, alternating
the trees, each run in a fresh process with nothing else of the benchmark beside it. The other tree is
a checkout (``git worktree add DIR COMMIT``) run with this tree's virtual environment, its own ``src``
first on the path. Why interleaved: on this shared machine the speed of one process moves by up to 2x
from minute to minute, more than the change measured.

Run: ``python benchmarks/decision-time/ab.py OTHER_TREE [ROUNDS]``; prints every run and the median
(range) of each tree's per-run medians.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

POLICIES = ("intune", "steer")
COMMAND = ["-m", "intune.cli", "bench", "agent", "--workload", "criteo", "--held-out", "0", "--waiting", "0",
           "--period", "3", "--policies", ",".join(POLICIES), "--oom-episodes", "0", "--decision-ticks", "300",
           "--jobs", "1"]


def one_run(tree: Path, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    subprocess.run([sys.executable, *COMMAND, "--json", str(out)], env=env, check=True, capture_output=True)
    rows = json.loads(out.read_text())["results"]
    return {r["policy"]: r["median_ms"] for r in rows if r["section"] == "decision_time"}


def main() -> None:
    here = Path(__file__).resolve().parents[2]
    other = Path(sys.argv[1]).resolve()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    trees = {"this tree": here, f"other tree ({other.name})": other}
    medians: dict[str, dict[str, list[float]]] = {name: {p: [] for p in POLICIES} for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for k, name, tree in interleaved(trees, rounds):
            got = one_run(tree, Path(tmp) / "out.json")
            print(f"round {k + 1} {name}: " + ", ".join(f"{p} {got[p]:.3f} ms" for p in POLICIES), flush=True)
            for p in POLICIES:
                medians[name][p].append(got[p])
    print("median (range) of the per-run medians, ms per decision:")
    print_medians(medians, 3)


def interleaved(trees: dict[str, Path], rounds: int) -> Iterator[tuple[int, str, Path]]:
    """``(round, name, tree)`` for every run: each round runs every tree once, the order reversed every
    other round, so that a drift of the machine's speed weighs on both alike."""
    for k in range(rounds):
        for name, tree in (trees.items() if k % 2 == 0 else reversed(trees.items())):
            yield k, name, tree


def print_medians(seen: dict[str, dict[str, list[float]]], digits: int) -> None:
    """Per tree, each figure's median and range over its runs."""
    for name, by_figure in seen.items():
        cells = [f"{f} {np.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})" for f, v in by_figure.items()]
        print(f"  {name}: " + ", ".join(cells))

if __name__ == "__main__":
    main()
