"""An iterable dataset's epoch: one stream, batched and collated in the loader's own process.

Owns ``StreamSource``, the pipeline's source for an ``IterableDataset``: it iterates the dataset once
per epoch, takes ``batch_size`` samples at a time (the last batch shorter unless ``drop_last``) and
collates them, as torch's DataLoader does with ``num_workers=0`` (with workers, ``shards`` reads it);
``get_worker_info()`` is ``None`` there, so a dataset that shards itself by worker yields every row,
once. An exception in the dataset or ``collate_fn`` travels in its batch's place: the loop gets the
batches made before it, then the exception, and a next ``next()`` asks the iterator again, as torch's.

Resume (``resume_at``): a dataset with ``state_dict()`` / ``load_state_dict()`` (torchdata's
``Stateful``) has its state taken right after each batch is drawn; the state travels with the batch,
so the loader keeps the one of the last batch delivered (batches read ahead into the prefetch buffer
are not delivered) and a resume loads it before iterating. A dataset without them is iterated again
from its start and the delivered batches' samples are read and dropped, not collated: that costs
reading them once more, and it is only right if the dataset yields the same samples in the same order
each time it is iterated (the loader cannot check it). It must not know about samplers.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from typing import Any

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
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.name = name
        self._resume: tuple[int, Any] | None = None

    @property
    def stateful(self) -> bool:
        """Whether the dataset saves and loads its own position (torchdata's ``Stateful``)."""
        return callable(getattr(self.dataset, "state_dict", None)) and callable(
            getattr(self.dataset, "load_state_dict", None)
        )

    def resume_at(self, batches: int, dataset_state: Any) -> None:
        """Make the next epoch start after its first ``batches`` batches: from ``dataset_state`` (the
        dataset's state after them) when the dataset is stateful, else by reading them again."""
        self._resume = (int(batches), dataset_state)

    def _samples(self) -> tuple[Iterator[Any], int]:
        """The epoch's samples, positioned after the batches a resume skips, and the next batch's number."""
        resume, self._resume = self._resume, None
        if resume is None or resume[0] == 0:
            return iter(self.dataset), 0
        skip, state = resume
        if self.stateful and state is not None:
            self.dataset.load_state_dict(state)
            return iter(self.dataset), skip
        samples = iter(self.dataset)
        per_batch = 1 if self.batch_size is None else self.batch_size
        for _ in itertools.islice(samples, skip * per_batch):
            pass
        return samples, skip

    def stream(self) -> Iterator[Item]:
        try:
            samples, start = self._samples()
        except Exception as exc:  # noqa: BLE001 - iter() failed: the epoch's one answer
            yield self._failed(exc, "iter() of the dataset", 0)
            return
        stateful = self.stateful
        for number in itertools.count(start):
            try:
                if self.batch_size is None:
                    sample = next(samples, _DONE)
                    if sample is _DONE:
                        return
                    batch, rows = self.collate_fn(sample), 1
                else:
                    group = list(itertools.islice(samples, self.batch_size))
                    if not group or (self.drop_last and len(group) < self.batch_size):
                        return
                    batch, rows = self.collate_fn(group), len(group)
            except Exception as exc:  # noqa: BLE001 - raised in its turn, after the batches made before it
                yield self._failed(exc, f"batch #{number}", number)
                continue  # as torch: the next batch asks the iterator again (a generator that raised ends)
            chunk = {OBJECT: batch, NUMBER: number}
            if stateful:
                chunk[DATASET_STATE] = copy.deepcopy(self.dataset.state_dict())
            yield Item(chunk, Origin((Segment(self, number, 0, rows),)), rows, nbytes(batch))

    def _failed(self, exc: BaseException, where: str, number: int) -> Item:
        """The dataset's (or ``collate_fn``'s) exception as an item in its batch's place."""
        record = failure_record(exc, f"{where} of the iterable dataset", self.name, None)
        return Item({FAILURE: record, NUMBER: number}, Origin((Segment(self, number, 0, 0),)), 0, 0)

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"batch #{unit} of iterable dataset {self.name}"


_DONE = object()
