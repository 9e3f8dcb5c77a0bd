"""The live tuner: observations from hand-made snapshots, the tuning loop, faults, history, overhead."""

import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import intune
from intune.knobs import Knob
from intune.monitor import Monitor
from intune.monitor.live import observe
from intune.monitor.observation import cpu_slack, reward
from intune.pipeline.metrics import PipelineMetrics, StageMetrics
from intune.tuner import Tuner, tune

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
GiB, MiB = 1 << 30, 1 << 20


def _stage(name, **kw):
    base = dict(
        kind=name, mode="thread", workers=1, items=0, rows=0, cpu_s=0.0, busy_s=0.0, starved_s=0.0,
        blocked_s=0.0, queue_len=0, queue_capacity=8, queue_fill=0.0, buffered_bytes=0,
    )  # fmt: skip
    return StageMetrics(name=name, **{**base, **kw})


def _snapshot(t, rows_out, stages, step=0.0):
    return PipelineMetrics(
        time_s=t, rows_out=rows_out, batches_out=rows_out // 100, rows_per_s=0.0, consumer_step_s=step,
        consumer_wait_s=0.0, buffered_bytes=sum(s.buffered_bytes for s in stages),
        stages={s.name: s for s in stages},
    )  # fmt: skip


# -- observe() on hand numbers ---------------------------------------------------------------------


def test_observe_per_stage_deltas_by_hand():
    prev = _snapshot(10.0, 1000, [
        _stage("read", workers=1, items=10, rows=10_000, cpu_s=1.0, busy_s=2.0, starved_s=0.0, blocked_s=1.0),
        _stage("udf", mode="process", workers=2, items=10, rows=10_000, cpu_s=5.0, busy_s=6.0, starved_s=1.0),
    ])  # fmt: skip
    cur = _snapshot(12.0, 9000, [
        # 2 s, 1 worker: 4 chunks, 0.4 cpu-s, 1.2 busy-s, 0.3 starved, 0.5 blocked; 2 chunks in a 8-slot queue
        _stage("read", workers=1, items=14, rows=14_000, cpu_s=1.4, busy_s=3.2, starved_s=0.3, blocked_s=1.5,
               queue_len=2, queue_fill=0.25, buffered_bytes=2 * 4096),
        # 2 s, 2 -> 4 workers (mean 3 -> 6 worker-s): 8 chunks, 4.0 cpu-s, 4.8 busy-s, 0.6 starved
        _stage("udf", mode="process", workers=4, items=18, rows=18_000, cpu_s=9.0, busy_s=10.8, starved_s=1.6,
               queue_len=0, queue_fill=0.0),
    ], step=0.05)  # fmt: skip
    knobs = {"read.workers": 1, "udf.workers": 4, "prefetch.buffer_mb": 64}
    obs = observe(prev, cur, knobs, tick=7, cpus=2.0, mem_used=3 * GiB, mem_limit=4 * GiB, host_free=9 * GiB)

    assert obs.tick == 7 and obs.dt_s == pytest.approx(2.0)
    assert obs.throughput == pytest.approx(4000.0)  # (9000 - 1000) rows / 2 s
    assert obs.step_time_s == 0.05 and obs.cpus == 2.0
    assert obs.memory_fraction == pytest.approx(0.75) and obs.host_memory_free_bytes == 9 * GiB
    assert [s.name for s in obs.stages] == ["read", "udf"]
    read, udf = obs.stages
    assert (read.workers, read.buffer_mb) == (1, 0)
    assert read.items_per_s == pytest.approx(2.0) and read.rows_per_s == pytest.approx(2000.0)
    assert read.cpu_s_per_item == pytest.approx(0.1) and read.wall_s_per_item == pytest.approx(0.3)
    assert read.busy == pytest.approx(0.6) and read.starved == pytest.approx(0.15)
    assert read.blocked == pytest.approx(0.25)
    assert read.queue_fill == 0.25 and read.buffered_bytes == 8192 and read.bytes_per_item == 4096
    assert udf.workers == 4 and (read.mode, udf.mode) == ("thread", "process")  # as each stage runs them
    assert udf.items_per_s == pytest.approx(4.0) and udf.cpu_s_per_item == pytest.approx(0.5)
    assert udf.wall_s_per_item == pytest.approx(0.6)
    assert udf.busy == pytest.approx(0.8) and udf.starved == pytest.approx(0.1) and udf.blocked == 0.0
    # unused worker time: read 1 - 0.1 * 2 = 0.8, udf 4 - 0.5 * 4 = 2.0 -> 2.8, about 3 workers
    assert obs.cpu_slack == 3.0
    assert obs.allocated_cpus == 5 and obs.free_cpus == 2 + 3 - 5


