"""The safety layer: joint CPU budget, memory margin, and zero OOMs under random exploration."""

import numpy as np

from intune.agent.config import AgentConfig
from intune.agent.env import random_sim
from intune.agent.safety import MB, SafetyLayer
from intune.knobs import Knob
from intune.observation import Observation, StageObservation

DELTAS = (-5, -1, 0, 1, 5)
GB = 1 << 30


def _knobs(values: dict[str, int]) -> list[Knob]:
    out = []
    for name in values:
        unit = "cpu" if name.endswith(".workers") else "mb"
        out.append(Knob(name, unit, 1, 4096, get=lambda n=name: values[n], set=lambda v, n=name: values.__setitem__(n, v)))
    return out


def _obs(values: dict[str, int], cpus: float, used_gb: float, limit_gb: float, bytes_per_item: float = 0.5 * MB) -> Observation:
    stages = []
    for stage in sorted({n.split(".")[0] for n in values}):
        stages.append(StageObservation(stage, values.get(f"{stage}.workers", 0), values.get(f"{stage}.buffer_mb", 0),
                                       10.0, 1e4, 0.01, 0.01, bytes_per_item, 0.5, 0.2, 0.3, 0.5, 0.0))
    return Observation(1, 1.0, 1e4, 0.0, cpus, used_gb * GB, limit_gb * GB, tuple(stages))


def test_simultaneous_increases_share_the_free_cpus_by_advantage():
    values = {"a.workers": 2, "b.workers": 2, "c.workers": 2}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS)
    obs = _obs(values, cpus=7, used_gb=1, limit_gb=100)  # one free CPU
    mask = safety.mask(obs)
    assert not mask[:, 4].any()  # +5 never fits in one free CPU
    assert mask[:, 3].all()
    scores = np.zeros((3, 5))
    scores[0, 3], scores[1, 3], scores[2, 3] = 1.0, 3.0, 2.0  # all want +1; b wants it most
    moves = safety.moves(safety.select(scores, mask, obs), obs)
    assert moves.tolist() == [0, 1, 0]


def test_the_mask_is_per_knob_a_decrease_elsewhere_does_not_unlock_growth():
    values = {"a.workers": 6, "b.workers": 2}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS)
    obs = _obs(values, cpus=8, used_gb=1, limit_gb=100)  # no free CPU
    scores = np.zeros((2, 5))
    scores[0, 0] = 5.0  # a: -5
    scores[1, 4] = 5.0  # b: +5 (masked), else hold
    scores[1, 2] = 1.0
    mask = safety.mask(obs)
    assert not mask[1, 3:].any()  # alone, b may not grow
    scores_masked_out = safety.moves(safety.select(scores, mask, obs), obs)
    assert scores_masked_out.tolist() == [-5, 0]  # the mask is per knob: b's growth is not unlocked


def test_past_the_memory_margin_buffers_must_shrink_and_nothing_grows():
    values = {"a.workers": 2, "a.buffer_mb": 100, "b.workers": 2}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS, margin=0.85)
    obs = _obs(values, cpus=64, used_gb=9.0, limit_gb=10.0)
    mask = safety.mask(obs)
    up = np.array(DELTAS) > 0
    assert not mask[:, up].any()
    assert mask[1].tolist() == [True, True, False, False, False]  # the buffer: only -5 or -1


def test_buffer_steps_are_one_item_and_respect_the_memory_budget():
    values = {"a.workers": 1, "a.buffer_mb": 40}
    knobs = _knobs(values)
    safety = SafetyLayer(knobs, DELTAS, margin=0.5)
    obs = _obs(values, cpus=4, used_gb=4.97, limit_gb=10.0, bytes_per_item=8 * MB)  # 8 MB items
    assert safety.units(obs).tolist() == [1, 8]
    mask = safety.mask(obs)
    # 40 MB room is left to the margin (buffer counted full): +1 item (8 MB) fits, +5 items (40 MB) does too, barely
    budget = safety.memory_budget(obs, [1, 40])
    assert mask[1, 3] == (8 * MB <= budget) and mask[1, 4] == (40 * MB <= budget)


def test_random_exploration_through_the_mask_never_ooms_on_tight_memory():
    """Random scores on tight-memory simulated pipelines: the safety layer alone must prevent every OOM."""
    config = AgentConfig(tight_memory_probability=1.0)
    rng = np.random.default_rng(123)
    ooms = 0
    grew_past_cpus = 0
    for _ in range(12):
        sim = random_sim(rng, config, ticks=60)
        knobs = list(sim.knobs.values())
        safety = SafetyLayer(knobs, DELTAS, config.memory_margin)
        obs = sim.reset()
        for _ in range(60):
            values = [k.value for k in knobs]
            before = sum(v for k, v in zip(knobs, values) if k.unit == "cpu")
            mask = safety.mask(obs, values)
            moves = safety.moves(safety.select(rng.random(mask.shape), mask, obs, values), obs)
            for k, v, d in zip(knobs, values, moves):
                if d:
                    k.set(int(v + d))
            after = sum(k.value for k in knobs if k.unit == "cpu")
            grew_past_cpus += after > before and after > obs.cpus
            obs = sim.step()
            ooms += obs.oom
    assert grew_past_cpus == 0
    assert ooms == 0
