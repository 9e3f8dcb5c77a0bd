"""An iterable dataset's epoch: one stream, batched and collated in the loader's own process.

Owns ``StreamSource``, the pipeline's source for an ``IterableDataset``: it iterates the dataset once
per epoch, takes ``batch_size`` samples at a time (the last batch shorter unless ``drop_last``) and
collates them, as torch's DataLoader does with ``num_workers=0``; ``get_worker_info()`` is ``None``
there, so a dataset that shards itself by worker yields every row, once. An iterable is not split
among workers: its rows can only be divided by the dataset itself, for a fixed number of workers, and
a live-resized worker count would lose or repeat rows. An exception in the dataset or ``collate_fn``
reaches the training loop as it was raised and ends the epoch. It must not know about samplers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from intune.dataloader.fetch import OBJECT
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

    def stream(self) -> Iterator[Item]:
        samples = iter(self.dataset)
        for number in itertools.count():
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
            yield Item({OBJECT: batch}, Origin((Segment(self, number, 0, rows),)), rows, nbytes(batch))

    def describe(self, unit: int, lo: int, hi: int) -> str:
        return f"batch #{unit} of iterable dataset {self.name}"


_DONE = object()
