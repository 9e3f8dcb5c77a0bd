"""The loader's fetch stage: the engine's map stage, with torch's workers.

Owns what ``intune.DataLoader`` changes in ``MapStage``. Process workers start as torch's do: at
``iter()``, on the caller's thread (a start that fails raises there), each with its own id, seed and
``WorkerInfo``, by the start method in force (``launch``: forked from this process, or that context's
own ``Process``); a ``worker_init_fn`` that raises fails ``iter()`` with its own class; without ``persistent_workers`` they end with their epoch and the next ``iter()``
starts fresh ones (a new seed, ``worker_init_fn`` again, the dataset as it is then), as torch's do.
Batches go to the workers round-robin (``dispatch``). A worker's output is delivered as it is (a
collated batch's arrays and spec, or a failure record): batches may hold any structure and a failed
batch travels in its place, while the chunk schema and equal-length checks of ``MapStage`` are for
columnar chunks. A batch past ``timeout`` raises ``DataLoaderTimeoutError``. With ``num_workers=0``
the fetcher runs in one thread of this process (``MapStage``'s thread mode). It must not know about
samplers or the training loop's side.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from intune.dataloader.dispatch import Dispatch, LoaderPoolRun, Opener
from intune.dataloader.errors import DataLoaderTimeoutError, init_failure
from intune.dataloader.fetch import INHERITED, NUMBER, Fetcher, WorkerFetcher
from intune.dataloader.launch import ContextLaunch, resolve
from intune.dataloader.shards import EXHAUSTED
from intune.dataloader.transport import nbytes
from intune.pipeline.channel import Channel, Item
from intune.pipeline.errors import WorkerLostError
from intune.pipeline.forked import fork_child
from intune.pipeline.procworker import SLOTS, ProcessWorker, WorkerDied, WorkerInitError
from intune.pipeline.stages import EpochContext, MapStage, origin_words
from intune.pipeline.stats import WorkerStats


class FetchStage(MapStage):
    """``dataset[i]`` and ``collate_fn`` for each batch (or an iterable's next batch), in resizable
    process workers fed round-robin, or in one thread of this process (``mode="thread"``).

    ``context``: torch's ``multiprocessing_context`` after its checks (None: Python's default start
    method when the workers start). ``floor``: the least workers the knob allows (an explicit
    ``num_workers`` under a tuner). ``shards``: the fetcher reads an iterable dataset, one part per
    worker; the worker count is then fixed, and a worker cannot be replaced."""

    def __init__(
        self,
        fetcher: Fetcher,
        name: str,
        mode: str,
        context: Any,
        max_workers: int,
        workers: int,
        timeout_s: float | None,
        worker_init_fn: Callable[[int], None] | None,
        seed: Callable[[], int],
        *,
        floor: int = 1,
        persistent: bool = False,
        prefetch_factor: int = 2,
        sharding: tuple[int, int] = (1, 0),
        shards: bool = False,
    ) -> None:
        # MapStage pickles the function for its own process mode: this stage starts its workers itself
        super().__init__(fetcher, name, "thread", "raise", max_workers, workers, timeout_s)
        self.mode = mode
        self.fetcher = fetcher
        self.context = context
        self.worker_init_fn = worker_init_fn
        self.persistent = persistent
        self.prefetch_factor = prefetch_factor
        self.sharding = sharding
        self.shards = shards
        self._seed = seed
        self._launch: tuple[str, Any] = ("fork", None)  # the start method and context of the workers now
        knob = self.knobs[0]
        knob.min = min(floor, knob.max)
        if shards:
            knob.min = knob.max = workers  # each worker reads its part: their number holds for the loader
        self._key = id(self)
        self._first = 0  # the worker the next epoch's cycle starts with (a resumed epoch's)
        self._opener: Opener | None = None  # the next epoch's opening of each worker (``worker_state``)
        if mode == "process":
            INHERITED[self._key] = (fetcher, worker_init_fn)

    def start(self, epoch: EpochContext, inp: Channel | None) -> Channel:
        assert inp is not None
        if self.mode != "process":
            return super().start(epoch, inp)
        if not self.persistent:
            self.end_workers()  # an epoch abandoned before its end left them: a new epoch starts fresh ones
        with self._procs_lock:
            if not self._procs:  # persistent workers keep the start method they were started with
                self._launch = resolve(self.context)
        out = epoch.channel(f"{self.name}.out", ordered=epoch.deterministic, window=self.window)
        self._out = out
        label = f"{epoch.label}-{self.name}"
        first, opener, self._first, self._opener = self._first, self._opener, 0, None
        dispatch = Dispatch(
            self._get_workers, self.window, epoch.deterministic, self.prefetch_factor, epoch.stop, out, first=first
        )

        def lost(item: Item, exc: BaseException) -> BaseException:
            return WorkerLostError(
                f"DataLoader worker died {self.max_attempts} times on {origin_words(item)} ({exc}); "
                f"stage {self.name!r} of intune.DataLoader"
            )

        run = LoaderPoolRun(
            self.name,
            self._get_workers,
            lambda index: self.process_worker(index, label),
            self._chunk_handling(lost),
            dispatch,
            out,
            self.stats,
            epoch.fail,
            epoch.stop,
            exhausted_key=EXHAUSTED,
            replaceable=not self.shards,
            dataset_name=self.fetcher.dataset_name,
            opener=opener,
        )
        # as torch's iterator, start the workers here, on the caller's thread: a failed start raises from
        # iter(), and so does a worker_init_fn that raises (with its own class, before any batch is sent,
        # as torchdata's StatefulDataLoader does); persistent workers started already
        workers = [self.process_worker(index, label) for index in range(self._target)]
        for worker in workers:
            worker.ensure_started()  # all at once: a spawned interpreter takes a second
        for worker in workers:
            try:
                worker.wait_ready()
            except WorkerDied:
                pass  # the pool restarts it, as any worker that dies, and gives up after three deaths
            except WorkerInitError as exc:
                error = init_failure(str(exc), exc.remote_traceback, self.fetcher.dataset_name)
                if error is None:
                    raise
                raise error from exc
        run.open(dict(enumerate(workers)))  # each worker's state as the epoch opens: in a state taken now
        self._run = run
        epoch.pools.append(run)
        epoch.spawn(lambda: dispatch.run(inp), f"{self.name}-dispatch")
        run.start()
        return out

    def open_next(self, opener: Opener | None, first: int = 0) -> None:
        """The next epoch's opening of each worker (None: none) and the worker its cycle starts with
        (a resumed epoch's: after the last one delivered)."""
        self._opener, self._first = opener, first

    def new_process_worker(self, index: int, label: str) -> ProcessWorker:
        method, context = self._launch
        blob = pickle.dumps(
            WorkerFetcher(index, self._seed(), self.workers(), self._key, method == "fork", self.sharding)
        )
        if method == "fork":
            return ProcessWorker(blob, f"{label}-w{index}", launch=fork_child)
        return ProcessWorker(blob, f"{label}-w{index}", launch=ContextLaunch(context, self._key, INHERITED[self._key]))

    def _result(self, out: Any, item: Item) -> list[Item]:
        # the batch's number rides along (the sampler's source numbered it), for the loader's resume state
        number = np.array([item.origin.segments[0].unit], dtype=np.int64)
        return [Item({**out, NUMBER: number}, item.origin, item.rows, nbytes(out))]

    def _timed_out(self, item: Item, stats: WorkerStats) -> list[Item]:
        assert self.timeout_s is not None
        seconds = f"{self.timeout_s:g}"
        raise DataLoaderTimeoutError(
            f"DataLoader timed out after {seconds} seconds: {origin_words(item)} was still not fetched "
            f"(intune.DataLoader timeout={seconds}; the worker holding it was killed)",
            origin=origin_words(item),
            timeout_s=self.timeout_s,
        )

    def window(self) -> int:
        """Batches handed out and not yet released: every worker's ``prefetch_factor`` (at least the two
        its child holds), plus one each and slack; for an iterable dataset torch's exactly (each worker's
        ``prefetch_factor``), which decides when a worker's end is seen, and so the batches' order."""
        if self.mode != "process":
            return super().window()
        if self.shards:
            return self.prefetch_factor * self._target
        return (max(SLOTS, self.prefetch_factor) + 1) * self._target + 2

    def end_workers(self) -> None:
        """End the worker processes now (they are started again by the next epoch)."""
        with self._procs_lock:
            procs, self._procs = self._procs, []
        for proc in procs:
            proc.close()

    def detach(self) -> None:
        super().detach()
        if self.mode == "process" and not self.persistent:
            self.end_workers()  # as torch's, workers without persistent_workers end with their epoch

    def close(self) -> None:
        super().close()
        INHERITED.pop(self._key, None)
