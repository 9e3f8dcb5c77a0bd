"""intune.DataLoader when things go wrong: a failing __getitem__ or collate_fn, a dataset that cannot be
pickled, a failing worker_init_fn, a hung or dying worker, bad arguments, and close()."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

import intune
from _processes import still_running
from intune.dataloader import DataLoaderWorkerError, DatasetPickleError
from intune.pipeline.errors import StageError, StageTimeoutError, WorkerLostError

pytestmark = pytest.mark.timeout(120)


class Rows(Dataset):
    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class FailsAt(Rows):
    """Raises ``error`` at index ``bad``."""

    def __init__(self, bad: int, error: Exception) -> None:
        super().__init__()
        self.bad = bad
        self.error = error

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise self.error
        return i


class CustomError(Exception):
    def __init__(self, code: int, text: str) -> None:  # not rebuildable from one message
        super().__init__(code, text)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_getitem_error_reaches_the_loop_in_order_with_index_and_traceback(start: str) -> None:
    """The batch holding index 13 raises the dataset's KeyError there, in its turn, naming the index,
    the dataset and carrying the worker's traceback; the loop may go on with the next batch, as torch's."""
    with intune.DataLoader(
        FailsAt(13, KeyError("no row 13")),
        batch_size=4,
        num_workers=2,
        tune=None,
        multiprocessing_context=start,
    ) as loader:
        it = iter(loader)
        before = [next(it) for _ in range(3)]
        with pytest.raises(KeyError) as caught:
            next(it)
        after = list(it)
    text = str(caught.value)
    assert "dataset index 13" in text and "FailsAt" in text and "no row 13" in text
    assert "__getitem__" in text and "raise self.error" in text, "the worker's traceback is missing"
    assert torch.cat(before).tolist() == list(range(12))
    assert torch.cat(after).tolist() == list(range(16, 40))


def test_an_error_class_that_cannot_be_rebuilt_comes_as_dataloader_worker_error() -> None:
    with intune.DataLoader(
        FailsAt(5, CustomError(3, "bad")), batch_size=4, num_workers=1, tune=None
    ) as loader:
        with pytest.raises(DataLoaderWorkerError, match="CustomError.*dataset index 5"):
            list(loader)


def failing_collate(samples: list) -> torch.Tensor:
    if 7 in samples:
        raise ValueError("cannot collate 7")
    return torch.tensor(samples)


def test_collate_error_names_the_batch_indices() -> None:
    with intune.DataLoader(
        Rows(), batch_size=4, collate_fn=failing_collate, num_workers=1, tune=None
    ) as loader:
        with pytest.raises(ValueError, match=r"collate_fn on dataset indices \[4, 5, 6, 7\]"):
            list(loader)


class Unpicklable(Rows):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def test_unpicklable_dataset_is_named_for_spawned_workers_and_fine_when_forked() -> None:
    """As torch's, spawned workers get the dataset pickled when they start, at iter(): it fails there
    with torch's warning and an error naming the part that cannot be pickled."""
    with intune.DataLoader(
        Unpicklable(), batch_size=4, num_workers=2, multiprocessing_context="spawn", tune=None
    ) as spawned:
        with pytest.warns(UserWarning, match="Got pickle error when attempting to start a worker Process"):
            with pytest.raises(
                DatasetPickleError, match="the dataset test_dataloader_errors.Unpicklable cannot be pickled"
            ):
                iter(spawned)
    with intune.DataLoader(
        Unpicklable(), batch_size=4, num_workers=2, tune=None
    ) as loader:  # fork inherits it
        assert torch.cat(list(loader)).tolist() == list(range(40))


def bad_init(worker_id: int) -> None:
    raise OSError(f"no device for worker {worker_id}")


