"""How far any policy deciding through the safety mask can go: the teacher that knows the true model,
acting on every tick through the agent's own mask, start and runner, beside the network, `steer` and
the oracles that jump to their allocation.

Why: a network pretrained by imitation is trained toward what its teacher does from the states it
reaches, not past it. The oracle rows of `intune bench agent` jump to the optimum at every resize, past
the mask (no memory projection, no probe pricing, no one-step moves), so they say nothing of what a
masked policy can reach. These rows show it:

- `teacher`: `imitation.DaggerPolicy` with the teacher on every tick (teacher share 1, no random start,
  no hold spells), toward the shipped recipe's target (the reward's optimum at the mask's margins);
  each tick's move is the label the network is trained on, resolved by the mask as the network's is;
- `teacher-reachable`: the same toward `--teacher reachable`'s target (the most rows/s the mask lets
  a policy reach);
- `oracle-reachable`: `OraclePolicy(objective="reachable")` under the same margins, jumping there
  (`benchmarks/feasibility/oracles.py`'s `reachable` row);
- `autotune`, for target 1's second clause (at least 0.98x `autotune` on every held-out spec where it
  has no OOM).

Every episode is scored as `intune bench agent` scores it (`score_episode`: mean model throughput /
mean phase optimum, simulator seed 0; with each phase's ratio beside), on its shipped
workloads, 40 held-out specs of each of its two seeds and its 20 waiting specs, at 60- and 150-tick
phases, so the `intune`, `steer`, `autotune` and `oracle` rows equal `benchmarks/agent.json`'s to the
last digit.

    python benchmarks/agent-ceiling/ceiling.py [--jobs 2] [--quick]

writes `ceiling.json` (one row per episode: the ratio, convergence ticks and the ratio per phase) and
`ceiling.md` beside this script (`--render` rewrites `ceiling.md` from `ceiling.json`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from intune.agent.evaluate import score_episode
from intune.bench.agent import WITHIN_TICKS, build_policy, waiting_specs
from intune.monitor.observation import MEMORY_SAFE_FRACTION
from intune.policies.safety import WORKER_CEILING
from intune.sim import Simulator, list_workloads, load_workload, paper_schedule, random_workload

HERE = Path(__file__).resolve().parent
HELD_OUT_SEEDS = (20231117, 777)
POLICIES = ("intune", "steer", "autotune", "teacher", "teacher-reachable", "oracle", "oracle-reachable")


def make_policy(name: str):
    """A row's policy: the teachers acting through the shipped agent's mask, or a registry policy."""
    from intune.policies import make

    if name.startswith("teacher"):
        from intune.agent.imitation import DaggerPolicy

        student = make("intune")  # its mask, start allocation and shuffle floor; its network's moves are overridden
        if name == "teacher-reachable":
            student.config.teacher_objective = "reachable"
        return DaggerPolicy(student, teacher_share=1.0, rng=np.random.default_rng(0), random_start=0.0)
    if name == "oracle-reachable":  # the margins the teacher aims under (as benchmarks/feasibility/oracles.py)
        return make("oracle", objective="reachable", margins=(MEMORY_SAFE_FRACTION, WORKER_CEILING))
    return build_policy(name, {})


def held_out_specs(per_seed: int = 40) -> list:
    """`intune bench agent`'s held-out specs: ``per_seed`` random specs from each of its seeds."""
    specs = []
    for seed in HELD_OUT_SEEDS:
        rng = np.random.default_rng(seed)
        specs += [random_workload(rng, name=f"held-out-{seed}-{i}") for i in range(per_seed)]
    return specs


def run_one(task: tuple, policy=None) -> dict:
    """One episode scored by ``score_episode``; ``policy`` in place of the row name's, where given."""
    spec, group, name, period = task
    sim = Simulator(spec, cpus=paper_schedule(period_ticks=period), seed=0)
    score = score_episode(sim, policy if policy is not None else make_policy(name), seed=0)
    return {"workload": spec.name, "group": group, "policy": name, "period": period,
            "optimum_ratio": score.ratio, "phase_ratios": score.phase_ratios,
            "convergence_ticks": score.convergence, "ooms": int(score.ooms)}


