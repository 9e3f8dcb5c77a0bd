"""An iterable dataset read by worker processes, each its own part by ``get_worker_info()``, resumes in
the middle of an epoch: every worker's place in its own iterator is in the state (its delivered batch
count, and its copy's own ``state_dict()`` as torchdata's ``StatefulDataLoader`` takes it per worker),
so the rows delivered before and after a resume are one epoch, each row once, in the uninterrupted
run's order. Before, such a state was refused (``ResumeMismatchError``)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

import intune
from intune.dataloader import ResumeMismatchError


class Sharded(IterableDataset):
    """Worker ``w`` of ``len(sizes)`` yields ``sizes[w]`` rows of its own block; each row read is logged
    to ``log`` (one line per row, appended by whichever process reads it)."""

    def __init__(self, sizes: list[int], log: str) -> None:
        self.sizes, self.log = list(sizes), log
        self.start = 0  # where the next iter() starts within this copy's block (the stateful kinds)

    def block(self) -> range:
        info = get_worker_info()
        assert info is not None and info.num_workers == len(self.sizes), "read by the loader's workers only"
        first = sum(self.sizes[: info.id])
        return range(first, first + self.sizes[info.id])

    def __iter__(self):
        rows = self.block()
        start, self.start = self.start, 0
        for offset in range(start, len(rows)):
            self.position = offset + 1
            with open(self.log, "a") as f:
                f.write(f"{rows[offset]}\n")
            yield rows[offset]


class StatefulSharded(Sharded):
    """The dataset's own state: its place in its block (taken after each batch in its worker)."""

    position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.start = int(state["position"])


class Cursor:
    """An iterator with a state of its own (the dataset keeps none)."""

    def __init__(self, dataset: IteratorSharded) -> None:
        self.rows, self.offset, self.log = dataset.block(), 0, dataset.log

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.offset >= len(self.rows):
            raise StopIteration
        self.offset += 1
        with open(self.log, "a") as f:
            f.write(f"{self.rows[self.offset - 1]}\n")
        return self.rows[self.offset - 1]

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state):
        self.offset = int(state["offset"])


class IteratorSharded(Sharded):
    def __iter__(self):
        return Cursor(self)


KINDS = [Sharded, StatefulSharded, IteratorSharded]


