"""Remote workers without a cluster: the arguments, a missing Ray, the Observation's remote fields, and
the dispatch loop's exactly-once rules driven through fake remote workers (deaths, hangs, a cluster
that cannot start any). The same loop on a real multi-node Ray cluster: test_remote_ray_cluster.py."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import cloudpickle
import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, assert_same_order, delivered_ids
from _remote_udfs import busy_chunk, busy_row, id_chunks
from intune.monitor.live import observe
from intune.monitor.observation import StageObservation, cpu_slack
from intune.pipeline.errors import StageError, StageTimeoutError
from intune.pipeline.metrics import PipelineMetrics, StageMetrics
from intune.pipeline.remote_pool import RemoteInitError, RemoteLost
from intune.pipeline.row_map import RowMapStage
from intune.pipeline.stages import MapStage

SRC = Path(__file__).resolve().parents[1] / "src"


# ---- arguments ------------------------------------------------------------------------------------


def _pipe() -> intune.Pipeline:
    return intune.Pipeline.from_iterable(id_chunks(10, 5))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"remote": "spark", "mode": "process"}, "remote must be None or 'ray', got 'spark'"),
        ({"remote": "ray", "mode": "thread"}, "remote='ray' needs mode='process'"),
        ({"address": "auto", "mode": "process"}, "pass remote='ray' too"),
        ({"remote_workers": 2, "mode": "process"}, "remote_workers=2 needs remote='ray'"),
        ({"remote": "ray", "mode": "process", "remote_workers": -1}, "remote_workers = -1 is out of range"),
        ({"remote": "ray", "mode": "process", "remote_workers": 2.5}, "remote_workers must be an integer"),
        ({"remote": "ray", "mode": "process", "address": "nohost"}, "address must be None, 'auto' or 'host:port'"),
        ({"remote": "ray", "mode": "process", "address": "head:port"}, "address must be None, 'auto' or 'host:port'"),
        ({"remote": "ray", "mode": "process", "address": 6379}, "address must be None, 'auto' or 'host:port'"),
        ({"remote": "ray", "mode": "process", "address": "ray://head:10001"}, "Ray Client address"),
    ],
)
@pytest.mark.parametrize("method", ["map", "map_rows"])
def test_bad_remote_arguments_get_a_clear_error_naming_the_method(method, kwargs, words):
    fn = busy_chunk if method == "map" else busy_row
    with pytest.raises(ValueError) as info:
        getattr(_pipe(), method)(fn, **kwargs)
    assert words in str(info.value) and str(info.value).startswith(f"{method}:")


@pytest.mark.parametrize("method", ["map", "map_rows"])
def test_remote_ray_without_ray_installed_names_the_extra(monkeypatch, method):
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` raises ImportError
    with pytest.raises(ImportError, match=r"needs Ray, which is not installed.*pip install intune\[ray\]"):
        getattr(_pipe(), method)(busy_chunk if method == "map" else busy_row, mode="process", remote="ray")
    # without remote=, nothing asks for Ray
    with _pipe().map(busy_chunk, mode="process") as pipe:
        assert_exactly_once(delivered_ids(pipe), range(10))


def test_the_engine_and_the_tuner_do_not_import_ray():
    code = "import sys, intune, intune.pipeline, intune.tuner; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(SRC), "PATH": ""}, timeout=120)


# ---- the Observation's remote fields ---------------------------------------------------------------


def _stage(**kw) -> StageMetrics:
    base = dict(
        name="udf", kind="map", mode="process", workers=2, items=0, rows=0, cpu_s=0.0, busy_s=0.0,
        starved_s=0.0, blocked_s=0.0, queue_len=0, queue_capacity=8, queue_fill=0.0, buffered_bytes=0,
    )
    return StageMetrics(**{**base, **kw})


def test_observe_fills_the_remote_fields_from_the_stage_counters():
    class Knobs(dict):
        pass

    prev = PipelineMetrics(0.0, 0, 0, 0.0, 0.0, 0.0, 0, {"udf": _stage(items=10, rows=1000, cpu_s=1.0, busy_s=1.2,
                                                                         remote_items=4, transfer_s=0.2,
                                                                         transfer_bytes=4000)})
    # over 2 s: 30 chunks, 12 of them remote (0.6 s and 24,000 bytes of transfers); 18 local ones took
    # 3.6 CPU seconds and 4.5 busy seconds
    cur = PipelineMetrics(2.0, 0, 0, 0.0, 0.0, 0.0, 0, {"udf": _stage(items=40, rows=4000, cpu_s=4.6, busy_s=5.7,
                                                                        remote_items=16, transfer_s=0.8,
                                                                        transfer_bytes=28000, remote_workers=3)},
                          remote_cpus=5.0)
    obs = observe(prev, cur, Knobs({"udf.workers": 2, "udf.remote_workers": 3}), 0, 2.0, 0.0, 1.0)
    s = obs.stage("udf")
    assert obs.remote_cpus == 5.0 and obs.allocated_remote_cpus == 3
    assert s.remote_workers == 3 and s.workers == 2
    assert s.items_per_s == pytest.approx(15.0) and s.remote_items_per_s == pytest.approx(6.0)
    assert s.transfer_s_per_item == pytest.approx(0.05) and s.transfer_bytes_per_item == pytest.approx(2000.0)
    # the local workers' time over every emitted chunk (as the simulator reports it): 3.6 / 30, 4.5 / 30
    assert s.cpu_s_per_item == pytest.approx(0.12) and s.wall_s_per_item == pytest.approx(0.15)
    # a stage without remote workers keeps 0 in every remote field
    plain = observe(prev, cur, {"udf.workers": 2}, 0, 2.0, 0.0, 1.0).stage("udf")
    assert plain.remote_workers == 0


def test_cpu_slack_counts_the_cpu_of_local_chunks_only():
    # 2 local workers that used 0.5 CPU over the 150 chunks/s the stage emitted (100 of them from
    # remote workers): cpu_s_per_item is that CPU over every chunk, so 1.5 (rounded: 2) workers' worth
    # is unused
    s = StageObservation("udf", 2, 0, 150.0, 150.0, 0.5 / 150, 0.5 / 150, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0,
                         kind="map", remote_workers=4, remote_items_per_s=100.0)
    assert cpu_slack((s,)) == 2.0


# ---- the dispatch loop, through fake remote workers -------------------------------------------------


class FakeWorker:
    """Applies the stage's function in the calling thread, dying or hanging as its registry says."""

    def __init__(self, registry: FakeRegistry, index: int) -> None:
        self.registry = registry
        self.where = f"fake {index}"
        self.index = index
        self.results: dict[int, dict] = {}
        self.tickets = 0

    def ready(self, timeout: float) -> bool:
        if self.registry.init_error:
            raise RemoteInitError("ModuleNotFoundError: No module named 'elsewhere'", "Traceback ...")
        return True

    def submit(self, chunk: dict) -> int:
        self.tickets += 1
        self.results[self.tickets] = chunk
        return self.tickets

    def done(self, ticket: int, timeout: float) -> bool:
        registry = self.registry
        first = int(self.results[ticket]["id"][0])
        if first >= registry.late_from and first not in registry.died_late:
            # a late chunk comes back only after the input has surely ended (then its worker dies)
            threading.Event().wait(timeout)
            with registry.lock:
                registry.late_waits[first] = registry.late_waits.get(first, 0) + 1
                return registry.late_waits[first] > 10
        with registry.lock:
            if registry.hang and registry.hung is None:
                registry.hung = np.asarray(self.results[ticket]["id"]).tolist()  # the first chunk sent
            hangs = registry.hung == np.asarray(self.results[ticket]["id"]).tolist()
        if hangs:
            threading.Event().wait(timeout)
            return False
        return True

    def result(self, ticket: int) -> tuple:
        chunk = self.results.pop(ticket)
        first = int(chunk["id"][0])
        if first >= self.registry.late_from and first not in self.registry.died_late:
            self.registry.died_late.add(first)
            raise RemoteLost("fake actor died late")
        with self.registry.lock:
            self.registry.calls += 1
            die = self.registry.die_every and self.registry.calls % self.registry.die_every == 0
        if die:
            raise RemoteLost("fake actor died")
        self.registry.remote_ids.extend(np.asarray(chunk["id"]).tolist())
        return ("ok", self.registry.fn({k: v.copy() for k, v in chunk.items()}), 0.001, 0.002)


