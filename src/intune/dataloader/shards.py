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

Resume, per shard (torchdata's per-worker snapshots): every answer but ``EXHAUSTED`` counts as one of
the worker's batches and carries ``SHARD`` (the worker's id and its count of batches so far) and, when
the copy or its iterator is stateful (``dataset_state``), their states taken after iter() and every
``snapshot_every`` batches, right after the batch's samples are drawn, pickled (``SHARD_STATE``). The
loader keeps, per worker, the count and the latest snapshot of the batches the loop received
(``ShardProgress``) and the worker whose batch came last. A resumed epoch gives each worker, with its
first request (``RESUME``), its snapshot and count: the worker restores its copy and iterator from the
snapshot (``dataset_state.restore``) and reads again, without collating, the batches delivered after
it (all of them when nothing is stateful); the cycle starts at the worker after the last one
delivered, so the batches come as in the uninterrupted run. It must not know about samplers, pools or
the training loop's side.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from intune.dataloader import dataset_state, transport
from intune.dataloader.dataset_state import Snapshot
from intune.dataloader.fetch import Fetcher, is_datapipe, seed_datapipe
from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment
from intune.pipeline.sources import Source

REQUEST = "request"
"""The request column: ``[epoch, generation, 1 if a shared seed follows else 0, shared seed]`` (int64)."""
EXHAUSTED = "__exhausted__"
"""The output key of a request whose worker's iterator has ended: no batch, and no more from it."""
SHARD = "__shard__"
"""The output key of a worker's batch (or failure): ``[worker id, its batches this epoch, this one
included]`` (int64)."""
SHARD_STATE = "__shard_state__"
"""The output key of the worker's snapshot taken with this batch (a pickled ``Snapshot``, uint8)."""
RESUME = "__resume__"
"""The column added to a worker's first request of a resumed epoch: its pickled ``(snapshot state or
None, batches delivered)`` (uint8)."""


class ShardRequests(Source):
    """The fetch stage's input for an iterable dataset: request after request, numbered, for one epoch."""

    parallel = False

    def __init__(self, name: str, dataset_name: str, rows: int) -> None:
        self.name = name
        self.dataset_name = dataset_name
        self.rows = rows  # what one request is counted as (its batch size) in the pipeline's metrics
        self._request = np.zeros(4, dtype=np.int64)
        self._epoch = 0
        self._generation = 0

    def begin(self, epoch: int, shared_seed: int | None) -> None:
        """The next epoch's requests (or a resumed one's): its number, a new generation, and a
        datapipe's shared seed (torch's ``_shared_seed``)."""
        self._epoch = epoch
        self._generation += 1
        self._request = np.array(
            [epoch, self._generation, shared_seed is not None, shared_seed or 0], dtype=np.int64
        )

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
        self.snapshot_every = snapshot_every or 0  # 0: after iter() only
        self._generation: int | None = None
        self._samples: Iterator[Any] | None = None
        self._made = 0  # this epoch's batches answered (failed ones too): the resume's count
        self._snapshots = False  # the copy or its iterator keeps a state of its own
        self._snapshot: Snapshot | None = None  # taken, not yet sent

    def __call__(self, chunk: Mapping[str, np.ndarray]) -> dict[str, Any]:
        epoch, generation, seeded, shared = (int(v) for v in chunk[REQUEST])
        if generation != self._generation:
            resume = pickle.loads(chunk[RESUME].tobytes()) if RESUME in chunk else None
            failed = self._begin(generation, shared if seeded else None, resume)
            if failed is not None:
                return failed
        if self._samples is None:
            return {EXHAUSTED: np.ones(1, dtype=np.bool_)}
        out = self._next_batch()
        if out is None:
            self._samples = None
            return {EXHAUSTED: np.ones(1, dtype=np.bool_)}
        return self._counted(out)

    def _next_batch(self) -> dict[str, Any] | None:
        """The next batch, collated and encoded (or its failure record); None once the iterator ended."""
        where = f"batch #{self._made} of worker {self.worker_id}'s iterator"
        try:
            samples = self._draw()
        except StopIteration:
            return None
        except Exception as exc:  # noqa: BLE001 - delivered in the batch's place; the iterator goes on
            self._after_draw()
            return self._failure(exc, f"{where} (the dataset's __iter__ / __next__)")
        self._after_draw()
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

    def _after_draw(self) -> None:
        """One more batch drawn (or failed): counted, and the snapshot due after it taken."""
        self._made += 1
        every = self.snapshot_every
        if self._snapshots and every and self._made % every == 0:
            self._snapshot = dataset_state.take(self.dataset, self._samples, self._made)

    def _counted(self, out: dict[str, Any]) -> dict[str, Any]:
        """``out`` with this worker's count, and the snapshot taken since the last batch sent, if any."""
        out[SHARD] = np.array([self.worker_id or 0, self._made], dtype=np.int64)
        if self._snapshot is not None:
            out[SHARD_STATE] = np.frombuffer(pickle.dumps(self._snapshot), dtype=np.uint8)
            self._snapshot = None
        return out

    def _begin(self, generation: int, shared_seed: int | None, resume: tuple[Any, int] | None) -> dict[str, Any] | None:
        """This worker's iterator for the epoch (a datapipe seeded first), restored and moved past its
        delivered batches when the epoch is resumed; a failing ``iter()`` is the epoch's first answer,
        and the worker has nothing more to give."""
        self._generation, self._made, self._samples, self._snapshot = generation, 0, None, None
        if shared_seed is not None and is_datapipe(self.dataset):
            self.dataset = seed_datapipe(self.dataset, shared_seed)
        snapshot = None if resume is None or resume[0] is None else Snapshot.from_state(resume[0])
        try:
            self._samples = dataset_state.restore(self.dataset, snapshot)
        except Exception as exc:  # noqa: BLE001
            return self._failure(exc, f"iter() of the dataset in worker {self.worker_id}")
        self._snapshots = dataset_state.resumable(self.dataset, self._samples)
        if resume is not None:
            self._made = snapshot.batches if snapshot is not None else 0
            self._skip(int(resume[1]) - self._made)
        if self._snapshots:  # the start (or the restored place): a checkpoint before this worker's first batch
            self._snapshot = dataset_state.take(self.dataset, self._samples, self._made)
        return None

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
            self._made += 1