def _loader(dataset, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("num_workers", len(dataset.sizes))
    kw.setdefault("tune", None)
    return intune.DataLoader(dataset, **kw)


def _rows(batches) -> list[int]:
    return [int(v) for batch in batches for v in batch.tolist()]


def _take(it, n):
    return [next(it) for _ in range(n)]


def _reads(log: str) -> list[int]:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [int(line) for line in f]


# 3 workers with parts of 6, 30 and 14 rows: in batches of 4, worker 0 ends after 2 batches, worker 2
# after 4, worker 1 after 8 (14 batches in all); checkpoints before any batch, early, after worker 0's
# end, after worker 2's, and after the last batch (before the iterator says the epoch ended)
SIZES = [6, 30, 14]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cut", [0, 1, 5, 11, 14])
def test_a_sharded_iterable_resumes_mid_epoch_exactly_once_in_order(tmp_path, kind, cut):
    whole = _rows(_loader(kind(SIZES, str(tmp_path / "whole.log"))))
    assert sorted(whole) == list(range(sum(SIZES)))
    with _loader(kind(SIZES, str(tmp_path / "first.log"))) as first:
        it = iter(first)
        before = _rows(_take(it, cut))
        state = first.state_dict()
    json.dumps(state)  # as torchdata's: plain values
    log = str(tmp_path / "resumed.log")
    with _loader(kind(SIZES, log)) as resumed:
        resumed.load_state_dict(state)
        after = _rows(resumed)
        reread = _reads(log)
        nxt = _rows(resumed)
    assert before + after == whole  # one epoch, each row once, in the uninterrupted run's order
    assert sorted(nxt) == list(range(sum(SIZES)))  # the next epoch is whole
    if kind is Sharded:  # no state: each worker reads its part again from its start, and drops what was delivered
        assert sorted(reread) == list(range(sum(SIZES)))
    else:  # a state of its own: no delivered row is read again
        assert not set(reread) & set(before)
        assert sorted(reread) == sorted(after)


def test_snapshot_every_n_steps_reads_again_only_the_batches_since_each_workers_snapshot(tmp_path):
    every = 3
    whole = _rows(_loader(StatefulSharded(SIZES, str(tmp_path / "whole.log")), snapshot_every_n_steps=every))
    with _loader(StatefulSharded(SIZES, str(tmp_path / "a.log")), snapshot_every_n_steps=every) as first:
        before = _rows(_take(iter(first), 7))
        state = first.state_dict()
    # each worker's snapshot is from its last batch delivered whose count is a multiple of 3 (or its start)
    workers = state["epoch"]["workers"]
    assert [w["delivered"] for w in workers["workers"]] == [2, 3, 2] and workers["last"] == 1
    assert [w["snapshot"]["batches"] for w in workers["workers"]] == [0, 3, 0]
    log = str(tmp_path / "b.log")
    with _loader(StatefulSharded(SIZES, log), snapshot_every_n_steps=every) as resumed:
        resumed.load_state_dict(state)
        after = _rows(resumed)
    assert before + after == whole
    # read again: worker 0's 2 batches (6 rows) and worker 2's 2 (8 rows); worker 1 none
    assert sorted(_reads(log)) == sorted(after + list(range(0, 6)) + list(range(36, 44)))


class FailsAt(IterableDataset):
    """Two workers, 20 rows each; worker 1's generator raises at its 6th row (then ends, as a generator)."""

    sizes = [20, 20]

    def __iter__(self):
        info = get_worker_info()
        for i in range(20):
            if info.id == 1 and i == 5:
                raise ValueError("row 5 of worker 1")
            yield 20 * info.id + i


def test_a_failed_batch_counts_as_delivered_on_resume():
    def run(loader, n=None):
        out, it = [], iter(loader)
        while n is None or len(out) < n:
            try:
                out.append(next(it).tolist())
            except ValueError:
                out.append("failed")
            except StopIteration:
                break
        return out

    whole = run(_loader(FailsAt(), num_workers=2))
    assert "failed" in whole
    with _loader(FailsAt(), num_workers=2) as first:
        it = iter(first)
        before = []
        while "failed" not in before:
            try:
                before.append(next(it).tolist())
            except ValueError:
                before.append("failed")
        state = first.state_dict()
    with _loader(FailsAt(), num_workers=2) as resumed:
        resumed.load_state_dict(state)
        after = run(resumed)
    assert before + after == whole


@pytest.mark.parametrize("in_order", [True, False])
def test_a_resume_with_persistent_workers_and_out_of_order_delivery(tmp_path, in_order):
    kw = dict(persistent_workers=True, in_order=in_order)
    with _loader(StatefulSharded(SIZES, str(tmp_path / "a.log")), **kw) as first:
        _rows(first)  # an epoch first: the persistent workers' copies carry on into the next
        it = iter(first)
        before = _rows(_take(it, 6))
        state = first.state_dict()
        tail = _rows(it)
    with _loader(StatefulSharded(SIZES, str(tmp_path / "b.log")), **kw) as resumed:
        resumed.load_state_dict(state)
        after = _rows(resumed)
    assert sorted(before + after) == list(range(sum(SIZES)))
    assert sorted(after) == sorted(tail)
    if in_order:
        assert after == tail


def test_a_resume_in_the_same_loader_restarts_its_persistent_workers_iterators(tmp_path):
    """The same epoch number again, with workers that live on: each starts over from the state, not
    from where its iterator stood."""
    dataset = StatefulSharded(SIZES, str(tmp_path / "a.log"))
    with _loader(dataset, persistent_workers=True) as loader:
        it = iter(loader)
        before = _rows(_take(it, 3))
        state = loader.state_dict()
        _take(it, 4)  # read further, then go back
        loader.load_state_dict(state)
        after = _rows(loader)
    assert sorted(before + after) == list(range(sum(SIZES)))


def test_a_state_with_another_worker_count_is_refused(tmp_path):
    with _loader(Sharded(SIZES, str(tmp_path / "a.log"))) as first:
        _take(iter(first), 3)
        state = first.state_dict()
    other = Sharded([25, 25], str(tmp_path / "b.log"))
    with _loader(other) as second:
        second.load_state_dict(state)
        with pytest.raises(ResumeMismatchError, match="num_workers: saved 3, now 2"):
            iter(second)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_shared_seed_of_a_datapipe_is_drawn_again_on_resume(workers):
    """A shuffled datapipe: its shared seed is drawn before the workers' seed, on resume too (the replay
    drew only the workers' seed, which then differed from the saved one: every resume of a datapipe's
    epoch was refused)."""
    from torch.utils.data.datapipes.iter import IterableWrapper

    def pipe():
        return IterableWrapper(range(40)).shuffle().sharding_filter()

    kw = dict(batch_size=4, num_workers=workers, tune=None, shuffle=True, generator=torch.Generator().manual_seed(5))
    with intune.DataLoader(pipe(), **kw) as first:
        whole = _rows(first)
    kw["generator"] = torch.Generator().manual_seed(5)
    with intune.DataLoader(pipe(), **kw) as second:
        it = iter(second)
        before = _rows(_take(it, 3))
        state = second.state_dict()
    kw["generator"] = torch.Generator().manual_seed(99)  # the state's generator decides
    with intune.DataLoader(pipe(), **kw) as resumed:
        resumed.load_state_dict(state)
        after = _rows(resumed)
    assert before + after == whole
