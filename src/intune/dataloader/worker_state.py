"""Each worker's own state, as torchdata's ``StatefulDataLoader`` keeps it per worker.

A worker process holds its own copy of the dataset (and, for an iterable dataset, its own iterator),
whose ``state_dict()`` (a random generator, a position) changes as it fetches: the loader's state must
hold each worker's, and a resume must give each worker its own back. Owns both sides of that:

- in the worker, ``WorkerSnapshots``: the worker's count of batches this epoch and its snapshot
  (``dataset_state``: the copy's and its iterator's states) taken when the epoch opens and every
  ``snapshot_every`` batches, right after the batch's samples are drawn; each batch carries the count
  (``WORKER``) and the snapshot taken since the last batch sent, pickled (``WORKER_STATE``);
- the epoch's opening (``OPEN``, an ``Opening``): a message each worker gets before its first batch of
  an epoch (its generation, and on a resume its snapshot, its count of delivered batches and, for a
  map-style dataset, the indices of its batches delivered after the snapshot, which it fetches again
  without sending them so that its state moves as it did; after a resume between epochs, a persistent
  worker first reaches where it stood at the end of the last one); the worker answers with its snapshot then,
  so a state taken before any batch holds every worker's start;
- in the loader, ``WorkerProgress``: per worker, the count, the latest snapshot and the indices of the
  batches delivered since it (map-style), of the batches the training loop received, and the worker whose batch came last
  (a resumed epoch hands its first batch to the next one, as the uninterrupted run did).

It must not know about pools, samplers or the training loop's side.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from intune.dataloader import dataset_state
from intune.dataloader.dataset_state import Snapshot

WORKER = "__worker__"
"""The output key of a worker's batch (or failure): ``[worker id, its batches this epoch, this one
included]`` (int64)."""
WORKER_STATE = "__worker_state__"
"""The output key of the worker's snapshot taken with this batch or at the opening (a pickled ``Snapshot``)."""
OPEN = "__open__"
"""The input key of an epoch's opening message (a pickled ``Opening``, uint8)."""
OPENED = "__opened__"
"""The output key of a worker's answer to its opening (with ``WORKER_STATE`` when it has a state)."""


@dataclass(frozen=True)
class Opening:
    """What a worker is told before its first batch of an epoch. ``snapshot``: the state to restore
    (``Snapshot.state()``), None to start as it is; ``delivered``: its batches the loop already
    received this epoch; ``refetch``: a map-style worker's index lists of those delivered after the
    snapshot, to fetch again unsent; ``epoch`` and ``shared_seed``: an iterable's epoch and a datapipe's
    shared seed; ``previous``: where a persistent worker stood at the end of the last epoch (its
    ``snapshot``, ``delivered`` and ``refetch``), to reach first (a fresh worker after a resume between
    epochs: the uninterrupted run's worker carried its state over)."""

    generation: int
    snapshot: Mapping[str, Any] | None = None
    delivered: int = 0
    refetch: list[Any] = field(default_factory=list)
    epoch: int = 0
    shared_seed: int | None = None
    previous: Opening | None = None

    def chunk(self) -> dict[str, np.ndarray]:
        return {OPEN: np.frombuffer(pickle.dumps(self), dtype=np.uint8)}

    @staticmethod
    def read(chunk: Mapping[str, np.ndarray]) -> Opening | None:
        return pickle.loads(np.asarray(chunk[OPEN]).tobytes()) if OPEN in chunk else None

    def restored(self) -> Snapshot | None:
        return None if self.snapshot is None else Snapshot.from_state(self.snapshot)


class WorkerSnapshots:
    """The worker's side: its count of batches this epoch and the snapshot to send with the next one."""

    def __init__(self, every: int | None) -> None:
        self.every = every or 0  # 0: at the opening only
        self.generation: int | None = None
        self.made = 0
        self.stateful = False
        self._pending: Snapshot | None = None

    def open(self, generation: int, stateful: bool, made: int) -> None:
        self.generation, self.stateful, self.made, self._pending = generation, stateful, made, None

    def take(self, dataset: Any, iterator: Iterator[Any] | None) -> Snapshot | None:
        """The snapshot now (the opening's answer)."""
        return dataset_state.take(dataset, iterator, self.made) if self.stateful else None

    def after_batch(self, dataset: Any, iterator: Iterator[Any] | None) -> None:
        """One more batch drawn (or failed): counted, and the snapshot due after it taken."""
        self.made += 1
        if self.stateful and self.every and self.made % self.every == 0:
            self._pending = dataset_state.take(dataset, iterator, self.made)

    def attach(self, out: dict[str, Any], worker_id: int | None) -> dict[str, Any]:
        """``out`` with this worker's count, and the snapshot taken since the last batch sent, if any."""
        out[WORKER] = np.array([worker_id or 0, self.made], dtype=np.int64)
        if self._pending is not None:
            out[WORKER_STATE] = encode(self._pending)
            self._pending = None
        return out


