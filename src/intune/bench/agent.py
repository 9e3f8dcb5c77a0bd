"""``intune bench agent``: the agent against every policy in the simulator, on shipped and held-out workloads.

Every shipped simulator workload (``list_workloads()`` without ``ladder``) and ``--held-out`` random specs
from each ``--held-out-seed`` (seeds pretraining never draws: it draws from its ``--seed`` and
seed + 1,000,003), ``--waiting`` more from each such seed with a map stage that waits (``waiting_specs``),
over the paper's resize schedule 32 -> 64 -> 128 -> 64 -> 32 at each ``--period``; and on small machines
(``--small-levels``, 2 -> 4 -> 8 -> 4 -> 2 CPUs) the live benchmark's pipeline as a spec
(``tune_workload.simulated_spec``) with the waiting specs, the regime ``intune bench tune`` runs in.
Each (workload, policy, period) episode goes through ``intune.sim.run_episode`` and is scored against
the phase optimum by ``intune.agent.evaluate.score_episode``: mean model throughput / mean optimum, OOM
ticks, ticks to 95% of the optimum per phase. Then a per-policy summary, the OOMs of ``planner``, ``network``, ``steer``
and ``autotune`` over randomised tight-memory episodes, and each policy's decision time. Episodes run
in a process pool of ``--jobs`` (each worker builds its own policies; the results equal ``--jobs 1``).
A policy missing from ``intune.policies`` is skipped with a note; an episode that fails is reported and
left out. It must not train anything: the ablations are networks made by ``intune pretrain``.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import numpy as np

from intune.bench import md_report
from intune.policies import POLICY_NAMES, make
from intune.results import format_table, machine_info, write_json

HELD_OUT_SEEDS = (20_231_117, 777)
"""Seeds of the held-out random specs; pretraining draws from its --seed (0 for the shipped weights) and
seed + 1,000,003, never these."""
WAITING_STREAM = 1
"""The held-out seed's second stream (``default_rng([seed, WAITING_STREAM])``) draws the specs with a
waiting map stage, so that they are neither the held-out specs nor pretraining's."""
OOM_SEED = 20_231_118  # the tight-memory episodes' generator
POLICIES = (
    "planner",
    "planner+agent",
    "network",
    "steer",
    "network+steer",
    "oracle",
    "oracle-safe",
    "autotune",
    "autotune-adaptive",
    "plumber-adaptive",
    "heuristic",
)
OOM_POLICIES = ("planner", "network", "steer", "autotune")
PERIODS = (60, 150)
SMALL_LEVELS = (2, 4, 8, 4, 2)
"""CPUs of the small machines' resize schedule: the live benchmark's machine has 2."""
WITHIN_TICKS = 30  # a phase counts as converged when it reaches 95% of its optimum within this many ticks
BELOW = 0.98  # held-out specs where intune / autotune is under this are counted
OOM_CHUNK = 25  # tight-memory episodes per pool task


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="60-tick phases only, 8 held-out specs per seed, 100 tight-memory episodes",
    )
    parser.add_argument(
        "--period",
        type=int,
        action="append",
        default=None,
        metavar="P",
        help="ticks per phase of the resize schedule (repeatable; default 60 and 150, quick 60)",
    )
    parser.add_argument(
        "--held-out",
        type=int,
        default=None,
        metavar="N",
        help="random specs from each held-out seed (default 40, quick 8)",
    )
    parser.add_argument(
        "--held-out-seed",
        type=int,
        action="append",
        default=None,
        metavar="S",
        help="seed of held-out specs (repeatable; default "
        + " and ".join(str(s) for s in HELD_OUT_SEEDS)
        + ", which pretraining never draws)",
    )
    parser.add_argument(
        "--waiting",
        type=int,
        default=None,
        metavar="N",
        help="random specs with a map stage that waits on I/O or the GIL from each held-out seed "
        "(default 10, quick 4; 0 skips them)",
    )
    parser.add_argument(
        "--small-levels",
        default=",".join(map(str, SMALL_LEVELS)),
        metavar="C,C,...",
        help="CPUs of each phase of the small machines' schedule, on which the live benchmark's pipeline and the "
        "waiting specs run too (default %(default)s; 'none' skips that group)",
    )
    parser.add_argument(
        "--ablation",
        action="append",
        default=[],
        metavar="NAME=WEIGHTS",
        help="an ablation network from `intune pretrain`, row network-NAME (repeatable)",
    )
    parser.add_argument(
        "--oom-episodes",
        type=int,
        default=None,
        metavar="N",
        help="randomised tight-memory episodes (default 1000, quick 100; 0 skips that section)",
    )
    parser.add_argument(
        "--oom-ticks", type=int, default=None, help="ticks per tight-memory episode (default 120, quick 60)"
    )
    parser.add_argument(
        "--workload",
        action="append",
        default=None,
        help="a shipped name or a .yaml/.json path (repeatable; default: every shipped workload)",
    )
    parser.add_argument(
        "--policies",
        default=None,
        help="comma-separated subset (default: " + ",".join(POLICIES) + "; ablations are added)",
    )
    parser.add_argument(
        "--decision-ticks", type=int, default=300, help="ticks of the decision-time run (0 skips it)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="J",
        help=f"episodes in parallel processes (default os.cpu_count(), here {os.cpu_count()})",
    )
    parser.add_argument("--seed", type=int, default=0, help="the simulator's seed in every schedule episode")
    parser.add_argument("--json", metavar="PATH", help="write {machine, results} here")
    parser.add_argument("--md", metavar="PATH", help="write the Markdown report here")


