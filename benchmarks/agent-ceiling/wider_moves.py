"""Whether larger moves would lift what a masked policy reaches: the reward's teacher acting through the
agent's mask (as `ceiling.py`'s `teacher` row) with its largest moves at ±5 (the agent's), ±10 and ±20,
on `intune bench agent`'s 80 held-out specs at 60-tick phases, scored as `ceiling.py` scores them.

    python benchmarks/agent-ceiling/wider_moves.py > benchmarks/agent-ceiling/wider_moves.txt
"""

from __future__ import annotations

import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ceiling  # noqa: E402  (this directory's scoring and specs)

MOVES = ((-5, -1, 0, 1, 5), (-10, -1, 0, 1, 10), (-20, -1, 0, 1, 20))


def run(task: tuple) -> tuple[tuple[int, ...], dict]:
    spec, deltas = task
    teacher = ceiling.make_policy("teacher")
    teacher.student.config.action_deltas = deltas  # five moves, as the network's heads: only their sizes change
    return deltas, ceiling.run_one((spec, "held-out", "teacher", 60), policy=teacher)


def main() -> None:
    with Pool(2) as pool:
        done = pool.map(run, [(s, d) for s in ceiling.held_out_specs() for d in MOVES], chunksize=2)
    print("The reward's teacher through the agent's mask, 80 held-out specs, 60-tick phases:")
    for deltas in MOVES:
        rows = [r for d, r in done if d == deltas]
        ratio = np.mean([r["optimum_ratio"] for r in rows])
        first = np.mean([r["phase_ratios"][0] for r in rows])
        rest = np.mean([np.mean(r["phase_ratios"][1:]) for r in rows])
        print(f"  moves {deltas}: held out {ratio:.3f}; first phase {first:.3f}, phases 2-5 {rest:.3f}")


if __name__ == "__main__":
    main()
