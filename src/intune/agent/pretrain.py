"""``intune pretrain [--rounds R] [--steps N] [--out PATH] [--seed S]``: pretrain the agent in the simulator.

Draws random pipelines from ``--seed`` (``random_sim``: random machines, resizes, memory limits and
consumers; half of them on the paper's kind of resize schedule), first imitates the oracle
(``intune.agent.imitation``, DAgger rounds), then fine-tunes with DQN (``intune.agent.dqn.train``,
``--steps``; 0 skips it: the imitation-only ablation). The greedy agent is scored on validation
episodes (the agent benchmark's kind) drawn from a different seed after every round and every
``eval_every`` DQN steps; the network written is the best-validated one of the DQN's second half, or
the imitation's if no DQN network validates better. ``--members M`` pretrains M networks from seeds
``--seed`` on and keeps them as an ensemble or, with ``--keep best``, the best-validated one. Writes
the weights and the learning curve (JSON and, with ``--curve``, a PNG). The shipped weights were made
by the command in ``weights/README.md``. It must not hold the algorithm itself.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from intune.agent.config import AgentConfig
from intune.agent.decision import DECISIONS
from intune.agent.dqn import TrainingLog, new_network, train
from intune.agent.env import SimEnv, random_sim, with_remote_pool, with_waiting_stage
from intune.agent.evaluate import score_episode
from intune.agent.imitation import ImitationLog, imitate
from intune.agent.network import BranchingQNetwork, EnsembleQNetwork
from intune.agent.policy import DEFAULT_WEIGHTS, IntunePolicy, save_weights
from intune.results import save_figure
from intune.sim.schedule import PAPER_LEVELS

VALIDATION_SEED_OFFSET = 1_000_003  # validation pipelines never share the training draws
VALIDATION_PERIOD = 60  # ticks per phase of the validation episodes' resize schedule (the agent benchmark's)
VALIDATION_TICKS = len(PAPER_LEVELS) * VALIDATION_PERIOD  # one pass of the paper's schedule
KEEP_RULES = ("ensemble", "best")  # what pretrain keeps of several members


def configure(parser: argparse.ArgumentParser) -> None:
    defaults = AgentConfig()
    parser.add_argument("--rounds", type=int, default=defaults.imitation_rounds, help="DAgger rounds of imitation")
    parser.add_argument("--episodes", type=int, default=defaults.imitation_episodes, help="episodes per DAgger round")
    parser.add_argument("--steps", type=int, default=defaults.total_steps,
                        help="vector steps of DQN fine-tuning after imitation (0: imitation only)")
    parser.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="where to write the weights")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--envs", type=int, default=defaults.num_envs, help="simulated pipelines in parallel")
    parser.add_argument("--remote-share", type=float, default=defaults.imitation_remote_share,
                        help="share of the imitation's pipelines with a remote pool")
    parser.add_argument("--waiting-share", type=float, default=defaults.imitation_waiting_share,
                        help="share of the imitation's pipelines with a map stage that waits on I/O")
    parser.add_argument("--regret-weight", type=float, default=defaults.imitation_regret_weight,
                        help="weight of the imitation's expected-regret term, every action priced where it "
                             "lands (AgentConfig.imitation_regret_weight; 0: off)")
    parser.add_argument("--members", type=int, default=defaults.ensemble_members,
                        help="networks pretrained from seeds SEED.. SEED+M-1 (see --keep)")
    parser.add_argument("--keep", choices=KEEP_RULES, default="ensemble",
                        help="with --members > 1: all members deciding together (ensemble), or the one that "
                             "scores best on SEED's validation episodes, which every member validates on (best)")
    parser.add_argument("--decision", choices=DECISIONS, default=defaults.decision,
                        help="how the network's Q-values become moves, in validation and wherever the network "
                             "acts (AgentConfig.decision); stored with the weights")
    parser.add_argument("--jobs", type=int, default=1, help="member networks pretrained at a time, in processes")
    parser.add_argument("--validation", type=int, default=defaults.validation_pipelines,
                        help="validation pipelines that pick the best round")
    parser.add_argument("--curve", default=None, help="write the learning curve as a PNG here")
    parser.add_argument("--log-json", default=None, help="write the learning curve as JSON here")


def validation_sims(config: AgentConfig, n: int | None = None, seed: int | None = None):
    """The agent benchmark's kind of held-out episode on random specs from a seed training never draws
    (``random_workload`` on the paper's resize schedule, 32 -> 64 -> 128 -> 64 -> 32 CPUs, 60 ticks
    each), plus as many with a remote pool as the imitation's remote share asks. ``seed`` (default
    ``config.seed``) picks the set.

    Why this kind: the network kept is the best-validated one, and DAgger rounds of one run differ by
    up to 0.2 of the optimum on held-out specs, so validation must rank networks as the benchmark does.
    """
    from intune.sim import Simulator, paper_schedule, random_workload

    rng = np.random.default_rng((config.seed if seed is None else seed) + VALIDATION_SEED_OFFSET)
    n = config.validation_pipelines if n is None else n
    sims = [Simulator(random_workload(rng, name=f"validation-{i}"), cpus=paper_schedule(period_ticks=VALIDATION_PERIOD), seed=i)
            for i in range(n)]
    for _ in range(math.ceil(n * config.imitation_remote_share)):  # beside a remote pool, as the imitation
        sims.append(with_remote_pool(rng, training_sim(rng, config, VALIDATION_TICKS), VALIDATION_TICKS))
    for _ in range(math.ceil(n * config.imitation_waiting_share)):  # a waiting map stage, as the imitation
        sims.append(with_waiting_stage(rng, training_sim(rng, config, VALIDATION_TICKS)))
    return sims


def make_evaluator(config: AgentConfig, seed: int | None = None):
    """Greedy score (mean throughput / optimum) of a network on the fixed validation episodes of
    ``seed`` (default ``config.seed``)."""
    sims = validation_sims(config, seed=seed)

    def evaluate(q) -> float:
        scores = []
        for i, sim in enumerate(sims):
            policy = IntunePolicy(network=q, config=config, online=False)
            scores.append(score_episode(sim, policy, VALIDATION_TICKS, seed=i).ratio)
        return float(np.mean(scores))

    return evaluate


def training_sim(rng: np.random.Generator, config: AgentConfig, ticks: int):
    """One pretraining pipeline: half from ``random_sim``, half a random workload on the paper's kind of
    resize schedule (phases of 20-60 ticks)."""
    from intune.sim import Simulator, paper_schedule, random_workload

    if rng.random() < 0.5:
        return random_sim(rng, config, ticks=ticks)
    schedule = paper_schedule(period_ticks=int(rng.integers(20, 61)))
    return Simulator(random_workload(rng), cpus=schedule, seed=int(rng.integers(2**31)))


def imitation_sim(rng: np.random.Generator, config: AgentConfig):
    """One imitation pipeline: a ``training_sim``, with a remote pool in ``imitation_remote_share`` of them."""
    sim = training_sim(rng, config, config.imitation_ticks)
    if config.imitation_remote_share > 0 and rng.random() < config.imitation_remote_share:  # 0: the draws as before
        sim = with_remote_pool(rng, sim, config.imitation_ticks)
    if config.imitation_waiting_share > 0 and rng.random() < config.imitation_waiting_share:  # 0: as before
        sim = with_waiting_stage(rng, sim)
    return sim


@dataclass
class MemberLog:
    """One member network's pretraining: its seed, the DAgger rounds and the DQN steps (None: none)."""

    seed: int
    imitation: ImitationLog
    dqn: TrainingLog | None


