"""The engine's behaviour: batching, shuffling by seed and epoch, knobs, metrics, memory bounds."""

import threading
import time

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, assert_same_order, delivered_ids
from intune.pipeline import SourceError
from intune.pipeline.metrics import PipelineMetrics


def chunks(rows=1000, size=100):
    return [
        {"id": np.arange(i, i + size), "f": np.arange(i, i + size, dtype=np.float32)}
        for i in range(0, rows, size)
    ]


def test_batches_have_exact_sizes_and_keep_order_without_shuffle():
    with intune.Pipeline.from_iterable(chunks(980, 70)).batch(64) as pipe:
        batches = list(pipe)
    assert [len(b["id"]) for b in batches] == [64] * 15 + [980 - 15 * 64]
    assert_same_order(delivered_ids(batches), np.arange(980))
    assert all(np.array_equal(b["id"], b["f"].astype(np.int64)) for b in batches)  # rows stay aligned
    with intune.Pipeline.from_iterable(chunks(980, 70)).batch(64, drop_last=True) as pipe:
        assert [len(b["id"]) for b in pipe] == [64] * 15


def test_shuffle_is_reproducible_from_seed_and_epoch():
    def build(seed):
        return intune.Pipeline.from_iterable(chunks(5000)).shuffle(buffer_rows=1000, seed=seed).batch(100)

    with build(1) as a, build(1) as b, build(2) as c:
        a0, a1 = delivered_ids(a), delivered_ids(a)
        b0, b1 = delivered_ids(b), delivered_ids(b)
        c0 = delivered_ids(c)
    assert_same_order(a0, b0)
    assert_same_order(a1, b1)
    assert not np.array_equal(a0, a1) and not np.array_equal(a0, c0)
    assert_exactly_once(a0, range(5000))
    assert_exactly_once(a1, range(5000))
    assert not np.array_equal(a0, np.arange(5000))


def test_map_after_batch_may_change_lengths_and_rows_count_source_rows():
    def dedup(batch):
        unique, inverse = np.unique(batch["id"] % 10, return_inverse=True)
        return {"values": unique, "inverse": inverse}

    with intune.Pipeline.from_iterable(chunks(1000)).batch(250).map(dedup, name="dedup") as pipe:
        out = list(pipe)
        assert [len(b["values"]) for b in out] == [10] * 4
        assert [len(b["inverse"]) for b in out] == [250] * 4
        m = pipe.metrics()
    assert m.rows_out == 1000 and m.batches_out == 4
    assert m.stages["dedup"].rows == 1000 and m.stages["dedup"].items == 4


def test_metrics_counters_match_hand_counts():
    pipe = intune.Pipeline.from_iterable(chunks(1000)).map(lambda c: c, name="udf").batch(64).prefetch(3)
    with pipe:
        start = time.monotonic()
        for _ in range(2):
            list(pipe)
        elapsed = time.monotonic() - start
        m = pipe.metrics()
    assert isinstance(m, PipelineMetrics)
    assert m.rows_out == 2000 and m.batches_out == 2 * 16
    assert m.stages["read"].items == 20 and m.stages["read"].rows == 2000
    assert m.stages["udf"].items == 20 and m.stages["udf"].mode == "thread" and m.stages["udf"].workers == 1
    assert m.stages["batch"].items == 32 and m.stages["prefetch"].queue_capacity == 3
    assert set(m.stages) == {"read", "udf", "batch", "prefetch"}
    # every next() adds its own duration to the wait, so the sum is positive and within the loop's time
    assert 0 < m.consumer_wait_s <= elapsed
    # both epochs ran to their end: no stage holds a row any more
    assert m.buffered_bytes == 0 and all(s.buffered_bytes == 0 for s in m.stages.values())
    # bytes emitted: 2 epochs x 1000 rows x (int64 id + float32 f), the same at every stage
    for name in ("read", "udf", "batch", "prefetch"):
        assert m.stages[name].bytes_out == 2 * 1000 * (8 + 4), name


def _finished_pipeline_snapshots(n: int) -> tuple[list[PipelineMetrics], float]:
    """``n`` metrics() snapshots of a pipeline whose epoch has ended, and the seconds they took."""
    pipe = intune.Pipeline.from_iterable(chunks(100)).shuffle(100).map(lambda c: c).batch(10).prefetch(2)
    with pipe:
        list(pipe)
        t0 = time.perf_counter()
        snapshots = [pipe.metrics() for _ in range(n)]
        return snapshots, time.perf_counter() - t0


