"""Tuner.state_dict / load_state_dict: knobs restored (clamped to a smaller machine), the intune agent's
weights and measurements carried over, mismatched policies and knob sets refused, file round trips."""

import time
from pathlib import Path

import numpy as np
import pytest

from intune.checkpoint import dumps_checkpoint, load_checkpoint, loads_checkpoint, save_checkpoint
from intune.dataloader.resume import ResumeMismatchError
from intune.monitor import Monitor
from intune.pipeline import Pipeline
from intune.tuner import tune

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"


def _monitor(cpus=8, name="v2-unlimited"):
    """The real monitor on a fixture tree (4 GiB used of 16 GiB), with ``cpus`` CPUs."""
    return Monitor(root=FIXTURES / name, affinity=set(range(cpus)))


def _pipeline(n_chunks=100_000, rows=64):
    def chunks():
        for i in range(n_chunks):
            yield {"id": np.arange(i * rows, (i + 1) * rows)}

    def udf(chunk):
        time.sleep(0.0005)
        return {"id": chunk["id"]}

    return Pipeline.from_iterable(chunks).map(udf, name="udf").batch(128).prefetch(depth=2, buffer_mb=8)


def _run_ticks(tuner, ticks, timeout=30.0):
    """Consume batches until the tuner has run ``ticks`` ticks (generous bound: the machine is shared)."""
    deadline = time.monotonic() + timeout
    for _ in tuner:
        if len(tuner.history()) >= ticks or time.monotonic() > deadline:
            break
    assert len(tuner.history()) >= ticks, f"only {len(tuner.history())} ticks in {timeout} s"


class SetOnce:
    """Asks for a fixed allocation at its first step; keeps no state."""

    name = "set-once"

    def __init__(self, request):
        self.request, self.steps = request, 0

    def reset(self, knobs, observation):
        pass

    def step(self, observation):
        self.steps += 1
        return self.request if self.steps == 1 else {}


def test_knobs_restored_then_clamped_to_a_smaller_machine():
    pipe = _pipeline()
    with tune(pipe, SetOnce({"udf.workers": 4, "prefetch.buffer_mb": 40}), tick_s=0.05, monitor=_monitor(8)) as tuner:
        _run_ticks(tuner, 3)
        state = tuner.state_dict()
    assert state["knobs"]["udf.workers"]["value"] == 4 and state["knobs"]["prefetch.buffer_mb"]["value"] == 40
    assert state["policy"] == "set-once" and state["policy_state"] is None

    same = _pipeline()
    with tune(same, SetOnce({}), tick_s=0.05, monitor=_monitor(8)) as tuner:
        tuner.load_state_dict(loads_checkpoint(dumps_checkpoint(state, kind="tuner"), kind="tuner"))
        assert same.knobs["udf.workers"].value == 4 and same.knobs["prefetch.buffer_mb"].value == 40
        assert tuner.restored.applied == {"udf.workers": 4, "prefetch.buffer_mb": 40}

    # 3 CPUs: the read stage holds one, so udf may grow only to 2 (from its start at 1)
    small = _pipeline()
    with tune(small, SetOnce({}), tick_s=0.05, monitor=_monitor(3)) as tuner:
        tuner.load_state_dict(state)
        assert small.knobs["udf.workers"].value == 2
        assert small.knobs["prefetch.buffer_mb"].value == 40
        _run_ticks(tuner, 2)  # and it runs on from there
    assert tuner.failures == {}


def test_buffers_restored_only_into_free_memory():
    state = {
        "format": 1, "policy": "set-once", "reward_scale": None, "ticks": 0, "machine": None, "policy_state": None,
        "knobs": {"read.workers": {"value": 1, "unit": "cpu", "min": 1, "max": 1},
                  "udf.workers": {"value": 1, "unit": "cpu", "min": 1, "max": 4},
                  "prefetch.buffer_mb": {"value": 2000, "unit": "mb", "min": 1, "max": 4096}},
    }  # fmt: skip
    pipe = _pipeline()
    # v1 fixture: 500 MB used of a 1 GiB limit: the buffer is granted from its minimum (1 MB) into the
    # free 524 MB, whatever it holds now
    monitor = _monitor(8, "v1")
    free_mb = monitor.sample().memory_free_bytes >> 20
    tuner = tune(pipe, SetOnce({}), tick_s=0.05, monitor=monitor)
    try:
        knobs = pipe.knobs
        if "read.workers" not in knobs:
            state["knobs"].pop("read.workers")
        tuner.load_state_dict(state)
        assert free_mb == 524
        assert pipe.knobs["prefetch.buffer_mb"].value == 1 + free_mb
        assert tuner.restored.applied == {"prefetch.buffer_mb": 1 + free_mb}
    finally:
        tuner.close()


