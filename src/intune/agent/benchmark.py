"""The agent's simulator benchmarks (issue 4, items 1-5): ``python -m intune.agent.benchmark [--quick]``.

1-3. Every shipped workload over the paper's resize schedule (32 -> 64 -> 128 -> 64 -> 32), and held-out
     random workloads from a seed pretraining never drew: throughput / phase optimum, ratio to
     ``oracle``, ``autotune``, ``autotune-adaptive``, ``plumber-adaptive``, ticks to 95% of the optimum.
4.   OOMs over randomised tight-memory episodes, the agent and ``autotune`` on the same episodes.
5.   Ablations: per-stage vs global-only observation, even-split vs Plumber warm start, {+-1} vs {+-1, +-5}
     (networks trained by ``intune pretrain --global-only`` / ``--deltas=-1,0,1``, passed in by path).
And the decision time per tick. Results go through ``intune.bench.results.write_json``. It must not
train: it only scores policies through ``intune.agent.evaluate.score_episode``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from intune.agent.config import AgentConfig
from intune.agent.env import random_schedule
from intune.agent.evaluate import score_episode
from intune.agent.policy import IntunePolicy, load_weights
from intune.bench.results import format_table, write_json
from intune.policies import make

HELD_OUT_SEED = 20_231_117  # never used by pretraining (which draws from --seed and seed + 1_000_003)
BASELINES = ("oracle", "autotune", "autotune-adaptive", "plumber", "plumber-adaptive", "heuristic")


def _policy(name: str, ablations: dict[str, str]):
    if name == "intune":
        return IntunePolicy(online=False)
    if name == "intune-online":
        return IntunePolicy(online=True)
    if name == "intune-plumber-start":
        return IntunePolicy(online=False, warm_start="plumber")
    if name.startswith("intune-") and name[len("intune-"):] in ablations:
        return IntunePolicy(weights=ablations[name[len("intune-"):]], online=False)
    return make(name)


def _conv_summary(conv: list[int | None]) -> tuple[int | None, int]:
    """(worst ticks to 95% over the phases, phases that never got there)."""
    reached = [c for c in conv if c is not None]
    return (max(reached) if reached else None), sum(c is None for c in conv)


def schedule_runs(specs, policies: list[str], period: int, seed: int, ablations: dict[str, str]) -> list[dict[str, Any]]:
    from intune.sim import Simulator, paper_schedule

    rows = []
    for spec in specs:
        scores = {}
        for name in policies:
            sim = Simulator(spec, cpus=paper_schedule(period_ticks=period), seed=seed)
            scores[name] = score_episode(sim, _policy(name, ablations), seed=seed, online=name == "intune-online")
        for name, sc in scores.items():
            worst, missed = _conv_summary(sc.convergence)
            row = {"workload": spec.name, "policy": name, "optimum_ratio": sc.ratio, "ooms": sc.ooms,
                   "convergence_ticks": sc.convergence, "worst_convergence": worst, "phases_not_converged": missed}
            for base in ("oracle", "autotune", "autotune-adaptive", "plumber-adaptive"):
                if base in scores and scores[base].ratio > 0:
                    row[f"vs_{base}"] = sc.ratio / scores[base].ratio
            rows.append(row)
    return rows


def oom_runs(episodes: int, ticks: int, policies: list[str]) -> list[dict[str, Any]]:
    """Randomised tight-memory episodes (the simulator's generator, tight limit forced, random resizes)."""
    from intune.sim import Simulator, random_workload

    rng = np.random.default_rng(HELD_OUT_SEED + 1)
    config = AgentConfig()
    cases = []
    for _ in range(episodes):
        spec = random_workload(rng, tight_memory_p=1.0)
        cases.append((spec, random_schedule(rng, config, ticks), int(rng.integers(1 << 30))))
    rows = []
    for name in policies:
        ooms = episodes_with_oom = 0
        for spec, schedule, seed in cases:
            sim = Simulator(spec, cpus=schedule, seed=seed)
            from intune.sim import run_episode

            result = run_episode(sim, _policy(name, {}), ticks)
            ooms += result.oom_count
            episodes_with_oom += result.oom_count > 0
        rows.append({"policy": name, "episodes": episodes, "ticks": ticks, "ooms": ooms,
                     "episodes_with_oom": episodes_with_oom, "oom_rate": episodes_with_oom / episodes})
    return rows


def decision_time(ticks: int = 300) -> dict[str, float]:
    from intune.sim import Simulator, load_workload

    sim = Simulator(load_workload("criteo"), cpus=128, seed=0)
    policy = IntunePolicy(online=False)
    obs = sim.reset()
    policy.reset(sim.knobs, obs)
    times = []
    for _ in range(ticks):
        t = time.perf_counter()
        request = policy.step(obs)
        times.append(time.perf_counter() - t)
        for name, value in request.items():
            sim.knobs[name].set(sim.knobs[name].clamp(value))
        obs = sim.step()
    ms = np.array(times[10:]) * 1e3
    return {"median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="shorter phases, fewer held-out specs")
    parser.add_argument("--period", type=int, default=None, help="ticks per phase (default 150, quick 60)")
    parser.add_argument("--held-out", type=int, default=None, help="held-out random specs (default 12, quick 6)")
    parser.add_argument("--held-out-seed", type=int, default=HELD_OUT_SEED,
                        help=f"seed of the held-out specs (default {HELD_OUT_SEED}; pretraining never draws it)")
    parser.add_argument("--oom-episodes", type=int, default=200, help="tight-memory episodes (0: skip that section)")
    parser.add_argument("--oom-ticks", type=int, default=None, help="ticks per OOM episode (default 120, quick 60)")
    parser.add_argument("--ablation", action="append", default=[], metavar="NAME=PATH",
                        help="an ablation network, e.g. global-only=PATH or pm1=PATH (repeatable)")
    parser.add_argument("--json", default=None, help="write {machine, results} here")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from intune.sim import list_workloads, load_workload, random_workload

    if args.oom_episodes < 0:
        raise SystemExit(f"--oom-episodes must be >= 0 (0 skips that section), got {args.oom_episodes}")
    period = args.period or (60 if args.quick else 150)
    n_held = args.held_out if args.held_out is not None else (6 if args.quick else 12)
    ablations = dict(a.split("=", 1) for a in args.ablation)
    for name, path in ablations.items():
        load_weights(path)  # fail early, naming the file
    agents = ["intune", "intune-plumber-start", "intune-online", *(f"intune-{n}" for n in ablations)]
    started = time.time()

    shipped = [load_workload(n) for n in list_workloads() if n != "ladder"]
    rng = np.random.default_rng(args.held_out_seed)
    held_out = [random_workload(rng, name=f"held-out-{i}") for i in range(n_held)]
    results: list[dict[str, Any]] = []

    print(f"== 1-3: paper resize schedule, {period} ticks per phase ==")
    rows = schedule_runs(shipped, [*agents, *BASELINES], period, args.seed, ablations)
    rows += schedule_runs(held_out, [*agents, "oracle", "autotune", "autotune-adaptive", "plumber-adaptive"],
                          period, args.seed, ablations)
    for r in rows:
        r["section"] = "schedule"
    results += rows
    cols = ["workload", "policy", "optimum_ratio", "vs_oracle", "vs_autotune", "vs_autotune-adaptive",
            "vs_plumber-adaptive", "ooms", "worst_convergence", "phases_not_converged"]
    print(format_table([r for r in rows if r["policy"] == "intune"], cols))
    summary = _summary(rows, agents)
    print(format_table(summary))
    results += [{"section": "summary", **s} for s in summary]

    oom_ticks = args.oom_ticks or (60 if args.quick else 120)
    if args.oom_episodes > 0:
        print(f"== 4: {args.oom_episodes} tight-memory episodes of {oom_ticks} ticks ==")
        ooms = oom_runs(args.oom_episodes, oom_ticks, ["intune", "autotune"])
        print(format_table(ooms))
        results += [{"section": "ooms", **r} for r in ooms]

    print("== decision time (criteo, 128 CPUs) ==")
    dt = decision_time()
    print(format_table([dt]))
    results.append({"section": "decision_time", **dt})
    print(f"done in {time.time() - started:.0f}s")
    if args.json:
        print(f"wrote {write_json(args.json, results, period_ticks=period, held_out_seed=args.held_out_seed)}")
    return 0


def _summary(rows: list[dict[str, Any]], agents: list[str]) -> list[dict[str, Any]]:
    """Per agent variant: mean and worst optimum ratio, shipped vs held-out, and convergence."""
    out = []
    for name in [*agents, *BASELINES]:
        for group, pick in (("shipped", lambda w: not w.startswith("held-out")), ("held-out", lambda w: w.startswith("held-out"))):
            sel = [r for r in rows if r["policy"] == name and pick(r["workload"])]
            if not sel:
                continue
            conv = [c for r in sel for c in r["convergence_ticks"]]
            reached = [c for c in conv if c is not None]
            out.append({
                "policy": name, "workloads": group, "n": len(sel),
                "mean_optimum_ratio": float(np.mean([r["optimum_ratio"] for r in sel])),
                "min_optimum_ratio": float(np.min([r["optimum_ratio"] for r in sel])),
                "mean_vs_oracle": float(np.mean([r.get("vs_oracle", np.nan) for r in sel])),
                "phases_within_30_ticks": f"{sum(c <= 30 for c in reached)}/{len(conv)}",
                "median_convergence": float(np.median(reached)) if reached else None,
                "ooms": int(sum(r["ooms"] for r in sel)),
            })
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m intune.agent.benchmark", description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
