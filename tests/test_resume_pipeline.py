"""Pipeline.state_dict / load_state_dict: a resumed epoch delivers exactly the rows not yet delivered,
in the batches the uninterrupted run delivers, for every source and at any batch."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import intune
from _exactly_once import assert_exactly_once, assert_same_order
from intune.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from intune.pipeline import resume
from intune.pipeline.resume import ResumeError

ROWS, BATCH = 6000, 100


@pytest.fixture(autouse=True, params=["from the start", "from an anchor"])
def replay_origin(request, monkeypatch):
    """Every test twice: states replayed from the epoch's start, and states that carry an anchor (the
    buffer's ids and generator a buffer's worth of input back; only deep states do by default)."""
    if request.param == "from an anchor":
        monkeypatch.setattr(resume, "ANCHOR_MIN_CHUNKS", 0)
    return request.param


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume_parquet")
    for f in range(3):
        ids = np.arange(f * ROWS // 3, (f + 1) * ROWS // 3, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float32) * 2, "s": [f"r{i}".encode() for i in ids]})
        pq.write_table(table, d / f"part-{f}.parquet", row_group_size=700)
    return d


def plus_one(chunk):
    """A row-wise map: each output row depends on its input row only (the resume contract)."""
    return {**chunk, "y": chunk["x"] + 1}


def plus_two(chunk):
    return {**chunk, "z": chunk["y"] + 1}


def parquet_pipeline(parquet_dir, seed=3, mode="thread", buffer_rows=900, batch=BATCH, **options):
    return (
        intune.Pipeline.from_parquet(str(parquet_dir / "*.parquet"), chunk_rows=256, **options)
        .map(plus_one, name="before", mode=mode)
        .shuffle(buffer_rows=buffer_rows, seed=seed)
        .batch(batch)
        .map(plus_two, name="after")
        .prefetch(2)
    )


def ids_of(batches):
    return [np.asarray(b["id"]).copy() for b in batches]


def checkpoint_at(build, k, path, during=None):
    """Run a pipeline ``k`` batches, save its state to ``path``, then run it to the end (the
    uninterrupted run). Returns (batches before, batches after) as id arrays."""
    pipe = build()
    it = iter(pipe)
    before = []
    for i in range(k):
        batch = next(it)
        before.append(np.asarray(batch["id"]).copy())
        if "z" in batch:
            assert np.array_equal(batch["z"], batch["x"] + 2)
        if during is not None:
            during(pipe, i)
    save_checkpoint(path, pipe.state_dict(), kind="pipeline")
    after = ids_of(it)
    pipe.close()
    return before, after


def resumed(build, path):
    pipe = build()
    pipe.load_state_dict(load_checkpoint(path, kind="pipeline"))
    batches = list(pipe)
    for b in batches:
        if "z" in b:
            assert np.array_equal(b["z"], b["x"] + 2)
    pipe.close()
    return ids_of(batches)


def assert_same_batches(a, b):
    assert [len(x) for x in a] == [len(x) for x in b], "batch sizes differ"
    for x, y in zip(a, b, strict=True):
        assert_same_order(x, y)


@pytest.mark.parametrize("k", [0, 1, 17, 59, 60])  # nothing, the first batch, mid-epoch, the last, after it
def test_resume_at_batch_k_gives_the_uninterrupted_batches(parquet_dir, tmp_path, k):
    build = lambda: parquet_pipeline(parquet_dir)  # noqa: E731
    reference = ids_of(build())
    assert len(reference) == ROWS // BATCH
    before, after = checkpoint_at(build, k, tmp_path / "ck")
    assert_same_batches(before + after, reference)
    again = resumed(build, tmp_path / "ck")
    assert_same_batches(before + again, reference)
    assert_exactly_once(np.concatenate(before + again), range(ROWS))


def test_resume_in_a_later_epoch_uses_that_epochs_order(parquet_dir, tmp_path):
    pipe = parquet_pipeline(parquet_dir)
    first = ids_of(pipe)
    it = iter(pipe)
    before = [np.asarray(next(it)["id"]).copy() for _ in range(5)]
    save_checkpoint(tmp_path / "ck", pipe.state_dict(), kind="pipeline")
    rest = ids_of(it)
    pipe.close()
    assert not np.array_equal(np.concatenate(first), np.concatenate(before + rest))
    again = resumed(lambda: parquet_pipeline(parquet_dir), tmp_path / "ck")
    assert_same_batches(before + again, before + rest)


def test_state_between_epochs_points_at_the_next_epoch(parquet_dir, tmp_path):
    pipe = parquet_pipeline(parquet_dir)
    assert pipe.state_dict()["epoch"] == 0 and pipe.state_dict()["rows"] == 0
    list(pipe)
    state = pipe.state_dict()
    assert (state["epoch"], state["rows"], state["shuffle"]) == (1, 0, None)
    second = ids_of(pipe)
    pipe.close()
    other = parquet_pipeline(parquet_dir)
    other.load_state_dict(state)
    assert_same_batches(ids_of(other), second)
    other.close()


def test_resume_twice_in_one_epoch(parquet_dir, tmp_path):
    build = lambda: parquet_pipeline(parquet_dir)  # noqa: E731
    reference = ids_of(build())
    first, _ = checkpoint_at(build, 10, tmp_path / "a")
    second = build()
    second.load_state_dict(load_checkpoint(tmp_path / "a"))
    it = iter(second)
    middle = [np.asarray(next(it)["id"]).copy() for _ in range(25)]
    save_checkpoint(tmp_path / "b", second.state_dict(), kind="pipeline")
    second.close()
    last = resumed(build, tmp_path / "b")
    assert_same_batches(first + middle + last, reference)


def test_process_mode_map_before_the_shuffle(parquet_dir, tmp_path):
    build = lambda: parquet_pipeline(parquet_dir, mode="process")  # noqa: E731
    before, after = checkpoint_at(build, 23, tmp_path / "ck")
    again = resumed(build, tmp_path / "ck")
    assert_same_batches(again, after)
    assert_exactly_once(np.concatenate(before + again), range(ROWS))


def test_checkpoint_while_workers_resize(parquet_dir, tmp_path):
    """A checkpoint taken while a resizer changes every worker count: the order does not depend on
    workers, so the resumed run still gives the uninterrupted run's batches."""
    stop = threading.Event()
    rng = np.random.default_rng(0)

    def resizer(pipe):
        names = [n for n in pipe.knobs if n.endswith(".workers")]
        while not stop.is_set():
            knob = pipe.knobs[names[rng.integers(len(names))]]
            knob.set(int(rng.integers(knob.min, min(knob.max, 4) + 1)))
            time.sleep(0.002)

    threads = []

    def during(pipe, i):
        if i == 0:
            threads.append(threading.Thread(target=resizer, args=(pipe,), daemon=True))
            threads[0].start()

    build = lambda: parquet_pipeline(parquet_dir)  # noqa: E731
    reference = ids_of(build())
    try:
        before, after = checkpoint_at(build, 31, tmp_path / "ck", during=during)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert_same_batches(before + after, reference)
    assert_same_batches(before + resumed(build, tmp_path / "ck"), reference)