def test_mismatched_policy_and_knobs_raise_naming_them():
    pipe = _pipeline()
    with tune(pipe, SetOnce({}), tick_s=0.05, monitor=_monitor()) as tuner:
        state = tuner.state_dict()
    other = _pipeline()
    with tune(other, "heuristic", tick_s=0.05, monitor=_monitor()) as tuner:
        with pytest.raises(ResumeMismatchError, match="'set-once'.*'heuristic'"):
            tuner.load_state_dict(state)
    # another pipeline: a knob it does not have
    bad = {**state, "knobs": {**state["knobs"], "parse.workers": {"value": 2, "unit": "cpu", "min": 1, "max": 4}}}
    with tune(_pipeline(), SetOnce({}), tick_s=0.05, monitor=_monitor()) as tuner:
        with pytest.raises(ResumeMismatchError, match="parse.workers"):
            tuner.load_state_dict(bad)
        unit = {**state, "knobs": {**state["knobs"], "udf.workers": {**state["knobs"]["udf.workers"], "unit": "mb"}}}
        with pytest.raises(ResumeMismatchError, match="udf.workers"):
            tuner.load_state_dict(unit)
        with pytest.raises(ResumeMismatchError, match="format"):
            tuner.load_state_dict({"format": 99})


def _weights(policy):
    return {k: v.detach().numpy().copy() for k, v in policy.q.state_dict().items()}


def test_intune_agent_weights_and_measurements_carry_over(tmp_path):
    pipe = _pipeline()
    with tune(pipe, "network", tick_s=0.05, monitor=_monitor()) as tuner:
        _run_ticks(tuner, 12)
        t0 = time.perf_counter()
        state = tuner.state_dict()
        state_ms = (time.perf_counter() - t0) * 1e3
        policy = tuner.policy
        saved_knobs = {n: k.value for n, k in pipe.knobs.items()}
        features = policy.chooser.builder.state_dict()
    path = save_checkpoint(tmp_path / "tuner.ckpt", state, kind="tuner")
    print(f"tuner state (intune): {path.stat().st_size} bytes on disk, state_dict() {state_ms:.1f} ms")
    loaded = load_checkpoint(path, kind="tuner")
    assert loaded["policy"] == "network" and loaded["policy_state"]["replay"] is None
    assert features["best_throughput"] > 0

    fresh = _pipeline()
    with tune(fresh, "network", tick_s=0.05, monitor=_monitor()) as tuner:
        tuner.load_state_dict(loaded)
        assert {n: k.value for n, k in fresh.knobs.items()} == saved_knobs
        _run_ticks(tuner, 1)  # the policy is reset and takes its state at the first tick
        with tuner._policy_lock:
            new = tuner.policy
            assert new.chooser.builder.best_throughput > 0
            assert new._observed >= state["policy_state"]["observed"]
            assert new._start is None  # no warm start: it goes on from the restored allocation
            if state["policy_state"]["online"] is None:  # no gradient step yet: the weights are the same
                for name, w in _weights(new).items():
                    np.testing.assert_array_equal(w, state["policy_state"]["weights"][name])
    assert tuner.failures == {}