def test_observe_reads_each_stages_wait_for_a_cpu_per_chunk_and_none_where_not_measured():
    prev = _snapshot(10.0, 1000, [
        _stage("read", items=10, rows=10_000, cpu_s=1.0, busy_s=2.0, cpu_wait_s=0.5, cpu_wait_measured=True),
        _stage("udf", mode="process", workers=2, items=10, rows=10_000, cpu_s=5.0, busy_s=6.0),
    ])  # fmt: skip
    cur = _snapshot(12.0, 9000, [
        # 4 chunks, 0.6 s more of waiting for a CPU: 0.15 s a chunk
        _stage("read", items=14, rows=14_000, cpu_s=1.4, busy_s=3.2, cpu_wait_s=1.1, cpu_wait_measured=True),
        _stage("udf", mode="process", workers=2, items=18, rows=18_000, cpu_s=9.0, busy_s=10.8),
    ])  # fmt: skip
    read, udf = observe(prev, cur, {}, tick=1, cpus=2.0, mem_used=GiB, mem_limit=4 * GiB).stages
    assert read.cpu_wait_s_per_item == pytest.approx(0.15)
    assert udf.cpu_wait_s_per_item is None  # its counter is not read here: not 0, which would say no wait


def test_observe_idle_tick_and_new_stage():
    prev = _snapshot(0.0, 500, [_stage("read", items=5, rows=500)])
    cur = _snapshot(
        1.0,
        500,
        [
            _stage("read", items=5, rows=500, starved_s=0.9),
            _stage("batch", mode="inline", workers=0, busy_s=0.2, items=1, rows=50),
        ],
    )
    obs = observe(prev, cur, {}, tick=0, cpus=1, mem_used=0, mem_limit=1)
    read, batch = obs.stages
    assert obs.throughput == 0.0 and read.cpu_s_per_item == 0.0 and read.wall_s_per_item == 0.0
    assert read.starved == pytest.approx(0.9)
    # a stage absent from prev counts from zero; an inline stage runs on one thread
    assert batch.items_per_s == 1.0 and batch.busy == pytest.approx(0.2) and batch.workers == 0


def test_cpu_slack_gives_back_what_light_workers_leave_unused():
    # 2 s tick: a reader (1 worker) used 0.2 CPU-s, a UDF (1 worker) used 1.9 CPU-s, both emitted
    prev = _snapshot(0.0, 0, [_stage("read"), _stage("udf")])
    cur = _snapshot(
        2.0, 1000, [_stage("read", items=10, rows=1000, cpu_s=0.2), _stage("udf", items=10, rows=1000, cpu_s=1.9)]
    )
    obs = observe(prev, cur, {"read.workers": 1, "udf.workers": 1}, tick=1, cpus=2, mem_used=0, mem_limit=GiB)
    # unused: read 1 - 0.1 = 0.9, udf 1 - 0.95 = 0.05 -> 0.95 rounds to one whole worker
    assert cpu_slack(obs.stages) == obs.cpu_slack == 1.0
    assert obs.free_cpus == 2 + 1 - 2
    # a stage that emitted nothing gives no evidence
    idle = _snapshot(2.0, 0, [_stage("read"), _stage("udf")])
    assert observe(prev, idle, {"read.workers": 4, "udf.workers": 1}, 1, 2, 0, GiB).cpu_slack == 0.0
    # readers that only wait on storage hold no CPU: 3 of them leave all 3 free
    waiting = _snapshot(2.0, 1000, [_stage("read", items=10, rows=1000, cpu_s=0.0)])
    obs = observe(prev, waiting, {"read.workers": 3}, 1, 2, 0, GiB)
    assert obs.cpu_slack == 3.0 and obs.free_cpus == 2.0
    # saturated: 3 CPU-bound workers sharing 2 CPUs use 2 between them -> nothing free
    saturated = _snapshot(2.0, 1000, [_stage("udf", items=10, rows=1000, cpu_s=4.0)])
    assert observe(prev, saturated, {"udf.workers": 3}, 1, 2, 0, GiB).free_cpus == 0.0