def pretrain(config: AgentConfig, out: str | Path, log=print, jobs: int = 1,
             keep: str = "ensemble") -> tuple[Path, list[MemberLog]]:
    """Train from scratch with ``config`` and write the weights to ``out``: one network, or with
    ``ensemble_members`` M, M networks pretrained alike from seeds ``seed`` to ``seed + M - 1``,
    ``jobs`` at a time in processes of their own, and then by ``keep``:

    - ``ensemble``: all M deciding together; member ``i`` is what ``--seed seed+i`` alone would make.
    - ``best``: the one member that scores best on ``seed``'s validation episodes. Every member picks
      its round on that same set, so one validation set decides everything: a seed's own set would
      rank its members on episodes the others never saw.

    Why several seeds: networks pretrained alike from different seeds differ on held-out specs by more
    than most changes to training move them (docs/agent.md).
    """
    if keep not in KEEP_RULES:
        raise ValueError(f"keep must be one of {KEEP_RULES}, got {keep!r}")
    configs = [replace(config, seed=config.seed + i, ensemble_members=1) for i in range(config.ensemble_members)]
    validation_seed = config.seed if keep == "best" else None
    if jobs > 1 and len(configs) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(jobs, len(configs))) as pool:
            made = list(pool.map(_member_in_process, configs, [validation_seed] * len(configs)))
    else:
        made = []
        for c in configs:
            if len(configs) > 1:
                log(f"member seed {c.seed} of {len(configs)} members")
            made.append(pretrain_network(c, log, validation_seed))
    networks = [q for q, _, _ in made]
    logs = [MemberLog(c.seed, imitation, history) for c, (_, imitation, history) in zip(configs, made, strict=True)]
    if len(networks) == 1:
        return save_weights(out, networks[0], config), logs
    evaluate = make_evaluator(config)
    if keep == "best":
        scores = [evaluate(q) for q in networks]
        for c, score in zip(configs, scores, strict=True):
            log(f"member seed {c.seed}: validation {score:.3f} on seed {config.seed}'s episodes")
        best = int(np.argmax(scores))
        members = ", ".join(f"{score:.3f}" for score in scores)
        note = (f"member seed {configs[best].seed} of {config.seed}..{configs[-1].seed}, validation "
                f"{scores[best]:.3f} on seed {config.seed}'s episodes (members: {members})")
        log(f"kept {note}")
        return save_weights(out, networks[best], replace(configs[best], extra={**config.extra, "kept": note})), logs
    ensemble = EnsembleQNetwork(networks)
    log(f"ensemble of {len(networks)}: validation {evaluate(ensemble):.3f} on seed {config.seed}'s pipelines")
    return save_weights(out, ensemble, config), logs


