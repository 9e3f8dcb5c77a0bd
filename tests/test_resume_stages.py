"""Every stage's part of a pipeline's state passes the shared round trip (``_stage_round_trip``): the
read stage of each source, maps of each kind before and after the shuffle, the slot and the session
shuffle, a batch stage keeping the log or cutting the shuffle's output, prefetch and dedup; and every
stage class of intune is covered here or resumed by its owner."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import intune
from _stage_round_trip import assert_round_trip
from intune.pipeline.stages import PooledStage, Stage

ROWS = 3000


@pytest.fixture(scope="module")
def parquet_glob(tmp_path_factory):
    d = tmp_path_factory.mktemp("stages_parquet")
    for f in range(2):
        ids = np.arange(f * ROWS // 2, (f + 1) * ROWS // 2, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float32)}), d / f"p{f}.parquet", row_group_size=350)
    return str(d / "*.parquet")


def plus_one(chunk):
    return {**chunk, "y": chunk["x"] + 1}


def row_plus_one(row):
    return {"id": row["id"], "y": row["x"] + 1}


def session_chunks(n=2400, seed=0):
    rng = np.random.default_rng(seed)
    session = np.repeat(np.arange(n), rng.integers(1, 9, n))[:n]
    return [{"id": np.arange(i, min(n, i + 97)), "session_id": session[i : i + 97]} for i in range(0, n, 97)]


def criteo_file(path, n):
    lines = ["\t".join([str(i % 2), str(i)] + [""] * 12 + [f"{i:08x}"] + [""] * 25) + "\n" for i in range(n)]
    path.write_text("".join(lines))
    return path


CASES = {
    # read (Parquet) -> batch keeping the input log (no shuffle)
    "parquet read, batch keeps the log": lambda g, t: intune.Pipeline.from_parquet(g, chunk_rows=128).batch(100),
    # read (a stream) -> batch keeping the log -> prefetch
    "iterable read, batch, prefetch": lambda g, t: (
        intune.Pipeline.from_iterable([{"id": np.arange(i, min(ROWS, i + 97))} for i in range(0, ROWS, 97)])
        .batch(64)
        .prefetch(2)
    ),
    # thread map before the shuffle, slot shuffle, batch cutting its output, map after the batch
    "thread maps around a slot shuffle": lambda g, t: (
        intune.Pipeline.from_parquet(g, chunk_rows=128)
        .map(plus_one, name="before")
        .shuffle(buffer_rows=400, seed=3)
        .batch(100, drop_last=True)
        .map(plus_one, name="after")
    ),
    "process map before a slot shuffle": lambda g, t: (
        intune.Pipeline.from_parquet(g, chunk_rows=128).map(plus_one, mode="process").shuffle(buffer_rows=400, seed=4).batch(100)
    ),
    "map_rows before a slot shuffle": lambda g, t: (
        intune.Pipeline.from_parquet(g, chunk_rows=128).map_rows(row_plus_one, mode="thread").shuffle(buffer_rows=300, seed=5).batch(100)
    ),
    "criteo read, slot shuffle": lambda g, t: (
        intune.Pipeline.from_criteo_tsv(str(t / "day"), chunk_rows=128, block_bytes=8192)
        .shuffle(buffer_rows=300, seed=6)
        .batch(100)
    ),
    # RecD: the session shuffle (an adapter stage), dedup after the batch
    "session shuffle, dedup": lambda g, t: (
        intune.Pipeline.from_iterable(session_chunks()).shuffle(buffer_rows=500, seed=7, by="session_id").batch(80).dedup({"s": ["session_id"]})
    ),
}
COLUMN = {"criteo read, slot shuffle": "I1"}


@pytest.mark.parametrize("case", list(CASES))
def test_every_stage_round_trips(case, parquet_glob, tmp_path):
    criteo_file(tmp_path / "day", ROWS)  # written once: a file rewritten between runs is refused
    build = lambda: CASES[case](parquet_glob, tmp_path)  # noqa: E731
    column = COLUMN.get(case, "id")
    expected = range(2400) if "session" in case else range(ROWS)
    pipe = build()
    batches = sum(1 for _ in pipe)
    pipe.close()
    positions = [0, 1, batches // 2, batches - 1, batches]
    reference = assert_round_trip(build, positions, column=column, rows=None if column != "id" else expected)
    assert len(reference) == batches


def _subclasses(base: type) -> set[type]:
    out = set()
    for sub in base.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_every_stage_class_is_covered_by_the_round_trip_or_resumed_by_its_owner():
    import intune.dataloader.stage  # noqa: F401 - every module defining a stage
    import intune.pipeline.row_map  # noqa: F401
    import intune.pipeline.serial_stages  # noqa: F401
    import intune.recd.session_stage  # noqa: F401

    covered = {
        "ReadStage": "parquet, iterable and criteo read",
        "MapStage": "thread and process maps, dedup",
        "RowMapStage": "map_rows before a slot shuffle",
        "ShuffleStage": "thread maps around a slot shuffle",
        "SessionShuffleStage": "session shuffle, dedup",
        "BatchStage": "batch keeping the log, and cutting a shuffle's output",
        "PrefetchStage": "iterable read, batch, prefetch",
    }
    owned = {"FetchStage": "intune.DataLoader.state_dict (the loader's own state, docs/dataloader.md)"}
    classes = {c.__name__ for c in _subclasses(Stage) if c is not PooledStage and c.__module__.startswith("intune.")}
    assert classes <= covered.keys() | owned.keys(), f"stages without a round trip: {classes - covered.keys() - owned.keys()}"
