"""Live resizing: exactly-once delivery under 1,000 random knob changes, thread and process pools."""

import random
import threading
import time

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, assert_same_order, delivered_ids

ROWS, CHUNK = 20_000, 50


def chunks():
    return [
        {"id": np.arange(i, min(ROWS, i + CHUNK)), "x": np.full(min(CHUNK, ROWS - i), 1.0)}
        for i in range(0, ROWS, CHUNK)
    ]


def jitter(chunk):
    """A UDF with random sleeps, so that chunks finish out of order."""
    if chunk["id"][0] % 7 == 0:
        time.sleep(0.0005)
    return {"id": chunk["id"], "x": chunk["x"] * 2}


def _resizer(pipe, names, count, stop, rng):
    done = 0
    while done < count and not stop.is_set():
        name = rng.choice(names)
        knob = pipe.knobs[name]
        knob.set(rng.randint(knob.min, min(knob.max, 4)))
        done += 1
        time.sleep(0.001)
    return done


@pytest.mark.parametrize("deterministic", [True, False])
def test_exactly_once_under_1000_random_resizes(deterministic):
    pipe = (
        intune.Pipeline.from_iterable(chunks, deterministic=deterministic, max_workers=4)
        .shuffle(buffer_rows=2_000, seed=3, buffer_mb=1)
        .map(jitter, name="tudf", mode="thread")
        .map(jitter, name="pudf", mode="process")
        .batch(128)
        .prefetch(depth=3)
    )
    names = ["tudf.workers", "pudf.workers", "shuffle.buffer_mb", "prefetch.buffer_mb"]
    reference = None
    with pipe:
        if deterministic:
            reference = delivered_ids(pipe)
        stop = threading.Event()
        counts = []
        resizer = threading.Thread(
            target=lambda: counts.append(_resizer(pipe, names, 1000, stop, random.Random(7)))
        )
        resizer.start()
        got = []
        while resizer.is_alive() or not got:  # keep data flowing until all 1,000 resizes happened
            ids = delivered_ids(pipe)
            assert_exactly_once(ids, range(ROWS))
            got.append(ids)
        resizer.join()
        assert counts == [1000]
    if deterministic:
        # workers and buffer knobs moved (1 MB already holds buffer_rows rows here, so the shuffle's
        # capacity did not change): each epoch's order must equal that epoch of an undisturbed pipeline
        with (
            intune.Pipeline.from_iterable(chunks)
            .shuffle(buffer_rows=2_000, seed=3, buffer_mb=1)
            .map(jitter, name="tudf")
            .map(jitter, name="pudf")
            .batch(128)
        ) as fresh:
            fresh_orders = [delivered_ids(fresh) for _ in range(1 + len(got))]
        assert_same_order(reference, fresh_orders[0])
        for k, ids in enumerate(got, start=1):
            assert_same_order(ids, fresh_orders[k])


def test_order_independent_of_worker_counts_and_timing():
    orders = []
    for workers in (1, 3):
        with (
            intune.Pipeline.from_iterable(chunks)
            .shuffle(buffer_rows=3_000, seed=11)
            .map(jitter, name="t", workers=workers)
            .map(jitter, name="p", mode="process", workers=workers)
            .batch(100)
        ) as pipe:
            orders.append([delivered_ids(pipe) for _ in range(2)])
    assert_same_order(orders[0][0], orders[1][0])
    assert_same_order(orders[0][1], orders[1][1])
    assert not np.array_equal(orders[0][0], orders[0][1]), "epochs must shuffle differently"
    assert_exactly_once(orders[0][0], range(ROWS))


def test_lowering_workers_parks_process_workers_without_losing_rows():
    pipe = intune.Pipeline.from_iterable(chunks).map(jitter, mode="process", workers=3).batch(500)
    with pipe:
        it = iter(pipe)
        first = [next(it) for _ in range(5)]
        pids = set(pipe.stage("map").worker_pids())
        pipe.knobs["map.workers"].set(1)
        rest = list(it)
        assert_exactly_once(delivered_ids(first + rest), range(ROWS))
        # the retired workers are still alive (parked), so raising again reuses them
        assert set(pipe.stage("map").worker_pids()) == pids and len(pids) == 3
        assert pipe.metrics().stages["map"].workers == 1


def sleepy(chunk):
    time.sleep(0.003)
    return chunk


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_retired_workers_use_no_cpu_once_the_input_has_ended(mode):
    chunks10 = [{"id": np.arange(10)}] * 300
    pipe = intune.Pipeline.from_iterable(chunks10).map(sleepy, mode=mode, workers=3).prefetch(1000)
    with pipe:
        it = iter(pipe)
        next(it)
        pipe.knobs["map.workers"].set(1)  # two workers retire and park while input remains
        deadline = time.monotonic() + 20
        while pipe.metrics().stages["map"].items < 300 and time.monotonic() < deadline:
            time.sleep(0.05)  # the input ends while the consumer does not read
        time.sleep(0.1)
        c0 = time.process_time()
        time.sleep(0.5)
        assert time.process_time() - c0 < 0.1, "parked workers are spinning"
        assert len(list(it)) == 299


def test_a_shrunk_shuffle_lets_its_rows_out_a_chunk_at_a_time():
    """Lowering ``shuffle.buffer_mb`` mid-epoch: the rows let out go downstream in chunks no larger than
    the input's (before, one chunk of every excess row: a process worker copies each chunk it takes
    three or four times, and a 140 MB one got a job OOM-killed under a 1 GB limit)."""
    rows, size = 30_000, 50
    wide = lambda: [{"id": np.arange(i, i + size), "pay": np.ones((size, 128))} for i in range(0, rows, size)]  # noqa: E731
    seen: list[int] = []

    def record(chunk):
        seen.append(len(chunk["id"]))
        return chunk

    pipe = (
        intune.Pipeline.from_iterable(wide)
        .shuffle(buffer_rows=20_000, seed=1, buffer_mb=8)  # 8 MB of 1 KB rows: 8,192 rows
        .map(record, name="look", mode="thread")
        .batch(100)
    )
    got = []
    with pipe:
        for n, batch in enumerate(pipe):
            got.append(batch["id"])
            if n == 120:  # 12,000 rows delivered: the buffer is full
                pipe.knobs["shuffle.buffer_mb"].set(1)
    assert_exactly_once(np.concatenate(got), range(rows))
    assert max(seen) <= size