def test_a_shuffle_buffer_shrink_before_the_checkpoint_is_replayed(tmp_path):
    """Rows of 16 KB: buffer_mb decides the capacity. A shrink mid-epoch (let out a chunk's worth at a
    time, partly while the shuffle waits for input) is in the log; the resume replays it."""
    n = 3000
    wide = np.zeros((n, 2048), dtype=np.float64)
    ids = np.arange(n)

    def build():
        chunks = [{"id": ids[i : i + 100], "w": wide[i : i + 100]} for i in range(0, n, 100)]
        return intune.Pipeline.from_iterable(chunks).shuffle(buffer_rows=400, seed=5, buffer_mb=8).batch(50)

    def during(pipe, i):
        if i == 2:
            pipe.set_knob("shuffle.buffer_mb", 1)  # 400 rows -> 64 rows

    before, after = checkpoint_at(build, 20, tmp_path / "ck", during=during)
    state = load_checkpoint(tmp_path / "ck")
    assert state["knobs"]["shuffle.buffer_mb"] == 1
    assert (state["shuffle"]["events"][:, 1] == 1).any()  # resize steps were logged
    again = resumed(build, tmp_path / "ck")
    assert_same_batches(again, after)
    assert_exactly_once(np.concatenate(before + again), range(n))


@pytest.mark.parametrize("callable_source", [False, True])
def test_iterable_source_is_streamed_again_and_skipped(tmp_path, callable_source):
    n = 2345
    chunks = [{"id": np.arange(i, min(n, i + 97))} for i in range(0, n, 97)]
    source = (lambda: iter(chunks)) if callable_source else chunks

    def build():
        return intune.Pipeline.from_iterable(source).shuffle(buffer_rows=500, seed=1).batch(64)

    reference = ids_of(build())
    for k in (1, 20, 36, 37):
        before, after = checkpoint_at(build, k, tmp_path / "ck")
        again = resumed(build, tmp_path / "ck")
        assert_same_batches(before + again, reference)
        assert_exactly_once(np.concatenate(before + again), range(n))


