"""An iterable dataset's epoch: one stream, batched and collated in the loader's own process.

Owns ``StreamSource``, the pipeline's source for an ``IterableDataset``: it takes ``batch_size``
samples at a time from the epoch's iterator (the last batch shorter unless ``drop_last``) and collates
them, as torch's DataLoader does with ``num_workers=0`` (with workers, ``shards`` reads it);
``get_worker_info()`` is ``None`` there, so a dataset that shards itself by worker yields every row,
once. An exception in the dataset or ``collate_fn`` travels in its batch's place: the loop gets the
batches made before it, then the exception, and a next ``next()`` asks the iterator again, as torch's.

The epoch's iterator is made by the loader, on its own thread, at ``iter(loader)`` (``begin``):
``iter(dataset)`` is called once per epoch, and samples are then taken with ``next()`` alone (never
``iter()`` again: a dataset whose ``__iter__`` resets itself and returns ``self`` would start over).

Resume (``dataset_state``): the dataset's and its iterator's ``state_dict()`` are taken every
``snapshot_every`` batches, right after the batch's samples are drawn, and travel with that batch, so
the loader keeps the snapshot of the last batch delivered (batches read ahead into the prefetch
buffer are not delivered); another is taken at the end of the stream (``end_snapshot``). A resume
restores the latest snapshot (``dataset_state.restore``) and reads again, without collating, the
batches delivered after it (``begin``'s ``skip``): with a snapshot at every batch, none. A dataset
that keeps no state is restored by reading every delivered batch again, which is right only if it
yields the same samples in the same order each time it is iterated (the loader cannot check it). It
must not know about samplers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from intune.dataloader import dataset_state
from intune.dataloader.fetch import DATASET_STATE, FAILURE, NUMBER, OBJECT, failure_record
from intune.dataloader.transport import nbytes
from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment
from intune.pipeline.sources import Source


class StreamSource(Source):
    """Batches of an iterable dataset, collated in the pipeline's reading thread."""

    parallel = False

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        batch_size: int | None,
        drop_last: bool,
        name: str,
        snapshot_every: int | None = 1,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.name = name
        self.snapshot_every = snapshot_every or 0  # 0: at the epoch's start and end only
        self._next: tuple[Iterator[Any], int, int, bool] | None = None
        self.end_snapshot: dataset_state.Snapshot | None = None  # set when the epoch's stream ran out

    def begin(self, iterator: Iterator[Any], skip: int = 0, first: int = 0) -> None:
        """The next epoch reads ``iterator`` (from ``iter(dataset)`` or a restored snapshot): it first
        reads and drops ``skip`` batches' samples, then numbers its batches from ``first``."""
        snapshots = dataset_state.resumable(self.dataset, iterator)
        self._next = (iterator, int(skip), int(first), snapshots)
        self.end_snapshot = None

    def stream(self) -> Iterator[Item]:
        pending, self._next = self._next, None
        if pending is None:
            raise RuntimeError("intune.DataLoader: an iterable epoch started without begin()")
        samples, skip, number, snapshots = pending
        per_batch = 1 if self.batch_size is None else self.batch_size
        for _ in range(skip * per_batch):
            if next(samples, _DONE) is _DONE:
                break
        every = self.snapshot_every
        while True:
            try:
                batch, rows = self._batch(samples)
            except Exception as exc:  # noqa: BLE001 - raised in its turn, after the batches made before it
                yield self._failed(exc, f"batch #{number}", number)
                number += 1
                continue  # as torch: the next batch asks the iterator again (a generator that raised ends)
            if batch is _DONE:
                break
            chunk = {OBJECT: batch, NUMBER: number}
            if snapshots and every and (number + 1) % every == 0:
                chunk[DATASET_STATE] = dataset_state.take(self.dataset, samples, number + 1)
            yield Item(chunk, Origin((Segment(self, number, 0, rows),)), rows, nbytes(batch))
            number += 1
        # after the iterator ran out: a dataset that moves to its next epoch there (a counter, a reset
        # position) has its end-of-epoch state saved, so a checkpoint between epochs resumes the next one
        if snapshots:
            self.end_snapshot = dataset_state.take(self.dataset, samples, number)

    def _failed(self, exc: BaseException, where: str, number: int) -> Item:
        """The dataset's (or ``collate_fn``'s) exception as an item in its batch's place."""
        record = failure_record(exc, f"{where} of the iterable dataset", self.name, None)
        return Item({FAILURE: record, NUMBER: number}, Origin((Segment(self, number, 0, 0),)), 0, 0)

    def _batch(self, samples: Iterator[Any]) -> tuple[Any, int]:
        """The next collated batch and its rows, or ``_DONE`` when the iterator ran out (``next()`` only:
        ``itertools.islice`` would call ``iter()`` on it, which restarts a dataset that is its own iterator)."""
        if self.batch_size is None:
            sample = next(samples, _DONE)
            return (_DONE, 0) if sample is _DONE else (self.collate_fn(sample), 1)
        group = []
        for _ in range(self.batch_size):
            sample = next(samples, _DONE)
            if sample is _DONE:
                break
            group.append(sample)
        if not group or (self.drop_last and len(group) < self.batch_size):
            return _DONE, 0
        return self.collate_fn(group), len(group)

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"batch #{unit} of iterable dataset {self.name}"


_DONE = object()
