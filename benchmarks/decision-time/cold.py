"""Decision CPU time with warm and with cold caches, interleaved in one process.

``intune bench agent``'s decision-time section times ``policy.step`` back to back, criteo at 128 CPUs:
everything the decision touches stays in the CPU's caches from one tick to the next. Live, the tuner
decides once a second on a machine whose pipeline streams data through the caches in between, so each
decision starts cold. Here every tick of the same episode is, at random, either warm (the step follows
the previous one) or cold (before the step, a 64 MB array is rewritten and 43,000 Python objects are
read, which evicts the caches as the pipeline's data does); both kinds share the process, the policy
and the machine's minute, so the difference is the caches'. CPU time of the calling thread
(``time.thread_time``), the first 20 ticks left out.

Run: ``python benchmarks/decision-time/cold.py [TICKS] [REPEATS]`` (defaults 400 and 3); prints, per
policy, each repeat's medians and the median (range) over the repeats.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from intune.bench.agent import build_policy
from intune.policies.runner import Runner
from intune.sim import Simulator, load_workload

POLICIES = ("intune", "steer")


def one_episode(policy: str, ticks: int, seed: int) -> tuple[float, float]:
    """``(warm, cold)`` median CPU ms per decision over one episode's ticks."""
    rng = np.random.default_rng(seed)
    sim = Simulator(load_workload("criteo"), cpus=128, seed=0)
    p = build_policy(policy, {})
    runner = Runner(sim.knobs)
    obs = runner.observe(sim.reset(0))
    p.reset(sim.knobs, obs)
    big = np.ones(64 * 2**20 // 8)
    objects = [str(i) for i in range(300_000)][::7]
    times: dict[bool, list[float]] = {False: [], True: []}
    for tick in range(ticks):
        cold = bool(rng.random() < 0.5)
        if cold:
            big += 1.0
            sum(len(o) for o in objects)
        start = time.thread_time()
        request = p.step(obs)
        spent = time.thread_time() - start
        if tick >= 20:
            times[cold].append(spent * 1e3)
        if request:
            runner.apply(obs, request)
        obs = runner.observe(sim.step())
    return float(np.median(times[False])), float(np.median(times[True]))


def main() -> None:
    ticks = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    seen: dict[str, dict[str, list[float]]] = {p: {"warm": [], "cold": []} for p in POLICIES}
    for r in range(repeats):
        for policy in POLICIES if r % 2 == 0 else reversed(POLICIES):
            warm, cold = one_episode(policy, ticks, seed=r)
            seen[policy]["warm"].append(warm)
            seen[policy]["cold"].append(cold)
            print(f"repeat {r + 1} {policy}: warm {warm:.3f} ms, cold {cold:.3f} ms, cold / warm {cold / warm:.2f}", flush=True)
    print("median (range) over the repeats, CPU ms per decision:")
    for policy, kinds in seen.items():
        ratio = [c / w for w, c in zip(kinds["warm"], kinds["cold"], strict=True)]
        cells = [f"{k} {np.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in kinds.items()]
        print(f"  {policy}: " + ", ".join(cells) + f", cold / warm {np.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})")


if __name__ == "__main__":
    main()
