"""What the teacher labels where a compute-bound stage binds and the mask lets it grow.

Rolls the teacher out (``DaggerPolicy`` with the teacher acting on every tick, as in DAgger's round 0)
on 40 pipelines of the pretraining distribution (``env.random_sim``, a quarter with a map stage that
waits on I/O), and takes every worker knob whose stage is busy at least 0.95 of the tick on CPU (its
CPU per wall second at least 0.9), with CPUs free (``free_cpu_share`` at least 0.3) and +1 allowed by
the safety mask. Counts of each label (-5, -1, hold, +1, +5) and their summed weights, split by whether
memory is past 0.8 of the limit or the consumer's demand is known (where the reward's optimum may hold
a binding stage) or neither.

Run: ``python benchmarks/candidate-holds/teacher_labels.py``; its output: ``teacher_labels.txt``.
"""

from __future__ import annotations

import numpy as np

from intune.agent.env import random_sim, with_waiting_stage
from intune.agent.features import CONTEXT_FEATURES, KNOB_FEATURES
from intune.agent.imitation import DaggerPolicy
from intune.agent.policy import IntunePolicy, load_weights
from intune.sim.episode import run_episode


def main() -> None:
    names = (*KNOB_FEATURES, *CONTEXT_FEATURES)
    col = {n: i for i, n in enumerate(names)}
    q, config = load_weights()
    rng = np.random.default_rng(5)
    states = []
    for _ in range(40):
        sim = random_sim(rng, config, config.imitation_ticks)
        if rng.random() < 0.25:
            sim = with_waiting_stage(rng, sim)
        policy = DaggerPolicy(IntunePolicy(network=q, config=config, online=False), 1.0, rng,
                              config.random_start_probability)
        run_episode(sim, policy, config.imitation_ticks)
        states.extend(policy.states)
    valid = np.stack([s[1] for s in states])
    rows, mask = np.stack([s[0] for s in states])[valid], np.stack([s[2] for s in states])[valid]
    label, weight = np.stack([s[3] for s in states])[valid], np.stack([s[4] for s in states])[valid]
    plus_one = list(config.action_deltas).index(1)
    binding = ((rows[:, col["is_cpu"]] == 1) & (rows[:, col["busy"]] >= 0.95) & (rows[:, col["cpu_per_wall"]] >= 0.9)
               & (rows[:, col["free_cpu_share"]] >= 0.3) & mask[:, plus_one])
    bound = (rows[:, col["memory_fraction"]] > 0.8) | (rows[:, col["demand_ratio"]] > 0)
    print(f"{len(states)} labelled states, {len(rows)} knob rows; a compute-bound stage binding with CPUs free and "
          f"+1 allowed: {binding.sum()}")
    print("labels (-5, -1, hold, +1, +5): count; summed weight")
    for title, chosen in (("memory past 0.8 or a known demand", binding & bound), ("neither", binding & ~bound)):
        counts = np.bincount(label[chosen], minlength=5)
        weights = np.bincount(label[chosen], weights=weight[chosen], minlength=5)
        print(f"  {title}: {counts.tolist()}; {np.round(weights, 1).tolist()}")


if __name__ == "__main__":
    main()