class FakeRegistry:
    """A stage's remote workers without a cluster (``remote_pool.RemoteRegistry``)."""

    connected = True

    def __init__(self, fn_blob: bytes, die_every: int = 0, hang: bool = False, unavailable: bool = False,
                 init_error: bool = False, late_from: int = 1 << 62) -> None:
        self.late_from = late_from  # chunks from this id on come back late, and their worker dies
        self.late_waits: dict[int, int] = {}
        self.died_late: set[int] = set()
        self.fn = cloudpickle.loads(fn_blob)
        self.die_every = die_every
        self.hang = hang  # the first chunk a worker gets never comes back
        self.hung: list[int] | None = None
        self.unavailable = unavailable
        self.init_error = init_error
        self.lock = threading.Lock()
        self.calls = 0
        self.remote_ids: list[int] = []
        self.workers: dict[int, FakeWorker] = {}
        self.lost_calls: list[int] = []
        self.released: list[int] = []

    def connect(self) -> None:
        pass

    def worker(self, index: int) -> FakeWorker:
        if self.unavailable:
            raise RemoteLost("no cluster")
        with self.lock:
            return self.workers.setdefault(index, FakeWorker(self, index))

    def release(self, index: int) -> None:
        with self.lock:
            self.workers.pop(index, None)
            self.released.append(index)

    def lost(self, index: int, cause: BaseException, chunks: int) -> None:
        with self.lock:
            self.workers.pop(index, None)
            self.lost_calls.append(chunks)

    def held_cpus(self) -> int:
        return len(self.workers)

    def close(self) -> None:
        pass


