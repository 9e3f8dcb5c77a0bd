"""Nothing hangs: per-chunk timeouts, stalled stages reported as stalled, and what a tuner does then."""

import threading
import time

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, delivered_ids
from intune.pipeline import StageError, StageTimeoutError
from intune.pipeline.engine import default_max_mb
from intune.policies import clamp_request

HANG_BOUND_S = 60  # generous: the errors below come after 1 s; this only keeps a regression from hanging


def chunks(n: int = 6, rows: int = 10) -> list[dict]:
    return [{"id": np.arange(i * rows, (i + 1) * rows)} for i in range(n)]


def hang_on_chunk_2(chunk: dict) -> dict:
    if chunk["id"][0] == 20:
        threading.Event().wait(3600)
    return chunk


def held_at_chunk_2(release: threading.Event):
    """A UDF that holds chunk 2 (ids 20-29) until ``release`` is set: a stall the test can end."""

    def wait_on_chunk_2(chunk):
        if chunk["id"][0] == 20:
            release.wait(HANG_BOUND_S)
        return chunk

    return wait_on_chunk_2


def run_with_bound(fn):
    """Run ``fn`` in a thread; its exception or result, or a failure if it is still running."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    assert not thread.is_alive(), f"still running after {HANG_BOUND_S} s: the pipeline hangs"
    return box


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_hung_udf_with_timeout_fails_naming_the_stage_and_the_chunk(mode):
    pipe = intune.Pipeline.from_iterable(chunks()).map(hang_on_chunk_2, name="udf", mode=mode, timeout_s=1)
    with pipe:
        box = run_with_bound(lambda: list(pipe))
    error = box.get("error")
    assert isinstance(error, StageTimeoutError), box
    assert error.stage == "udf" and "chunk #2" in str(error) and "timeout_s=1" in str(error)


def test_a_hung_process_worker_is_ended_by_the_timeout():
    pipe = intune.Pipeline.from_iterable(chunks()).map(hang_on_chunk_2, name="udf", mode="process", timeout_s=1)
    with pipe:
        run_with_bound(lambda: list(pipe))
        deadline = time.monotonic() + 10
        while pipe.stage("udf").worker_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pipe.stage("udf").worker_pids() == []


def test_a_hung_process_chunk_is_skipped_and_counted_under_skip():
    pipe = intune.Pipeline.from_iterable(chunks()).map(
        hang_on_chunk_2, name="udf", mode="process", timeout_s=1, on_error="skip"
    )
    with pipe:
        box = run_with_bound(lambda: delivered_ids(pipe))
        assert "error" not in box, box
        assert_exactly_once(box["value"], [i for i in range(60) if not 20 <= i < 30])
        assert pipe.metrics().stages["udf"].skipped == 1


def test_a_stalled_stage_is_reported_stalled_and_busy_not_starved_then_recovers():
    release = threading.Event()
    wait_on_chunk_2 = held_at_chunk_2(release)
    pipe = intune.Pipeline.from_iterable(chunks(), stall_after_s=0.5).map(wait_on_chunk_2, name="udf")
    with pipe:
        it = iter(pipe)
        got = [next(it), next(it)]
        deadline = time.monotonic() + HANG_BOUND_S
        while not pipe.metrics().stages["udf"].stalled and time.monotonic() < deadline:
            time.sleep(0.05)
        before = pipe.metrics().stages["udf"]
        time.sleep(0.3)
        after = pipe.metrics().stages["udf"]
        assert after.stalled and after.stalled_s >= 0.5
        assert after.busy_s - before.busy_s >= 0.2  # the hung chunk's time counts as busy
        assert after.starved_s - before.starved_s < 0.1
        release.set()
        got.extend(it)
        assert not pipe.metrics().stages["udf"].stalled
    assert_exactly_once(delivered_ids(got), range(60))


def test_clamp_request_holds_the_workers_of_a_stalled_stage():
    pipe = intune.Pipeline.from_iterable(chunks()).map(lambda c: c, name="udf").map(lambda c: c, name="other")
    with pipe:
        request = {"udf.workers": 3, "other.workers": 2}
        clamped = clamp_request(pipe.knobs, request, cpus=8, memory_free_bytes=0, hold=["udf.workers"])
        assert clamped.applied == {"other.workers": 2}
        pipe.knobs["udf.workers"].set(3)
        down = clamp_request(pipe.knobs, {"udf.workers": 1}, cpus=8, memory_free_bytes=0, hold=["udf.workers"])
        assert down.applied == {"udf.workers": 1}  # a stalled stage may still give workers back


class AlwaysMore:
    """Asks for one more UDF worker every tick."""

    name = "always-more"

    def reset(self, knobs, observation):
        self.knobs = knobs

    def step(self, observation):
        return {"udf.workers": self.knobs["udf.workers"].value + 1}


def test_the_tuner_adds_no_worker_to_a_stalled_stage():
    release = threading.Event()
    wait_on_chunk_2 = held_at_chunk_2(release)
    pipe = intune.Pipeline.from_iterable(chunks(), stall_after_s=0.3).map(wait_on_chunk_2, name="udf")
    tuner = intune.tune(pipe, AlwaysMore(), tick_s=0.2)
    with tuner:
        it = iter(tuner)
        next(it)
        deadline = time.monotonic() + HANG_BOUND_S
        while not any(r["stages"]["udf"]["stalled"] for r in tuner.history()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        stalled_rows = [r for r in tuner.history() if r["stages"]["udf"]["stalled"]]
        assert stalled_rows and all("udf.workers" not in r["applied"] for r in stalled_rows)
        assert all(r["requested"].get("udf.workers") for r in stalled_rows)
        release.set()
        list(it)


@pytest.mark.parametrize("policy", ["oracle", "oracle-safe"])
def test_a_simulator_only_policy_is_refused_live(policy):
    pipe = intune.Pipeline.from_iterable(chunks())
    with pipe, pytest.raises(ValueError, match=f"'{policy}' runs in the simulator only"):
        intune.tune(pipe, policy)


@pytest.mark.parametrize("option", ["max_workers", "max_mb"])
def test_zero_bounds_are_errors_not_defaults(option):
    with pytest.raises(ValueError, match=f"{option} = 0 is out of range"):
        intune.Pipeline.from_iterable(chunks(), **{option: 0})


def test_sys_exit_in_a_thread_udf_is_a_stage_error():
    def leave(chunk):
        raise SystemExit(3)

    pipe = intune.Pipeline.from_iterable(chunks()).map(leave, name="udf")
    with pipe, pytest.raises(StageError, match=r"stage 'udf' failed on source 'read' chunk #0.*SystemExit: 3"):
        list(pipe)


def test_the_buffer_ceiling_comes_from_the_cgroup_limit(monkeypatch):
    import intune.monitor

    monkeypatch.setattr(intune.monitor, "memory_usage", lambda root="/": (100 << 20, 500 << 20))
    assert default_max_mb() == 250
    pipe = intune.Pipeline.from_iterable(chunks())
    with pipe, pytest.raises(ValueError, match=r"buffer_mb = 2048 is out of range, valid range is \[1, 250\]"):
        pipe.shuffle(1000, buffer_mb=2048)
