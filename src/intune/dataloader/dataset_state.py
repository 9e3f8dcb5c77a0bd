"""A dataset's own position, as torchdata's ``StatefulDataLoader`` saves and restores it.

Owns ``Snapshot``: the ``state_dict()`` of a dataset and of the iterator that ``iter(dataset)``
returned, taken after a given number of batches of an epoch, and the rule that restores them:

1. the dataset's state is loaded (only when the iterator is another object: a dataset that is its own
   iterator has its state saved once, as the iterator's),
2. ``iter(dataset)`` is called, once,
3. the iterator's state is loaded into the iterator it returned.

The order matters: a dataset whose ``__iter__`` resets itself and returns ``self`` would lose a state
loaded before ``iter()``; a dataset whose ``__iter__`` reads a resume point set by ``load_state_dict``
needs its state before. An object counts as stateful when it has both ``state_dict`` and
``load_state_dict`` (torchdata's ``Stateful`` protocol). Every state is deep-copied when it is taken
and when it is loaded, so a dataset that keeps a reference to what it was given and changes it cannot
change a checkpoint, and one checkpoint can be loaded any number of times. It must not know about
epochs, batches in flight or workers (the loader and ``stream`` do).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` saves and loads its own position (torchdata's ``Stateful``)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


@dataclass(frozen=True)
class Snapshot:
    """The dataset's and its iterator's states after ``batches`` batches of the epoch (None where the
    object keeps no state). ``batches`` tells a resume how many batches to read again after loading it."""

    batches: int
    dataset: Any = None
    iterator: Any = None

    @property
    def empty(self) -> bool:
        return self.dataset is None and self.iterator is None

    def state(self) -> dict[str, Any]:
        return {"batches": self.batches, "dataset": copy.deepcopy(self.dataset), "iterator": copy.deepcopy(self.iterator)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Snapshot:
        return cls(int(state["batches"]), state["dataset"], state["iterator"])


def take(dataset: Any, iterator: Iterator[Any] | None, batches: int) -> Snapshot:
    """The states of ``dataset`` and ``iterator`` now, deep-copied (``iterator`` None: the dataset's
    alone, for a map-style dataset). A dataset that is its own iterator is saved once, as the iterator."""
    own = iterator is not None and iterator is dataset
    dataset_state = copy.deepcopy(dataset.state_dict()) if not own and is_stateful(dataset) else None
    iterator_state = copy.deepcopy(iterator.state_dict()) if iterator is not None and is_stateful(iterator) else None
    return Snapshot(batches, dataset_state, iterator_state)


def load_dataset(dataset: Any, snapshot: Snapshot | None) -> None:
    """Step 1 of a restore: the dataset's own state (a copy), when it has one and the snapshot holds it."""
    if snapshot is not None and snapshot.dataset is not None and is_stateful(dataset):
        dataset.load_state_dict(copy.deepcopy(snapshot.dataset))


def restore(dataset: Any, snapshot: Snapshot | None) -> Iterator[Any]:
    """The epoch's iterator at ``snapshot``: the dataset's state loaded, ``iter(dataset)`` called once,
    the iterator's state loaded (copies); with no snapshot, just ``iter(dataset)``."""
    load_dataset(dataset, snapshot)
    iterator = iter(dataset)
    if snapshot is not None and snapshot.iterator is not None and is_stateful(iterator):
        iterator.load_state_dict(copy.deepcopy(snapshot.iterator))
    return iterator


def resumable(dataset: Any, iterator: Iterator[Any] | None = None) -> bool:
    """Whether a snapshot restores the position by itself (torchdata's rule: the dataset or its
    iterator is stateful), so that the batches before it need not be read again."""
    return is_stateful(dataset) or (iterator is not None and is_stateful(iterator))


__all__ = ["Snapshot", "is_stateful", "load_dataset", "restore", "resumable", "take"]