# ------------------------------------------------------------------------------------------- the runs


def waiting_specs(seed: int, n: int) -> list:
    """``n`` random specs (3 to 8 stages) each with one map stage that waits, on I/O (the even ones) or on
    the GIL (the odd ones), as pretraining's ``--waiting-share`` draws them
    (``agent.env.with_waiting_stage``), from the held-out seed's ``WAITING_STREAM``.

    Why: the held-out specs' stages wait only in the first one (a reader). A stage that fetches rows
    after a cheap source (ids, then a store) is busy on little CPU and needs more workers than the
    CPUs, as the live benchmark's pipeline does; one that waits on the GIL looks alike and gains
    nothing from them. Without these the benchmark cannot see either."""
    from intune.agent.env import with_waiting_stage
    from intune.sim import Simulator, paper_schedule, random_workload

    rng = np.random.default_rng([seed, WAITING_STREAM])
    out = []
    while len(out) < n:
        spec = random_workload(rng, min_stages=3, name=f"waiting-{seed}-{len(out)}")
        sim = Simulator(spec, cpus=paper_schedule(period_ticks=1), seed=0)
        waiting = with_waiting_stage(rng, sim, gil_share=float(len(out) % 2))  # I/O, GIL, I/O, ...
        if waiting is not sim:
            out.append(waiting.spec)
    return out


def build_policy(name: str, ablations: dict[str, str]):
    """``make(name)``, or for an ablation row ``network-NAME`` the network policy with those weights."""
    if name.startswith("network-") and name[len("network-") :] in ablations:
        return make("network", weights=ablations[name[len("network-") :]])
    return make(name)


def run_schedule_episode(task: tuple) -> tuple[dict[str, Any] | None, str | None]:
    """One (workload, policy, period) episode, scored against the phase optimum. ``task``: ``(spec, group,
    held_out_seed, policy, ablations, period, seed, levels)``, where ``levels`` is each phase's CPUs, or
    None for the paper's schedule.

    Runs in a pool worker as well as in-process: it builds its own policy and simulator."""
    from intune.agent.evaluate import score_episode
    from intune.sim import Simulator, paper_schedule
    from intune.sim.schedule import stepped_schedule

    spec, group, held_out_seed, name, ablations, period, seed, levels = task
    try:
        schedule = paper_schedule(period_ticks=period) if levels is None else stepped_schedule(levels, period)
        sim = Simulator(spec, cpus=schedule, seed=seed)
        score = score_episode(sim, build_policy(name, ablations), seed=seed)
    except Exception as e:  # a failing policy must not stop the benchmark
        return (
            None,
            f"{name} failed on {spec.name} (period {period}): {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}",
        )
    return {
        "section": "episode",
        "workload": spec.name,
        "group": group,
        "held_out_seed": held_out_seed,
        "policy": name,
        "period": period,
        "cpu_levels": list(levels or paper_schedule(period_ticks=period).levels),
        "optimum_ratio": score.ratio,
        "ooms": score.ooms,
        "convergence_ticks": score.convergence,
        "mean_reward": score.mean_reward,
    }, None