def test_failing_worker_init_fn_fails_the_epoch_with_its_traceback() -> None:
    with intune.DataLoader(Rows(), batch_size=4, num_workers=1, tune=None, worker_init_fn=bad_init) as loader:
        with pytest.raises(
            StageError, match="worker_init_fn raised in intune.DataLoader worker 0: OSError: no device"
        ) as caught:
            list(loader)
    assert "bad_init" in caught.value.remote_traceback


class Hangs(Rows):
    def __getitem__(self, i: int) -> int:
        if i == 9:
            time.sleep(600)
        return i


def test_timeout_ends_a_hung_worker_instead_of_waiting_forever() -> None:
    start = time.monotonic()
    with intune.DataLoader(Hangs(), batch_size=4, num_workers=1, tune=None, timeout=1) as loader:
        with pytest.raises(StageTimeoutError, match="dataset .*Hangs indices \\[8, 9, 10, 11\\]"):
            list(loader)
    assert time.monotonic() - start < 30


class Dies(Rows):
    def __getitem__(self, i: int) -> int:
        if i == 21:
            os._exit(3)
        return i


def test_a_worker_that_keeps_dying_is_reported_with_its_batch() -> None:
    with intune.DataLoader(Dies(), batch_size=4, num_workers=2, tune=None) as loader:
        with pytest.raises(
            WorkerLostError, match=r"died 3 times on batch #5 .*indices \[20, 21, 22, 23\].*exit 3"
        ):
            list(loader)


def worker_pids(loader: intune.DataLoader, n: int, within_s: float = 10.0) -> list[int]:
    """The fetch workers' pids once ``n`` have started (each pool thread starts its own)."""
    deadline = time.monotonic() + within_s
    while True:
        pids = loader.pipeline.stage("fetch").worker_pids()
        if len(pids) >= n or time.monotonic() > deadline:
            return pids
        time.sleep(0.02)


def test_close_ends_every_worker_process() -> None:
    loader = intune.DataLoader(Rows(400), batch_size=4, num_workers=3, tune=None)
    it = iter(loader)
    next(it)
    pids = worker_pids(loader, 3)
    assert len(pids) == 3
    loader.close()
    assert still_running(pids, within_s=5.0) == []
    with pytest.raises(intune.PipelineClosedError):
        list(it)
    with pytest.raises(ValueError, match="closed"):
        iter(loader)


def test_a_loader_dropped_without_close_ends_its_workers() -> None:
    """Nothing in the pipeline holds the loader: once the training loop lets go of it (and of its
    iterator), it is collected and its workers end."""
    loader = intune.DataLoader(Rows(400), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    pids = worker_pids(loader, 2)
    assert len(pids) == 2
    del loader, it
    gc.collect()
    assert still_running(pids, within_s=5.0) == []


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(5)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(batch_size=4, shuffle=True, sampler=[0, 1]), "sampler option is mutually exclusive with shuffle"),
        (dict(batch_size=4, batch_sampler=[[0, 1]]), "batch_sampler option is mutually exclusive with batch_size"),
        (dict(batch_size=0), "batch_size must be a positive integer"),
        (dict(batch_size=None, drop_last=True), "batch_size=None"),
        (dict(num_workers=-1), "num_workers option should be non-negative"),
        (dict(num_workers=1.5), "num_workers must be"),
        (dict(timeout=-1), "timeout option should be non-negative"),
        (dict(rank=2, world_size=2), r"rank = 2 is out of range for world_size = 2"),
        (dict(multiprocessing_context="threads"), "multiprocessing_context option should specify a valid start"),
        (dict(num_workers=0, multiprocessing_context="fork"), r"multi-process loading \(num_workers > 0\)"),
        (dict(num_workers=0, persistent_workers=True), "persistent_workers option needs num_workers > 0"),
        (dict(num_workers=0, prefetch_factor=2), "prefetch_factor option could only be specified"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        intune.DataLoader(Rows(), tune=None, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(shuffle=True), dict(sampler=[0, 1])])
def test_iterable_dataset_refuses_order_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="IterableDataset"):
        intune.DataLoader(Stream(), **kwargs)
