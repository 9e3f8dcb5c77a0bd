"""The loader's fetch stage: the engine's map stage, with a worker id per process and no chunk schema.

Owns what ``intune.DataLoader`` changes in ``MapStage``: how a process worker starts (forked from this
process, as torch's default ``fork`` start does, or a fresh interpreter that gets the fetcher pickled
once), each worker's ``WorkerFetcher`` with its own id (for ``worker_init_fn`` and
``get_worker_info()``), and delivering a worker's output as it is (a collated batch's arrays and
spec, or a failure record): batches may hold any structure and a failed batch travels in its place,
while the chunk schema and equal-length checks of ``MapStage`` are for columnar chunks. Naming what cannot be pickled (dataset, ``collate_fn``, ``worker_init_fn``) is here too,
where the pickling is. It must not know about samplers or the training loop's side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from intune.dataloader.errors import DatasetPickleError, init_failure
from intune.dataloader.fetch import INHERITED, NUMBER, Fetcher, WorkerFetcher
from intune.dataloader.transport import nbytes
from intune.pipeline.channel import Item
from intune.pipeline.forked import fork_child
from intune.pipeline.procworker import ProcessWorker, WorkerDied, WorkerInitError
from intune.pipeline.stages import MapStage


class FetchStage(MapStage):
    """``dataset[i]`` and ``collate_fn`` for each batch, in resizable process workers (or one thread).

    ``start`` says how a process worker starts: ``"fork"`` (a fork of this process that finds the
    fetcher in the memory it inherits: nothing is pickled, nothing imported again) or ``"spawn"`` (a
    fresh interpreter that loads the fetcher pickled once here)."""

    def __init__(
        self,
        fetcher: Fetcher,
        name: str,
        mode: str,
        start: str,
        max_workers: int,
        workers: int,
        timeout_s: float | None,
        worker_init_fn: Callable[[int], None] | None,
        seed: Callable[[], int],
    ) -> None:
        spawn = mode == "process" and start == "spawn"
        if spawn:
            _check_picklable(fetcher, worker_init_fn)
        # MapStage pickles the function for process mode: only a spawned worker needs that pickle
        super().__init__(fetcher, name, mode if spawn else "thread", "raise", max_workers, workers, timeout_s)
        self.mode = mode
        self.start_method = start
        self.worker_init_fn = worker_init_fn
        self._seed = seed
        self._key: int | None = None
        if mode == "process" and not spawn:
            self._key = id(self)
            INHERITED[self._key] = (fetcher, worker_init_fn)

    def new_process_worker(self, index: int, label: str) -> ProcessWorker:
        import cloudpickle

        workers = self.workers()
        if self._key is not None:
            worker = WorkerFetcher(index, self._seed(), workers, key=self._key)
            return ProcessWorker(cloudpickle.dumps(worker), f"{label}-w{index}", launch=fork_child)
        worker = WorkerFetcher(index, self._seed(), workers, self._blob, self.worker_init_fn)
        return ProcessWorker(cloudpickle.dumps(worker), f"{label}-w{index}")

    def start(self, epoch: Any, inp: Any) -> Any:
        """As ``MapStage.start``, after the process workers the epoch starts with have started (persistent
        ones already have): a ``worker_init_fn`` that raises fails ``iter(loader)``, with its own class,
        before any batch is sent, as torchdata's ``StatefulDataLoader`` does."""
        if self.mode == "process":
            label = f"{epoch.label}-{self.name}"  # the label MapStage.start gives the pool's workers
            workers = [self.process_worker(index, label) for index in range(self.workers())]
            for worker in workers:
                worker.ensure_started()  # all at once: a spawned interpreter takes a second
            for worker in workers:
                try:
                    worker.wait_ready()
                except WorkerDied:
                    pass  # the pool restarts it, as any worker that dies, and gives up after three deaths
                except WorkerInitError as exc:
                    error = init_failure(str(exc), exc.remote_traceback, self.fn.dataset_name)
                    if error is None:
                        raise
                    raise error from exc
        return super().start(epoch, inp)

    def _result(self, out: Any, item: Item) -> list[Item]:
        # the batch's number rides along (the sampler's source numbered it), for the loader's resume state
        number = np.array([item.origin.segments[0].unit], dtype=np.int64)
        return [Item({**out, NUMBER: number}, item.origin, item.rows, nbytes(out))]

    def close(self) -> None:
        super().close()
        if self._key is not None:
            INHERITED.pop(self._key, None)


def _check_picklable(fetcher: Fetcher, worker_init_fn: Callable[[int], None] | None) -> None:
    """Raise ``DatasetPickleError`` naming the first part that cloudpickle cannot send to a worker."""
    import cloudpickle

    parts = [
        (f"the dataset {fetcher.dataset_name}", fetcher.dataset),
        (f"collate_fn {fetcher.collate_fn!r}", fetcher.collate_fn),
        (f"worker_init_fn {worker_init_fn!r}", worker_init_fn),
    ]
    for what, part in parts:
        try:
            cloudpickle.dumps(part)
        except Exception as exc:
            raise DatasetPickleError(
                f"intune.DataLoader: {what} cannot be pickled for the worker processes "
                f"({type(exc).__name__}: {exc}). Workers are separate processes that receive it pickled; "
                "make it picklable (open files and connections lazily, in __getitem__ or worker_init_fn), "
                "or pass num_workers=0 to load in this process"
            ) from exc
