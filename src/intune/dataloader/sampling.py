"""Which dataset indices each batch holds, in which order: torch's samplers, and the source that feeds them.

Owns the index plan of ``intune.DataLoader`` with torch's rules: the argument checks of
``torch.utils.data.DataLoader`` (``batch_sampler`` excludes ``batch_size``, ``shuffle``, ``sampler`` and
``drop_last``; ``sampler`` excludes ``shuffle``; an iterable dataset takes neither), the default
samplers (``RandomSampler`` with the loader's ``generator``, ``SequentialSampler``, ``BatchSampler``),
the split among data-parallel ranks (``DistributedSampler``: the same padding and ``drop_last``), the
per-epoch draw of the loader's seed from ``generator`` before the sampler runs (torch draws its workers'
base seed there, so the same generator state gives the same shuffle), and ``IndexSource``, the
pipeline's first stage: one item per batch, its indices and its seed, in the sampler's order. It must
not fetch samples or know about workers.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from intune.dataloader.fetch import INDEX, NUMBER
from intune.dataloader.resume import Delivered, ResumeMismatchError, batch_digest
from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment
from intune.pipeline.sources import Source


@dataclass
class Plan:
    """A map-style loader's samplers, as torch's DataLoader would hold them."""

    sampler: Any
    batch_sampler: Any
    batch_size: int | None
    drop_last: bool
    distributed: bool  # the sampler is the DistributedSampler this plan made (epochs set by the loader)

    @property
    def auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def index_sampler(self) -> Any:
        return self.batch_sampler if self.batch_sampler is not None else self.sampler


def is_iterable_dataset(dataset: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(dataset, IterableDataset)


def check_iterable_arguments(
    shuffle: Any, sampler: Any, batch_sampler: Any, batch_size: int | None, drop_last: bool
) -> None:
    """An iterable dataset decides its own order: torch refuses a shuffle or a sampler for it."""
    if shuffle not in (None, False):
        raise ValueError(
            "intune.DataLoader with IterableDataset: expected unspecified shuffle option, but got "
            f"shuffle={shuffle!r} (the dataset orders itself)"
        )
    for which, given in (("sampler", sampler), ("batch_sampler", batch_sampler)):
        if given is not None:
            raise ValueError(
                f"intune.DataLoader with IterableDataset: expected unspecified {which} option, but got "
                f"{which}={given!r} (the dataset orders itself)"
            )
    _check_batch_size(batch_size, drop_last)


def _check_batch_size(batch_size: int | None, drop_last: bool) -> None:
    if batch_size is None:
        if drop_last:
            raise ValueError(
                "intune.DataLoader: batch_size=None option disables auto-batching and is mutually exclusive "
                "with drop_last"
            )
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(
            f"intune.DataLoader: batch_size must be a positive integer or None, got {batch_size!r}"
        )


def build_plan(
    dataset: Any,
    batch_size: int | None,
    shuffle: bool | None,
    sampler: Any,
    batch_sampler: Any,
    drop_last: bool,
    generator: Any,
    rank: int,
    world_size: int,
    seed: int,
) -> Plan:
    """Torch's samplers for a map-style dataset, split among ``world_size`` ranks when there are several."""
    from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

    shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("intune.DataLoader: sampler option is mutually exclusive with shuffle (the sampler orders)")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError(
                "intune.DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, "
                "sampler, and drop_last (the batch sampler decides them)"
            )
        return Plan(None, batch_sampler, None, False, False)
    _check_batch_size(batch_size, drop_last)
    distributed = False
    if sampler is None:
        if world_size > 1:
            sampler = DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
            distributed = True
        elif shuffle:
            sampler = RandomSampler(dataset, generator=generator)
        else:
            sampler = SequentialSampler(dataset)
    batches = BatchSampler(sampler, int(batch_size), drop_last) if batch_size is not None else None
    return Plan(sampler, batches, None if batch_size is None else int(batch_size), drop_last, distributed)


def draw_seed(generator: Any) -> int:
    """One seed from ``generator`` (torch's global generator when None), drawn as torch's DataLoader
    draws its workers' base seed, so that the sampler after it sees the generator in the same state."""
    import torch

    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def keys_array(batch: Any) -> np.ndarray:
    """A batch's indices (what a batch sampler yields) as int64, or as an object array when they are
    not all integers."""
    if hasattr(batch, "tolist") and not isinstance(batch, list):
        batch = batch.tolist()
    keys = list(batch) if isinstance(batch, (list, tuple, range)) else [batch]
    if all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in keys):
        return np.array(keys, dtype=np.int64)
    out = np.empty(len(keys), dtype=object)
    for i, key in enumerate(keys):
        out[i] = key
    return out


