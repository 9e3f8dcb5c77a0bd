"""Live decision time, this tree against another, interleaved.

Runs ``intune bench tune``'s pipeline (``tune_workload.Workload()``: an id source, a reader waiting on
I/O in thread workers, a CPU-bound UDF in process workers, prefetch) under the live tuner for SECONDS
with 1 s ticks, from the even split, on every CPU of this machine, ROUNDS times on each tree,
alternating the trees, each run in a fresh process. Prints the tuner's own figures (``Tuner.overhead``):
the median CPU milliseconds of one decision (``policy.step`` and the runner's clamp, on the tuner's
thread: ``time.thread_time``), its mean wall milliseconds (which include waiting for the GIL held by
the pipeline's threads) and the tuning thread's share of a core. The other tree is a checkout (``git
worktree add DIR COMMIT``) run with this tree's virtual environment, its own ``src`` first on the path.

Run: ``python benchmarks/decision-time/live_ab.py OTHER_TREE [ROUNDS] [SECONDS] [POLICY]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import interleaved, print_medians  # noqa: E402  (this folder is not a package)

CHILD = """
import json, sys
from intune.bench import tune_workload as wl
run = wl.run_policy(sys.argv[1], wl.Workload(), float(sys.argv[2]), 1.0)
print(json.dumps(run.tuner_stats))
"""
FIELDS = ("decision_cpu_ms_median", "decision_ms_mean", "cpu_fraction")


def one_run(tree: Path, policy: str, seconds: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run([sys.executable, "-c", CHILD, policy, str(seconds)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    here = Path(__file__).resolve().parents[2]
    other = Path(sys.argv[1]).resolve()
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 40.0
    policy = sys.argv[4] if len(sys.argv) > 4 else "intune"
    trees = {"this tree": here, f"other tree ({other.name})": other}
    seen: dict[str, dict[str, list[float]]] = {name: {f: [] for f in FIELDS} for name in trees}
    for k, name, tree in interleaved(trees, rounds):
        stats = one_run(tree, policy, seconds)
        cells = ", ".join(f"{f} {stats.get(f, float('nan')):.4f}" for f in FIELDS)
        print(f"round {k + 1} {name} ({policy}, {stats.get('decisions', 0):.0f} decisions): {cells}", flush=True)
        for f in FIELDS:
            seen[name][f].append(float(stats.get(f, float("nan"))))
    print("median (range) over the runs:")
    print_medians(seen, 4)

if __name__ == "__main__":
    main()
