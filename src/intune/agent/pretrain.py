"""``intune pretrain [--steps N] [--out PATH] [--seed S]``: pretrain the agent in the simulator.

Draws random pipelines (``intune.agent.env.random_sim``) from ``--seed``, trains with
``intune.agent.dqn.train``, scores the greedy agent on validation pipelines drawn from a different
seed, and writes the weights, the learning curve (JSON and, with ``--curve``, a PNG). The shipped
weights were made by the command in ``weights/README.md``. It must not hold the algorithm itself.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from intune.agent.config import AgentConfig
from intune.agent.dqn import TrainingLog, train
from intune.agent.env import SimEnv, random_sim
from intune.agent.evaluate import score_episode
from intune.agent.policy import DEFAULT_WEIGHTS, IntunePolicy, save_weights
from intune.bench.results import save_figure

VALIDATION_SEED_OFFSET = 1_000_003  # validation pipelines never share the training draws
VALIDATION_PIPELINES = 8
VALIDATION_TICKS = 200


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = AgentConfig()
    parser.add_argument("--steps", type=int, default=defaults.total_steps, help="vector steps of training")
    parser.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="where to write the weights")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--envs", type=int, default=defaults.num_envs, help="simulated pipelines in parallel")
    parser.add_argument("--global-only", action="store_true", help="ablation: the paper's global observation")
    parser.add_argument("--deltas", default=",".join(str(d) for d in defaults.action_deltas),
                        help="per-knob moves, e.g. -1,0,1 for the ablation without +-5")
    parser.add_argument("--curve", default=None, help="write the learning curve as a PNG here")
    parser.add_argument("--log-json", default=None, help="write the learning curve as JSON here")


def validation_sims(config: AgentConfig, n: int = VALIDATION_PIPELINES):
    """Random pipelines from a seed training never draws, half on the paper's kind of resize schedule
    (32 -> 64 -> 128 -> 64 -> 32), half from the pretraining distribution."""
    from intune.sim import Simulator, random_workload
    from intune.sim.schedule import stepped_schedule

    rng = np.random.default_rng(config.seed + VALIDATION_SEED_OFFSET)
    sims = []
    for i in range(n):
        if i % 2 == 0:
            schedule = stepped_schedule((32, 64, 128, 64, 32), VALIDATION_TICKS // 5)
            sims.append(Simulator(random_workload(rng, name=f"validation-{i}"), cpus=schedule, seed=i))
        else:
            sims.append(random_sim(rng, config, ticks=VALIDATION_TICKS))
    return sims


def make_evaluator(config: AgentConfig):
    """Greedy score (mean throughput / optimum) of a network on the fixed validation pipelines."""
    sims = validation_sims(config)

    def evaluate(q) -> float:
        scores = []
        for i, sim in enumerate(sims):
            policy = IntunePolicy(network=q, config=config, online=False)
            scores.append(score_episode(sim, policy, VALIDATION_TICKS, seed=i).ratio)
        return float(np.mean(scores))

    return evaluate


def pretrain(config: AgentConfig, out: str | Path, log=print) -> tuple[Path, TrainingLog]:
    """Train from scratch with ``config`` and write the weights to ``out``."""
    torch.set_num_threads(1)
    q, history = train(config, lambda rng: SimEnv(random_sim(rng, config)), make_evaluator(config), log=log)
    return save_weights(out, q, config), history


def plot_curve(history: TrainingLog, path: str | Path, title: str = "InTune agent pretraining") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history.steps, history.episode_reward, label="training: reward per tick (explores)", alpha=0.7)
    ax.plot(history.eval_steps, history.eval_score, "o-", label="validation: greedy throughput / optimum")
    ax.axhline(0.95, color="grey", ls=":", lw=1)
    ax.set_xlabel("vector steps (x envs transitions)")
    ax.set_ylabel("fraction of the phase optimum")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(loc="lower right")
    return save_figure(fig, path, dpi=110)


def run(args: argparse.Namespace) -> int:
    deltas = tuple(int(d) for d in str(args.deltas).split(","))
    if 0 not in deltas:
        raise SystemExit(f"--deltas must include 0 (hold), got {args.deltas}")
    command = (f"intune pretrain --steps {args.steps} --seed {args.seed} --envs {args.envs} --deltas={args.deltas}"
               + (" --global-only" if args.global_only else "") + f" --out {args.out}")
    config = AgentConfig(seed=args.seed, total_steps=args.steps, num_envs=args.envs, action_deltas=deltas,
                         global_only=args.global_only, extra={"command": command})
    started = time.time()
    path, history = pretrain(config, args.out)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB) in {time.time() - started:.0f}s; "
          f"validation score {max(history.eval_score[len(history.eval_score) // 2:], default=float('nan')):.3f} "
          f"(network of step {history.best_step})")
    if args.log_json:
        Path(args.log_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.log_json).write_text(json.dumps({"command": command, "seconds": history.seconds,
                                                   **{k: v for k, v in vars(history).items() if k != "seconds"}}) + "\n")
    if args.curve:
        print(f"wrote {plot_curve(history, args.curve)}")
    return 0
