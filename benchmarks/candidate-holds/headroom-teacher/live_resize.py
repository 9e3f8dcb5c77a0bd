"""The live resize of ``intune bench tune`` (2 -> 1 -> 2 CPUs, 45 s each, a decision a second) with the
shipped network, headroom-teacher networks and ``steer``, interleaved, one run each per round.

Each ``intune`` variant runs the shipped policy code with other weights (``policy.DEFAULT_WEIGHTS``
pointed at them for the run). Prints each run's rows/s per phase; the last phase is the one the issue's
re-convergence target fails on.

Run from the repository root: ``python benchmarks/candidate-holds/headroom-teacher/live_resize.py [ROUNDS]``
(the ensemble of seeds 0 and 1 is read from /tmp/ens01.pt, made by ``ensemble.py``).
"""

import sys
from pathlib import Path

from intune import monitor
from intune.agent import policy as agent_policy
from intune.bench import tune_workload as wl

HERE = Path(__file__).parent
VARIANTS = {
    "intune (shipped)": ("intune", agent_policy.DEFAULT_WEIGHTS),
    "headroom seed 0": ("intune", HERE / "seed0.pt"),
    "headroom seed 1": ("intune", HERE / "seed1.pt"),
    "headroom seeds 0+1": ("intune", Path("/tmp/ens01.pt")),
    "steer": ("steer", None),
}
PHASE_S = 45.0


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    full = int(monitor.available_cpus())
    phases = [(0.0, full), (PHASE_S, 1), (2 * PHASE_S, full)]
    shipped = agent_policy.DEFAULT_WEIGHTS
    for r in range(rounds):
        names = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in names:
            policy, weights = VARIANTS[name]
            agent_policy.DEFAULT_WEIGHTS = weights or shipped
            try:
                run = wl.run_policy(policy, wl.Workload(), 3 * PHASE_S, 1.0, phases=phases[1:])
            finally:
                agent_policy.DEFAULT_WEIGHTS = shipped
            cells = [f"{cpus} CPU {run.arrivals.rate(start, start + PHASE_S):,.0f} rows/s" for start, cpus in phases]
            print(f"round {r + 1} {name:20} " + "; ".join(cells) + f"; exactly once: {run.check}", flush=True)


if __name__ == "__main__":
    main()
