"""intune.DataLoader under data-parallel training: ranks split a map-style dataset as DistributedSampler
does (padding, drop_last, a new shuffle each epoch), every row is delivered across the ranks, and every
rank yields the same number of batches; rank and world size come from torchrun's variables."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DistributedSampler

import intune
from _datasets import IdRows
from intune.dataloader import loader as loader_module

pytestmark = pytest.mark.timeout(180)


def expected_indices(n: int, world: int, rank: int, epoch: int, drop_last: bool) -> list[int]:
    sampler = DistributedSampler(
        IdRows(n), num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=drop_last
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def rank_main(rank: int, world: int, init_file: str, out_dir: str, rows: int) -> None:
    """One trainer process: a gloo group, a loader that reads RANK / WORLD_SIZE, two epochs gathered."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        with intune.DataLoader(IdRows(rows), batch_size=8, shuffle=True, num_workers=1) as loader:
            epochs = [[batch.tolist() for batch in loader] for _ in range(2)]
            assert loader.rank == rank and loader.world_size == world and len(loader) == len(epochs[0])
        gathered: list = [None] * world
        dist.all_gather_object(gathered, epochs)
        if rank == 0:
            Path(out_dir, "epochs.json").write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_split_the_rows_as_distributed_sampler() -> None:
    rows, world = 101, 2
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(world, os.path.join(tmp, "init"), tmp, rows), nprocs=world, join=True)
        gathered = json.loads(Path(tmp, "epochs.json").read_text())
    for epoch in range(2):
        per_rank = [gathered[r][epoch] for r in range(world)]
        assert len({len(batches) for batches in per_rank}) == 1, "ranks yielded different numbers of batches"
        for r, batches in enumerate(per_rank):
            flat = [i for batch in batches for i in batch]
            assert flat == expected_indices(rows, world, r, epoch, drop_last=False), f"rank {r} epoch {epoch}"
        union = Counter(i for batches in per_rank for batch in batches for i in batch)
        assert set(union) == set(range(rows)), "a row was never delivered"
        assert sum(union.values()) == rows + 1 and max(union.values()) == 2, "padding is one repeated row"
    assert gathered[0][0] != gathered[0][1], "the second epoch was not reshuffled"


def test_drop_last_ranks_deliver_each_row_at_most_once_with_equal_batches() -> None:
    rows, world = 103, 3
    seen: Counter = Counter()
    counts = set()
    for rank in range(world):
        with intune.DataLoader(
            IdRows(rows),
            batch_size=5,
            shuffle=True,
            drop_last=True,
            num_workers=1,
            tune=None,
            rank=rank,
            world_size=world,
        ) as loader:
            batches = [b.tolist() for b in loader]
        counts.add(len(batches))
        assert all(len(b) == 5 for b in batches)
        flat = [i for b in batches for i in b]
        assert flat == expected_indices(rows, world, rank, 0, drop_last=True)[: len(flat)]
        seen.update(flat)
    assert len(counts) == 1 and max(seen.values()) == 1


def test_rank_and_world_come_from_torchrun_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with intune.DataLoader(IdRows(40), batch_size=5, tune=None) as loader:
        assert (loader.rank, loader.world_size, loader.machine_share) == (1, 4, 0.5)
        assert len(loader) == 2  # 10 rows of 40
    with intune.DataLoader(IdRows(40), batch_size=5, tune=None, rank=0, world_size=1) as loader:
        assert (loader.rank, loader.world_size, loader.machine_share) == (0, 1, 1.0)
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(ValueError, match="intune.DataLoader: the environment variable WORLD_SIZE='x'"):
        intune.DataLoader(IdRows(40))


def test_each_rank_tunes_its_share_of_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks on this machine: each one starts with, and its tuner sees, half the CPUs."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda *a, **k: 8.0)
    monkeypatch.setattr("intune.monitor.machine.available_cpus", lambda *a, **k: 8.0)
    with intune.DataLoader(
        IdRows(10), batch_size=5, rank=0, world_size=2, tune="none", max_workers=16
    ) as loader:
        assert loader.num_workers == 4  # "auto" starts at this rank's share
        assert loader.tuner.monitor.sample().cpus == 4.0
    with intune.DataLoader(IdRows(10), batch_size=5, tune="none") as loader:
        assert loader.tuner.monitor.sample().cpus == 8.0  # one rank: the whole machine
