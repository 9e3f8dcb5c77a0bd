"""An iterable dataset read by worker processes: each worker iterates its own copy, as torch's do.

Owns both ends of it. ``ShardRequests`` is the pipeline's source: an endless numbered stream of
requests ("your next batch"), each carrying the epoch, its generation (a new one at every ``begin``,
so a resume of the same epoch restarts persistent workers' iterators) and a datapipe's shared seed,
which the fetch stage hands to the workers round-robin (``dispatch``) until every worker's iterator
has ended. ``ShardFetcher`` is what a worker does with a request: at the first request of an epoch it
calls ``iter()`` on its copy of the dataset (after ``worker_init_fn``, with ``get_worker_info()`` set,
so a dataset that shards itself by worker reads its own part), then each request takes
``batch_size`` samples and collates them, or answers ``EXHAUSTED`` once its iterator has ended (a
short last batch with ``drop_last`` is dropped, as torch drops it). An exception from the dataset or
``collate_fn`` travels as a failure record in its batch's place, after the batches made before it;
the worker goes on with its iterator, as torch's workers do (a generator that raised then ends). A
dataset that does not shard itself yields its rows once per worker, as under torch.

Resume, per worker (``worker_state``): every answer but ``EXHAUSTED`` counts as one of the worker's
batches and carries its count and, when the copy or its iterator is stateful, their snapshot. The
epoch's opening (sent to each worker before its first request) calls ``iter()`` there and answers with
the start snapshot; on a resume it restores the copy and its iterator from the worker's snapshot
(``dataset_state.restore``) and reads again, without collating, the batches delivered after it (all
of them when nothing is stateful). It must not know about samplers, pools or the training loop's side.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from intune.dataloader import dataset_state, transport
from intune.dataloader.fetch import Fetcher, is_datapipe, seed_datapipe
from intune.dataloader.worker_state import OPENED, WORKER_STATE, Opening, WorkerSnapshots, encode
from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment
from intune.pipeline.sources import Source

REQUEST = "request"
"""The request column: ``[epoch, generation, 1 if a shared seed follows else 0, shared seed]`` (int64)."""
EXHAUSTED = "__exhausted__"
"""The output key of a request whose worker's iterator has ended: no batch, and no more from it."""


class ShardRequests(Source):
    """The fetch stage's input for an iterable dataset: request after request, numbered, for one epoch."""

    parallel = False

    def __init__(self, name: str, dataset_name: str, rows: int) -> None:
        self.name = name
        self.dataset_name = dataset_name
        self.rows = rows  # what one request is counted as (its batch size) in the pipeline's metrics
        self._request = np.zeros(4, dtype=np.int64)
        self._epoch = 0

    def begin(self, epoch: int, shared_seed: int | None, generation: int) -> None:
        """The next epoch's requests (or a resumed one's): its number, its generation (new at every
        begin), and a datapipe's shared seed (torch's ``_shared_seed``)."""
        self._epoch = epoch
        self._request = np.array([epoch, generation, shared_seed is not None, shared_seed or 0], dtype=np.int64)

    def stream(self) -> Iterator[Item]:
        request = self._request
        for number in itertools.count():
            origin = Origin((Segment(self, number, 0, self.rows),))
            yield Item({REQUEST: request}, origin, self.rows, request.nbytes)

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"request #{unit} of epoch {self._epoch} of iterable dataset {self.dataset_name}"


