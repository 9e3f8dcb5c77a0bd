"""held-out-777-9 under the shipped network and the headroom-teacher seeds: each phase's ratio to the
optimum and the workers at its end, beside the teachers' targets at 64 CPUs.

Run from the repository root: ``python benchmarks/candidate-holds/headroom-teacher/stall.py``.
"""

from pathlib import Path

import numpy as np

from intune.bench.agent import build_policy
from intune.sim import Simulator, paper_schedule, random_workload, run_episode
from intune.sim.oracle import search_optimum

HERE = Path(__file__).parent
SEEDS = {f"h{s}": str(HERE / f"seed{s}.pt") for s in range(4)}


def main() -> None:
    rng = np.random.default_rng(777)
    spec = [random_workload(rng, name=f"held-out-777-{i}") for i in range(10)][9]
    sim = Simulator(spec, cpus=64, seed=0)
    for objective in ("reward", "headroom"):
        target, rate = search_optimum(sim, 64, objective)
        print(f"{objective} teacher's target at 64 CPUs: {target} ({rate:,.0f} rows/s)")
    for name in ("intune", "steer", *(f"intune-{s}" for s in SEEDS)):
        sim = Simulator(spec, cpus=paper_schedule(period_ticks=60), seed=0)
        run = run_episode(sim, build_policy(name, SEEDS), seed=0)
        cells = []
        for start, end, cpus in sim.schedule.phases():
            optimum = sim.optimum(int(cpus), objective="throughput")[1]
            workers = "/".join(str(int(v[end - 1])) for k, v in run.knobs.items() if k.endswith(".workers"))
            cells.append(f"{int(cpus)} CPUs {np.mean(run.model_throughput[start:end]) / optimum:.3f} ({workers})")
        print(f"{name:10} " + "; ".join(cells))


if __name__ == "__main__":
    main()
