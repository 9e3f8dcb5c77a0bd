"""An iterable dataset read by worker processes: each worker iterates its own copy, as torch's do.

Owns both ends of it. ``ShardRequests`` is the pipeline's source: an endless numbered stream of
requests ("your next batch"), each carrying the epoch (and a datapipe's shared seed), which the fetch
stage hands to the workers round-robin (``dispatch``) until every worker's iterator has ended.
``ShardFetcher`` is what a worker does with a request: at the first request of an epoch it calls
``iter()`` on its copy of the dataset (after ``worker_init_fn``, with ``get_worker_info()`` set, so a
dataset that shards itself by worker reads its own part), then each request takes ``batch_size``
samples and collates them, or answers ``EXHAUSTED`` once its iterator has ended (a short last batch
with ``drop_last`` is dropped, as torch drops it). An exception from the dataset or ``collate_fn``
travels as a failure record in its batch's place, after the batches made before it; the worker
goes on with its iterator, as torch's workers do (a generator that raised then ends). A dataset that
does not shard itself yields its rows once per worker, as under torch. It must not know about
samplers, pools or the training loop's side.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from intune.dataloader import transport
from intune.dataloader.fetch import Fetcher, is_datapipe, seed_datapipe
from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment
from intune.pipeline.sources import Source

REQUEST = "request"
"""The request column: ``[epoch, 1 if a shared seed follows else 0, shared seed]`` (int64)."""
EXHAUSTED = "__exhausted__"
"""The output key of a request whose worker's iterator has ended: no batch, and no more from it."""


class ShardRequests(Source):
    """The fetch stage's input for an iterable dataset: request after request, numbered, for one epoch."""

    parallel = False

    def __init__(self, name: str, dataset_name: str, rows: int) -> None:
        self.name = name
        self.dataset_name = dataset_name
        self.rows = rows  # what one request is counted as (its batch size) in the pipeline's metrics
        self._request = np.zeros(3, dtype=np.int64)
        self._epoch = 0

    def begin(self, epoch: int, shared_seed: int | None) -> None:
        """The next epoch's requests: its number and a datapipe's shared seed (torch's ``_shared_seed``)."""
        self._epoch = epoch
        self._request = np.array([epoch, shared_seed is not None, shared_seed or 0], dtype=np.int64)

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
    ) -> None:
        super().__init__(dataset, collate_fn, batch_size is not None, dataset_name)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._epoch: int | None = None
        self._samples: Iterator[Any] | None = None
        self._made = 0  # batches made this epoch (for error messages)

    def __call__(self, chunk: Mapping[str, np.ndarray]) -> dict[str, Any]:
        epoch, seeded, shared = (int(v) for v in chunk[REQUEST])
        if epoch != self._epoch:
            failed = self._begin(epoch, shared if seeded else None)
            if failed is not None:
                return failed
        if self._samples is None:
            return {EXHAUSTED: np.ones(1, dtype=np.bool_)}
        where = f"batch #{self._made} of worker {self.worker_id}'s iterator"
        try:
            if self.batch_size is None:
                samples = next(self._samples)
            else:
                samples = list(itertools.islice(self._samples, self.batch_size))
                if not samples or (self.drop_last and len(samples) < self.batch_size):
                    raise StopIteration
        except StopIteration:
            self._samples = None
            return {EXHAUSTED: np.ones(1, dtype=np.bool_)}
        except Exception as exc:  # noqa: BLE001 - delivered in the batch's place; the iterator goes on
            return self._failure(exc, f"{where} (the dataset's __iter__ / __next__)")
        self._made += 1
        try:
            batch = self.collate_fn(samples)
        except Exception as exc:  # noqa: BLE001
            return self._failure(exc, f"collate_fn on {where}")
        try:
            return transport.encode(batch)
        except Exception as exc:  # noqa: BLE001
            return self._failure(exc, f"sending {where}")

    def _begin(self, epoch: int, shared_seed: int | None) -> dict[str, Any] | None:
        """This worker's iterator for ``epoch`` (a datapipe seeded first); a failing ``iter()`` is the
        epoch's first answer, and the worker has nothing more to give."""
        self._epoch, self._made, self._samples = epoch, 0, None
        if shared_seed is not None and is_datapipe(self.dataset):
            self.dataset = seed_datapipe(self.dataset, shared_seed)
        try:
            self._samples = iter(self.dataset)
        except Exception as exc:  # noqa: BLE001
            return self._failure(exc, f"iter() of the dataset in worker {self.worker_id}")
        return None
