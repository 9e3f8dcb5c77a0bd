"""What a policy that knows the true model reaches: upper bounds for the agent benchmark's targets.

The oracle holding, at every phase and refresh (every 25 ticks), the optimum of one of three objectives
(``intune.sim.oracle.search_optimum``), on ``intune bench agent``'s shipped workloads, 40 held-out specs
of each default seed and 10 waiting specs of each, at 60-tick phases, scored as the benchmark scores:

- ``throughput``: the most rows/s of any allocation whose worst-case memory fits the limit (the score's
  optimum; it needs the true memory, which no policy reads: the readings carry 2% noise);
- ``reachable``: the most rows/s within the safety mask's memory limits (projected memory under
  ``MEMORY_SAFE_FRACTION`` of the limit, or, with buffers at their minimum, under ``WORKER_CEILING``):
  the most any policy under the mask can reach, were it to price every worker exactly;
- ``reward``: rows/s times the reward's memory factor (what the benchmark's ``oracle`` row holds).

Run: ``python benchmarks/feasibility/oracles.py`` (about 2 minutes on 2 CPUs); its output: ``oracles.txt``.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import numpy as np

OBJECTIVES = ("throughput", "reachable", "reward")
GROUPS = ("shipped", "held-out", "waiting")


def score(task: tuple) -> tuple[str, str, str, float, int, int, int]:
    from intune.agent.evaluate import score_episode
    from intune.monitor.observation import MEMORY_SAFE_FRACTION
    from intune.policies.safety import WORKER_CEILING
    from intune.sim import Simulator, paper_schedule
    from intune.sim.oracle import OraclePolicy

    spec, group, objective = task
    margins = (MEMORY_SAFE_FRACTION, 1.0 if objective == "throughput" else WORKER_CEILING)
    sim = Simulator(spec, cpus=paper_schedule(period_ticks=60), seed=0)
    s = score_episode(sim, OraclePolicy(objective=objective, margins=margins), seed=0)
    within = sum(c is not None and c <= 30 for c in s.convergence)
    return spec.name, group, objective, s.ratio, s.ooms, within, len(s.convergence)


def main() -> None:
    from intune.bench.agent import HELD_OUT_SEEDS, waiting_specs
    from intune.sim import list_workloads, load_workload, random_workload

    specs = [(load_workload(w), "shipped") for w in list_workloads() if w != "ladder"]
    for seed in HELD_OUT_SEEDS:
        rng = np.random.default_rng(seed)
        specs += [(random_workload(rng, name=f"held-out-{seed}-{i}"), "held-out") for i in range(40)]
        specs += [(s, "waiting") for s in waiting_specs(seed, 10)]
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(score, [(s, g, o) for s, g in specs for o in OBJECTIVES]))
    print("objective  group     mean   worst (workload)                  OOM ticks  phases at 95% within 30 ticks")
    for objective in OBJECTIVES:
        mine = [r for r in results if r[2] == objective]
        for group in GROUPS:
            rows = [r for r in mine if r[1] == group]
            worst = min(rows, key=lambda r: r[3])
            print(f"{objective:10s} {group:8s} {np.mean([r[3] for r in rows]):.3f}  {worst[3]:.3f} ({worst[0]:24s}) "
                  f"{sum(r[4] for r in rows):9d}  {sum(r[5] for r in rows)}/{sum(r[6] for r in rows)}")
        held_below = sum(r[3] < 0.8 for r in mine if r[1] == "held-out")
        within, phases = sum(r[5] for r in mine), sum(r[6] for r in mine)
        print(f"{objective:10s} all      phases {within}/{phases} ({within / phases:.0%}); held-out specs below 0.80: "
              f"{held_below}")


if __name__ == "__main__":
    main()
