"""The allocation memory and the policy's guard: no moving back into a worker vector just measured worse."""

import math

import numpy as np
import pytest
import torch

from _knobs import dict_knobs
from intune.agent.config import AgentConfig
from intune.agent.features import KNOB_FEATURES
from intune.agent.policy import NetworkProposer
from intune.monitor.observation import Observation, StageObservation
from intune.policies.allocation_memory import AllocationMemory
from intune.policies.steer import SteerConfig, SteerPolicy

MB = 1 << 20


# -- the memory on its own ----------------------------------------------------------------------------
def test_readings_are_kept_per_worker_vector_and_expire():
    memory = AllocationMemory(ticks=5, tolerance=0.05)
    memory.observe(2.0, (1, 2), 120.0)
    memory.observe(2.0, (1, 1), 75.0)
    assert memory.recall((1, 2)).value == 120.0
    assert memory.recall((1, 1)).value == 75.0
    assert memory.recall((2, 1)) is None
    for _ in range(4):
        memory.observe(2.0, (1, 1), 75.0)
    assert memory.recall((1, 2)) is None  # measured 5 ticks ago: expired, to be re-explored
    assert memory.recall((1, 1)) is not None


def test_settled_readings_are_smoothed_and_beat_transitional_ones():
    memory = AllocationMemory(ticks=30, tolerance=0.05, smoothing=0.5)
    memory.observe(2.0, (2,), 60.0)  # the tick right after a change: transitional
    assert not memory.recall((2,)).settled
    memory.observe(2.0, (2,), 100.0)  # a whole tick under (2,): replaces the transitional reading
    assert memory.recall((2,)).value == 100.0 and memory.recall((2,)).settled
    memory.observe(2.0, (2,), 120.0)
    assert memory.recall((2,)).value == pytest.approx(110.0)
    memory.observe(2.0, (1,), 70.0)
    memory.observe(2.0, (2,), 40.0)  # back after one tick away: transitional, does not spoil the settled value
    assert memory.recall((2,)).value == pytest.approx(110.0)


def test_only_a_clearly_worse_recent_vector_is_worse():
    memory = AllocationMemory(ticks=30, tolerance=0.05)
    for workers, thr in (((1,), 75.0), ((2,), 120.0), ((2,), 120.0), ((3,), 116.0), ((3,), 116.0), ((2,), 120.0), ((2,), 120.0)):
        memory.observe(2.0, workers, thr)
    assert memory.is_worse((1,), (2,))  # 75 < 0.90 x 120 (transitional-only reading: doubled tolerance)
    assert not memory.is_worse((3,), (2,))  # 116 is within 5% of 120: noise, not worse
    assert not memory.is_worse((2,), (1,))  # better
    assert not memory.is_worse((4,), (2,))  # never measured
    assert not memory.is_worse((2,), (2,))


def test_the_tolerance_is_doubled_for_a_reading_taken_right_after_a_change():
    memory = AllocationMemory(ticks=30, tolerance=0.05)
    for workers, thr in (((2,), 100.0), ((2,), 100.0), ((1,), 92.0), ((2,), 100.0)):
        memory.observe(2.0, workers, thr)
    assert not memory.is_worse((1,), (2,))  # 8% below, but (1,) was seen only in a transitional tick
    memory.observe(2.0, (1,), 92.0)
    memory.observe(2.0, (1,), 92.0)  # now settled at 92
    memory.observe(2.0, (2,), 100.0)
    memory.observe(2.0, (2,), 100.0)
    assert memory.is_worse((1,), (2,))


def test_a_cpu_change_forgets_everything_and_bad_ticks_are_not_recorded():
    memory = AllocationMemory(ticks=30, tolerance=0.05)
    memory.observe(2.0, (1,), 75.0)
    memory.observe(2.0, (2,), 120.0)
    assert memory.is_worse((1,), (2,))
    memory.observe(4.0, (2,), 130.0)
    assert memory.recall((1,)) is None and not memory.is_worse((1,), (2,))
    memory.observe(4.0, (3,), 500.0, valid=False)  # an OOM tick
    memory.observe(4.0, (4,), 0.0)  # a restart: nothing delivered
    assert memory.recall((3,)) is None and memory.recall((4,)) is None


def test_zero_ticks_turns_it_off():
    memory = AllocationMemory(ticks=0)
    memory.observe(2.0, (1,), 75.0)
    memory.observe(2.0, (2,), 120.0)
    assert not memory.enabled and not memory.is_worse((1,), (2,))