def _criteo_file(path, n, bad_at=()):
    lines = []
    for i in range(n):
        if i in bad_at:
            lines.append("not\ta\tline\n")
        else:
            fields = [str(i % 2), str(i)] + [""] * 12 + [f"{i:08x}"] + [""] * 25
            lines.append("\t".join(fields) + "\n")
    path.write_text("".join(lines))


def test_criteo_tsv_with_skipped_lines(tmp_path):
    path = tmp_path / "day_0"
    bad = {5, 400, 1201}
    _criteo_file(path, 2000, bad_at=bad)

    def build():
        return (
            intune.Pipeline.from_criteo_tsv(str(path), chunk_rows=128, block_bytes=4096, on_error="skip")
            .shuffle(buffer_rows=300, seed=2)
            .batch(50)
        )

    def criteo_ids(batches):
        return [b.astype(np.int64) for b in batches]

    build_ids = lambda pipe: [np.asarray(b["I1"]).astype(np.int64) for b in pipe]  # noqa: E731
    reference = build_ids(build())
    expected = [i for i in range(2000) if i not in bad]
    assert_exactly_once(np.concatenate(reference), expected)
    pipe = build()
    it = iter(pipe)
    before = [np.asarray(next(it)["I1"]).astype(np.int64) for _ in range(13)]
    save_checkpoint(tmp_path / "ck", pipe.state_dict(), kind="pipeline")
    pipe.close()
    other = build()
    other.load_state_dict(load_checkpoint(tmp_path / "ck"))
    again = build_ids(other)
    other.close()
    assert_same_batches(criteo_ids(before + again), criteo_ids(reference))


def test_each_rank_resumes_its_own_share_and_refuses_another_ranks_state(parquet_dir, tmp_path):
    delivered = []
    states = []
    for rank in (0, 1):
        build = lambda rank=rank: parquet_pipeline(parquet_dir, rank=rank, world_size=2)  # noqa: E731
        reference = ids_of(build())
        before, _ = checkpoint_at(build, 7 + rank, tmp_path / f"ck{rank}")
        again = resumed(build, tmp_path / f"ck{rank}")
        assert_same_batches(before + again, reference)
        delivered.extend(before + again)
        states.append(load_checkpoint(tmp_path / f"ck{rank}"))
    assert_exactly_once(np.concatenate(delivered), range(ROWS))
    wrong = parquet_pipeline(parquet_dir, rank=1, world_size=2)
    with pytest.raises(CheckpointError, match=r"shard\.rank: 0 in the checkpoint, 1 here"):
        wrong.load_state_dict(states[0])
    wrong.close()