def test_observe_rejects_snapshots_out_of_order():
    s = _snapshot(5.0, 0, [])
    with pytest.raises(ValueError, match="forward in time"):
        observe(s, s, {}, tick=0, cpus=1, mem_used=0, mem_limit=1)


# -- a small engine stand-in with the Pipeline's attributes ---------------------------------------


class FakePipeline:
    """Yields ``n_batches`` batches of row ids; the udf stage's speed grows with its workers knob."""

    def __init__(self, n_batches=60, batch_rows=100, batch_s=0.002):
        self._values = {"read.workers": 1, "udf.workers": 1, "prefetch.buffer_mb": 8}
        self.set_calls: list[tuple[str, int]] = []
        bounds = {
            "read.workers": ("cpu", 1, 8),
            "udf.workers": ("cpu", 1, 16),
            "prefetch.buffer_mb": ("mb", 1, 512),
        }
        self.knobs = {
            name: Knob(
                name, unit, lo, hi, get=lambda n=name: self._values[n], set=lambda v, n=name: self._set(n, v)
            )
            for name, (unit, lo, hi) in bounds.items()
        }
        self.n_batches, self.batch_rows, self.batch_s = n_batches, batch_rows, batch_s
        self.rows_out = 0
        self.closed = False
        self._lock = threading.Lock()

    def _set(self, name, value):
        self.set_calls.append((name, value))
        self._values[name] = value

    def __iter__(self):
        for b in range(self.n_batches):
            if self.closed:
                return
            time.sleep(self.batch_s / self._values["udf.workers"])
            with self._lock:
                self.rows_out += self.batch_rows
            yield {"id": list(range(b * self.batch_rows, (b + 1) * self.batch_rows))}

    def metrics(self):
        with self._lock:
            rows = self.rows_out
        items = rows // self.batch_rows
        stages = [
            _stage(n, workers=self._values[f"{n}.workers"], items=items, rows=rows) for n in ("read", "udf")
        ]
        return _snapshot(time.monotonic(), rows, stages)

    def close(self):
        self.closed = True


def _monitor(name="v2-unlimited"):
    """The real monitor on a fixture tree: 8 CPUs, 4 GiB used of 16 GiB, so tests are repeatable."""
    return Monitor(root=FIXTURES / name, affinity=set(range(8)))


class AskOnce:
    """Asks for one request at its first step, nothing after; records what it saw."""

    name = "ask-once"

    def __init__(self, request):
        self.request, self.steps, self.resets, self.observed = request, 0, 0, []

    def reset(self, knobs, observation):
        self.resets += 1

    def step(self, observation):
        self.steps += 1
        return self.request if self.steps == 1 else {}

    def observe(self, observation, r):
        self.observed.append((observation, r))


class Raises:
    name = "raises"

    def reset(self, knobs, observation):
        pass

    def step(self, observation):
        raise RuntimeError("policy exploded")