def _member_in_process(config: AgentConfig, validation_seed: int | None
                       ) -> tuple[BranchingQNetwork, ImitationLog, TrainingLog | None]:
    """``pretrain_network`` in a worker process, logging each line with its member's seed."""
    return pretrain_network(config, lambda line: print(f"[seed {config.seed}] {line}", flush=True), validation_seed)


def pretrain_network(config: AgentConfig, log=print, validation_seed: int | None = None
                     ) -> tuple[BranchingQNetwork, ImitationLog, TrainingLog | None]:
    """One network from scratch: imitation, then DQN, keeping the DQN's network only if it validates
    better than the imitation's, on ``validation_seed``'s episodes (default: ``config.seed``'s). Seeded
    by ``config.seed`` alone (the initial weights too), so the network does not depend on what ran
    before it in the process."""
    torch.set_num_threads(1)
    torch.manual_seed(config.seed)
    evaluate = make_evaluator(config, seed=validation_seed)
    q, imitation = imitate(config, lambda rng: imitation_sim(rng, config), new_network(config), evaluate, log=log)
    history = None
    if config.total_steps > 0:
        imitated = {k: v.clone() for k, v in q.state_dict().items()}
        q, history = train(config, lambda rng: SimEnv(training_sim(rng, config, config.episode_ticks)), evaluate,
                           log=log, q=q)
        best_dqn = max(history.eval_score[len(history.eval_score) // 2:], default=-np.inf)
        imitated_score = max(imitation.eval_score)
        if best_dqn <= imitated_score:
            log(f"DQN fine-tuning validated {best_dqn:.3f} <= imitation's {imitated_score:.3f}: "
                "keeping the imitation network")
            q.load_state_dict(imitated)
            history.best_step = 0
    return q, imitation, history


def plot_curve(members: list[MemberLog], path: str | Path, title: str = "InTune agent pretraining") -> Path:
    """Per member network: validation score (greedy throughput / optimum) after each DAgger round, then
    along the DQN steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for m in members:
        tag = f"seed {m.seed}: " if len(members) > 1 else ""
        left.plot(m.imitation.rounds, m.imitation.eval_score, "o-", label=f"{tag}validation: greedy throughput / optimum")
        left.plot(m.imitation.rounds, m.imitation.agreement, "s--", label=f"{tag}labels the network agrees with", alpha=0.7)
        if m.dqn is not None:
            right.plot(m.dqn.steps, m.dqn.episode_reward, label=f"{tag}training: reward per tick (explores)", alpha=0.7)
            right.plot(m.dqn.eval_steps, m.dqn.eval_score, "o-", label=f"{tag}validation: greedy throughput / optimum")
    left.set_xlabel("DAgger round")
    left.set_ylabel("fraction")
    left.set_title("imitation of the oracle")
    left.legend(loc="lower right", fontsize="small")
    if any(m.dqn is not None for m in members):
        right.legend(loc="lower right", fontsize="small")
    right.set_xlabel("DQN vector steps (x envs transitions)")
    right.set_title("DQN fine-tuning")
    for ax in (left, right):
        ax.axhline(0.95, color="grey", ls=":", lw=1)
        ax.set_ylim(0, 1.05)
    fig.suptitle(title)
    return save_figure(fig, path, dpi=110)


def run(args: argparse.Namespace) -> int:
    defaults = AgentConfig()
    if args.members < 1 or args.jobs < 1:
        raise SystemExit(f"--members and --jobs must be at least 1, got {args.members} and {args.jobs}")
    if args.curve and Path(args.curve).suffix.lower() != ".png":  # refused before the minutes of training, not after
        raise SystemExit(f"--curve writes the learning curve as a PNG: give a path ending in .png, got {args.curve} "
                         "(--log-json writes it as JSON)")
    command = (f"intune pretrain --rounds {args.rounds} --episodes {args.episodes} --steps {args.steps} --seed {args.seed} "
               f"--envs {args.envs}"
               + (f" --validation {args.validation}" if args.validation != defaults.validation_pipelines else "")
               + (f" --remote-share {args.remote_share}" if args.remote_share != defaults.imitation_remote_share else "")
               + (f" --waiting-share {args.waiting_share}" if args.waiting_share != defaults.imitation_waiting_share else "")
               + (f" --members {args.members}" if args.members != defaults.ensemble_members else "")
               + (f" --keep {args.keep}" if args.members > 1 and args.keep != "ensemble" else "")
               + (f" --decision {args.decision}" if args.decision != defaults.decision else "")
               + (f" --regret-weight {args.regret_weight}" if args.regret_weight else "")
               + f" --out {args.out}")
    config = AgentConfig(seed=args.seed, total_steps=args.steps, num_envs=args.envs,
                         imitation_rounds=args.rounds, imitation_episodes=args.episodes,
                         validation_pipelines=args.validation, imitation_remote_share=args.remote_share,
                         imitation_waiting_share=args.waiting_share,
                         imitation_regret_weight=args.regret_weight, ensemble_members=args.members, decision=args.decision, extra={"command": command})
    started = time.time()
    path, members = pretrain(config, args.out, jobs=args.jobs, keep=args.keep)
    seconds = time.time() - started
    for m in members:
        print(f"seed {m.seed}: validation after imitation {max(m.imitation.eval_score):.3f} (round {m.imitation.best_round})"
              + (f", DQN network of step {m.dqn.best_step}" if m.dqn else ""))
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB) in {seconds:.0f}s")
    if args.log_json:
        Path(args.log_json).parent.mkdir(parents=True, exist_ok=True)
        logs = [{"seed": m.seed, "imitation": vars(m.imitation), "dqn": vars(m.dqn) if m.dqn else None} for m in members]
        Path(args.log_json).write_text(json.dumps({"command": command, "seconds": seconds, "members": logs}) + "\n")
    if args.curve:
        print(f"wrote {plot_curve(members, args.curve)}")
    return 0
