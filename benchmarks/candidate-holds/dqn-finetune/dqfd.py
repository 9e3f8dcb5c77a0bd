"""DQN fine-tuning from the shipped network with DQfD's large-margin loss on teacher-labelled states
(Hester et al. 2018): TD + lam * weighted margin loss, so the values become returns while the teacher's
move stays ranked first. Scratch experiment.

Run: ``python dqfd.py LR EPSILON STEPS LAM MARGIN DEMO_EPISODES [WARM]``. With WARM > 0 the value heads
(advantage and value layers) are drawn afresh near zero and fitted by the margin loss alone for WARM
steps first, the trunk kept (the runs logged as ``dqfd-fresh-head-*``); WARM 0 (the default) keeps the
imitated heads (the runs logged as ``dqfd-lr*``).
"""
import copy
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import intune.agent.dqn as dqn
from intune.agent.imitation import DaggerPolicy
from intune.agent.policy import IntunePolicy, load_weights
from intune.agent.pretrain import SimEnv, imitation_sim, make_evaluator, training_sim
from intune.sim.episode import run_episode

torch.set_num_threads(1)
q, cfg = load_weights()
lr, eps0, steps, lam, margin, demo_eps = (float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                                          float(sys.argv[5]), int(sys.argv[6]))
warm = int(sys.argv[7]) if len(sys.argv) > 7 else 0
cfg_mean = replace(cfg, total_steps=steps, learning_rate=lr, epsilon_start=eps0, epsilon_end=min(eps0, 0.02),
                   eval_every=max(steps // 4, 1), learning_starts=100)
cfg_arg = replace(cfg_mean, decision="argmax")

# demonstrations: one DAgger round's worth of states, rolled out by the shipped network with teacher ticks
rng = np.random.default_rng(12345)
t = time.time()
data = []
for _ in range(demo_eps):
    sim = imitation_sim(rng, cfg)
    pol = DaggerPolicy(IntunePolicy(network=q, config=cfg, online=False), cfg.imitation_teacher_share, rng,
                       cfg.random_start_probability)
    run_episode(sim, pol, cfg.imitation_ticks)
    data.extend(pol.states)
D = [torch.from_numpy(np.stack([d[i] for d in data])) for i in range(5)]  # rows, valid, mask, label, weight
print(f"{len(data)} demonstration states ({time.time() - t:.0f}s)", flush=True)
drng = np.random.default_rng(7)


def margin_loss(qn):
    """DQfD's J_E on a batch of demonstrations: max_a (Q(s, a) + margin if a is not the teacher's) - Q(s, a_E),
    over the allowed moves, each knob weighted as its imitation label."""
    idx = torch.from_numpy(drng.integers(0, len(data), size=cfg.batch_size))
    rows, valid, mask, label, weight = (x[idx] for x in D)
    values = qn(rows, valid)
    bump = torch.full_like(values, margin).scatter(-1, label.unsqueeze(-1), 0.0)
    best = (values + bump).masked_fill(~mask, -1e9).max(-1).values
    expert = values.gather(-1, label.unsqueeze(-1)).squeeze(-1)
    w = valid.float() * weight
    return ((best - expert) * w).sum() / w.sum().clamp_min(1e-9)


orig_td = dqn.td_loss


def td_plus_margin(qn, target, batch):
    return orig_td(qn, target, batch) + lam * margin_loss(qn)


if warm > 0:
    # the heads start again from zero-scale values: the trunk keeps what imitation learned, the values no logits
    q = copy.deepcopy(q)
    for layer in (q.head, q.value):
        torch.nn.init.zeros_(layer.bias)
        torch.nn.init.normal_(layer.weight, std=1e-3)
    opt = torch.optim.Adam(list(q.head.parameters()) + list(q.value.parameters()), lr=1e-3)
    for i in range(warm):
        loss = margin_loss(q)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 200 == 0:
            print("warm", i, round(loss.item(), 4), flush=True)
dqn.td_loss = td_plus_margin
ev_mean, ev_arg = make_evaluator(cfg_mean), make_evaluator(cfg_arg)


def both(net):
    m, a = ev_mean(net), ev_arg(net)
    print(f"  validation: mean rule {m:.3f}, argmax {a:.3f}", flush=True)
    return max(m, a)


if warm > 0:
    print("after the margin warm-up:", end=" ")
    both(q)
net, hist = dqn.train(cfg_mean, lambda r: SimEnv(training_sim(r, cfg_mean, cfg_mean.episode_ticks)), both, q=q)
Path("/tmp/exp/dqn").mkdir(parents=True, exist_ok=True)
torch.save(net.state_dict(), f"/tmp/exp/dqn/dqfd{'-fresh-head' if warm > 0 else ''}-{lr}-{lam}-{margin}.sd")
print("done", round(hist.seconds))