# -- the guard in the steer rules, on a network's proposal --------------------------------------------------------------------------
class Flipper(torch.nn.Module):
    """A network that is wrong the way the live one was: at 2 udf workers it wants 1, at 1 it wants 2.
    It also always wants a smaller buffer, a move the guard must let through."""

    def forward(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        q = torch.zeros(rows.shape[0], 5)
        q[:, 2] = 0.5  # hold
        is_cpu = rows[:, KNOB_FEATURES.index("is_cpu")] > 0.5
        log_value = rows[:, KNOB_FEATURES.index("log_value")]
        at = {w: is_cpu & (torch.abs(log_value - math.log1p(w) / 5.0) < 1e-4) for w in (1, 2)}
        q[at[2], 1] = 1.0  # -1 worker
        q[at[1], 3] = 1.0  # +1 worker
        q[~is_cpu, 1] = 1.0  # -1 buffer step
        return q


def _observation(store, tick, throughput, udf_busy=1.0):
    stages = (
        StageObservation("read", store["read.workers"], 0, 10.0, 2560.0, 0.01, 0.02, 2 * MB, 0.5, 0.0, 0.5, 0.9, 0.0, kind="read"),
        StageObservation("udf", store["udf.workers"], 0, 10.0, 2560.0, 0.05, 0.05, 2 * MB, udf_busy, 0.0, 0.0, 0.5, 0.0, kind="map"),
        StageObservation("prefetch", 0, store["prefetch.buffer_mb"], 10.0, 2560.0, 0.0, 0.0, 2 * MB, 0.1, 0.9, 0.0, 0.5, 0.0, kind="prefetch"),
    )
    return Observation(tick, 1.0, throughput, 0.0, 2.0, 300 * MB, 8192 * MB, stages, cpu_slack=1.0)


def _run(memory_ticks, ticks=24, udf_busy=1.0):
    """The live case: 2 CPUs, a read worker that half waits, udf at 2 workers: 120k rows/s, at 1: 75k."""
    knobs, store = dict_knobs({"read.workers": ("cpu", 1, 1, 1), "udf.workers": ("cpu", 1, 4, 1),
                               "prefetch.buffer_mb": ("mb", 16, 4096, 1024)})
    policy = SteerPolicy(propose=NetworkProposer(Flipper(), AgentConfig()), config=SteerConfig(memory_ticks=memory_ticks))
    obs = _observation(store, 0, 75_000.0, udf_busy)
    policy.reset(knobs, obs)
    udf, buffers = [], []
    for tick in range(1, ticks + 1):
        request = policy.step(obs)
        store.update(request)
        udf.append(store["udf.workers"])
        buffers.append(store["prefetch.buffer_mb"])
        obs = _observation(store, tick, {1: 75_000.0, 2: 120_000.0}[store["udf.workers"]], udf_busy)
    return udf, buffers, policy


def test_without_the_guard_the_flipper_flips_every_tick():
    udf, _, policy = _run(memory_ticks=0)
    assert udf[-10:] == [2, 1] * 5 or udf[-10:] == [1, 2] * 5
    assert policy.guard_holds == 0


def test_the_guard_stops_the_flip_at_the_better_allocation_and_lets_buffers_move():
    udf, buffers, policy = _run(memory_ticks=30)
    assert udf[0] == 1  # the start: the even split
    assert udf[1:] == [2] * (len(udf) - 1)  # the move to the unknown (better) allocation went through, never back
    assert policy.guard_holds >= len(udf) - 3
    assert np.all(np.diff(buffers[1:]) < 0)  # buffer moves go through while the workers are held


def test_an_expired_memory_re_explores_once_per_period():
    # udf under SWAP_BUSY: the bottleneck hold stays out of it
    udf, _, _ = _run(memory_ticks=6, ticks=30, udf_busy=0.85)
    dips = sum(1 for a, b in zip(udf[:-1], udf[1:], strict=True) if a == 2 and b == 1)
    assert 2 <= dips <= 30 // 6  # it still looks again after the memory expires, but rarely


def test_an_expired_memory_does_not_take_a_worker_off_a_busy_bottleneck():
    # udf busy all the tick: once the memory has expired, the network's -1 there is held all the same
    udf, _, policy = _run(memory_ticks=6, ticks=30)
    assert udf[1:] == [2] * (len(udf) - 1)
    assert policy.neck_holds > 0


def test_the_best_vector_can_be_limited_to_those_the_runner_can_grant_again():
    memory = AllocationMemory(ticks=30, tolerance=0.05)
    for workers, rate in [((3, 3), 45.0), ((3, 3), 45.0), ((3, 1), 35.0), ((3, 1), 35.0), ((2, 2), 30.0), ((2, 2), 30.0)]:
        memory.observe(4.0, workers, rate)
    assert memory.best()[0] == (3, 3)  # read over-allocated after a shrink: 6 workers on 4 CPUs
    assert memory.best(4)[0] == (3, 1)
    assert memory.best(3) is None


def test_a_clear_change_at_the_same_workers_forgets_the_other_vectors():
    memory = AllocationMemory(ticks=100, tolerance=0.05, drift=0.25)
    memory.observe(2.0, (1, 1), 75.0)
    memory.observe(2.0, (1, 1), 75.0)  # settled
    memory.observe(2.0, (1, 2), 120.0)
    memory.observe(2.0, (1, 2), 120.0)
    memory.observe(2.0, (1, 2), 110.0)  # noise: kept
    assert memory.recall((1, 1)) is not None
    memory.observe(2.0, (1, 2), 60.0)  # half the rate at the same workers: the workload changed
    assert memory.recall((1, 1)) is None and memory.recall((1, 2)).value == 60.0


def test_the_dip_right_after_a_move_is_not_taken_for_a_changed_workload():
    memory = AllocationMemory(ticks=100, tolerance=0.05, drift=0.25)
    for workers, rate in [((1, 2), 120.0), ((1, 2), 120.0), ((1, 2), 120.0), ((1, 1), 75.0), ((1, 1), 75.0)]:
        memory.observe(2.0, workers, rate)
    memory.observe(2.0, (1, 2), 40.0)  # back to 2 workers: the new process starts, queues refill
    memory.observe(2.0, (1, 2), 60.0)  # still half the rate on the second tick: not yet drift
    assert memory.recall((1, 1)) is not None and memory.is_worse((1, 1), (1, 2))
