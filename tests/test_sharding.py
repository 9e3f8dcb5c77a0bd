"""Data-parallel sharding: each rank's rows, equal counts (pad / drop), argument errors, machine share,
and two real ranks under torch.distributed (gloo) whose union is every row."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once
from intune.pipeline.sharding import Shard, range_slices

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 160  # 103 + 57 rows in row groups of 20 (a short one of 3) and 50 (a short one of 7)


@pytest.fixture(scope="module")
def parquet_glob(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    pq.write_table(pa.table({"id": np.arange(0, 103)}), d / "a.parquet", row_group_size=20)
    pq.write_table(pa.table({"id": np.arange(103, ROWS)}), d / "b.parquet", row_group_size=50)
    return str(d / "*.parquet")


def rank_ids(make, world_size: int) -> list[np.ndarray]:
    """The ids each rank delivers in one epoch, ranks read one after another in this process."""
    out = []
    for rank in range(world_size):
        with make(rank) as pipe:
            parts = [b["id"] for b in pipe]
        out.append(np.concatenate(parts) if parts else np.empty(0, np.int64))
    return out


def check_union(per_rank: list[np.ndarray], total: int, uneven: str) -> None:
    """Equal counts on every rank; with pad every row at least once and only the first rows repeated,
    with drop no row repeated and fewer than world_size left out."""
    w = len(per_rank)
    counts = {len(ids) for ids in per_rank}
    assert len(counts) == 1, f"ranks deliver different row counts: {[len(i) for i in per_rank]}"
    got = np.concatenate(per_rank)
    if uneven == "pad":
        assert counts == {-(-total // w)}
        extra = len(got) - total
        assert_exactly_once(got, np.concatenate([np.arange(total), np.arange(extra) % total]))
    else:
        assert counts == {total // w}
        assert len(np.unique(got)) == len(got) == total // w * w  # nothing twice
        assert set(got.tolist()) <= set(range(total))


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_parquet_ranks_split_the_rows_exactly_once_with_equal_counts(parquet_glob, world_size, uneven):
    per_rank = rank_ids(
        lambda r: intune.Pipeline.from_parquet(
            parquet_glob, chunk_rows=16, rank=r, world_size=world_size, uneven=uneven
        ),
        world_size,
    )
    check_union(per_rank, ROWS, uneven)


def test_each_rank_reads_only_the_row_groups_of_its_range():
    rows = [20, 20, 20, 20, 20, 3, 50, 7]  # the fixture's row groups: 160 rows, 3 ranks get 54, 53, 53
    # (row group, first row, end row): a contiguous range each, a boundary group shared, then the pad row
    assert range_slices(rows, Shard(0, 3)) == [(0, 0, 20), (1, 0, 20), (2, 0, 14)]
    assert range_slices(rows, Shard(1, 3)) == [
        (2, 14, 20),
        (3, 0, 20),
        (4, 0, 20),
        (5, 0, 3),
        (6, 0, 4),
        (0, 0, 1),
    ]
    assert range_slices(rows, Shard(2, 3)) == [(6, 4, 50), (7, 0, 7), (0, 1, 2)]
    assert range_slices(rows, Shard(0, 3, "drop")) == [(0, 0, 20), (1, 0, 20), (2, 0, 13)]


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize("world_size", [2, 3, 40])
def test_iterable_ranks_split_the_rows_exactly_once_with_equal_counts(world_size, uneven):
    sizes = [5, 1, 13, 0, 7, 3]  # uneven chunks, an empty one; 29 rows (fewer than 40 ranks)
    starts = np.cumsum([0, *sizes])
    chunks = [{"id": np.arange(s, s + n)} for s, n in zip(starts[:-1], sizes, strict=True)]
    per_rank = rank_ids(
        lambda r: intune.Pipeline.from_iterable(chunks, rank=r, world_size=world_size, uneven=uneven),
        world_size,
    )
    check_union(per_rank, int(starts[-1]), uneven)


def criteo_line(i: int) -> str:
    return "\t".join(["1", *(str(k) for k in range(13)), f"{i:08x}", *(f"{k:08x}" for k in range(25))]) + "\n"


def test_criteo_ranks_count_lines_and_make_up_skipped_ones(tmp_path):
    lines = [criteo_line(i) for i in range(300)]
    lines[123] = "garbage\n"  # skipped: its block repeats a row of its own so the rank keeps its count
    (tmp_path / "a.tsv").write_text("".join(lines[:170]) + "\n")  # an empty line holds no row
    (tmp_path / "b.tsv").write_text("".join(lines[170:]))
    glob = str(tmp_path / "*.tsv")
    for uneven in ("pad", "drop"):
        per_rank = []
        for rank in range(3):
            pipe = intune.Pipeline.from_criteo_tsv(
                glob, block_bytes=4096, on_error="skip", rank=rank, world_size=3, uneven=uneven
            )
            with pipe:
                per_rank.append(np.concatenate([c["C1"] for c in pipe]))
        counts = [len(ids) for ids in per_rank]
        assert counts == [counts[0]] * 3 and counts[0] == 100, counts
        got = np.concatenate(per_rank)
        assert set(got.tolist()) == set(range(300)) - {123}  # every good line, the garbage one nowhere


def test_rank_and_world_size_default_to_torchrun_variables(parquet_glob, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with intune.Pipeline.from_parquet(parquet_glob) as pipe:
        assert pipe.shard == Shard(1, 2, "pad", 2)
        assert np.concatenate([b["id"] for b in pipe]).tolist() == list(range(80, 160))


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        (
            {"WORLD_SIZE": "2", "RANK": "2"},
            {},
            r"rank = 2 \(from \$RANK\) is out of range for world_size = 2 \(from \$WORLD_SIZE\)",
        ),
        ({"WORLD_SIZE": "two"}, {}, r"environment variable WORLD_SIZE='two' is not an integer.*world_size="),
        ({"WORLD_SIZE": "2", "RANK": "x1"}, {}, r"RANK='x1' is not an integer.*pass rank="),
        ({"RANK": "1"}, {}, r"rank = 1 \(from \$RANK\) is out of range for world_size = 1"),
        (
            {},
            {"rank": 3, "world_size": 3},
            r"from_parquet: rank = 3 is out of range for world_size = 3: valid ranks are 0..2",
        ),
        ({}, {"rank": -1, "world_size": 2}, r"rank = -1 is out of range, it must be >= 0"),
        ({}, {"rank": 0, "world_size": 0}, r"world_size = 0 is out of range, it must be >= 1"),
        ({}, {"rank": 0, "world_size": 2.0}, r"world_size must be an integer >= 1, got 2.0"),
        ({}, {"rank": 0, "world_size": 2, "uneven": "repeat"}, r"uneven must be one of \['pad', 'drop'\]"),
        ({"LOCAL_WORLD_SIZE": "0"}, {}, r"local_world_size = 0 \(from \$LOCAL_WORLD_SIZE\) is out of range"),
    ],
)
def test_bad_rank_arguments_name_the_argument_and_the_variable(
    parquet_glob, monkeypatch, env, kwargs, message
):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=message):
        intune.Pipeline.from_parquet(parquet_glob, **kwargs)


def test_other_sources_check_rank_arguments_too(tmp_path):
    with pytest.raises(ValueError, match=r"from_iterable: rank = 2 is out of range for world_size = 2"):
        intune.Pipeline.from_iterable([{"id": np.arange(3)}], rank=2, world_size=2)
    (tmp_path / "a.tsv").write_text(criteo_line(0))
    with pytest.raises(ValueError, match=r"from_criteo_tsv: world_size = 0 is out of range"):
        intune.Pipeline.from_criteo_tsv(str(tmp_path / "a.tsv"), rank=0, world_size=0)


def test_each_rank_tunes_for_its_share_of_the_machine(parquet_glob):
    from intune.monitor import Monitor

    whole = Monitor().sample()
    with intune.Pipeline.from_parquet(parquet_glob, rank=0, world_size=4, local_world_size=2) as pipe:
        tuner = intune.tune(pipe, policy="none")
        share = tuner.monitor.sample()
    assert share.cpus == pytest.approx(max(1.0, whole.cpus / 2))
    assert share.memory_free_bytes == pytest.approx(whole.memory_free_bytes / 2, rel=0.2)
    with intune.Pipeline.from_parquet(parquet_glob, rank=0, world_size=1) as pipe:
        assert pipe.shard is None and intune.tune(pipe, policy="none").monitor.sample().cpus == whole.cpus


def test_without_local_world_size_every_rank_is_taken_to_share_this_machine(parquet_glob, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with intune.Pipeline.from_parquet(parquet_glob, rank=1, world_size=2) as pipe:
        assert pipe.shard.machine_share == 0.5  # as under torch.multiprocessing.spawn
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one rank per machine (torchrun on several nodes)
    with intune.Pipeline.from_parquet(parquet_glob, rank=1, world_size=2) as pipe:
        assert pipe.shard.machine_share == 1.0


RANK_SCRIPT = textwrap.dedent(
    """
    import datetime, json, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    import intune

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # env:// as torchrun sets it
    rank = dist.get_rank()
    pipe = (
        intune.Pipeline.from_parquet(sys.argv[1], chunk_rows=16)  # rank / world_size from the environment
        .shuffle(buffer_rows=64, seed=rank)
        .batch(16)
    )
    ids, batches = [], 0
    with pipe:
        for batch in pipe:
            ids.extend(batch["id"].tolist())
            step = torch.ones(1)
            dist.all_reduce(step)  # as DDP syncs gradients every step: unequal batch counts would hang
            batches += 1
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {"rank": rank, "ids": ids, "batches": batches, "shard": repr(pipe.shard)})
    if rank == 0:
        print("RESULT " + json.dumps(everyone))
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torch_distributed_ranks_deliver_every_row_once(parquet_glob, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), parquet_glob],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    line = next(x for x in outs[0][0].splitlines() if x.startswith("RESULT "))
    ranks = json.loads(line[len("RESULT ") :])
    assert [r["shard"] for r in ranks] == [
        "Shard(rank=0, world_size=2, uneven='pad', local_world_size=2)",
        "Shard(rank=1, world_size=2, uneven='pad', local_world_size=2)",
    ]
    assert ranks[0]["batches"] == ranks[1]["batches"] == 5
    assert not set(ranks[0]["ids"]) & set(ranks[1]["ids"])
    assert_exactly_once(np.array(ranks[0]["ids"] + ranks[1]["ids"]), range(ROWS))