class ShardFetcher(Fetcher):
    """One worker's reading of an iterable dataset: a batch per request from the worker's own iterator."""

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        batch_size: int | None,
        drop_last: bool,
        dataset_name: str,
        snapshot_every: int | None = 1,
    ) -> None:
        super().__init__(dataset, collate_fn, batch_size is not None, dataset_name)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.progress = WorkerSnapshots(snapshot_every)
        self._samples: Iterator[Any] | None = None
        self._failed: dict[str, Any] | None = None  # iter() raised at the opening: the epoch's first answer

    def __call__(self, chunk: Mapping[str, np.ndarray]) -> dict[str, Any]:
        opening = Opening.read(chunk)
        if opening is not None:
            return self._open(opening)
        epoch, generation, seeded, shared = (int(v) for v in chunk[REQUEST])
        if generation != self.progress.generation:  # no opening came: begin here
            self._open(Opening(generation, epoch=epoch, shared_seed=shared if seeded else None))
        if self._failed is not None:
            failed, self._failed = self._failed, None
            return failed
        if self._samples is None:
            return {EXHAUSTED: np.ones(1, dtype=np.bool_)}
        out = self._next_batch()
        if out is None:
            self._samples = None
            return {EXHAUSTED: np.ones(1, dtype=np.bool_)}
        return self.progress.attach(out, self.worker_id)

    def _next_batch(self) -> dict[str, Any] | None:
        """The next batch, collated and encoded (or its failure record); None once the iterator ended."""
        where = f"batch #{self.progress.made} of worker {self.worker_id}'s iterator"
        try:
            samples = self._draw()
        except StopIteration:
            return None
        except Exception as exc:  # noqa: BLE001 - delivered in the batch's place; the iterator goes on
            self.progress.after_batch(self.dataset, self._samples)
            return self._failure(exc, f"{where} (the dataset's __iter__ / __next__)")
        self.progress.after_batch(self.dataset, self._samples)
        try:
            batch = self.collate_fn(samples)
        except Exception as exc:  # noqa: BLE001
            return self._failure(exc, f"collate_fn on {where}")
        try:
            return transport.encode(batch)
        except Exception as exc:  # noqa: BLE001
            return self._failure(exc, f"sending {where}")

    def _draw(self) -> Any:
        """One batch's samples from the iterator (``next()`` only: ``itertools.islice`` would call
        ``iter()`` on it, which restarts a dataset that is its own iterator); ``StopIteration`` at its end."""
        assert self._samples is not None
        if self.batch_size is None:
            return next(self._samples)
        samples = []
        for _ in range(self.batch_size):
            try:
                samples.append(next(self._samples))
            except StopIteration:
                break
        if not samples or (self.drop_last and len(samples) < self.batch_size):
            raise StopIteration
        return samples

    def _open(self, opening: Opening) -> dict[str, Any]:
        """This worker's iterator for the epoch (a datapipe seeded first), restored and moved past its
        delivered batches on a resume; the answer holds its snapshot then. A failing ``iter()`` is the
        epoch's first answer, and the worker has nothing more to give."""
        self._samples, self._failed = None, None
        if opening.previous is not None:  # where this persistent worker stood at the last epoch's end
            self._finish(opening.previous)
        if opening.shared_seed is not None and is_datapipe(self.dataset):
            self.dataset = seed_datapipe(self.dataset, opening.shared_seed)
        snapshot = opening.restored()
        try:
            self._samples = dataset_state.restore(self.dataset, snapshot)
        except Exception as exc:  # noqa: BLE001
            self.progress.open(opening.generation, False, 0)
            self._failed = self._failure(exc, f"iter() of the dataset in worker {self.worker_id}")
            return {OPENED: np.ones(1, dtype=np.bool_)}
        made = snapshot.batches if snapshot is not None else 0
        self.progress.open(opening.generation, dataset_state.resumable(self.dataset, self._samples), made)
        self._skip(opening.delivered - made)
        answer: dict[str, Any] = {OPENED: np.ones(1, dtype=np.bool_)}
        taken = self.progress.take(self.dataset, self._samples)  # a checkpoint before this worker's next batch
        if taken is not None:
            answer[WORKER_STATE] = encode(taken)
        return answer

    def _finish(self, previous: Opening) -> None:
        """The last epoch read again to its end, unsent: its iterator restored from the snapshot, its
        delivered batches read, then the ``next()`` that found its end (a dataset's state may move there)."""
        try:
            self._samples = dataset_state.restore(self.dataset, previous.restored())
        except Exception:  # noqa: BLE001, S110 - that epoch's iter() failure was delivered already
            return
        made = previous.restored().batches if previous.snapshot is not None else 0
        self._skip(previous.delivered - made + 1)
        self._samples = None

    def _skip(self, batches: int) -> None:
        """Read again, without collating, ``batches`` batches already delivered (failed ones included)."""
        for _ in range(batches):
            try:
                self._draw()
            except StopIteration:
                self._samples = None  # it ended sooner than it did before: it answers EXHAUSTED
                return
            except Exception:  # noqa: BLE001, S110 - this batch's failure was delivered already
                pass
            self.progress.made += 1