def _wait_for_ticks(tuner, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while len(tuner.history()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(tuner.history()) >= n, f"only {len(tuner.history())} ticks in {timeout} s"


# -- the tuning loop --------------------------------------------------------------------------------


def test_clamped_request_is_applied_and_recorded(tmp_path):
    pipe = FakePipeline(n_batches=10_000)
    policy = AskOnce({"udf.workers": 12, "prefetch.buffer_mb": 600})
    tuner = tune(pipe, policy, tick_s=0.02, monitor=_monitor())
    with tuner:
        it = iter(tuner)
        next(it)
        _wait_for_ticks(tuner, 3)
    assert not tuner.running and pipe.closed
    first = tuner.history()[0]
    # 8 CPUs (plus what light workers measurably leave unused), read holds 1: udf may grow to 7 + slack,
    # and one more if its workers are light, not 12; the buffer is clamped to its bound 512
    udf = 7 + int(first["cpu_slack"]) + ("udf" in first["light_stages"])
    assert first["requested"] == {"udf.workers": 12, "prefetch.buffer_mb": 600}
    assert first["applied"] == {"udf.workers": udf, "prefetch.buffer_mb": 512}
    assert first["knobs"] == {"read.workers": 1, "udf.workers": udf, "prefetch.buffer_mb": 512}
    assert first["cpus"] == 8.0 and first["memory_limit"] == 16 * GiB and first["memory_used"] == 4 * GiB
    assert pipe.set_calls == [("udf.workers", udf), ("prefetch.buffer_mb", 512)]
    assert policy.resets == 1 and policy.steps >= 3
    assert all(row["applied"] == {} for row in tuner.history()[1:])


def test_reward_scale_and_online_observe():
    pipe = FakePipeline(n_batches=10_000)
    policy = AskOnce({})
    with tune(pipe, policy, tick_s=0.03, monitor=_monitor()) as tuner:
        for _ in tuner:
            if len(tuner.history()) >= 4:
                break
    rows = tuner.history()
    scale = next(r["throughput"] for r in rows if r["throughput"] > 0)
    assert tuner.reward_scale == scale
    for row in rows:  # memory is at 25 % of the limit: the factor is 1
        assert row["reward"] == pytest.approx(row["throughput"] / scale)
    # observe() gets each tick after the first with that tick's reward
    assert len(policy.observed) == len(rows) - 1
    assert [r for _, r in policy.observed] == [pytest.approx(row["reward"]) for row in rows[1:]]
    assert policy.observed[0][1] == pytest.approx(reward(policy.observed[0][0], scale))


def test_policy_raising_is_logged_once_and_pipeline_continues(caplog):
    pipe = FakePipeline(n_batches=150)
    tuner = tune(pipe, Raises(), tick_s=0.01, monitor=_monitor())
    with caplog.at_level(logging.ERROR, logger="intune.tuner"):
        seen = [row for batch in tuner for row in batch["id"]]
        _wait_for_ticks(tuner, 5)
        tuner.close()
    assert seen == list(range(150 * 100))  # every row, once, in order
    records = [r for r in caplog.records if r.name == "intune.tuner"]
    assert len(records) == 1 and "policy exploded" in records[0].getMessage()
    assert tuner.failures["policy"] >= 5
    assert pipe.set_calls == [] and {k.value for k in pipe.knobs.values()} == {1, 8}
    assert all(row["applied"] == {} and "policy exploded" in row["error"] for row in tuner.history())


def test_monitor_raising_is_logged_once(caplog, tmp_path):
    class BrokenMonitor(Monitor):
        def sample(self):
            raise OSError("cgroup vanished")

    pipe = FakePipeline(n_batches=100)
    tuner = tune(pipe, AskOnce({"udf.workers": 2}), tick_s=0.01, monitor=BrokenMonitor())
    with caplog.at_level(logging.ERROR, logger="intune.tuner"):
        n = sum(len(b["id"]) for b in tuner)
        time.sleep(0.1)
        tuner.close()
    assert n == 100 * 100
    assert [r.getMessage() for r in caplog.records if r.name == "intune.tuner"][0].count(
        "cgroup vanished"
    ) == 1
    assert len([r for r in caplog.records if r.name == "intune.tuner"]) == 1
    assert tuner.failures["monitor"] >= 3 and tuner.history() == [] and pipe.set_calls == []


def test_save_writes_json_lines(tmp_path):
    pipe = FakePipeline(n_batches=10_000)
    with tune(pipe, AskOnce({"read.workers": 2}), tick_s=0.02, monitor=_monitor()) as tuner:
        for _ in tuner:
            if len(tuner.history()) >= 3:
                break
    path = tuner.save(tmp_path / "sub" / "history.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == len(tuner.history()) >= 3
    rows = [json.loads(line) for line in lines]
    assert [r["tick"] for r in rows] == list(range(len(rows)))
    for key in ("time", "knobs", "throughput", "memory_used", "memory_limit", "cpus", "reward",
                "requested", "applied", "decision_ms"):  # fmt: skip
        assert key in rows[0], key
    assert rows[0]["applied"] == {"read.workers": 2} and rows[0]["stages"]["udf"]["busy"] == 0.0


def test_close_stops_the_thread_promptly():
    pipe = FakePipeline(n_batches=10_000)
    tuner = tune(pipe, AskOnce({}), tick_s=30.0, monitor=_monitor()).start()
    assert tuner.running
    t0 = time.monotonic()
    tuner.close()
    assert time.monotonic() - t0 < 5.0 and not tuner.running and pipe.closed  # a hang bound; the tick is 30 s


def test_closing_the_pipeline_stops_the_tuner():
    pipe = FakePipeline(n_batches=10_000)
    tuner = tune(pipe, AskOnce({}), tick_s=0.02, monitor=_monitor()).start()
    pipe.close()
    deadline = time.monotonic() + 10.0
    while tuner.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not tuner.running


def test_overhead_is_measured():
    pipe = FakePipeline(n_batches=10_000)
    with tune(pipe, AskOnce({}), tick_s=0.01, monitor=_monitor()) as tuner:
        tuner.start()
        _wait_for_ticks(tuner, 20)
    o = tuner.overhead()
    assert o["decisions"] >= 20
    assert 0 < o["decision_ms_mean"] <= o["decision_ms_max"] < 100  # a trivial policy + clamp
    assert 0 <= o["decision_cpu_ms_mean"] < 100
    assert 0 <= o["decision_cpu_ms_median"] <= o["decision_cpu_ms_mean"] * o["decisions"]
    assert 0 < o["thread_cpu_s"] <= o["wall_s"] and o["cpu_fraction"] == pytest.approx(
        o["thread_cpu_s"] / o["wall_s"]
    )
    assert all(row["decision_ms"] is not None for row in tuner.history())


def test_tune_argument_errors():
    pipe = FakePipeline()
    with pytest.raises(TypeError, match="policy arguments"):
        tune(pipe, AskOnce({}), epsilon=0.1)
    with pytest.raises(ValueError, match="unknown policy"):
        tune(pipe, "nonsense")
    with pytest.raises(ValueError, match="tick_s"):
        Tuner(pipe, AskOnce({}), tick_s=0)


# -- intune report ---------------------------------------------------------------------------------


def test_report_plots_a_saved_history(tmp_path, capsys):
    from intune.cli import main

    pipe = FakePipeline(n_batches=10_000)
    with tune(pipe, AskOnce({"udf.workers": 3}), tick_s=0.02, monitor=_monitor()) as tuner:
        for _ in tuner:
            if len(tuner.history()) >= 4:
                break
    history = tuner.save(tmp_path / "h.jsonl")
    assert main(["report", str(history), "--out", str(tmp_path / "h.png")]) == 0
    png = (tmp_path / "h.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    out = capsys.readouterr().out
    assert "udf.workers=3" in out and "ticks" in out


def test_report_names_a_malformed_line(tmp_path):
    from intune.history import load_history

    path = tmp_path / "bad.jsonl"
    path.write_text('{"tick": 0}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2"):
        load_history(path)


# -- on the real engine -----------------------------------------------------------------------------


def _real_pipeline(n_chunks=300, rows=250, udf_s=0.001):
    np = pytest.importorskip("numpy")
    Pipeline = pytest.importorskip("intune.pipeline.engine", reason="the engine has not landed").Pipeline

    def chunks():
        for i in range(n_chunks):
            yield {"id": np.arange(i * rows, (i + 1) * rows)}

    def udf(chunk):
        time.sleep(udf_s)
        return {"id": chunk["id"], "twice": chunk["id"] * 2}

    pipe = Pipeline.from_iterable(chunks).map(udf, name="udf").batch(128).prefetch(depth=2, buffer_mb=8)
    return pipe, n_chunks * rows


class Flip:
    """Moves the udf pool between 1 and 3 workers and the prefetch buffer between 8 and 16 MB every tick."""

    name = "flip"

    def reset(self, knobs, observation):
        self.knobs = knobs

    def step(self, observation):
        up = self.knobs["udf.workers"].value == 1
        return {"udf.workers": 3 if up else 1, "prefetch.buffer_mb": 16 if up else 8}


def test_real_pipeline_resized_every_tick_delivers_every_row_once():
    pipe, n_rows = _real_pipeline()
    with tune(pipe, Flip(), tick_s=0.02, monitor=_monitor()) as tuner:
        ids = []
        for batch in tuner:
            assert (batch["twice"] == batch["id"] * 2).all()
            ids.extend(int(i) for i in batch["id"])
        # a second epoch through the same tuner
        again = sum(len(batch["id"]) for batch in tuner)
    assert ids == list(range(n_rows)) and again == n_rows  # deterministic order, each row once
    rows = tuner.history()
    assert len(rows) >= 5 and tuner.failures == {}
    assert all(row["applied"] for row in rows)  # every tick moved the knobs
    assert {row["knobs"]["udf.workers"] for row in rows} == {1, 3}
    assert max(row["throughput"] for row in rows) > 0
    assert set(rows[0]["stages"]) == {"read", "udf", "batch", "prefetch"}
    assert not tuner.running


def test_real_pipeline_with_the_heuristic_policy():
    pytest.importorskip("intune.policies.static")
    pipe, n_rows = _real_pipeline(n_chunks=200)
    udf_max = pipe.knobs["udf.workers"].max
    # 8 CPUs over read (fixed at 1 worker) and udf: the even split asks 4 each, udf gets min(4, its max)
    with tune(pipe, "heuristic", tick_s=0.02, monitor=_monitor()) as tuner:
        ids = sorted(int(i) for batch in tuner for i in batch["id"])
        time.sleep(0.1)
    assert ids == list(range(n_rows))
    rows = tuner.history()
    assert rows and tuner.failures == {}
    assert rows[-1]["knobs"]["udf.workers"] == min(4, udf_max)
    assert rows[0]["requested"].get("udf.workers") == 4


def test_closing_the_real_pipeline_stops_the_tuner():
    pipe, _ = _real_pipeline(n_chunks=100_000)
    tuner = tune(pipe, Flip(), tick_s=0.02, monitor=_monitor())
    it = iter(tuner)
    next(it)
    _wait_for_ticks(tuner, 2)
    pipe.close()
    deadline = time.monotonic() + 10.0
    while tuner.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not tuner.running and tuner.failures == {}
    tuner.close()  # closing again is harmless


def test_the_cpu_budget_keeps_its_recent_highest_so_a_removed_worker_can_come_back():
    from intune.monitor.cpu_budget import RecentCpuBudget
    from intune.monitor.observation import Observation

    def obs(cpus, slack):
        return Observation(0, 1.0, 1.0, 0.0, cpus, 0.0, 0.0, (), cpu_slack=slack)

    budget = RecentCpuBudget(ticks=3)
    assert budget.apply(obs(2.0, 6.0)).cpu_slack == 6.0  # 8 workers on 2 CPUs, all of them busy
    assert budget.apply(obs(2.0, 4.0)).cpu_slack == 6.0  # one removed: its CPU is no longer measured
    budget.apply(obs(2.0, 4.0))
    assert budget.apply(obs(2.0, 4.0)).cpu_slack == 4.0  # after the window: what is measured now
    assert budget.apply(obs(1.0, 3.0)).cpu_slack == 3.0  # a CPU change starts afresh
    assert budget.apply(obs(1.0, 2.0)).free_cpus == 1.0 + 3.0  # no workers in this toy observation


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"policy": 42}, TypeError, "policy must be a policy name"),
        ({"policy": None}, TypeError, "got None"),
        ({"policy": "none", "tick_s": float("nan")}, ValueError, "tick_s must be a finite"),
        ({"policy": "none", "tick_s": float("inf")}, ValueError, "tick_s must be a finite"),
        ({"policy": "none", "tick_s": 0}, ValueError, "tick_s"),
        ({"policy": "none", "reward_scale": float("nan")}, ValueError, "reward_scale must be a finite"),
    ],
)
def test_bad_tune_arguments_are_refused_at_the_call(kwargs, error, words):
    # refused when tune() is called, not later in the tuning thread (where the job would run untuned)
    pipe = intune.Pipeline.from_iterable([{"x": np.arange(10)}])
    with pipe, pytest.raises(error, match=words):
        intune.tune(pipe, **kwargs)