def test_metrics_snapshots_only_read():
    snapshots, _ = _finished_pipeline_snapshots(200)
    first, last = snapshots[0], snapshots[-1]
    assert (first.rows_out, first.batches_out) == (last.rows_out, last.batches_out) == (100, 10)
    assert {n: (s.items, s.rows) for n, s in first.stages.items()} == {n: (s.items, s.rows) for n, s in last.stages.items()}


@pytest.mark.slow
def test_metrics_snapshot_is_cheap():
    # a measurement (the tuner takes one snapshot a tick): under 2 ms each on an idle machine
    _, seconds = _finished_pipeline_snapshots(200)
    assert seconds / 200 < 0.002


def test_knob_names_units_bounds_and_errors():
    pipe = (
        intune.Pipeline.from_iterable(chunks(100), max_workers=6, max_mb=512)
        .shuffle(1000)
        .map(lambda c: c, name="udf", mode="process")
        .batch(10)
        .prefetch(2)
    )
    with pipe:
        knobs = pipe.knobs
        assert sorted(knobs) == ["prefetch.buffer_mb", "read.workers", "shuffle.buffer_mb", "udf.workers"]
        assert (knobs["udf.workers"].unit, knobs["udf.workers"].min, knobs["udf.workers"].max) == (
            "cpu",
            1,
            6,
        )
        assert (knobs["prefetch.buffer_mb"].unit, knobs["prefetch.buffer_mb"].max) == ("mb", 512)
        assert (knobs["read.workers"].min, knobs["read.workers"].max) == (1, 1)  # an iterable is sequential
        with pytest.raises(ValueError, match=r"udf.workers.*\[1, 6\]"):
            knobs["udf.workers"].set(7)
        with pytest.raises(ValueError, match=r"\[1, 512\]"):
            knobs["shuffle.buffer_mb"].set(0)
        with pytest.raises(ValueError, match=r"unknown knob 'udf.threads'.*udf.workers"):
            pipe.set_knob("udf.threads", 2)
        with pytest.raises(KeyError, match=r"unknown knob 'read.buffer_mb'; valid knobs are \['prefetch"):
            knobs["read.buffer_mb"]
        assert "udf.workers" in knobs and "udf.threads" not in knobs and len(knobs) == 4
        with pytest.raises(TypeError):
            knobs["udf.workers"] = None  # the mapping is read-only
        knobs["udf.workers"].set(4)
        assert knobs["udf.workers"].value == 4 and pipe.metrics().stages["udf"].workers == 4


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: intune.Pipeline.from_iterable([]).batch(0), r"batch size n = 0 .* >= 1"),
        (lambda: intune.Pipeline.from_iterable([]).batch(-5), r">= 1"),
        (lambda: intune.Pipeline.from_iterable([]).prefetch(depth=0), r"depth .* >= 1"),
        (lambda: intune.Pipeline.from_iterable([]).shuffle(buffer_rows=-1), r"buffer_rows .* >= 1"),
        (lambda: intune.Pipeline.from_iterable([]).map(len, mode="gpu"), r"'thread' or 'process'"),
        (lambda: intune.Pipeline.from_iterable([]).map(len, on_error="ignore"), r"'raise' or 'skip'"),
        (lambda: intune.Pipeline.from_iterable([]).map(len, workers=0), r"workers = 0 .*\[1, "),
        (lambda: intune.Pipeline.from_parquet("x.parquet", chunk_rows=0), r"chunk_rows = 0 .* >= 1"),
        (lambda: intune.Pipeline.from_iterable([]).batch(2).batch(3), r"'batch' is already used"),
    ],
)
def test_invalid_arguments_raise_value_error_with_valid_range(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_prefetch_buffer_is_bounded_in_bytes_by_its_knob():
    big = [{"x": np.zeros(64 * 1024, dtype=np.float64)} for _ in range(40)]  # 0.5 MB each
    pipe = intune.Pipeline.from_iterable(big).prefetch(depth=100, buffer_mb=2)
    with pipe:
        it = iter(pipe)
        next(it)
        deadline = time.monotonic() + 5
        while pipe.metrics().stages["prefetch"].queue_len < 4 and time.monotonic() < deadline:
            time.sleep(0.01)  # let the prefetcher fill up: 4 items of 0.5 MB reach the 2 MB bound
        time.sleep(0.1)
        held = pipe.metrics().stages["prefetch"].buffered_bytes
        assert held == 4 * (512 << 10)
        pipe.knobs["prefetch.buffer_mb"].set(1)
        for _ in range(6):
            next(it)
        time.sleep(0.3)
        assert pipe.metrics().stages["prefetch"].buffered_bytes <= 1 << 20
        assert len(list(it)) == 40 - 7


def _prefetch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("intune-prefetch")]


