"""What holds the teacher back in the first phase: over the first 15 ticks of `intune bench agent`'s
held-out specs (60-tick phases), each worker knob at least 5 below the reachable teacher's target, and
whether the mask let it take +5; where it did not, whether the CPUs or the memory refused it.

    python benchmarks/agent-ceiling/first_phase.py > benchmarks/agent-ceiling/first_phase.txt
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np

from intune.sim import Simulator, paper_schedule
from intune.sim.episode import run_episode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ceiling  # noqa: E402  (this directory's policies and specs)

TICKS = 15


def count_tick(teacher, obs, counts: collections.Counter, prices: list[float]) -> None:
    """After the teacher's move on this tick: each worker knob 5 or more below the target, and why +5
    was allowed or refused by the mask."""
    safety, mask = teacher.student.safety, teacher.student.last_mask
    values = [k.value for k in safety.knobs]
    plus5 = int(np.flatnonzero(safety.deltas == 5)[0])
    for k, knob in enumerate(safety.knobs):
        if knob.unit != "cpu" or teacher.teacher._target.get(knob.name, values[k]) - values[k] < 5:
            continue
        counts["knob-ticks at least 5 workers below the target"] += 1
        if mask[k, plus5]:
            counts["+5 allowed"] += 1
            continue
        price = float(safety.stage_worker_bytes(obs, True)[k])
        if obs.free_cpus < 5:
            counts["+5 refused, fewer than 5 CPUs free"] += 1
        elif 5 * price > safety.worker_budget(obs, values):
            counts["+5 refused, 5 workers at the stage's price past the memory room"] += 1
            prices.append(price / 2**20)
        else:
            counts["+5 refused, other"] += 1


def main() -> None:
    counts: collections.Counter[str] = collections.Counter()
    prices: list[float] = []
    specs = ceiling.held_out_specs()
    for spec in specs:
        teacher = ceiling.make_policy("teacher-reachable")
        act = teacher.step

        def step(obs, teacher=teacher, act=act):
            out = act(obs)
            count_tick(teacher, obs, counts, prices)
            return out

        teacher.step = step
        run_episode(Simulator(spec, cpus=paper_schedule(period_ticks=60), seed=0), teacher, TICKS, seed=0)
    print(f"The reachable teacher through the mask, first {TICKS} ticks of the first phase, "
          f"{len(specs)} held-out specs (seeds {', '.join(map(str, ceiling.HELD_OUT_SEEDS))}):")
    for name, n in counts.items():
        print(f"  {name}: {n}")
    if prices:
        q = np.percentile(prices, [10, 50, 90])
        print(f"  the price of one worker where memory refused (MB): 10th / 50th / 90th percentile {q[0]:.0f} / {q[1]:.0f} / {q[2]:.0f}")


if __name__ == "__main__":
    main()
