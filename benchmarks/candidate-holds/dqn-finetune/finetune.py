"""DQN fine-tuning from the shipped network: does it collapse, and is the decision rule why?"""
import sys
import time
from dataclasses import replace

import torch

from intune.agent.dqn import train
from intune.agent.policy import load_weights
from intune.agent.pretrain import SimEnv, make_evaluator, training_sim

torch.set_num_threads(1)
q, cfg = load_weights()
lr, eps0, steps = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
cfg_mean = replace(cfg, total_steps=steps, learning_rate=lr, epsilon_start=eps0, epsilon_end=min(eps0, 0.02),
                   eval_every=max(steps // 4, 1), learning_starts=100)
cfg_arg = replace(cfg_mean, decision="argmax")
ev_mean, ev_arg = make_evaluator(cfg_mean), make_evaluator(cfg_arg)
t = time.time()
print(f"shipped: mean rule {ev_mean(q):.3f}, argmax {ev_arg(q):.3f} ({time.time()-t:.0f}s)", flush=True)
def both(net):
    m, a = ev_mean(net), ev_arg(net)
    print(f"  validation: mean rule {m:.3f}, argmax {a:.3f}", flush=True)
    return max(m, a)
net, hist = train(cfg_mean, lambda rng: SimEnv(training_sim(rng, cfg_mean, cfg_mean.episode_ticks)), both, q=q)
print("done", hist.seconds)