def test_prefetch_after_a_serial_stage_is_its_channel_not_a_thread():
    """Batch -> prefetch: the prefetch buffer is the batch stage's output channel under prefetch's
    bounds; it is counted once (by prefetch), and its counters come from the consumer's gets."""
    pipe = intune.Pipeline.from_iterable(chunks(1000)).batch(50).prefetch(depth=3)
    with pipe:
        it = iter(pipe)
        next(it)
        assert _prefetch_threads() == []
        deadline = time.monotonic() + 5
        while pipe.metrics().stages["prefetch"].queue_len < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        m = pipe.metrics()
        assert m.stages["prefetch"].queue_len == 3  # depth, although the batcher could make 17 more
        assert m.stages["prefetch"].buffered_bytes == 3 * 50 * (8 + 4)
        assert m.stages["batch"].queue_len == 0 and m.stages["batch"].queue_fill == 1.0  # full: it waits
        assert m.buffered_bytes == sum(s.buffered_bytes for s in m.stages.values())
        assert m.stages["batch"].buffered_bytes == 0
        rest = list(it)
        m = pipe.metrics()
    assert len(rest) == 19
    assert m.stages["prefetch"].items == 20 and m.stages["prefetch"].rows == 1000
    assert m.stages["prefetch"].blocked_s > 0  # the batch stage waited on the full buffer


def test_prefetch_after_a_pool_keeps_its_own_thread():
    pipe = intune.Pipeline.from_iterable(chunks(1000)).map(lambda c: c, name="udf", workers=2).prefetch(depth=2)
    with pipe:
        it = iter(pipe)
        next(it)
        assert _prefetch_threads() != []
        assert len(list(it)) == 9
        assert pipe.metrics().stages["prefetch"].items == 10


def test_shuffle_buffer_is_bounded_in_bytes_by_its_knob():
    rows = [{"x": np.zeros(16384, dtype=np.float64)} for _ in range(64)]  # 64 chunks of 128 KB
    pipe = intune.Pipeline.from_iterable(rows).shuffle(buffer_rows=10**9, buffer_mb=2)
    peak = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak.append(
                (pipe.stage("shuffle").internal_bytes(), pipe.metrics().stages["shuffle"].buffered_bytes)
            )
            time.sleep(0.001)

    with pipe:
        watcher = threading.Thread(target=watch)
        watcher.start()
        n = sum(len(b["x"]) for b in pipe)
        stop.set()
        watcher.join()
    assert n == 64 * 16384
    # the buffer itself (rows + their 8-byte ids) within the knob; the stage adds its 2-chunk output queue
    assert 0 < max(p[0] for p in peak) <= 2 << 20
    assert max(p[1] for p in peak) <= (2 << 20) + 2 * 128 * 1024


def test_non_deterministic_mode_delivers_exactly_once():
    def jitter(chunk):
        time.sleep(0.002 * (chunk["id"][0] % 3))
        return chunk

    pipe = intune.Pipeline.from_iterable(chunks(3000), deterministic=False).map(jitter, workers=3).batch(50)
    with pipe:
        assert_exactly_once(delivered_ids(pipe), range(3000))


def test_iterating_again_starts_a_new_epoch_even_midway():
    pipe = intune.Pipeline.from_iterable(chunks(1000)).map(lambda c: c, mode="process").batch(100)
    with pipe:
        it = iter(pipe)
        next(it)
        assert_exactly_once(delivered_ids(pipe), range(1000))  # abandons the first epoch
        assert_exactly_once(delivered_ids(pipe), range(1000))


def test_closed_pipeline_refuses_iteration_and_is_idempotent():
    pipe = intune.Pipeline.from_iterable(chunks(100))
    pipe.close()
    pipe.close()
    with pytest.raises(ValueError, match="closed"):
        iter(pipe)