def oom_cases(episodes: int, ticks: int, seed: int = OOM_SEED) -> list[tuple]:
    """Randomised tight-memory episodes: ``(spec, schedule, seed)``, the generator's tight limit forced,
    random resizes (``intune.agent.env.random_schedule``)."""
    from intune.agent.config import AgentConfig
    from intune.agent.env import random_schedule
    from intune.sim import random_workload

    rng = np.random.default_rng(seed)
    config = AgentConfig()
    cases = []
    for _ in range(episodes):
        spec = random_workload(rng, tight_memory_p=1.0)
        cases.append((spec, random_schedule(rng, config, ticks), int(rng.integers(1 << 30))))
    return cases


def run_oom_chunk(task: tuple) -> tuple[tuple[int, int] | None, str | None]:
    """(OOM ticks, episodes with an OOM) of one policy over some tight-memory episodes."""
    from intune.sim import Simulator, run_episode

    name, cases, ticks = task
    ooms = with_oom = 0
    try:
        for spec, schedule, seed in cases:
            result = run_episode(Simulator(spec, cpus=schedule, seed=seed), make(name), ticks)
            ooms += result.oom_count
            with_oom += result.oom_count > 0
    except Exception as e:
        return (
            None,
            f"{name} failed on a tight-memory episode: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}",
        )
    return (ooms, with_oom), None


