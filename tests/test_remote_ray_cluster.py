"""Remote workers on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head without CPUs
and nodes of 1 CPU, one cluster for the module): exactly once with the remote knob resized live, a
node removed mid-epoch, the whole cluster gone, a remote function's error, nothing left after
``close()``, the live Observation's remote fields, and the connection's errors."""

from __future__ import annotations

import functools
import gc
import glob
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _exactly_once import assert_exactly_once, assert_same_order, delivered_ids
from _remote_udfs import (
    after_remote_workers_ran,
    busy_chunk,
    busy_row,
    fails_on_ray,
    fails_row_on_ray,
    held_on_ray,
    id_chunks,
    slow_chunk,
)

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install intune[ray])")

import intune  # noqa: E402
from intune.pipeline import remote_ray  # noqa: E402
from intune.pipeline.errors import ClusterError, StageError  # noqa: E402

NODE = {"num_cpus": 1, "object_store_memory": 80 << 20}
HANG_S = 120  # generous bound on anything a test waits for (the cluster shares 2 busy cores)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": 80 << 20},
    )
    c.nodes_added = [c.add_node(**NODE) for _ in range(2)]
    ray.init(address=c.address, logging_level=logging.ERROR, log_to_driver=False)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def _wait_for(condition, what: str, timeout_s: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


def _pull_until(batches, started, timeout_s: float = HANG_S) -> None:
    """Take batches until ``started()`` holds (the remote workers run), within a hang bound."""
    deadline = time.monotonic() + timeout_s
    while not started():
        next(batches)
        assert time.monotonic() < deadline, f"the remote workers never started within {timeout_s} s"


def _cluster_is_idle() -> bool:
    """Every CPU and every byte of the object stores is free again."""
    free, total = ray.available_resources(), ray.cluster_resources()
    return free.get("CPU", 0) == total.get("CPU", 0) and free.get("object_store_memory") == total.get(
        "object_store_memory"
    )


def _two_actors_busy() -> intune.Pipeline:
    """A pipeline of ``slow_chunk`` with 2 actors, whose local worker runs nothing before an actor ran a
    chunk, over an epoch of minutes: the other actor starts long before it ends, however slow the
    machine. (Waiting for both would not do: the first one may fill the output window, held behind the
    local worker's chunk, before the second one is ready for a chunk.)"""
    marker = os.path.join(tempfile.mkdtemp(prefix="intune-test-"), "ran")
    fn = functools.partial(after_remote_workers_ran, marker, slow_chunk)
    return intune.Pipeline.from_iterable(id_chunks(200_000, 50)).map(
        fn, name="udf", mode="process", remote="ray", remote_workers=2
    ).batch(100)


def _live_actors() -> int:
    from ray._private import state

    return sum(1 for a in state.actors().values() if a["State"] != "DEAD")


def test_an_epoch_is_delivered_exactly_once_with_remote_workers_resized_live(cluster, tmp_path):
    n, rows = 6000, 50
    marker = tmp_path / "a-remote-worker-ran"
    pipe = (
        intune.Pipeline.from_iterable(id_chunks(n, rows))
        .map_rows(functools.partial(after_remote_workers_ran, str(marker), busy_row), name="udf", remote="ray", remote_workers=2)
        .batch(200)
    )
    # the epoch starts with 2 started actors (a busy machine may take longer to start one than the
    # epoch lasts), drops to 1, to 0, starts 2 again, then keeps 1; the local worker holds back until
    # an actor ran a chunk of this epoch (on a busy machine it could otherwise do the whole epoch first)
    sizes = {3: 1, 6: 0, 10: 2, 18: 1}
    with pipe:
        _warm(pipe, 2)
        for mark in tmp_path.glob("a-remote-worker-ran.*"):  # the warm-up epoch's: this epoch's make new ones
            mark.unlink()
        start = pipe.metrics().stages["udf"].remote_items
        ids, remote_seen = [], 0
        for i, batch in enumerate(pipe):
            ids.append(batch["id"])
            if i in sizes:
                pipe.set_knob("udf.remote_workers", sizes[i])
            if i == 9:  # at 0 since batch 6: the retired actors were released
                _wait_for(lambda: pipe.stage("udf").remote.live() == 0, "release of retired actors")
            remote_seen = max(remote_seen, pipe.metrics().stages["udf"].remote_items - start)
        ids = np.concatenate(ids)
        assert_exactly_once(ids, range(n))
        assert_same_order(ids, np.arange(n))  # the order without remote workers (deterministic=True)
        assert remote_seen > 0, "no chunk went to a remote worker"
        # a second epoch with the remote workers left at 1
        assert_same_order(delivered_ids(pipe), np.arange(n))


def _warm(pipe: intune.Pipeline, actors: int) -> None:
    """Run one epoch, then wait until the stage's ``actors`` hold every CPU of the cluster (they are
    kept for the next epoch, as parked local workers are)."""
    assert len(delivered_ids(pipe)) > 0
    _wait_for(lambda: ray.available_resources().get("CPU", 0) == 0, f"{actors} actors holding the cluster's CPUs")


class _RemoveWhenHeld:
    """Removes ``nodes`` from the cluster once the remote worker on ``node_id`` (on any node if it is
    empty) holds a chunk (``held_on_ray`` says so), on a thread of its own: the epoch's output waits for
    that chunk until the removal hands it to the other workers. Then lets held chunks go."""

    def __init__(self, cluster, nodes: list, marker, node_id: str = "") -> None:
        self.removed = False
        self._error: BaseException | None = None
        held = f"{glob.escape(str(marker))}.held.{node_id or '*'}"
        self._thread = threading.Thread(target=self._run, args=(cluster, nodes, marker, held), daemon=True)
        self._thread.start()

    def _run(self, cluster, nodes: list, marker, held: str) -> None:
        try:
            _wait_for(lambda: bool(glob.glob(held)), "a chunk held on a remote worker")
            self.removed = True
        except BaseException as exc:  # noqa: BLE001 - raised by join()
            self._error = exc
        finally:  # the nodes go even so: the tests after this one expect the cluster without them
            for node in nodes:
                cluster.remove_node(node, allow_graceful=False)
            marker.touch()

    def join(self) -> None:
        self._thread.join(HANG_S)
        if self._error is not None:
            raise self._error


def _held(pipe_of, marker, node_id: str, actors: int) -> intune.Pipeline:
    """``pipe_of(fn)`` with ``held_on_ray`` for ``fn``, warmed up (chunks not held) with ``actors``."""
    pipe = pipe_of(functools.partial(held_on_ray, str(marker), node_id))
    marker.touch()
    _warm(pipe, actors)
    marker.unlink()
    for held in glob.glob(f"{glob.escape(str(marker))}.held.*"):
        os.unlink(held)
    return pipe


def test_a_node_removed_mid_epoch_loses_and_repeats_no_row(cluster, caplog, tmp_path):
    extra = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    n = 4000
    marker = tmp_path / "release"

    def pipe_of(fn):
        return intune.Pipeline.from_iterable(id_chunks(n, 20)).map(
            fn, name="udf", mode="process", remote="ray", remote_workers=3
        ).batch(100)

    with caplog.at_level(logging.WARNING, logger="intune.pipeline.remote_ray"):
        # one actor on each of the 3 nodes (1 CPU each), holding their chunks until the extra node is gone
        with _held(pipe_of, marker, extra.node_id, 3) as pipe:
            remover = _RemoveWhenHeld(cluster, [extra], marker, extra.node_id)
            ids = np.concatenate([batch["id"] for batch in pipe])
            remover.join()
            m = pipe.metrics().stages["udf"]
    assert remover.removed
    assert_exactly_once(ids, range(n))
    assert_same_order(ids, np.arange(n))
    assert m.remote_restarts >= 1, "no chunk was in flight on the removed node"
    lost = [r for r in caplog.records if "remote worker lost" in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in lost]  # logged once


def test_a_remote_function_error_names_the_stage_and_the_chunk_origin(cluster, tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": np.arange(2000), "x": np.arange(2000) * 0.5}), path, row_group_size=100)
    gated = functools.partial(after_remote_workers_ran, str(tmp_path / "a-remote-worker-ran"), fails_on_ray)
    pipe = intune.Pipeline.from_parquet(str(path), chunk_rows=100).map(
        gated, name="udf", mode="process", remote="ray", remote_workers=2
    )
    with pipe, pytest.raises(StageError) as info:
        list(pipe)
    message = str(info.value)
    first = int(message.split("no feature for id ")[1].split("'")[0])  # the chunk the remote worker failed on
    assert info.value.stage == "udf"
    assert message.startswith(f"stage 'udf' failed on {path} rows {first}-{first + 99}: KeyError")
    assert "on the remote worker" in message and "fails_on_ray" in message  # the actor's traceback


def test_a_remote_row_error_names_the_row_and_skip_leaves_out_that_row_only(cluster, tmp_path):
    def gated(name):  # each pipeline's local worker waits until a remote one ran a row
        return functools.partial(after_remote_workers_ran, str(tmp_path / name), fails_row_on_ray)

    pipe = intune.Pipeline.from_iterable(id_chunks(3000, 100)).map_rows(
        gated("raise"), name="udf", remote="ray", remote_workers=2
    )
    with pipe, pytest.raises(StageError) as info:
        list(pipe)
    message = str(info.value)
    first = int(message.split("no feature for id ")[1].split("'")[0]) - 34
    assert info.value.stage == "udf" and f"row 34 of a chunk of 100 rows: source 'read' chunk #{first // 100}" in message
    pipe = intune.Pipeline.from_iterable(id_chunks(3000, 100)).map_rows(
        gated("skip"), name="udf", remote="ray", remote_workers=2, on_error="skip"
    )
    with pipe:
        ids = delivered_ids(pipe)
        skipped = pipe.metrics().stages["udf"].skipped
    left_out = sorted(set(range(3000)) - set(ids.tolist()))
    assert skipped == len(left_out) > 0 and all(i % 100 == 34 for i in left_out)
    assert_exactly_once(ids, sorted(set(range(3000)) - set(left_out)))


def test_close_leaves_no_actor_and_no_object_in_the_cluster(cluster):
    _wait_for(_cluster_is_idle, "idle cluster before the test")
    before = _live_actors()
    worker = ray._private.worker.global_worker
    gc.collect()
    refs_before = set(worker.core_worker.get_all_reference_counts())
    pipe = _two_actors_busy()
    try:
        _pull_until(iter(pipe), lambda: pipe.stage("udf").remote_cpus_held() >= 2
                    and pipe.metrics().stages["udf"].remote_items >= 2)
        assert not _cluster_is_idle()  # actors hold CPUs, chunks are in flight
    finally:
        pipe.close()  # the test (also when it failed: the tests after it need an idle cluster)
    _wait_for(_cluster_is_idle, "every CPU and object store byte back after close()")
    assert _live_actors() == before
    gc.collect()
    left = set(worker.core_worker.get_all_reference_counts()) - refs_before
    assert not left, f"objects of the closed pipeline still referenced: {left}"
    # between epochs the actors idle (kept for the next epoch): close() ends them too
    pipe = intune.Pipeline.from_iterable(id_chunks(1000, 50)).map(
        slow_chunk, name="udf", mode="process", remote="ray", remote_workers=2
    )
    _warm(pipe, 2)
    assert pipe.stage("udf").remote.live() == 2
    pipe.close()
    _wait_for(_cluster_is_idle, "every CPU back after close() between epochs")
    assert _live_actors() == before


def test_a_dropped_pipeline_and_an_exiting_process_leave_no_actor(cluster):
    _wait_for(_cluster_is_idle, "idle cluster before the test")

    def hold_two_actors():
        pipe = _two_actors_busy()
        _pull_until(iter(pipe), lambda: pipe.stage("udf").remote_cpus_held() >= 2)

    hold_two_actors()  # the pipeline and its iterator are dropped, never closed
    gc.collect()
    _wait_for(_cluster_is_idle, "every CPU back after the pipeline was dropped")
    child = (
        "import logging, ray, test_remote_ray_cluster as t\n"
        f"ray.init(address={cluster.address!r}, logging_level=logging.ERROR, log_to_driver=False)\n"
        "t.hold_two_actors_for_exit()\n"  # then exit without close()
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", child], check=True, timeout=120, env=env)
    _wait_for(_cluster_is_idle, "every CPU back after the process exited")


_KEPT: list = []


def hold_two_actors_for_exit() -> None:
    """In a child process: a pipeline holding two actors, kept referenced until the process exits."""
    pipe = _two_actors_busy()
    batches = iter(pipe)
    _KEPT.extend([pipe, batches])
    while pipe.stage("udf").remote_cpus_held() < 2:
        next(batches)
    assert ray.available_resources().get("CPU", 0) == 0


def test_the_live_observation_carries_the_remote_fields(cluster):
    seen = []  # (this pipeline's actors holding a CPU at the step, the step's observation)

    class Watch:
        name = "watch"

        def reset(self, knobs, observation):
            pass

        def step(self, observation):
            seen.append((pipe.stage("udf").remote_cpus_held(), observation))
            return {}

    pipe = intune.Pipeline.from_iterable(id_chunks(100000, 50)).map(
        slow_chunk, name="udf", mode="process", remote="ray", remote_workers=2
    ).batch(100)
    deadline, found = time.monotonic() + HANG_S, None
    with intune.tune(pipe, policy=Watch(), tick_s=0.3) as tuner:
        for _ in tuner:
            # a tick whose snapshot was taken after a step that saw both actors hold their CPUs, and
            # whose reading of the cluster's free CPUs is that recent (it is re-read in the background:
            # on a busy machine an older reading may predate an actor's start)
            ticks = list(seen)
            pairs = zip(ticks, ticks[1:], strict=False)
            found = next((obs for (held, _), (_, obs) in pairs if held == 2 and obs.remote_cpus == 2.0), None)
            if found is not None:
                break
            assert time.monotonic() < deadline, f"no tick saw 2 remote CPUs within {HANG_S} s: {[o.remote_cpus for _, o in seen]}"
        history = tuner.history()
    assert found is not None, "the epoch ended before a tick saw both actors hold their CPUs"
    s = found.stage("udf")
    assert s.remote_workers == 2 and found.allocated_remote_cpus == 2
    assert s.items_per_s >= s.remote_items_per_s > 0
    assert s.transfer_s_per_item > 0 and s.transfer_bytes_per_item > 0
    [row] = [h for h in history if h["tick"] == found.tick]
    assert row["remote_cpus"] == 2.0 and row["stages"]["udf"]["remote_workers"] == 2


def test_connecting_elsewhere_or_to_nothing_is_a_clear_error(cluster, monkeypatch):
    def pipe(address):
        return intune.Pipeline.from_iterable(id_chunks(100, 50)).map(
            busy_chunk, mode="process", remote="ray", address=address, name="udf"
        )

    with pipe("127.0.0.1:1") as p, pytest.raises(
        ClusterError, match=r"stage 'udf': address='127.0.0.1:1', but this process is already connected"
    ):
        list(p)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pipe("127.0.0.1:1") as p, pytest.raises(ClusterError, match=r"no Ray cluster answers at address='127.0.0.1:1'"):
        list(p)
    monkeypatch.setattr(remote_ray, "_auto_address", lambda: None)
    with pipe("auto") as p, pytest.raises(ClusterError, match="address='auto' found no running Ray cluster"):
        list(p)


def test_without_an_address_or_a_cluster_a_local_ray_is_started_and_said_so():
    # a fresh process: no Ray initialised, and "auto" finds nothing that answers
    code = (
        "import logging, numpy as np, intune, _remote_udfs as u\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "pipe = intune.Pipeline.from_iterable(u.id_chunks(2000, 50)).map(u.busy_chunk, name='udf', mode='process', remote='ray')\n"
        "with pipe:\n"
        "    ids = np.sort(np.concatenate([b['id'] for b in pipe]))\n"
        "    assert np.array_equal(ids, np.arange(2000)), 'not exactly once'\n"
        "    assert pipe.knobs['udf.remote_workers'].value == 1\n"
        "    print('REMOTE CPUS', pipe.remote_cpus())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "RAY_ADDRESS": "127.0.0.1:1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no Ray cluster found" in done.stderr and "started a local Ray" in done.stderr
    assert float(done.stdout.split("REMOTE CPUS")[1].split()[0]) > 0


def test_zz_a_cluster_that_disappears_leaves_the_epoch_to_the_local_workers(cluster, tmp_path):
    """Last in the module (zz): it takes every node of the shared cluster away."""
    n = 3000
    marker = tmp_path / "release"

    def pipe_of(fn):
        return intune.Pipeline.from_iterable(id_chunks(n, 20)).map(
            fn, name="udf", mode="process", remote="ray", remote_workers=2
        ).batch(100)

    with _held(pipe_of, marker, "", 2) as pipe:  # every actor holds its chunks until the nodes go
        remover = _RemoveWhenHeld(cluster, cluster.nodes_added, marker)
        ids = np.concatenate([batch["id"] for batch in pipe])
        remover.join()
        assert remover.removed
        assert_exactly_once(ids, range(n))
        assert_same_order(ids, np.arange(n))
        _wait_for(lambda: pipe.remote_cpus() == 0, "remote CPUs at 0 without nodes")
        assert pipe.metrics().stages["udf"].remote_restarts >= 1
