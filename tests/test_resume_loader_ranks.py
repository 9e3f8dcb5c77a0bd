"""intune.DataLoader resume with several ranks: each rank process (rank and world size from torchrun's
variables) saves its own checkpoint mid-epoch; fresh rank processes resume from their own files and
deliver, together, exactly the rows each rank had left, in DistributedSampler's order; a rank's file
loaded by another rank is refused."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from torch.utils.data import DistributedSampler

import intune
from _datasets import IdRows
from intune.checkpoint import load_checkpoint, save_checkpoint
from intune.dataloader import ResumeMismatchError

pytestmark = pytest.mark.timeout(180)

ROWS, WORLD, BATCH = 90, 2, 6


def _loader() -> intune.DataLoader:
    return intune.DataLoader(IdRows(ROWS), batch_size=BATCH, shuffle=True, num_workers=1, tune=None)


def first_run(rank: int, out: str) -> None:
    """Two batches more on rank 1 than on rank 0, then a checkpoint per rank (the job is preempted)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD))
    with _loader() as loader:
        it = iter(loader)
        seen = [next(it).tolist() for _ in range(3 + 2 * rank)]
        save_checkpoint(Path(out, f"rank{rank}.ckpt"), loader.state_dict(), kind="dataloader")
    Path(out, f"before{rank}.json").write_text(json.dumps(seen))


def resumed_run(rank: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD))
    with _loader() as loader:
        try:
            loader.load_state_dict(load_checkpoint(Path(out, f"rank{1 - rank}.ckpt"), kind="dataloader"))
            refused = ""
        except ResumeMismatchError as exc:
            refused = str(exc)
        loader.load_state_dict(load_checkpoint(Path(out, f"rank{rank}.ckpt"), kind="dataloader"))
        rest = [batch.tolist() for batch in loader]
        following = [batch.tolist() for batch in loader]
    Path(out, f"after{rank}.json").write_text(json.dumps({"rest": rest, "next": following, "refused": refused}))


def _expected(rank: int, epoch: int) -> list[int]:
    sampler = DistributedSampler(IdRows(ROWS), num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_each_rank_process_resumes_from_its_own_checkpoint() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(first_run, args=(tmp,), nprocs=WORLD, join=True)
        mp.spawn(resumed_run, args=(tmp,), nprocs=WORLD, join=True)
        runs = {
            r: (json.loads(Path(tmp, f"before{r}.json").read_text()), json.loads(Path(tmp, f"after{r}.json").read_text()))
            for r in range(WORLD)
        }
    union = []
    for rank, (before, after) in runs.items():
        flat = [i for batch in before + after["rest"] for i in batch]
        assert flat == _expected(rank, 0), f"rank {rank}: the resumed epoch is not the uninterrupted one"
        assert [i for batch in after["next"] for i in batch] == _expected(rank, 1), f"rank {rank}: next epoch"
        assert "rank: saved" in after["refused"], f"rank {rank} loaded the other rank's state: {after['refused']!r}"
        union += flat
    assert sorted(union) == list(range(ROWS)), "every row once across the ranks"