def summary_lines(rows: list[dict], periods: tuple[int, ...]) -> list[str]:
    out = ["| policy | period | shipped: mean / worst | held out: mean / worst | held out / `steer`: mean | "
           "held out: below 0.98x `autotune` where it has no OOM | waiting: mean / worst | "
           "phases at 95% within 30 ticks | OOM ticks |",
           "|---|---|---|---|---|---|---|---|---|"]
    for period in periods:
        def held(name: str, period: int = period) -> dict[str, dict]:
            return {r["workload"]: r for r in rows
                    if r["policy"] == name and r["period"] == period and r["group"] == "held-out"}

        steer, autotune = held("steer"), held("autotune")
        survived = [w for w, r in autotune.items() if r["ooms"] == 0]
        for name in POLICIES:
            mine = [r for r in rows if r["policy"] == name and r["period"] == period]
            cells = []
            for group in ("shipped", "held-out", "waiting"):
                values = [r["optimum_ratio"] for r in mine if r["group"] == group]
                cells.append(f"{np.mean(values):.3f} / {min(values):.3f}" if values else "-")
            own = held(name)
            versus = np.mean([r["optimum_ratio"] / steer[w]["optimum_ratio"] for w, r in own.items()]) if steer else float("nan")
            below = sum(own[w]["optimum_ratio"] < 0.98 * autotune[w]["optimum_ratio"] for w in survived)
            conv = [c for r in mine for c in r["convergence_ticks"]]
            within = sum(c is not None and c <= WITHIN_TICKS for c in conv)
            out.append(f"| {name} | {period} | {cells[0]} | {cells[1]} | {versus:.3f} | {below} of {len(survived)} | "
                       f"{cells[2]} | {within}/{len(conv)} ({100 * within / max(len(conv), 1):.0f}%) | "
                       f"{sum(r['ooms'] for r in mine)} |")
    return out


def phase_lines(rows: list[dict], periods: tuple[int, ...]) -> list[str]:
    """Held-out and waiting specs: the first phase (from the start allocation) apart from the four after
    a resize (from the allocation the policy left)."""
    out = ["| policy | period | held out: first phase | held out: phases 2-5 | waiting: first phase | waiting: phases 2-5 |",
           "|---|---|---|---|---|---|"]
    for period in periods:
        for name in POLICIES:
            cells = []
            for group in ("held-out", "waiting"):
                phases = np.array([r["phase_ratios"] for r in rows
                                   if r["policy"] == name and r["period"] == period and r["group"] == group])
                cells += [f"{phases[:, 0].mean():.3f}", f"{phases[:, 1:].mean():.3f}"] if len(phases) else ["-", "-"]
            out.append(f"| {name} | {period} | " + " | ".join(cells) + " |")
    return out


def write_report(data: dict, quick: bool, rendered: bool = False) -> str:
    """``ceiling.md`` from the results (``--render`` rewrites it from ``ceiling.json`` alone)."""
    rows, periods = data["rows"], tuple(data["periods"])
    return (f"# `python benchmarks/agent-ceiling/ceiling.py --jobs {data['jobs']}{' --quick' if quick else ''}`\n\n"
            f"Date: {data['date']}. Wall time {data['wall_s']:.0f} s on {data['jobs']} jobs. Scored as `intune bench "
            "agent` scores (ratio: mean model throughput / mean phase optimum; simulator seed 0). Held out / `steer`: "
            "the mean over the held-out specs of each spec's ratio over `steer`'s, as `intune bench agent` computes it. "
            "Phases: over the shipped, held-out and waiting specs."
            + (" This file was rewritten from `ceiling.json` by `--render`." if rendered else "") + "\n\n"
            + "\n".join(summary_lines(rows, periods)) + "\n\nThe ratio per phase, mean over the specs:\n\n"
            + "\n".join(phase_lines(rows, periods)) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="60-tick phases, 8 held-out specs per seed, no waiting specs")
    parser.add_argument("--render", action="store_true", help="rewrite ceiling.md from ceiling.json, running nothing")
    args = parser.parse_args()
    if args.render:
        data = json.loads((HERE / "ceiling.json").read_text())
        (HERE / "ceiling.md").write_text(write_report(data, data["held_out_per_seed"] < 40, rendered=True))
        return
    periods = (60,) if args.quick else (60, 150)
    n_held, n_waiting = (8, 0) if args.quick else (40, 10)
    specs = [(load_workload(w), "shipped") for w in list_workloads() if w != "ladder"]
    specs += [(s, "held-out") for s in held_out_specs(n_held)]
    specs += [(s, "waiting") for seed in HELD_OUT_SEEDS for s in waiting_specs(seed, n_waiting)]
    tasks = [(spec, group, name, period) for period in periods for spec, group in specs for name in POLICIES]
    start = time.time()
    with Pool(args.jobs) as pool:
        rows = pool.map(run_one, tasks, chunksize=2)
    wall = time.time() - start
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = {"date": stamp, "machine": platform.platform(), "jobs": args.jobs, "wall_s": round(wall, 1),
            "periods": list(periods), "held_out_seeds": list(HELD_OUT_SEEDS), "held_out_per_seed": n_held,
            "waiting_per_seed": n_waiting, "rows": rows}
    (HERE / "ceiling.json").write_text(json.dumps(data, indent=1) + "\n")
    report = write_report(data, args.quick)
    (HERE / "ceiling.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