def resume_columns(snapshot: Snapshot | None, delivered: int) -> dict[str, np.ndarray]:
    """The ``RESUME`` column of a worker's first request of a resumed epoch."""
    blob = pickle.dumps((None if snapshot is None else snapshot.state(), int(delivered)))
    return {RESUME: np.frombuffer(blob, dtype=np.uint8)}


class ShardProgress:
    """What the loop received of each worker's part this epoch: its batch count, the latest snapshot
    that came with them, and the worker whose batch came last (the cycle resumes after it)."""

    def __init__(self, workers: int, counts: list[int] | None = None,
                 snapshots: list[Snapshot | None] | None = None, last: int | None = None) -> None:
        self.workers = workers
        self.counts = list(counts) if counts is not None else [0] * workers
        self.snapshots: list[Snapshot | None] = list(snapshots) if snapshots is not None else [None] * workers
        self.last = last

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Record a delivered batch of a worker (its ``SHARD`` and ``SHARD_STATE``)."""
        worker, made = (int(v) for v in chunk[SHARD])
        if made <= self.counts[worker]:
            raise RuntimeError(f"intune.DataLoader: batch #{made - 1} of worker {worker} delivered twice in one epoch")
        self.counts[worker] = made
        state = chunk.get(SHARD_STATE)
        if state is not None:
            self.snapshots[worker] = pickle.loads(np.asarray(state).tobytes())
        self.last = worker

    def first_worker(self) -> int:
        """The worker the resumed cycle starts with."""
        return 0 if self.last is None else (self.last + 1) % self.workers

    def columns(self, worker: int) -> dict[str, np.ndarray]:
        return resume_columns(self.snapshots[worker], self.counts[worker])

    def state(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "delivered": list(self.counts),
            "snapshots": [None if s is None else s.state() for s in self.snapshots],
            "last": self.last,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ShardProgress:
        workers = int(state["workers"])
        counts = [int(c) for c in state["delivered"]]
        snapshots = [None if s is None else Snapshot.from_state(s) for s in state["snapshots"]]
        last = None if state["last"] is None else int(state["last"])
        if len(counts) != workers or len(snapshots) != workers or (last is not None and not 0 <= last < workers):
            raise ValueError(f"{workers} workers, {len(counts)} counts, {len(snapshots)} snapshots, last {last}")
        return cls(workers, counts, snapshots, last)