@pytest.mark.parametrize(
    "other, fragment",
    [
        (lambda d: parquet_pipeline(d, seed=4), r"stages\[2\]\.seed: 3 in the checkpoint, 4 here"),
        (lambda d: parquet_pipeline(d, batch=50), r"stages\[3\]\.batch_rows: 100 in the checkpoint, 50 here"),
        (lambda d: parquet_pipeline(d, buffer_rows=901), r"buffer_rows: 900 in the checkpoint, 901 here"),
        (
            lambda d: intune.Pipeline.from_parquet(str(d / "part-0.parquet"), chunk_rows=256)
            .map(plus_one, name="before")
            .shuffle(buffer_rows=900, seed=3)
            .batch(BATCH)
            .map(plus_two, name="after")
            .prefetch(2),
            r"stages\[0\]\.source\.files",
        ),
        (
            lambda d: intune.Pipeline.from_parquet(str(d / "*.parquet"), chunk_rows=256)
            .shuffle(buffer_rows=900, seed=3)
            .batch(BATCH),
            r"stages: read\(read\) -> before\(map\) -> shuffle\(shuffle\) -> batch\(batch\) -> after\(map\) -> "
            r"prefetch\(prefetch\) in the checkpoint, read\(read\) -> shuffle\(shuffle\) -> batch\(batch\) here",
        ),
    ],
)
def test_a_state_from_another_pipeline_is_refused_naming_what_differs(parquet_dir, tmp_path, other, fragment):
    checkpoint_at(lambda: parquet_pipeline(parquet_dir), 3, tmp_path / "ck")
    pipe = other(parquet_dir)
    with pytest.raises(CheckpointError, match=fragment):
        pipe.load_state_dict(load_checkpoint(tmp_path / "ck"))
    pipe.close()


def test_knobs_are_restored_clamped_to_the_new_bounds(parquet_dir, tmp_path):
    pipe = parquet_pipeline(parquet_dir, max_workers=8)
    pipe.set_knob("before.workers", 7)
    pipe.set_knob("shuffle.buffer_mb", 40)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    pipe.close()
    assert state["knobs"]["before.workers"] == 7
    small = parquet_pipeline(parquet_dir, max_workers=4)
    small.load_state_dict(state)
    assert small.knobs["before.workers"].value == 4
    assert small.knobs["shuffle.buffer_mb"].value == 40
    assert small.state_dict()["rows"] == BATCH  # loaded, not yet iterated: still that position
    small.close()


def test_load_state_dict_on_an_iterating_pipeline_raises(parquet_dir):
    pipe = parquet_pipeline(parquet_dir)
    state = pipe.state_dict()
    it = iter(pipe)
    next(it)
    with pytest.raises(ValueError, match="before iterating"):
        pipe.load_state_dict(state)
    pipe.close()


def test_unsupported_pipelines_say_why_at_state_dict():
    chunks = [{"id": np.arange(i, i + 10)} for i in range(0, 100, 10)]
    cases = [
        (intune.Pipeline.from_iterable(chunks, deterministic=False).shuffle(50).batch(10), "deterministic=True"),
        (intune.Pipeline.from_iterable(chunks).map(plus_one), "with no shuffle a batch stage"),
        (intune.Pipeline.from_iterable(chunks).shuffle(20).shuffle(30, name="again").batch(5), "one shuffle stage"),
    ]
    for pipe, fragment in cases:
        with pytest.raises(ResumeError, match=fragment):
            pipe.state_dict()
        pipe.close()


def test_a_map_before_the_shuffle_that_drops_rows_makes_the_epoch_unresumable():
    chunks = [{"id": np.arange(i, i + 10)} for i in range(0, 100, 10)]
    pipe = intune.Pipeline.from_iterable(chunks).map(lambda c: {"id": c["id"][::2]}, name="halve").shuffle(20).batch(5)
    it = iter(pipe)
    next(it)
    with pytest.raises(ResumeError, match="changed the row count"):
        pipe.state_dict()
    pipe.close()