def encode(snapshot: Snapshot) -> np.ndarray:
    return np.frombuffer(pickle.dumps(snapshot), dtype=np.uint8)


def decode(column: Any) -> Snapshot:
    return pickle.loads(np.asarray(column).tobytes())


class WorkerProgress:
    """The loader's side: per worker, what the loop received of it this epoch (thread-safe: workers added
    by the tuner open from their own threads)."""

    def __init__(
        self,
        map_style: bool,
        count: int,
        entries: dict[int, dict[str, Any]] | None = None,
        last: int | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.map_style = map_style  # its resume fetches again the batches since each snapshot (``since``)
        self.count = count  # the workers the epoch started with (an iterable's parts)
        self._entries: dict[int, dict[str, Any]] = entries or {}
        self.last = last

    def _entry(self, worker: int) -> dict[str, Any]:
        return self._entries.setdefault(worker, {"delivered": 0, "snapshot": None, "since": []})

    def opened(self, worker: int, answer: Mapping[str, Any]) -> None:
        """A worker's answer to its opening: its snapshot at the epoch's start. A resumed worker's entry
        keeps the snapshot it was restored from, as the uninterrupted run's did (the state taken after a
        resume equals the uninterrupted run's)."""
        if WORKER_STATE not in answer:
            return
        snapshot = decode(answer[WORKER_STATE])
        with self._lock:
            entry = self._entry(worker)
            if entry["snapshot"] is None and entry["delivered"] == 0:
                entry["snapshot"], entry["since"] = snapshot, []

    def add(self, chunk: Mapping[str, Any], keys: Any = None) -> None:
        """Record a delivered batch of the worker named in it (``keys``: a map-style batch's indices)."""
        worker, made = (int(v) for v in chunk[WORKER])
        with self._lock:
            entry = self._entry(worker)
            if made <= entry["delivered"]:  # a replaced worker counts afresh: its state was lost with it
                entry["snapshot"], entry["since"] = None, []
            entry["delivered"] = made
            if WORKER_STATE in chunk:
                entry["snapshot"], entry["since"] = decode(chunk[WORKER_STATE]), []
            elif self.map_style:
                entry["since"].append(np.asarray(keys).tolist())
            self.last = worker

    def first_worker(self, workers: int) -> int:
        """The worker a resumed epoch hands its first batch to: the one after the last delivered."""
        return 0 if self.last is None else (self.last + 1) % workers

    def workers(self) -> list[int]:
        with self._lock:
            return sorted(self._entries)

    def opening(self, worker: int, generation: int, **kw: Any) -> Opening:
        """Worker ``worker``'s opening of the epoch, where this progress left it (none: from its start)."""
        with self._lock:
            entry = self._entries.get(worker)
            if entry is None:
                return Opening(generation, **kw)
            snapshot = entry["snapshot"]
            return Opening(
                generation,
                None if snapshot is None else snapshot.state(),
                entry["delivered"],
                [list(keys) for keys in entry["since"]],
                **kw,
            )

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "map_style": self.map_style,
                "count": self.count,
                "workers": [
                    {
                        "worker": w,
                        "delivered": e["delivered"],
                        "snapshot": None if e["snapshot"] is None else e["snapshot"].state(),
                        "since": [list(keys) for keys in e["since"]],
                    }
                    for w, e in sorted(self._entries.items())
                ],
                "last": self.last,
            }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WorkerProgress:
        entries = {}
        for e in state["workers"]:
            snapshot = e["snapshot"]
            entries[int(e["worker"])] = {
                "delivered": int(e["delivered"]),
                "snapshot": None if snapshot is None else Snapshot.from_state(snapshot),
                "since": [list(keys) for keys in e["since"]],
            }
        last = state["last"]
        return cls(bool(state["map_style"]), int(state["count"]), entries, None if last is None else int(last))


__all__ = ["OPEN", "OPENED", "WORKER", "WORKER_STATE", "Opening", "WorkerProgress", "WorkerSnapshots"]
