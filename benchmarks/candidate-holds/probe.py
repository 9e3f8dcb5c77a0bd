"""Which inputs make the shipped network move, on a simulated copy of ``intune bench tune``'s pipeline.

The pipeline: an id source, a reader waiting 78 us a row on I/O (thread workers), a shuffle, a
CPU-bound UDF of 80 us a row in process workers, prefetch; 2 CPUs. Its optimum is read 2 / udf 2
(20.3k rows/s); the network holds read 1 / udf 1 (12.3k rows/s), as it does live after a CPU comes back
(``benchmarks/tune.md``: 11.2k rows/s after 1 -> 2 CPUs). At tick 1 it asks +1 for both; at tick 20,
in the same state but for the history, it holds. This script puts each input that differs between
the two ticks back to its tick-1 value, one at a time, and prints the move probabilities of the two
knobs (softmax of the Q-values over -5, -1, 0, +1, +5), then sets the knob's last move. Last, the
network and ``steer`` on that pipeline at constant CPUs from 2 to 8: the mean model rows/s of ticks
20-60 over the optimum, and the final read / udf workers.

Run: ``python benchmarks/candidate-holds/probe.py [WEIGHTS]`` (default: the shipped weights).
"""

from __future__ import annotations

import sys

import numpy as np

from intune.agent.features import CONTEXT_FEATURES, KNOB_FEATURES
from intune.policies import make
from intune.sim import Simulator, run_episode, spec_from_dict
from intune.sim.schedule import constant_schedule

SPEC = {
    "name": "live-tune", "batch_size": 1024, "chunk_rows": 512, "bytes_per_row": 80,
    "machine": {"cpus": 2, "memory_limit_gb": 24, "host_memory_gb": 24, "base_memory_gb": 0.5,
                "cpu_ghz": 2.5, "mem_bandwidth_gbs": 20, "restart_delay_s": 30, "oversubscription_cost": 0.1},
    "consumer": {"model_latency_s": 0.0},
    "stages": [
        {"name": "ids", "kind": "read", "mode": "thread", "cpu_us_per_row": 0.5, "max_workers": 1, "worker_mb": 1},
        {"name": "read", "kind": "map", "mode": "thread", "cpu_us_per_row": 3.0, "io_us_per_row": 78.0,
         "worker_mb": 2, "cpu_cv": 0.2},
        {"name": "shuffle", "kind": "shuffle", "mode": "thread", "cpu_us_per_row": 1.0, "max_workers": 1,
         "worker_mb": 1, "buffer": {"min": 1, "max": 4096, "default": 64}},
        {"name": "udf", "kind": "udf", "mode": "process", "cpu_us_per_row": 80.0, "worker_mb": 60, "cpu_cv": 0.1},
        {"name": "prefetch", "kind": "prefetch", "mode": "thread", "cpu_us_per_row": 1.0, "max_workers": 1,
         "worker_mb": 1, "buffer": {"min": 1, "max": 4096, "default": 64}},
    ],
}


def main() -> None:
    weights = sys.argv[1] if len(sys.argv) > 1 else None
    spec = spec_from_dict(SPEC)
    sim = Simulator(spec, cpus=constant_schedule(2, 100), seed=0)
    print("optimum at 2 CPUs:", sim.optimum(2, objective="throughput"))
    policy = make("intune", weights=weights) if weights else make("intune")
    kept: dict[int, np.ndarray] = {}
    step = policy.step
    tick = {"t": 0}

    def recording(obs):
        out = step(obs)
        if tick["t"] in (1, 20):
            kept[tick["t"]] = policy.chooser.last[0].copy()
        tick["t"] += 1
        return out

    policy.step = recording
    result = run_episode(sim, policy, 21, seed=0)
    print("allocation at tick 20:", {k: int(v[20]) for k, v in result.knobs.items()})
    names = (*KNOB_FEATURES, *CONTEXT_FEATURES)
    knobs = [k.name for k in policy.safety.knobs]
    n = len(knobs)

    def probabilities(rows: np.ndarray) -> np.ndarray:
        q = policy.chooser.numpy_q(rows[:n], np.ones(n, dtype=bool))
        z = np.exp(q - q.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    shown = [knobs.index("read.workers"), knobs.index("udf.workers")]

    def line(label: str, rows: np.ndarray) -> None:
        p = probabilities(rows)
        print(f"  {label:44s}" + "  ".join(f"{knobs[i]} {np.round(p[i], 2)}" for i in shown))

    print("move probabilities over (-5, -1, 0, +1, +5):")
    line("tick 1", kept[1])
    line("tick 20", kept[20])
    for j, name in enumerate(names):
        if np.abs(kept[1][:n, j] - kept[20][:n, j]).max() > 1e-3:
            rows = kept[20].copy()
            rows[:, j] = kept[1][:, j]
            line(f"tick 20, {name} as at tick 1", rows)
    if "last_delta" in names:
        j = names.index("last_delta")
        for move in (1, 5):
            rows = kept[20].copy()
            rows[shown, j] = move / 5.0
            line(f"tick 20, last move +{move}", rows)
    print("constant CPUs, ticks 20-60, rows/s / optimum (read / udf workers at the end):")
    for cpus in (2, 3, 4, 6, 8):
        cells = []
        for name in ("intune", "steer"):
            sim = Simulator(spec, cpus=constant_schedule(cpus, 60), seed=0)
            chosen = make("intune", weights=weights) if name == "intune" and weights else make(name)
            run = run_episode(sim, chosen, seed=0)
            ratio = float(run.model_throughput[20:].mean() / sim.optimum(cpus, objective="throughput")[1])
            cells.append(f"{name} {ratio:.2f} ({int(run.knobs['read.workers'][-1])} / {int(run.knobs['udf.workers'][-1])})")
        print(f"  {cpus} CPUs: " + ", ".join(cells))


if __name__ == "__main__":
    main()