def test_a_state_whose_log_does_not_cover_the_position_is_refused(parquet_dir, tmp_path):
    checkpoint_at(lambda: parquet_pipeline(parquet_dir), 5, tmp_path / "ck")
    state = load_checkpoint(tmp_path / "ck")
    state["rows"] = ROWS + 1
    pipe = parquet_pipeline(parquet_dir)
    with pytest.raises(CheckpointError, match="fewer than the 6001 delivered"):
        pipe.load_state_dict(state)
    pipe.close()


def test_state_dict_is_small_and_holds_no_rows(parquet_dir, tmp_path):
    before, _ = checkpoint_at(lambda: parquet_pipeline(parquet_dir), 30, tmp_path / "ck")
    size = (tmp_path / "ck").stat().st_size
    state = load_checkpoint(tmp_path / "ck")
    chunks = len(state["shuffle"]["rows"])
    anchor = state["shuffle"].get("anchor")
    assert size < 4096 + 16 * chunks + (4 * len(anchor["ids"]) if anchor is not None else 0)
    assert state["rows"] == 30 * BATCH and state["batches"] == 30


@pytest.mark.parametrize("by", [None, "session_id"])
def test_logged_steps_ahead_of_the_consumer_are_applied_where_they_ran(tmp_path, by):
    """The shuffle runs ahead of the consumer: a state's log may hold steps past the consumer's position
    (here a shrink, then the drain). The resumed shuffle applies them at the positions they ran at, for
    the slot buffer and for the session shuffle alike."""
    n = 3000
    wide = np.zeros((n, 2048), dtype=np.float64)
    ids = np.arange(n)
    session = ids // 7

    def build():
        chunks = [{"id": ids[i : i + 100], "session_id": session[i : i + 100], "w": wide[i : i + 100]} for i in range(0, n, 100)]
        return intune.Pipeline.from_iterable(chunks).shuffle(buffer_rows=400, seed=5, buffer_mb=8, by=by).batch(50)

    pipe = build()
    it = iter(pipe)
    before = [np.asarray(next(it)["id"]).copy() for _ in range(8)]
    state = pipe.state_dict()
    pipe.set_knob("shuffle.buffer_mb", 1)  # 400 rows -> 64 rows, after the state was taken
    after = ids_of(it)
    state["shuffle"] = pipe._last_epoch.shuffle_log.snapshot()  # the whole epoch's log
    state["knobs"]["shuffle.buffer_mb"] = 1
    pipe.close()
    events = state["shuffle"]["events"]
    assert (events[:, 1] == 1).sum() >= 1 and events[-1, 1] == 2  # shrink steps, then the drain
    other = build()
    other.load_state_dict(state)
    again = ids_of(other)
    other.close()
    assert_same_batches(again, after)
    assert_exactly_once(np.concatenate(before + again), range(n))
    # resumed again from the resumed run, before or after it applied those steps: the same batches
    for k in (0, 1, 3):
        second = build()
        second.load_state_dict(state)
        it = iter(second)
        middle = [np.asarray(next(it)["id"]).copy() for _ in range(k)]
        later = second.state_dict()
        second.close()
        third = build()
        third.load_state_dict(later)
        assert_same_batches(middle + ids_of(third), after)
        third.close()


