"""What a loader worker runs: ``dataset[i]`` for each index of a batch, ``collate_fn``, the result as columns.

Owns the worker side of ``intune.DataLoader``: the ``Fetcher`` (dataset, collate function, whether to
batch), a worker's start as torch's (``WorkerFetcher``: one torch thread; ``random``, torch and numpy
seeded from the loader's base seed plus the worker's id, as torch seeds them, once; torch's
``get_worker_info()``; a datapipe's sharding and shared seed; then ``worker_init_fn``, whose own
seeding stands), and failures as data: an exception in ``__getitem__`` or ``collate_fn`` becomes a
failure record that travels in the batch's place, so that it reaches the training loop in order,
with the dataset index and the worker's traceback, and the loop may go on with the next batch as
torch's DataLoader allows. A stateful dataset's copy in a worker has its state taken and restored per
worker (``worker_state``: the epoch's opening, a snapshot with its batches). It must not know about
pipelines, stages or samplers.
"""

from __future__ import annotations

import os
import pickle
import random
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from intune.dataloader import dataset_state, transport
from intune.dataloader.errors import init_failure_words
from intune.dataloader.worker_state import OPENED, WORKER_STATE, Opening, WorkerSnapshots
from intune.dataloader.worker_state import encode as encode_snapshot

INDEX = "index"
"""The input column: the batch's dataset indices (int64, or an object array of other keys)."""
FAILURE = "__failure__"
"""The output column of a failed batch: a pickled failure record (see ``failure_record``)."""
OBJECT = "__object__"
"""The output key of a batch made in the loader's own process (no transport needed)."""
NUMBER = "__batch__"
"""The output key the fetch stage adds: the batch's number in the sampler's order (int64, one value),
so the loader knows which batches were delivered (``in_order=False`` lets them overtake)."""
DATASET_STATE = "__dataset_state__"
"""The key of the dataset's own state (a ``dataset_state.Snapshot``) taken right after the batch it
travels with: an iterable dataset's (``stream``), or a map-style dataset's fetched in the loader's own
process (``Fetcher(snapshot=True)``)."""


class Fetcher:
    """Fetches and collates one batch; in a worker process (``encode``) or in the loader's own."""

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        auto_collation: bool,
        dataset_name: str,
        encode: bool = True,
        snapshot: bool = False,
        snapshot_every: int | None = 1,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.auto_collation = auto_collation
        self.dataset_name = dataset_name
        self.encode = encode
        # in the loader's process only: the dataset's state_dict() after each batch, for a resume
        self.snapshot = snapshot and not encode and dataset_state.is_stateful(dataset)
        # in a worker: its copy's state_dict(), per worker, as torchdata takes it (``worker_state``)
        self.progress = WorkerSnapshots(snapshot_every) if snapshot and encode and dataset_state.is_stateful(dataset) else None
        self.worker_id: int | None = None

    def __call__(self, chunk: Mapping[str, np.ndarray]) -> dict[str, Any]:
        opening = Opening.read(chunk)
        if opening is not None:
            return self._open(opening)
        out = self._fetch(chunk)
        if self.snapshot:  # the batches are fetched in order by one thread: the state after this one
            out[DATASET_STATE] = dataset_state.take(self.dataset, None, int(chunk[NUMBER][0]) + 1)
        elif self.progress is not None:
            self.progress.after_batch(self.dataset, None)
            self.progress.attach(out, self.worker_id)
        return out

    def _open(self, opening: Opening) -> dict[str, Any]:
        """The epoch's opening in a worker: on a resume, its copy's state loaded and its batches delivered
        after that state fetched again, unsent (so the copy's state moves as it did); the answer holds
        the copy's state then."""
        answer: dict[str, Any] = {OPENED: np.ones(1, dtype=np.bool_)}
        if self.progress is None:
            return answer
        if opening.previous is not None:  # where this persistent worker stood at the last epoch's end
            self._restore(opening.previous)
        self._restore(opening)
        self.progress.open(opening.generation, True, opening.delivered)
        answer[WORKER_STATE] = encode_snapshot(self.progress.take(self.dataset, None))
        return answer

    def _restore(self, opening: Opening) -> None:
        """The copy's state loaded, then its batches delivered after that state fetched again, unsent."""
        dataset_state.load_dataset(self.dataset, opening.restored())
        for keys in opening.refetch:
            try:
                self._samples(list(keys))
            except _Failed:
                pass  # this batch's failure was delivered already

    def _fetch(self, chunk: Mapping[str, np.ndarray]) -> dict[str, Any]:
        keys = chunk[INDEX].tolist()
        try:
            samples = self._samples(keys)
        except _Failed as failed:
            return self._failure(failed.cause, failed.where)
        try:
            batch = self.collate_fn(samples)
        except Exception as exc:  # noqa: BLE001 - delivered in the batch's place
            return self._failure(exc, f"collate_fn on dataset indices {_preview(keys)}")
        if not self.encode:
            return {OBJECT: batch}
        try:
            return transport.encode(batch)
        except Exception as exc:  # noqa: BLE001
            return self._failure(exc, f"sending the batch of dataset indices {_preview(keys)}")

    def _samples(self, keys: list[Any]) -> Any:
        """The samples (a list when batching, else the one sample); ``_Failed`` names the index."""
        dataset = self.dataset
        if not self.auto_collation:
            return _get(dataset, keys[0])
        getitems = getattr(dataset, "__getitems__", None)
        if getitems:
            try:
                return getitems(keys)
            except Exception as exc:  # noqa: BLE001
                raise _Failed(exc, f"__getitems__ on dataset indices {_preview(keys)}") from None
        return [_get(dataset, key) for key in keys]

    def _failure(self, exc: BaseException, where: str) -> dict[str, Any]:
        record = failure_record(exc, where, self.dataset_name, self.worker_id)
        if not self.encode:
            return {FAILURE: record}
        return {FAILURE: np.frombuffer(pickle.dumps(record), dtype=np.uint8)}


