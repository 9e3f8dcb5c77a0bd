"""How the AUTOTUNE port reads the irregular workloads' stages over the paper's resize schedule.

``autotune-adaptive`` on irregular-tail, irregular-drift and irregular-sizes (60-tick phases of
32 -> 64 -> 128 -> 64 -> 32 CPUs): at the middle of each phase, its ratio to the phase optimum, its
worker counts beside the optimum's, and the self time per element it models for each stage (busy wall
ms per element since its launch, what a tf.data node accumulates).

Run: ``python benchmarks/autotune-reads/reads.py``; its output: ``reads.txt``.
"""

from __future__ import annotations

from intune.policies import make
from intune.sim import Simulator, load_workload, paper_schedule, run_episode

TICKS = (30, 90, 150, 210, 270)


def main() -> None:
    for name in ("irregular-tail", "irregular-drift", "irregular-sizes"):
        sim = Simulator(load_workload(name), cpus=paper_schedule(period_ticks=60), seed=0)
        policy = make("autotune-adaptive")
        modelled: dict[int, dict[str, float]] = {}
        tick = {"t": 0}

        def on_tick(obs, applied, policy=policy, modelled=modelled, tick=tick) -> None:
            if tick["t"] in TICKS:
                modelled[tick["t"]] = {n: t.self_time * 1e3 for n, t in policy._totals.items()}
            tick["t"] += 1

        run = run_episode(sim, policy, seed=0, on_tick=on_tick)
        print(name)
        for t in TICKS:
            cpus = int(run.cpus[t])
            best, rows = sim.optimum(cpus, objective="throughput")[:2]
            workers = {k.split(".")[0]: int(v[t]) for k, v in run.knobs.items() if k.endswith(".workers")}
            optimum = {k.split(".")[0]: v for k, v in best.items() if k.endswith(".workers")}
            print(f"  tick {t}, {cpus} CPUs: {run.model_throughput[t] / rows:.2f} of the optimum")
            print(f"    workers {workers}; the optimum's {optimum}")
            print("    modelled self time, ms per element: " + ", ".join(f"{n} {v:.0f}" for n, v in modelled[t].items()))


if __name__ == "__main__":
    main()