def _fake_pipeline(stage_cls=MapStage, fn=busy_chunk, n=3000, rows=50, remote_workers=2, on_error="raise",
                   timeout_s=None, **fake) -> tuple[intune.Pipeline, MapStage, FakeRegistry]:
    pipe = intune.Pipeline.from_iterable(id_chunks(n, rows))
    stage = stage_cls(fn, "udf", "process", on_error, pipe.max_workers, 1, timeout_s, "ray", None, remote_workers)
    registry = FakeRegistry(stage._blob, **fake)
    stage.remote = registry  # type: ignore[assignment]
    pipe.add_stage(stage)
    return pipe.batch(100), stage, registry


def test_chunks_of_lost_remote_workers_are_rescued_exactly_once_in_order():
    pipe, stage, registry = _fake_pipeline(die_every=4)
    with pipe:
        for _ in range(2):  # the second epoch reuses the workers
            ids = delivered_ids(pipe)
            assert_exactly_once(ids, range(3000))
            assert_same_order(ids, np.arange(3000))
        m = pipe.metrics().stages["udf"]
    assert registry.lost_calls and m.remote_restarts == len(registry.lost_calls)
    assert 0 < m.remote_items < m.items == 120


def test_chunks_lost_remotely_after_the_input_ended_are_still_delivered():
    # the last 4 chunks: a remote worker holds each for about a second, then dies; by then the input
    # has ended, and the local worker must still be there to take them
    pipe, stage, registry = _fake_pipeline(n=1000, rows=50, remote_workers=1, late_from=800)
    with pipe:
        ids = delivered_ids(pipe)
    assert registry.died_late, "no late chunk went to the remote worker"
    assert_exactly_once(ids, range(1000))
    assert_same_order(ids, np.arange(1000))