def test_closure_udf_runs_in_a_process_worker():
    scale = 3.0
    offsets = {"f": 1.0}

    def affine(chunk):
        return {"id": chunk["id"], "f": chunk["f"] * scale + offsets["f"]}

    with intune.Pipeline.from_iterable(chunks(500)).map(affine, mode="process").batch(500) as pipe:
        (batch,) = list(pipe)
    np.testing.assert_allclose(batch["f"], np.arange(500) * 3.0 + 1.0)


def test_a_one_shot_iterator_source_says_so_on_the_second_epoch():
    pipe = intune.Pipeline.from_iterable(c for c in chunks(300))
    with pipe:
        assert_exactly_once(delivered_ids(pipe), range(300))
        with pytest.raises(SourceError, match="one-shot iterator .* callable"):
            list(pipe)
    with intune.Pipeline.from_iterable(lambda: (c for c in chunks(300))) as pipe:
        assert_exactly_once(delivered_ids(pipe), range(300))
        assert_exactly_once(delivered_ids(pipe), range(300))


def test_a_sequential_source_counts_its_cpu_but_not_its_wait_downstream():
    burned = []

    def chunks():
        for k in range(12):
            c0 = time.thread_time()
            total = 0
            while k < 4 and time.thread_time() - c0 < 0.04:  # pure-Python work inside the source
                total += sum(range(200))
            burned.append(time.thread_time() - c0)
            yield {"id": np.arange(k * 10, k * 10 + 10)}

    pipe = intune.Pipeline.from_iterable(chunks)
    with pipe:
        for _ in pipe:
            time.sleep(0.04)  # a slow consumer: the reader waits for room (blocked, no CPU)
        read = pipe.metrics().stages["read"]
    assert read.rows == 120
    assert sum(burned) * 0.9 <= read.cpu_s <= sum(burned) + 0.05  # before: 0
    assert read.blocked_s > 0.1  # the cheap chunks' wait for room is blocked time, not CPU


def test_a_stopped_epoch_leaves_no_buffered_rows_in_any_stage():
    # each stage forgets what it held of an ended epoch (its own detach): after an epoch stopped
    # mid-way, the shuffle buffer and the batcher's partial batch no longer count as buffered
    chunks = [{"id": np.arange(i * 100, (i + 1) * 100, dtype=np.int64)} for i in range(40)]
    with intune.Pipeline.from_iterable(chunks).shuffle(buffer_rows=1000, seed=0).batch(64).prefetch(2) as pipe:
        it = iter(pipe)
        next(it)
        assert pipe.metrics().stages["shuffle"].buffered_bytes > 0
        it.close()
        m = pipe.metrics()
    assert m.buffered_bytes == 0 and all(s.buffered_bytes == 0 for s in m.stages.values()), m.stages


PAUSE_S = 0.05  # the slow source's sleep before each chunk (shorter than a pool's 0.2-s input poll)


def slow_chunks(n: int = 20):
    """A source that sleeps ``PAUSE_S`` before each chunk: the stages after it wait for input."""
    for chunk in chunks(n * 10, 10):
        time.sleep(PAUSE_S)
        yield chunk


def identity(chunk: dict) -> dict:
    return chunk


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_map_stage_waiting_on_a_slow_source_reports_that_time_as_starved(mode):
    """A stage's worker time is busy, starved or blocked, whatever runs its work, and the wait for input
    that ends in a chunk is starved (the simulator reports it so, and policies read it). Behind a source
    that sleeps before each chunk, the worker's time after the first chunk spans at least the 18 sleeps
    that lie wholly after it (a sleep is never shorter than asked, however loaded the machine; the bound
    leaves a fifth for the counters' own gaps), and a near-free function leaves most of it starved."""
    pipe = intune.Pipeline.from_iterable(slow_chunks()).map(identity, name="udf", mode=mode)
    with pipe:
        it = iter(pipe)
        next(it)  # the worker (and its child process) is up: count from here
        before = pipe.metrics().stages["udf"]
        rest = list(it)
        after = pipe.metrics().stages["udf"]
    assert len(rest) == 19
    starved = after.starved_s - before.starved_s
    busy = after.busy_s - before.busy_s
    blocked = after.blocked_s - before.blocked_s
    assert starved + busy + blocked >= 0.8 * (len(rest) - 1) * PAUSE_S
    assert starved > busy