def session_chunks(n=4000, seed=0):
    """Rows clustered by session (runs of 1..12 rows with one session id), cut into uneven chunks."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 13, n)
    session = np.repeat(np.arange(n), lengths)[:n]
    cuts = np.cumsum(rng.integers(50, 150, n // 50))
    cuts = cuts[cuts < n]
    return [{"id": ids, "session_id": sid} for ids, sid in zip(np.split(np.arange(n), cuts), np.split(session, cuts), strict=True)]


@pytest.mark.parametrize("k", [1, 9, 40, 79, 80])
def test_recd_session_shuffle_resumes_exactly(tmp_path, k):
    chunks = session_chunks()

    def build():
        return intune.Pipeline.from_iterable(chunks).shuffle(buffer_rows=700, seed=4, by="session_id").batch(50)

    reference = ids_of(build())
    # sessions stay whole: the ids of one session come out together
    before, after = checkpoint_at(build, k, tmp_path / "ck")
    assert_same_batches(before + after, reference)
    again = resumed(build, tmp_path / "ck")
    assert_same_batches(before + again, reference)
    assert_exactly_once(np.concatenate(before + again), range(4000))


def test_recd_session_shuffle_with_a_shrink_and_dedup_after_batch(tmp_path):
    """Rows of 4 KB: buffer_mb decides the window. A shrink mid-epoch releases by resize; dedup after
    batch sees the same batches."""
    chunks = [{**c, "w": np.zeros((len(c["id"]), 1024), np.float32)} for c in session_chunks(seed=1)]

    def build():
        return (
            intune.Pipeline.from_iterable(chunks)
            .shuffle(buffer_rows=900, seed=2, by="session_id", buffer_mb=4)
            .batch(64)
            .dedup({"s": ["session_id"]})
        )

    def during(pipe, i):
        if i == 3:
            pipe.set_knob("shuffle.buffer_mb", 1)  # 900 rows -> 256 rows

    before, after = checkpoint_at(build, 30, tmp_path / "ck", during=during)
    state = load_checkpoint(tmp_path / "ck")
    assert state["knobs"]["shuffle.buffer_mb"] == 1  # the shuffle applies it where it meets it: logged or not
    again = resumed(build, tmp_path / "ck")
    assert_same_batches(again, after)
    assert_exactly_once(np.concatenate(before + again), range(4000))


@pytest.mark.parametrize("kind", ["add", "shrink", "drain"])
def test_a_session_release_is_redone_exactly(kind):
    """session_resume on the buffer alone: whatever triggered the release the position falls in (an
    add, a shrink, the drain), redoing it from the log gives the rows that followed, in order."""
    from intune.pipeline.resume import ShuffleLog
    from intune.pipeline.session_resume import LoggedSessions, redo, session_replay
    from intune.recd.session_shuffle import SessionShuffleBuffer

    chunks = session_chunks(n=1500, seed=3)

    def run(stop_at=None):
        log = ShuffleLog(sessions=True)
        rng = np.random.default_rng([7, 0])
        buf = LoggedSessions(SessionShuffleBuffer(rng, 400, key="session_id"), log, rng)
        out = []
        for i, chunk in enumerate(chunks):  # in the stage's order: a resize, the chunk's record, its add
            if kind == "shrink" and i == 8:
                log.event(1, 100, 64)  # the stage logs each step (RESIZE) before taking it
                out += buf.resize(100, max_out=64)
            log.add((i, 0), len(chunk["id"]), len(chunk["id"]), "shuffle")
            out += buf.add({**chunk, "__row_ids__": chunk["id"]})
        log.event(2, 97)  # DRAIN
        out += buf.drain(97)
        return np.concatenate([c["id"] for c in out]), log

    ids, log = run()
    snapshot = log.snapshot()
    kinds = {"add": 0, "shrink": 1, "drain": 2}
    releases = snapshot["releases"]
    r = int(np.flatnonzero(releases[:, 4] == kinds[kind])[-1])
    delivered = int(releases[r, 0] + releases[r, 1] // 2)  # in the middle of that release's rows
    plan = session_replay(snapshot, 0, delivered, "test")
    window = np.arange(plan.refill_ids[0], plan.refill_ids[-1] + 1)
    assert np.array_equal(plan.refill_ids, window)
    session = np.concatenate([c["session_id"] for c in chunks])
    rows = {"id": window, "session_id": session[window], "__row_ids__": window}
    rng = plan.rng
    buf = LoggedSessions(SessionShuffleBuffer(rng, plan.capacity, key="session_id"), plan.log, rng)
    first = redo(plan, buf, rows)
    following = np.concatenate([c["id"] for c in first]) if first else np.empty(0, np.int64)
    assert np.array_equal(following, ids[delivered : delivered + len(following)])
    assert delivered + len(following) == releases[r, 0] + releases[r, 1]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_without_a_shuffle_the_input_resumes_in_order(parquet_dir, tmp_path, mode):
    """No shuffle: the batch stage keeps the input log; a resume skips the delivered rows (the chunk that
    holds the next row is sent again from that row on) and the batches are the uninterrupted ones."""

    def build():
        return (
            intune.Pipeline.from_parquet(str(parquet_dir / "*.parquet"), chunk_rows=256)
            .map(plus_one, name="before", mode=mode)
            .batch(BATCH)
            .map(plus_two, name="after")
        )

    reference = ids_of(build())
    assert_same_order(np.concatenate(reference), np.arange(ROWS))
    for k in (1, 33, 60):  # the second batch ends inside a 256-row chunk; batch 33 too; then the end
        before, after = checkpoint_at(build, k, tmp_path / "ck")
        again = resumed(build, tmp_path / "ck")
        assert_same_batches(before + again, reference)
    # and resumed again from a resumed run (the first resume at row 500, inside a chunk)
    first, _ = checkpoint_at(build, 5, tmp_path / "a")
    second = build()
    second.load_state_dict(load_checkpoint(tmp_path / "a"))
    it = iter(second)
    middle = [np.asarray(next(it)["id"]).copy() for _ in range(5)]
    save_checkpoint(tmp_path / "b", second.state_dict(), kind="pipeline")
    second.close()
    assert_same_batches(first + middle + resumed(build, tmp_path / "b"), reference)


def test_a_deep_state_carries_an_anchor_and_replays_from_it(parquet_dir, tmp_path, replay_origin):
    before, after = checkpoint_at(lambda: parquet_pipeline(parquet_dir), 40, tmp_path / "ck")
    state = load_checkpoint(tmp_path / "ck")
    anchor = state["shuffle"].get("anchor")
    if replay_origin == "from the start":
        assert anchor is None  # 40 batches are far below ANCHOR_MIN_CHUNKS
        return
    assert anchor is not None and 0 < anchor["emitted"] <= state["rows"]
    assert anchor["ids"].dtype == np.uint32 and len(anchor["ids"]) == 900
    # the log before the anchor is not needed: the state keeps only the chunks from the one holding the
    # anchor's oldest row, and the steps after the anchor
    assert state["shuffle"]["first_event"] > 0  # the buffer's creation, before the anchor, is left out
    pipe = parquet_pipeline(parquet_dir)
    pipe.load_state_dict(state)
    again = ids_of(pipe)
    pipe.close()
    assert_same_batches(again, after)


def test_a_state_with_an_anchor_leaves_out_the_chunks_before_it(tmp_path, replay_origin):
    """A small buffer far into the epoch: no row of the early chunks is buffered any more, so the state
    keeps only the chunks from the one holding the anchor's oldest row; resumed twice, it still gives the
    uninterrupted batches."""
    if replay_origin == "from the start":
        return
    chunks = [{"id": np.arange(i, i + 50)} for i in range(0, 6000, 50)]

    def build():
        return intune.Pipeline.from_iterable(chunks).shuffle(buffer_rows=100, seed=8).batch(100)

    reference = ids_of(build())
    before, _ = checkpoint_at(build, 40, tmp_path / "a")
    state = load_checkpoint(tmp_path / "a")
    assert state["shuffle"]["first_chunk"] > 40 and len(state["shuffle"]["rows"]) < 40
    for k in (0, 7):  # at once (the resumed run has no anchor of its own yet: it keeps the one it started from)
        second = build()
        second.load_state_dict(state)
        it = iter(second)
        middle = [np.asarray(next(it)["id"]).copy() for _ in range(k)]
        save_checkpoint(tmp_path / "b", second.state_dict(), kind="pipeline")
        second.close()
        assert_same_batches(before + middle + resumed(build, tmp_path / "b"), reference)