def one_key(index: Any) -> np.ndarray:
    """What a sampler yields without batching, as one key: torch passes it to ``dataset[...]`` as it is,
    so a list (a bulk-loading sampler's) stays one list, never its elements one by one."""
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        return np.array([index], dtype=np.int64)
    out = np.empty(1, dtype=object)
    out[0] = index
    return out


class IndexSource(Source):
    """The pipeline's source: one item per batch (its indices), in the sampler's order.

    ``begin`` is called on the loader's thread at each ``iter(loader)``: it starts the sampler there and
    takes its first batch, so that a sampler drawing from torch's global generator draws at the same
    moment as under torch's DataLoader; the rest is taken by the pipeline's reading thread. Batches keep
    their number in the sampler's order, also after a resume skips some; ``digests`` holds each sent batch's ``batch_digest`` until the loader records its delivery."""

    parallel = False

    def __init__(self, name: str, dataset_name: str, batched: bool) -> None:
        self.name = name
        self.dataset_name = dataset_name
        self._keys = keys_array if batched else one_key  # a batch sampler's lists, or one sampler element
        self._batches: Iterator[Any] | None = None
        self._epoch = 0
        self._recent: OrderedDict[int, np.ndarray] = OrderedDict()  # for error messages only
        # digests of the batches sent and not yet delivered (the loader pops each on delivery)
        self.digests: dict[int, int] = {}
        # with ``keep_keys``, their indices too (a worker's state is restored by fetching them again)
        self.keep_keys = False
        self.keys: dict[int, np.ndarray] = {}

    def begin(self, index_sampler: Any, epoch: int, delivered: Delivered | None = None) -> None:
        """Start the epoch's sampler here and take its first batch; with ``delivered`` (a resume), skip
        the batches it holds without fetching them, after checking that the regenerated order gives
        them the same indices (``ResumeMismatchError`` otherwise)."""
        self._epoch = epoch
        self.digests.clear()
        self.keys.clear()
        numbered = enumerate(iter(index_sampler))
        if delivered is None or delivered.frontier == 0:
            first = next(numbered, None)
            self._batches = itertools.chain([first], numbered) if first is not None else iter(())
            return
        kept, digest, seen = [], 0, 0
        for number, batch in itertools.islice(numbered, delivered.frontier):
            seen += 1
            if number in delivered:
                digest ^= batch_digest(number, self._keys(batch))
            else:
                kept.append((number, batch))
        if digest != delivered.digest or seen < delivered.frontier:
            raise ResumeMismatchError(
                f"intune.DataLoader: cannot resume epoch {epoch}: the sampler "
                f"{type(index_sampler).__qualname__} regenerated other indices for the {delivered.count} "
                "batches delivered before the checkpoint (a sampler with randomness of its own and no "
                "state_dict(), a changed dataset, or another generator); resuming would repeat some rows "
                "and skip others"
            )
        self._batches = itertools.chain(kept, numbered)

    def stream(self) -> Iterator[Item]:
        batches, self._batches = self._batches, None
        if batches is None:
            raise RuntimeError("intune.DataLoader: an epoch started without begin()")
        self._recent.clear()
        for number, batch in batches:
            keys = self._keys(batch)
            self._remember(number, keys)
            self.digests[number] = batch_digest(number, keys)
            if self.keep_keys:
                self.keys[number] = keys
            rows = len(keys)
            origin = Origin((Segment(self, number, 0, rows),))
            # the batch's number: an in-process fetcher takes the dataset's state after it (resume)
            number_col = np.array([number], dtype=np.int64)
            yield Item({INDEX: keys, NUMBER: number_col}, origin, rows, keys.nbytes + number_col.nbytes)

    def _remember(self, number: int, keys: np.ndarray) -> None:
        self._recent[number] = keys
        while len(self._recent) > 256:
            self._recent.popitem(last=False)

    def describe(self, unit: int, lo: int, hi: int) -> str:
        keys = self._recent.get(unit)
        if keys is None:
            return f"batch #{unit} of epoch {self._epoch} of dataset {self.dataset_name}"
        shown = ", ".join(str(k) for k in keys[:8].tolist())
        more = ", ..." if len(keys) > 8 else ""
        return f"batch #{unit} of epoch {self._epoch} (dataset {self.dataset_name} indices [{shown}{more}])"