def run_pool(fn: Callable[[Any], Any], tasks: Sequence[Any], jobs: int, label: str) -> list[Any]:
    """``[fn(t) for t in tasks]`` in ``jobs`` processes (spawned: each imports and builds its own), in
    task order whatever order they finish in; progress printed at every tenth."""
    n = len(tasks)
    out: list[Any] = [None] * n
    started = time.perf_counter()
    marks = {math.ceil(n * k / 10) for k in range(1, 11)}

    def progress(done: int) -> None:
        if done in marks:
            print(f"  {label}: {done}/{n} ({time.perf_counter() - started:.0f} s)", flush=True)

    if jobs <= 1 or n <= 1:
        for i, task in enumerate(tasks):
            out[i] = fn(task)
            progress(i + 1)
        return out
    with ProcessPoolExecutor(
        max_workers=min(jobs, n), mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
        for done, future in enumerate(as_completed(futures), 1):
            out[futures[future]] = future.result()
            progress(done)
    return out


def decision_time(
    ticks: int = 300, policy: str = "planner", ablations: dict[str, str] | None = None
) -> dict[str, Any]:
    """Wall ms of ``policy.step`` and of the runner's clamp and apply per tick, criteo at 128 CPUs
    (the first 10 ticks left out as warm-up when there are more than 20)."""
    from intune.policies.runner import Runner
    from intune.sim import Simulator, load_workload

    sim = Simulator(load_workload("criteo"), cpus=128, seed=0)
    p = build_policy(policy, ablations or {})
    if hasattr(p, "bind_simulator"):
        p.bind_simulator(sim)
    runner = Runner(sim.knobs)
    obs = runner.observe(sim.reset(0))
    p.reset(sim.knobs, obs)
    step, clamp = [], []
    for _ in range(ticks):
        t = time.perf_counter()
        request = p.step(obs)
        t1 = time.perf_counter()
        if request:
            runner.apply(obs, request)
        clamp.append(time.perf_counter() - t1)
        step.append(t1 - t)
        obs = runner.observe(sim.step())
    skip = 10 if ticks > 20 else 0
    ms, cl = np.array(step[skip:]) * 1e3, np.array(clamp[skip:]) * 1e3
    return {
        "policy": policy,
        "median_ms": float(np.median(ms)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "clamp_median_ms": float(np.median(cl)),
        "clamp_p99_ms": float(np.percentile(cl, 99)),
    }


# ---------------------------------------------------------------------------------------- the metrics


def _within(conv: Sequence[int | None]) -> int:
    return sum(c is not None and c <= WITHIN_TICKS for c in conv)


def _mean_worst(rows: list[dict[str, Any]]) -> tuple[float | None, float | None, str | None]:
    if not rows:
        return None, None, None
    worst = min(rows, key=lambda r: r["optimum_ratio"])
    return (
        float(np.mean([r["optimum_ratio"] for r in rows])),
        float(worst["optimum_ratio"]),
        worst["workload"],
    )


def _by_spec(
    rows: list[dict[str, Any]], policy: str, period: int, group: str = "held-out"
) -> dict[str, dict[str, Any]]:
    return {
        r["workload"]: r
        for r in rows
        if r["policy"] == policy and r["period"] == period and r["group"] == group
    }


def is_agent(name: str) -> bool:
    """The planner, the network, their combinations and ablation rows: the policies compared with autotune
    and steer."""
    return name.startswith(("intune", "planner", "network"))


def is_compared(name: str) -> bool:
    """The agents, and beside them the safe oracle: its ratios to autotune and steer are the most any
    policy held to the safety layer's memory margins can have, what the targets can ask."""
    return is_agent(name) or name == "oracle-safe"


def summarize(
    rows: list[dict[str, Any]], policies: Sequence[str], periods: Sequence[int]
) -> list[dict[str, Any]]:
    """Per period and policy: mean and worst ratio to the phase optimum on shipped, on held-out specs, on
    the specs with a waiting stage and on the small machines, phases at 95% within ``WITHIN_TICKS``
    ticks, OOM ticks; for the agent's rows also, over the held-out specs where autotune had no OOM, the
    worst intune / autotune and how many are below ``BELOW``, and the mean intune / steer over the
    held-out specs, the waiting ones and the small machines' runs."""
    out = []
    for period in periods:
        for name in policies:
            sel = [r for r in rows if r["policy"] == name and r["period"] == period]
            if not sel:
                continue
            shipped = _mean_worst([r for r in sel if r["group"] == "shipped"])
            held = _mean_worst([r for r in sel if r["group"] == "held-out"])
            waiting = _mean_worst([r for r in sel if r["group"] == "waiting"])
            small = _mean_worst([r for r in sel if r["group"] == "small"])
            conv = [c for r in sel for c in r["convergence_ticks"]]
            row: dict[str, Any] = {
                "section": "summary",
                "policy": name,
                "period": period,
                "shipped_n": sum(r["group"] == "shipped" for r in sel),
                "shipped_mean": shipped[0],
                "shipped_worst": shipped[1],
                "shipped_worst_workload": shipped[2],
                "held_out_n": sum(r["group"] == "held-out" for r in sel),
                "held_out_mean": held[0],
                "held_out_worst": held[1],
                "held_out_worst_workload": held[2],
                "waiting_n": sum(r["group"] == "waiting" for r in sel),
                "waiting_mean": waiting[0],
                "waiting_worst": waiting[1],
                "waiting_worst_workload": waiting[2],
                "small_n": sum(r["group"] == "small" for r in sel),
                "small_mean": small[0],
                "small_worst": small[1],
                "small_worst_workload": small[2],
                "phases_within_30": f"{_within(conv)}/{len(conv)}",
                "phases_within_30_share": _within(conv) / len(conv) if conv else None,
                "ooms": int(sum(r["ooms"] for r in sel)),
            }
            if is_compared(name):
                row.update(versus(rows, name, period))
            out.append(row)
    return out


def versus(rows: list[dict[str, Any]], name: str, period: int) -> dict[str, Any]:
    mine = _by_spec(rows, name, period)
    auto = _by_spec(rows, "autotune", period)
    steer = _by_spec(rows, "steer", period)
    vs_auto = sorted(
        (mine[w]["optimum_ratio"] / a["optimum_ratio"], w)
        for w, a in auto.items()
        if w in mine and a["ooms"] == 0 and a["optimum_ratio"] > 0
    )
    vs_steer = _ratios(mine, steer)
    vs_steer_waiting = _ratios(_by_spec(rows, name, period, "waiting"), _by_spec(rows, "steer", period, "waiting"))
    vs_steer_small = _ratios(_by_spec(rows, name, period, "small"), _by_spec(rows, "steer", period, "small"))
    return {
        "vs_autotune_specs": len(vs_auto),
        "vs_autotune_min": vs_auto[0][0] if vs_auto else None,
        "vs_autotune_min_workload": vs_auto[0][1] if vs_auto else None,
        "vs_autotune_below_0.98": sum(v < BELOW for v, _ in vs_auto),
        "vs_steer_specs": len(vs_steer),
        "vs_steer_mean": float(np.mean(vs_steer)) if vs_steer else None,
        "vs_steer_waiting_specs": len(vs_steer_waiting),
        "vs_steer_waiting_mean": float(np.mean(vs_steer_waiting)) if vs_steer_waiting else None,
        "vs_steer_small_specs": len(vs_steer_small),
        "vs_steer_small_mean": float(np.mean(vs_steer_small)) if vs_steer_small else None,
    }


def _ratios(mine: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]) -> list[float]:
    """Per spec both ran: my ratio to the optimum / theirs (specs where theirs is 0 left out)."""
    return [mine[w]["optimum_ratio"] / t["optimum_ratio"] for w, t in theirs.items() if w in mine and t["optimum_ratio"] > 0]


def losses(rows: list[dict[str, Any]], periods: Sequence[int], name: str = "planner") -> list[str]:
    """Per period, the policy's wins over autotune and steer on the held-out specs, then one line per spec
    where it is below either, worst first."""
    lines = []
    for period in periods:
        mine = _by_spec(rows, name, period)
        rivals = {p: _by_spec(rows, p, period) for p in ("autotune", "steer")}
        counts = []
        for p, theirs in rivals.items():
            both = [w for w in mine if w in theirs]
            if both:
                wins = sum(mine[w]["optimum_ratio"] >= theirs[w]["optimum_ratio"] for w in both)
                counts.append(f"at or above {p} on {wins} of {len(both)}")
        if not mine or not counts:
            continue
        lines.append(f"- period {period}: {name} " + ", ".join(counts) + " held-out specs.")
        below = []
        for w, r in mine.items():
            hits = [
                f"{p} {theirs[w]['optimum_ratio']:.3f} ({r['optimum_ratio'] / theirs[w]['optimum_ratio']:.3f}x)"
                for p, theirs in rivals.items()
                if w in theirs and r["optimum_ratio"] < theirs[w]["optimum_ratio"]
            ]
            if hits:
                # only rivals above this row (so above 0): a rival killed by OOMs at 0 is no loss
                worst = min(
                    r["optimum_ratio"] / theirs[w]["optimum_ratio"]
                    for theirs in rivals.values()
                    if w in theirs and r["optimum_ratio"] < theirs[w]["optimum_ratio"]
                )
                below.append((worst, f"  - {w}: {name} {r['optimum_ratio']:.3f}; " + ", ".join(hits)))
        lines += [line for _, line in sorted(below)]
    return lines


# ----------------------------------------------------------------------------------------------- run


def _ablation_paths(specs: list[str]) -> dict[str, str]:
    """``--ablation NAME=WEIGHTS`` options as name -> weights path (not loaded)."""
    out = {}
    for item in specs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--ablation wants NAME=WEIGHTS, got {item!r}")
        out[name] = path
    return out


def _ablations(specs: list[str]) -> dict[str, str]:
    out = _ablation_paths(specs)
    for name, path in out.items():
        try:
            make("network", weights=path)  # fail early, naming the file
        except (OSError, ValueError) as e:
            raise SystemExit(f"--ablation {name}: {e}") from e
    return out


def read_files(args: argparse.Namespace) -> list[str]:
    """Files this command reads (``intune.bench.files``): the ablation networks' weights."""
    return list(_ablation_paths(args.ablation).values())


def _available(wanted: Sequence[str], ablations: dict[str, str]) -> tuple[list[str], list[str]]:
    ok, notes = [], []
    for name in wanted:
        if name.startswith("network-") and name[len("network-") :] in ablations:
            continue  # an ablation row: added below, whether listed or not
        if name not in POLICY_NAMES:
            notes.append(f"skipped {name}: not in intune.policies.POLICY_NAMES")
            continue
        try:
            make(name)
            ok.append(name)
        except Exception as e:  # a policy another engineer has not finished must not stop the benchmark
            notes.append(f"skipped {name}: {type(e).__name__}: {e}")
    return ok + [f"network-{n}" for n in ablations], notes


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from intune.bench.tune_workload import simulated_spec
    from intune.sim import list_workloads, load_workload, random_workload

    periods = list(dict.fromkeys(args.period or ((60,) if args.quick else PERIODS)))
    n_held = args.held_out if args.held_out is not None else (8 if args.quick else 40)
    n_waiting = args.waiting if args.waiting is not None else (4 if args.quick else 10)
    seeds = list(dict.fromkeys(args.held_out_seed or HELD_OUT_SEEDS))
    oom_episodes = args.oom_episodes if args.oom_episodes is not None else (100 if args.quick else 1000)
    oom_ticks = args.oom_ticks or (60 if args.quick else 120)
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    for flag, value, low in (
        ("--oom-episodes", oom_episodes, 0),
        ("--held-out", n_held, 0),
        ("--waiting", n_waiting, 0),
        ("--jobs", jobs, 1),
        ("--decision-ticks", args.decision_ticks, 0),
        ("--oom-ticks", oom_ticks, 1),
        *(("--period", p, 1) for p in periods),
    ):
        if value < low:
            skip = " (0 skips that section)" if low == 0 and flag not in ("--held-out", "--waiting") else ""
            raise SystemExit(f"{flag} must be >= {low}{skip}, got {value}")
    small_levels = _levels(args.small_levels)
    ablations = _ablations(args.ablation)
    wanted = args.policies.split(",") if args.policies else list(POLICIES)
    policies, notes = _available(wanted, ablations)
    for note in notes:
        print(note)

    shipped = [load_workload(w) for w in (args.workload or [w for w in list_workloads() if w != "ladder"])]
    held_out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        held_out += [(random_workload(rng, name=f"held-out-{seed}-{i}"), seed) for i in range(n_held)]
    waiting = [(s, seed) for seed in seeds for s in waiting_specs(seed, n_waiting)]
    small = [] if small_levels is None else [(simulated_spec(), None), *waiting]
    specs = [
        *((s, "shipped", None, None) for s in shipped),
        *((s, "held-out", seed, None) for s, seed in held_out),
        *((s, "waiting", seed, None) for s, seed in waiting),
        *((s, "small", seed, small_levels) for s, seed in small),
    ]
    tasks = [
        (spec, group, hseed, name, ablations, period, args.seed, levels)
        for period in periods
        for spec, group, hseed, levels in specs
        for name in policies
    ]
    print(
        f"== {len(shipped)} shipped + {len(held_out)} held-out + {len(waiting)} waiting + {len(small)} small-machine "
        "workloads x "
        f"{len(policies)} policies x "
        f"periods {', '.join(map(str, periods))}: {len(tasks)} episodes, {jobs} jobs ==",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for row, err in run_pool(run_schedule_episode, tasks, jobs, "episodes"):
        if err:
            print(err)
            notes.append(err.splitlines()[0])
        else:
            rows.append(row)
    summary = summarize(rows, policies, periods)
    _print_summary(summary)
    results: list[dict[str, Any]] = [*rows, *summary]
    loss_lines = losses(rows, periods) if "planner" in policies else []
    if loss_lines:
        print("\nwhere the planner is below autotune or steer on held-out specs:")
        print("\n".join(loss_lines))

    oom_rows: list[dict[str, Any]] = []
    if oom_episodes > 0:
        oom_policies = [p for p in OOM_POLICIES if p in policies]
        print(
            f"\n== {oom_episodes} tight-memory episodes of {oom_ticks} ticks: {', '.join(oom_policies)} ==",
            flush=True,
        )
        cases = oom_cases(oom_episodes, oom_ticks)
        chunks = [cases[i : i + OOM_CHUNK] for i in range(0, len(cases), OOM_CHUNK)]
        oom_tasks = [(p, chunk, oom_ticks) for p in oom_policies for chunk in chunks]
        done = run_pool(run_oom_chunk, oom_tasks, jobs, "tight-memory chunks")
        for p in oom_policies:
            parts = [r for (name, _, _), r in zip(oom_tasks, done, strict=True) if name == p]
            errors = [e for _, e in parts if e]
            for e in errors:
                print(e)
                notes.append(e.splitlines()[0])
            if errors:
                continue
            ooms, with_oom = sum(r[0] for r, _ in parts), sum(r[1] for r, _ in parts)
            oom_rows.append(
                {
                    "section": "ooms",
                    "policy": p,
                    "episodes": oom_episodes,
                    "ticks": oom_ticks,
                    "ooms": ooms,
                    "episodes_with_oom": with_oom,
                    "oom_rate": with_oom / oom_episodes,
                }
            )
        print(
            format_table(oom_rows, ["policy", "episodes", "ticks", "ooms", "episodes_with_oom", "oom_rate"])
        )
        results += oom_rows

    decision_rows: list[dict[str, Any]] = []
    if args.decision_ticks > 0:
        print(f"\n== decision time (criteo, 128 CPUs, {args.decision_ticks} ticks) ==", flush=True)
        for p in policies:
            try:
                decision_rows.append(
                    {"section": "decision_time", **decision_time(args.decision_ticks, p, ablations)}
                )
            except Exception as e:
                notes.append(f"decision time of {p} failed: {type(e).__name__}: {e}")
                print(notes[-1])
        print(
            format_table(
                decision_rows, ["policy", "median_ms", "p99_ms", "max_ms", "clamp_median_ms", "clamp_p99_ms"]
            )
        )
        results += decision_rows

    wall = time.perf_counter() - started
    print(f"\nmachine: {machine_info().get('usable_cpus')} CPUs; {jobs} jobs; wall time {wall:.0f} s")
    extra = {
        "periods": periods,
        "held_out_seeds": seeds,
        "held_out_per_seed": n_held,
        "waiting_per_seed": n_waiting,
        "small_levels": list(small_levels) if small_levels is not None else None,
        "oom_episodes": oom_episodes,
        "oom_ticks": oom_ticks,
        "jobs": jobs,
        "wall_s": wall,
        "notes": notes,
    }
    if args.json:
        print(f"wrote {write_json(args.json, results, **extra)}")
    if args.md:
        context = _context(shipped, seeds, n_held, n_waiting, small_levels, periods, jobs, wall, notes)
        report = md_report.agent_report(
            md_report.command_line(("bench", "agent")),
            machine_info(),
            context,
            summary,
            loss_lines,
            rows,
            oom_rows,
            decision_rows,
        )
        print(f"wrote {md_report.write(args.md, report)}")
    return 0


def _print_summary(summary: list[dict[str, Any]]) -> None:
    print(
        format_table(
            summary,
            [
                "policy",
                "period",
                "shipped_mean",
                "shipped_worst",
                "held_out_mean",
                "held_out_worst",
                "waiting_mean",
                "waiting_worst",
                "small_mean",
                "small_worst",
                "phases_within_30",
                "ooms",
                "vs_autotune_min",
                "vs_autotune_below_0.98",
                "vs_steer_mean",
                "vs_steer_waiting_mean",
                "vs_steer_small_mean",
            ],
        )
    )


def _levels(text: str) -> tuple[int, ...] | None:
    """``--small-levels``: CPUs per phase, or None for 'none'; a bad value exits naming the flag."""
    if text.strip().lower() == "none":
        return None
    try:
        levels = tuple(int(c) for c in text.split(","))
    except ValueError:
        raise SystemExit(f"--small-levels must be CPUs separated by commas (or 'none'), got {text!r}") from None
    if not levels or min(levels) < 1:
        raise SystemExit(f"--small-levels must be CPUs >= 1, got {text!r}")
    return levels


def _context(shipped, seeds, n_held, n_waiting, small_levels, periods, jobs, wall, notes) -> list[str]:
    return [
        f"Paper resize schedule 32 -> 64 -> 128 -> 64 -> 32 CPUs, {' and '.join(map(str, periods))} ticks per phase.",
        f"Shipped workloads ({len(shipped)}): {', '.join(s.name for s in shipped)}.",
        f"Held-out: {n_held} random specs from each of the seeds {', '.join(map(str, seeds))} (pretraining draws "
        "from its --seed and seed + 1,000,003).",
        f"Waiting: {n_waiting} random specs from each of those seeds' second stream with one map stage that waits, "
        "on I/O (half of them) or on the GIL, as pretraining's --waiting-share draws them (`waiting_specs`).",
        *(
            [f"Small machines: the live benchmark's pipeline as a spec (`tune_workload.simulated_spec`, tune-live) and "
             f"the waiting specs, on {' -> '.join(map(str, small_levels))} CPUs."]
            if small_levels is not None else []
        ),
        "Ratio: mean model throughput / mean phase optimum (`sim.optimum(cpus, objective='throughput')`: the most "
        "rows/s of any allocation that cannot OOM, at the current CPUs, refreshed every "
        f"120 ticks); a phase converges when it holds 95% of its optimum, counted within {WITHIN_TICKS} ticks.",
        f"{jobs} jobs; wall time {wall:.0f} s. {md_report.load_line()}",
        *(f"Note: {n}" for n in notes),
    ]