class _Failed(Exception):
    def __init__(self, cause: BaseException, where: str) -> None:
        self.cause = cause
        self.where = where


def _get(dataset: Any, key: Any) -> Any:
    try:
        return dataset[key]
    except Exception as exc:  # noqa: BLE001
        raise _Failed(exc, f"dataset index {key!r}") from None


def _preview(keys: Sequence[Any], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)})"


def failure_record(
    exc: BaseException, where: str, dataset_name: str, worker_id: int | None
) -> dict[str, Any]:
    """What the loader needs to raise ``exc`` again: its class (when it can travel), words, traceback."""
    try:
        import cloudpickle

        kind: bytes | None = cloudpickle.dumps(type(exc))
    except Exception:  # noqa: BLE001 - the loader falls back to a RuntimeError
        kind = None
    return {
        "class": kind,
        "class_name": type(exc).__qualname__,
        "message": str(exc),
        "where": where,
        "dataset": dataset_name,
        "worker": worker_id,
        "pid": os.getpid(),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed ``random``, torch and numpy's global generator as torch seeds a worker's: ``base_seed +
    worker_id`` (numpy from both, by torch's own rule where this torch has it); returns that seed."""
    import torch

    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_numpy_state(base_seed, worker_id))
    return seed


def _numpy_state(base_seed: int, worker_id: int) -> Any:
    try:
        from torch.utils.data._utils.worker import _generate_state
    except ImportError:  # another torch: a seed of both numbers, another value than torch's
        return np.random.SeedSequence([worker_id, base_seed]).generate_state(4)
    return _generate_state(base_seed, worker_id)


INHERITED: dict[int, tuple[Fetcher, Callable[[int], None] | None]] = {}
"""The fetcher and ``worker_init_fn`` a worker finds under its loader's key: in the memory a forked
worker inherited (the loader adds and removes them), or put there by a spawned worker's entry."""


class WorkerFetcher:
    """The function one worker process loads: the loader's ``Fetcher`` plus this worker's start.

    Unpickling it in the worker finds the fetcher under ``key`` in ``INHERITED`` and starts the worker as
    torch does (``_start``); a failure there fails the epoch at once with the worker's traceback (every
    batch would fail alike)."""

    def __init__(
        self, worker_id: int, seed: int, workers: int, key: int, forked: bool, sharding: tuple[int, int] = (1, 0)
    ) -> None:
        self.worker_id = worker_id
        self.seed = seed
        self.workers = workers
        self.key = key
        self.forked = forked  # forked from the loader: it holds every class this worker inherited
        self.sharding = sharding  # (world size, rank): a datapipe is sharded over ranks and workers
        self._fetcher: Fetcher | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_fetcher"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        fetcher, init = INHERITED[self.key]
        fetcher.worker_id = self.worker_id
        self._fetcher = fetcher
        self._start(fetcher, init)

    def _start(self, fetcher: Fetcher, init: Callable[[int], None] | None) -> None:
        """What torch's workers do first: one torch thread, seeded generators, worker info, the init."""
        import torch

        torch.set_num_threads(1)  # the processes are the parallelism
        if self.forked:
            transport.FORKED_FROM = os.getppid()
        seed = seed_worker(self.seed, self.worker_id)
        _set_torch_worker_info(self.worker_id, self.workers, seed, fetcher.dataset)
        if is_datapipe(fetcher.dataset):
            world, rank = self.sharding
            shard_datapipe(fetcher.dataset, self.workers * world, self.worker_id * world + rank)
        if init is not None:
            try:
                init(self.worker_id)
            except Exception as exc:
                raise RuntimeError(init_failure_words(self.worker_id, exc)) from exc

    def __call__(self, chunk: Mapping[str, np.ndarray]) -> dict[str, Any]:
        assert self._fetcher is not None
        return self._fetcher(chunk)


def is_datapipe(dataset: Any) -> bool:
    try:
        from torch.utils.data import IterDataPipe, MapDataPipe
    except ImportError:
        return False
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def shard_datapipe(dataset: Any, shards: int, index: int) -> None:
    """A datapipe's ``sharding_filter`` keeps shard ``index`` of ``shards``, as torch's workers set it."""
    from torch.utils.data import graph_settings

    graph_settings.apply_sharding(dataset, shards, index)


def seed_datapipe(dataset: Any, shared_seed: int) -> Any:
    """Seed a datapipe's shuffles from the epoch's shared seed (the same in every worker, as torch's)."""
    import torch
    from torch.utils.data import graph_settings

    return graph_settings.apply_random_seed(dataset, torch.Generator().manual_seed(shared_seed))


def _set_torch_worker_info(worker_id: int, workers: int, seed: int, dataset: Any) -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer in this worker, as in torch's own workers."""
    try:
        from torch.utils.data._utils import worker as torch_worker

        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=worker_id, num_workers=workers, seed=seed, dataset=dataset
        )
    except (ImportError, AttributeError, TypeError):  # another torch layout: get_worker_info() stays None
        pass