def test_remote_workers_resized_live_lose_and_repeat_nothing():
    pipe, stage, registry = _fake_pipeline(fn=busy_chunk, n=4000, remote_workers=0, die_every=7)
    sizes = [3, 0, 1, 4, 0, 2]
    with pipe:
        ids = []
        for i, batch in enumerate(pipe):
            ids.append(batch["id"])
            if i % 6 == 0:
                pipe.set_knob("udf.remote_workers", sizes[(i // 6) % len(sizes)])
        ids = np.concatenate(ids)
    assert_exactly_once(ids, range(4000))
    assert_same_order(ids, np.arange(4000))
    assert registry.released  # workers retired by a smaller knob were released
    assert len(registry.remote_ids) > 0


def test_a_cluster_that_cannot_start_workers_leaves_the_epoch_to_the_local_workers():
    pipe, stage, registry = _fake_pipeline(n=1000, unavailable=True)
    with pipe:
        assert_exactly_once(delivered_ids(pipe), range(1000))
        assert pipe.metrics().stages["udf"].remote_items == 0


def test_a_remote_chunk_past_timeout_is_skipped_and_its_worker_released():
    # the hung chunk never ends; 5 s keeps the others, slowed by a busy machine, from reaching the timeout
    pipe, stage, registry = _fake_pipeline(n=1000, hang=True, timeout_s=5.0, on_error="skip")
    with pipe:
        ids = delivered_ids(pipe)
        skipped = pipe.metrics().stages["udf"].skipped
    assert registry.hung is not None and len(registry.hung) == 50
    assert_exactly_once(ids, sorted(set(range(1000)) - set(registry.hung)))
    assert skipped == 1 and registry.released  # the hung worker was ended


def test_a_remote_chunk_past_timeout_fails_the_epoch_naming_the_stage_and_the_chunk():
    pipe, stage, registry = _fake_pipeline(n=1000, hang=True, timeout_s=5.0)
    with pipe, pytest.raises(StageTimeoutError) as info:
        list(pipe)
    assert registry.hung is not None
    first = registry.hung[0]
    assert info.value.stage == "udf" and f"chunk #{first // 50} (rows {first}-{first + 49})" in str(info.value)


def test_a_remote_worker_that_cannot_load_the_function_fails_the_epoch():
    pipe, stage, registry = _fake_pipeline(n=1000, init_error=True)
    with pipe, pytest.raises(StageError, match=r"stage 'udf' failed on the remote worker's start: ModuleNotFoundError"):
        list(pipe)


def test_map_rows_rows_of_lost_remote_workers_are_rescued_exactly_once():
    pipe, stage, registry = _fake_pipeline(stage_cls=RowMapStage, fn=busy_row, die_every=3)
    with pipe:
        ids = delivered_ids(pipe)
    assert_exactly_once(ids, range(3000))
    assert_same_order(ids, np.arange(3000))
    assert registry.lost_calls


# ---- the live scale benchmark's arithmetic ------------------------------------------------------------


def test_scale_real_summary_compares_the_best_configuration_of_each_side():
    from intune.bench.scale_real import summarize

    def row(config, round_, rate):
        return {"config": config, "round": round_, "rows_per_s": rate, "exactly_once": True, "remote_share": 0.5}

    rows = [
        row("local-only, 1 local worker", 0, 100.0), row("local-only, 1 local worker", 1, 110.0),
        row("local-only, 2 local workers", 0, 120.0), row("local-only, 2 local workers", 1, 100.0),
        row("with-remote, 1 local worker", 0, 240.0), row("with-remote, 1 local worker", 1, 200.0),
        row("with-remote, 2 local workers", 0, 180.0), row("with-remote, 2 local workers", 1, 190.0),
        row("with-remote, resized, 1 local worker", 0, 500.0),  # never the best: not a steady configuration
    ]
    summary = {e["config"]: e for e in summarize(rows)}
    assert summary["local-only, 2 local workers"]["rows_per_s_median"] == 110.0
    assert summary["local-only, 1 local worker"]["rows_per_s_min"] == 100.0
    ratio = summary["with-remote / local-only"]
    # medians: local-only 105 (1 worker) and 110 (2 workers); with-remote 220 (1 worker) and 185 (2)
    assert ratio["local_only"] == "local-only, 2 local workers" and ratio["with_remote"] == "with-remote, 1 local worker"
    assert ratio["ratio_of_medians"] == pytest.approx(2.0) and ratio["met"]
    assert ratio["paired_ratio_min"] == pytest.approx(2.0) and ratio["paired_ratio_max"] == pytest.approx(2.0)