def _assert_same_tree(a, b, where="state"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            _assert_same_tree(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_tree(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, np.asarray(b), err_msg=where)
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def test_intune_state_loads_exactly_into_a_reset_policy():
    """Weights, target, optimizer moments, generator, replay and measurements: a reset policy that loads a
    state (through the file format) saves the same state back, field by field."""
    import torch

    from intune.agent.online_learning import OnlineLearner

    pipe = _pipeline()
    with tune(pipe, "network", tick_s=0.05, monitor=_monitor()) as tuner:
        _run_ticks(tuner, 6)
        with tuner._policy_lock:
            policy = tuner.policy
            # make it look trained: other weights, an online optimizer that has stepped, a used generator
            with torch.no_grad():
                for p in policy.q.parameters():
                    p.add_(0.01)
            policy._learner = OnlineLearner(policy.q, lr=1e-3, max_grad_norm=10.0)
            policy._learner._adam({name: np.ones_like(a) for name, a in policy._learner.params.items()})
            policy._learner.write_to(policy.q)
            policy._rng.random(5)
            state = policy.state_dict(replay=True)
    assert state["online"] is not None and state["replay"] is not None and state["replay"]["size"] > 0
    stored = loads_checkpoint(dumps_checkpoint(state, kind="policy"), kind="policy")

    with tune(_pipeline(), "network", tick_s=0.05, monitor=_monitor()) as tuner:
        _run_ticks(tuner, 1)
        with tuner._policy_lock:
            new = tuner.policy
            new.load_state_dict(stored)
            again = new.state_dict(replay=True)
            assert new._start is None
            draws = new._rng.random(3)
    _assert_same_tree(state, again)
    np.testing.assert_array_equal(draws, np.random.Generator(policy._rng.bit_generator).random(3))


def test_state_dict_while_the_tuner_resizes_every_tick():
    """state_dict() from the loop while ticks move the knobs: every state is whole and loadable."""
    pipe = _pipeline()

    class Flip(SetOnce):
        name = "flip"

        def reset(self, knobs, observation):
            self.knobs = knobs

        def step(self, observation):
            return {"udf.workers": 3 if self.knobs["udf.workers"].value == 1 else 1}

    states = []
    with tune(pipe, Flip({}), tick_s=0.02, monitor=_monitor()) as tuner:
        deadline = time.monotonic() + 30
        for i, _ in enumerate(tuner):
            if i % 20 == 0:
                states.append(tuner.state_dict())
            if len(tuner.history()) >= 8 or time.monotonic() > deadline:
                break
    assert {s["knobs"]["udf.workers"]["value"] for s in states} <= {1, 3}
    with tune(_pipeline(), Flip({}), tick_s=0.02, monitor=_monitor()) as tuner:
        tuner.load_state_dict(states[-1])


def _observation(pipe, cpus=8.0):
    from intune.monitor.live import observe

    it = iter(pipe)
    next(it)
    before = pipe.metrics()
    time.sleep(0.05)
    next(it)
    return observe(before, pipe.metrics(), pipe.knobs, 0, cpus, 1 << 30, 16 << 30, 8 << 30)


@pytest.mark.parametrize("name", ["intune", "steer", "network+steer"])
def test_a_loaded_policy_skips_its_warm_start(name):
    """Reset on 8 CPUs, the policy would first ask for its start (the even split, udf.workers 4, or the
    planner's plan from the first tick); with its state loaded, its first step is a decision from the
    restored allocation instead."""
    from intune.policies import make

    pipe = _pipeline()
    try:
        obs = _observation(pipe)
        trained = make(name)
        trained.reset(pipe.knobs, obs)
        trained.step(obs)
        state = trained.state_dict()
        fresh = make(name)
        fresh.reset(pipe.knobs, obs)
        start = fresh.step(obs)  # the warm start, without a state
        if name != "intune":
            assert start == {"udf.workers": 4}
        assert start.get("udf.workers", 1) > 1
        resumed = make(name)
        resumed.reset(pipe.knobs, obs)
        resumed.load_state_dict(loads_checkpoint(dumps_checkpoint(state, kind="policy"), kind="policy"))
        assert resumed._start is None
        _assert_same_tree(trained.state_dict(), resumed.state_dict())
    finally:
        pipe.close()


def test_a_pipeline_and_its_tuner_in_one_bundle(tmp_path):
    """The trainer's recipe (docs/agent.md, "Resume"): one checkpoint of kind "bundle" holding the
    pipeline's state and its tuner's; load the pipeline first, then the tuner (whose clamp to this
    machine has the last word on the knobs)."""
    n = 6000
    chunks = [{"id": np.arange(i, i + 100)} for i in range(0, n, 100)]

    def build():
        def udf(chunk):
            time.sleep(0.0005)
            return {"id": chunk["id"]}

        return Pipeline.from_iterable(chunks).map(udf, name="udf").shuffle(buffer_rows=500, seed=3).batch(64)

    reference = [b["id"].copy() for b in build()]
    pipe = build()
    tuner = tune(pipe, SetOnce({}), tick_s=0.05, monitor=_monitor(8))
    before = []
    for batch in tuner:
        before.append(batch["id"].copy())
        if len(before) == 10:
            pipe.knobs["udf.workers"].set(3)  # where the policy might have put it
        if len(before) >= 30:
            break
    save_checkpoint(tmp_path / "job.ckpt", {"pipeline": pipe.state_dict(), "tuner": tuner.state_dict()}, kind="bundle")
    tuner.close()

    bundle = load_checkpoint(tmp_path / "job.ckpt", kind="bundle")
    again = build()
    with tune(again, SetOnce({}), tick_s=0.05, monitor=_monitor(2)) as resumed:
        again.load_state_dict(bundle["pipeline"])
        resumed.load_state_dict(bundle["tuner"])
        assert again.knobs["udf.workers"].value == 1  # 3 saved; 2 CPUs, one of them the reader's
        after = [b["id"].copy() for b in resumed]
    got = np.concatenate(before + after)
    assert np.array_equal(got, np.concatenate(reference))
