"""``intune.DataLoader``: torch's DataLoader interface over the engine, with its worker count tuned live.

Owns the public class: torch's constructor arguments and their checks, the attributes torch users
read (``dataset``, ``batch_size``, ``sampler``, ``batch_sampler``, ``drop_last``, ``collate_fn``,
``generator``, ``num_workers``), ``len()``, the epochs (``iter``), and the pipeline under it: an
``IndexSource`` of batches of indices (or a ``StreamSource`` for an iterable dataset), the
``FetchStage`` whose process workers fetch and collate, and a prefetch buffer, tuned by a policy from
the first batch (``tune=None`` leaves the allocation as given). Also the iterator's side: a batch is
rebuilt from shared memory into tensors, and a failed batch raises its worker's exception in its
place. The samplers are in ``sampling``, the worker's work in ``fetch``, the transport in
``transport``. It must not hold a sampler's, a worker's or a policy's logic.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import numpy as np

from intune.dataloader import dataset_state, shared_list
from intune.dataloader.dataset_state import Snapshot
from intune.dataloader.errors import raise_failure
from intune.dataloader.fetch import (
    DATASET_STATE,
    FAILURE,
    NUMBER,
    OBJECT,
    Fetcher,
    is_datapipe,
    seed_datapipe,
)
from intune.dataloader.launch import check_context, resolve, unstartable
from intune.dataloader.resume import (
    STATE_FORMAT,
    Delivered,
    FetchModeMismatchError,
    ResumeMismatchError,
    check_fingerprint,
    decode_bytes,
    encode_bytes,
    fingerprint,
    from_json_safe,
    generator_state,
    json_safe,
    replaying,
    set_generator_state,
)
from intune.dataloader.sampling import (
    IndexSource,
    Plan,
    build_plan,
    check_iterable_arguments,
    draw_seed,
    is_iterable_dataset,
)
from intune.dataloader.shards import ShardFetcher, ShardRequests
from intune.dataloader.stage import FetchStage, Opener
from intune.dataloader.stream import StreamSource
from intune.dataloader.transport import SPEC, decode
from intune.dataloader.worker_state import WORKER, WorkerProgress
from intune.knobs import Knob
from intune.monitor import available_cpus
from intune.pipeline import Pipeline
from intune.pipeline.engine import default_max_workers
from intune.pipeline.errors import PipelineClosedError
from intune.pipeline.sharding import resolve_shard
from intune.tunable import MovableKnobs

PREFETCH_MB = 64
"""The prefetch buffer's starting bound in MB (its knob, ``prefetch.buffer_mb``, is tuned)."""

T_co = TypeVar("T_co", covariant=True)

_FIXED = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
"""Attributes that cannot change once the loader is built (torch refuses them with ``ValueError`` too)."""


class DataLoader(Generic[T_co]):
    """A drop-in for ``torch.utils.data.DataLoader`` whose worker count and buffers are tuned live.

    The arguments are torch's, with the same meaning and checks, plus: ``num_workers="auto"`` (the
    default) starts with this rank's share of the CPUs; an int is exactly that many workers untuned,
    and the start and the floor of the tuner's range when tuned (``0``: fetch in this process, untuned);
    ``tune`` names the policy (``intune.policies``) or is ``None`` for a fixed allocation;
    ``max_workers`` bounds the workers' knob (default: twice the CPUs, at least 4, and at least an
    explicit ``num_workers``; one below ``num_workers`` caps it, with a warning); ``rank`` and
    ``world_size`` (default: ``RANK`` / ``WORLD_SIZE``) split a map-style dataset among data-parallel
    ranks as ``DistributedSampler`` does, shuffled from ``seed`` and the epoch. Workers are processes
    started at ``iter()`` as torch's: seeded with the base seed drawn from ``generator`` plus their id,
    and, without ``persistent_workers``, ended with their epoch. ``multiprocessing_context`` (or
    Python's default start method) says how they start: forked from this process (``"fork"``, the
    default on Linux: the dataset is inherited, not pickled), or through that context's ``Process``
    (``"spawn"``, ``"forkserver"``: the dataset pickled for each). Batches go to the workers
    round-robin, as torch's; an ``IterableDataset`` is read by every worker, each with its own
    ``get_worker_info()``, and their batches interleaved. ``prefetch_factor`` (default 2) batches per
    worker are handed out ahead, and as many per possible worker may wait ready within the tuned
    ``prefetch.buffer_mb``; ``pin_memory_device`` is accepted and ignored (torch deprecates it).
    ``snapshot_every_n_steps`` (torchdata's ``StatefulDataLoader`` argument, default 1) is how often, in
    batches, an iterable dataset's own ``state_dict()`` (and its iterator's) is taken for
    ``state_dict()``; a resume reads again the batches delivered since the last one (``0`` or ``None``:
    at the epoch's start and end only). ``share_lists=True`` replaces, in place, the dataset's lists of
    str, bytes, int, float or bool (of at least 1,000 items; attributes and the values of dict
    attributes) by ``intune.SharedList``: read-only, in shared memory, so workers read them without
    copying them (without it, a dataset holding containers of more than a million Python objects gets
    a ``CopyOnReadWarning`` naming them). Use ``close()`` (or ``with``) to end the workers at once; a
    loader dropped without it is closed when
    collected.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | str = "auto",
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        share_lists: bool = False,
        tune: str | Any | None = "intune",
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        max_workers: int | None = None,
    ) -> None:
        _check_workers(num_workers, timeout, prefetch_factor, persistent_workers)
        if snapshot_every_n_steps is not None and (
            isinstance(snapshot_every_n_steps, bool) or not isinstance(snapshot_every_n_steps, int) or snapshot_every_n_steps < 0
        ):
            raise ValueError(
                "intune.DataLoader: snapshot_every_n_steps must be an integer >= 0 or None, got "
                f"{snapshot_every_n_steps!r}"
            )
        self.snapshot_every_n_steps = snapshot_every_n_steps
        shard = self.shard = resolve_shard("intune.DataLoader", rank, world_size)
        self.rank, self.world_size = (shard.rank, shard.world_size) if shard is not None else (0, 1)
        self.machine_share = shard.machine_share if shard is not None else 1.0
        self.dataset = dataset
        self.generator = generator
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.persistent_workers = bool(persistent_workers)
        self.seed = int(seed)
        self.iterable = is_iterable_dataset(dataset)
        if self.iterable and is_datapipe(dataset) and shuffle is not None:
            from torch.utils.data import graph_settings

            self.dataset = graph_settings.apply_shuffle_settings(dataset, shuffle=shuffle)  # as torch does
            shuffle = None
        self._plan = self._make_plan(batch_size, shuffle, sampler, batch_sampler, bool(drop_last))
        if collate_fn is None:
            collate_fn = _default_collate() if self._batched(batch_size) else _default_convert()
        self.collate_fn = collate_fn
        self._pin = _pin_memory(pin_memory)
        self._epochs = 0
        self._generation = 0  # epochs begun or resumed: a worker knows a new one by it
        self._epoch_set: int | None = None
        self._seed = _Seed()
        self._epoch: _Epoch | None = None  # the epoch in flight (None: none, or it ended)
        self._ended: Snapshot | None = None  # the dataset's state at the end of the last epoch, until the next
        # persistent workers' progress at the end of the last epoch (their states carry over), until the next
        self._ended_workers: WorkerProgress | None = None
        self._catch_up: WorkerProgress | None = None  # loaded: fresh workers reach it before the next epoch
        self._pending: _Pending | None = None  # a state loaded by load_state_dict, resumed by the next iter()
        self._running: weakref.ref[_Batches] | None = None  # the last epoch's iterator
        self._closed = False
        self._iterable_len: int | None = None  # len(dataset) when len(loader) was asked (torch's warning)
        self.multiprocessing_context = multiprocessing_context
        tuned = tune is not None and not self.iterable  # an iterable's workers each read a part: held
        # an iterable dataset gets workers only when asked: each would yield it all unless it divides
        # itself by get_worker_info(), which only its author knows (torch's default is 0 too)
        start = 0 if self.iterable and num_workers == "auto" else _start_workers(num_workers, self.machine_share)
        context = check_context(multiprocessing_context, start)
        if num_workers == "auto" and start and (why := unstartable(context, self.dataset, self.collate_fn, worker_init_fn)):
            warnings.warn(
                f"intune.DataLoader: num_workers='auto' loads in this process: {why}. Make them picklable "
                "(or use the 'fork' start method) to get workers",
                UserWarning,
                stacklevel=2,
            )
            start = 0
        start, floor, ceiling = _worker_range(num_workers, start, max_workers, tuned)
        # where batches are fetched: the dataset's own state and the random draws differ (see resume)
        self._fetch_mode = "in-process" if start == 0 else "workers"
        if share_lists:  # before any worker starts: they inherit (or map) the shared lists
            shared_list.share_lists(dataset)
        self.pipeline = self._build(start, floor, ceiling, context, prefetch_factor or 2, bool(in_order))
        if not share_lists and self.num_workers > 0:
            _warn_copy_on_read(dataset, resolve(context)[0])
        self.tuner = self._make_tuner(tune if start > 0 and tuned else None)
        self._finalizer = weakref.finalize(self, _shutdown, self.tuner, self.pipeline)
        self._initialized = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED and getattr(self, "_initialized", False):
            raise ValueError(f"{name} attribute should not be set after intune.DataLoader is initialized")
        super().__setattr__(name, value)

    # ---- construction ----------------------------------------------------------------------------
    def _batched(self, batch_size: int | None) -> bool:
        return batch_size is not None if self.iterable else self._plan.auto_collation

    def _make_plan(
        self, batch_size: int | None, shuffle: bool | None, sampler: Any, batch_sampler: Any, drop_last: bool
    ) -> Plan:
        if self.iterable:
            check_iterable_arguments(shuffle, sampler, batch_sampler, batch_size, drop_last)
            return Plan(None, None, batch_size, drop_last, False)
        return build_plan(
            self.dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            drop_last,
            self.generator,
            self.rank,
            self.world_size,
            self.seed,
        )

    def _build(
        self, workers: int, floor: int, ceiling: int, context: Any, prefetch_factor: int, in_order: bool
    ) -> Pipeline:
        """The pipeline: the batches' indices (an iterable dataset's requests), their fetch, a prefetch
        buffer; an iterable dataset without workers is one stream in this process (``StreamSource``)."""
        name = dataset_name(self.dataset)
        plan = self._plan
        if self.iterable and workers == 0:
            source = self._stream = StreamSource(
                self.dataset, self.collate_fn, plan.batch_size, plan.drop_last, name, self.snapshot_every_n_steps
            )
            return Pipeline(source, name="stream").prefetch(depth=2 * prefetch_factor, buffer_mb=PREFETCH_MB)
        if self.iterable:
            source: IndexSource | ShardRequests = ShardRequests("requests", name, plan.batch_size or 1)
            self._requests = source
            fetcher: Fetcher = ShardFetcher(
                self.dataset, self.collate_fn, plan.batch_size, plan.drop_last, name, self.snapshot_every_n_steps
            )
        else:
            source = self._source = IndexSource("sampler", name, plan.auto_collation)
            fetcher = Fetcher(
                self.dataset,
                self.collate_fn,
                plan.auto_collation,
                name,
                encode=workers > 0,
                snapshot=True,
                snapshot_every=self.snapshot_every_n_steps,
            )
        pipe = Pipeline(source, name=source.name, deterministic=in_order, max_workers=ceiling, shard=self.shard)
        stage = FetchStage(
            fetcher,
            "fetch",
            "process" if workers > 0 else "thread",
            context,
            pipe.max_workers,
            max(1, workers),
            float(self.timeout) if self.timeout else None,
            self.worker_init_fn,
            self._seed.get,
            floor=floor,
            persistent=self.persistent_workers,
            prefetch_factor=prefetch_factor,
            sharding=(self.world_size, self.rank),
            shards=self.iterable,
        )
        depth = prefetch_factor * pipe.max_workers
        return pipe.add_stage(stage).prefetch(depth=depth, buffer_mb=min(PREFETCH_MB, pipe.max_mb))

    def _make_tuner(self, policy: str | Any | None) -> Any:
        if policy is None:
            return None
        from intune.tuner import tune

        return tune(MovableKnobs(self.pipeline), policy=policy)  # its monitor: the shard's share of the machine

    # ---- torch's attributes ----------------------------------------------------------------------
    @property
    def batch_size(self) -> int | None:
        return self._plan.batch_size

    @property
    def drop_last(self) -> bool:
        return self._plan.drop_last

    @property
    def sampler(self) -> Any:
        return self._plan.sampler

    @property
    def batch_sampler(self) -> Any:
        return self._plan.batch_sampler

    @property
    def num_workers(self) -> int:
        """The fetch workers now (it changes while the tuner runs); 0 when fetching in this process."""
        if self.pipeline.stage_names()[1] != "fetch":
            return 0
        stage = self.pipeline.stage("fetch")
        return stage.workers() if stage.mode == "process" else 0

    @property
    def knobs(self) -> Mapping[str, Knob]:
        """The knobs that move: ``fetch.workers`` and ``prefetch.buffer_mb`` (the pipeline's ``knobs``
        also lists the sampler's one thread, fixed)."""
        return MovableKnobs(self.pipeline).knobs

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` shuffles for (by default the count of epochs started): with
        ranks, ``DistributedSampler.set_epoch``; always the per-batch seeds of the workers."""
        self._epoch_set = int(epoch)

    def __len__(self) -> int:
        if not self.iterable:
            return len(self._plan.index_sampler)
        length = self._iterable_len = len(self.dataset)
        size = self._plan.batch_size
        if size is None:
            return length
        return length // size if self._plan.drop_last else -(-length // size)

    # ---- epochs ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise ValueError("intune.DataLoader: the loader is closed")
        self._stop_running()  # its threads must not read the dataset while this epoch sets it up
        pending, self._pending = self._pending, None
        try:
            if pending is not None:
                self._resume_from(pending)
            else:
                self._begin()
        except BaseException:
            if pending is not None:
                self._pending = pending  # a refused resume stays pending: a retry raises again
            raise
        batches = _Batches(self, iter(self.pipeline), self._epoch, self._iterable_len if self.iterable else None)
        self._running = weakref.ref(batches)
        if self.tuner is not None:
            self.tuner.start()
        return batches

    def _stop_running(self) -> None:
        """End the last epoch's iterator, if it still runs: its reading threads are stopped and joined,
        so they neither read the dataset (or its iterator) nor record a batch after this point."""
        running = self._running() if self._running is not None else None
        self._running = None
        if running is not None:
            running.stop()

    def _begin(self) -> None:
        """A new epoch: its number, the seed drawn as torch draws it, the sampler (or ``iter(dataset)``)
        started on this thread, and the dataset's state at its start (for a resume before any batch)."""
        epoch = self._epoch_set if self._epoch_set is not None else self._epochs
        self._epoch_set = None
        self._epochs += 1
        self._ended, self._ended_workers = None, None
        start = generator_state(self.generator)  # before any draw of the epoch: what a resume replays
        # a datapipe's shared seed first, then the workers' base seed, from the same generator, as torch
        shared = draw_seed(self.generator) if self.iterable and is_datapipe(self.dataset) else None
        drawn = self._seed.value is None or not self.persistent_workers  # when torch's DataLoader draws it
        if drawn:
            self._seed.value = draw_seed(self.generator)
        record = _Epoch(epoch, self._seed.get(), drawn, start, self._sampler_states())
        if self.iterable and self.num_workers > 0:
            self._open_workers(record, shared)  # each worker calls iter() on its own copy
        elif self.iterable:
            if shared is not None:
                seed_datapipe(self.dataset, shared)  # read in this process: seeded here
            self._claim_dataset()
            iterator = iter(self.dataset)  # once per epoch, here, as torch's loader does at iter()
            self._register_reader(iterator)
            if dataset_state.resumable(self.dataset, iterator):
                record.snapshot = dataset_state.take(self.dataset, iterator, 0)
            self._stream.begin(iterator)
        else:
            if self._plan.distributed:
                self._plan.sampler.set_epoch(epoch)
            self._source.begin(self._plan.index_sampler, epoch)
            if self._in_process_state():
                record.snapshot = dataset_state.take(self.dataset, None, 0)
            elif self.num_workers > 0:
                self._open_workers(record, None)
        self._epoch = record

    def _per_worker(self) -> bool:
        """Whether each worker's own state is kept (torchdata's per-worker snapshots, ``worker_state``):
        an iterable dataset read by workers, or a map-style dataset with a state of its own fetched by them."""
        return self.num_workers > 0 and (self.iterable or dataset_state.is_stateful(self.dataset))

    def _open_workers(self, record: _Epoch, shared: int | None) -> None:
        """The epoch's opening of each worker, at its start (``record.workers`` None) or on a resume
        (``record.workers`` holds each worker's progress): a new generation, each worker's state and
        place, and the worker the cycle starts with. After a resume between epochs with persistent
        workers, each fresh worker first reaches where the saved one stood at the last epoch's end."""
        self._generation += 1
        generation = self._generation
        if self.iterable:
            self._requests.begin(record.epoch, shared, generation)
        stage = self.pipeline.stage("fetch")
        if not self._per_worker():
            record.workers = None
            stage.open_next(None)
            return
        if not self.iterable:
            self._source.keep_keys = True  # a worker's batches since its snapshot are fetched again on resume
        resumed = record.workers is not None
        progress = record.workers if resumed else WorkerProgress(not self.iterable, self.num_workers)
        record.workers = progress
        previous, self._catch_up = self._catch_up, None
        kw: dict[str, Any] = {"epoch": record.epoch, "shared_seed": shared} if self.iterable else {}

        def chunk(worker: int) -> dict[str, Any]:
            if previous is not None:
                kw["previous"] = previous.opening(worker, generation)
            return progress.opening(worker, generation, **kw).chunk()

        stage.open_next(Opener(chunk, progress.opened), progress.first_worker(self.num_workers) if resumed else 0)

    def _claim_dataset(self) -> None:
        """Before ``iter(dataset)``: another loader whose epoch still reads this same dataset object, when
        the dataset is its own iterator, is stopped (its iterator then raises ``PipelineClosedError``):
        ``iter()`` resets the position they share, and its reading thread would take this epoch's rows."""
        other = _OWN_ITERATOR_READERS.get(id(self.dataset))
        if other is not None and other is not self and other.dataset is self.dataset:
            other._stop_running()

    def _register_reader(self, iterator: Any) -> None:
        if iterator is self.dataset:
            _OWN_ITERATOR_READERS[id(self.dataset)] = self

    def _in_process_state(self) -> bool:
        """A map-style dataset with its own state, fetched in this process: its state is part of the
        loader's (with workers each worker has its own copy, whose state is not taken)."""
        return not self.iterable and self._fetch_mode == "in-process" and dataset_state.is_stateful(self.dataset)

    def _resume_from(self, pending: _Pending) -> None:
        """The next epoch from a loaded state: the epoch in flight at the checkpoint, continued; or,
        between epochs, the dataset's end-of-epoch state and the generator restored, then a new epoch."""
        if pending.fetch_mode != self._fetch_mode:
            raise FetchModeMismatchError(
                f"intune.DataLoader: cannot resume: the state was taken with batches fetched "
                f"{_mode_words(pending.fetch_mode)}, this loader fetches them {_mode_words(self._fetch_mode)} "
                "(num_workers=0 against num_workers > 0): the dataset's own state and the random draws of "
                "the two differ"
            )
        if pending.epoch is not None:
            self._replay(pending.epoch)
            return
        if pending.ended is not None:
            if self.iterable:
                self._claim_dataset()
                dataset_state.restore(self.dataset, pending.ended)  # as torchdata: load, iter(), load
            elif self._in_process_state():
                dataset_state.load_dataset(self.dataset, pending.ended)
        if pending.ended_workers is not None and self.persistent_workers and self._per_worker():
            self._catch_up = pending.ended_workers  # the fresh workers reach the saved ones' states first
        if pending.global_generator is not None:
            # what torch's global generator held at the checkpoint decides the next epoch's draws (its
            # seed, a RandomSampler's order) as in the uninterrupted run; it is left advanced by them
            set_generator_state(None, pending.global_generator)
        self._begin()

    def _replay(self, resumed: _Epoch) -> None:
        """The loaded epoch again, from its start state, with its delivered batches skipped unfetched
        (map-style) or its dataset restored to the last snapshot delivered (iterable)."""
        with replaying(self.generator, resumed.generator):
            # the draws of the epoch's start again, in _begin's order: a datapipe's shared seed first
            shared = draw_seed(self.generator) if self.iterable and is_datapipe(self.dataset) else None
            if resumed.seed_drawn and draw_seed(self.generator) != resumed.seed:
                raise ResumeMismatchError(
                    "intune.DataLoader: cannot resume: the saved generator state does not give the epoch's "
                    "saved seed (the state was edited, or comes from another torch)"
                )
            self._seed.value = resumed.seed
            self._load_sampler_states(resumed.sampler_states)
            if not self.iterable:
                if self._plan.distributed:
                    self._plan.sampler.set_epoch(resumed.epoch)
                self._source.begin(self._plan.index_sampler, resumed.epoch, resumed.delivered)
        # after the replay, whose borrowed global generator is given back: a dataset's own state may set it
        count = resumed.delivered.count
        if self.iterable and self.num_workers > 0:
            self._resume_shards(resumed, shared)
        elif self.iterable:
            if shared is not None:
                seed_datapipe(self.dataset, shared)  # the shuffle of the epoch being resumed
            self._claim_dataset()
            iterator = dataset_state.restore(self.dataset, resumed.snapshot)
            self._register_reader(iterator)
            done = resumed.snapshot.batches if resumed.snapshot is not None else 0
            self._stream.begin(iterator, skip=count - done, first=count)
        elif self._in_process_state():
            dataset_state.load_dataset(self.dataset, resumed.snapshot)
        elif self.num_workers > 0:
            if resumed.workers is not None and not self._per_worker():
                resumed.workers = None  # the state holds workers' states this loader's dataset does not keep
            self._open_workers(resumed, None)
        # the batches delivered before the checkpoint, and those delivered from now on, in one record
        self._epoch = resumed

    def _resume_shards(self, resumed: _Epoch, shared: int | None) -> None:
        """An iterable dataset read by workers: each worker restores its part from its own snapshot and
        count of delivered batches (``worker_state``), and the cycle starts after the last worker
        delivered. The parts are the workers' ``get_worker_info()`` views, so the worker count must be
        the saved one."""
        progress = resumed.workers
        saved = progress.count if progress is not None else self.num_workers
        if saved != self.num_workers:
            raise ResumeMismatchError(
                f"intune.DataLoader: cannot resume iterable dataset {dataset_name(self.dataset)}: "
                f"num_workers: saved {saved}, now {self.num_workers} (each worker reads its own "
                "part, chosen by get_worker_info(), so the parts differ with another count)"
            )
        self._open_workers(resumed, shared)

    def _samplers(self) -> dict[str, Any]:
        return {"sampler": self._plan.sampler, "batch_sampler": self._plan.batch_sampler}

    def _sampler_states(self) -> dict[str, Any]:
        """The ``state_dict()`` of each sampler that has one, taken before the epoch's ``iter()``."""
        return {
            role: copy.deepcopy(sampler.state_dict())
            for role, sampler in self._samplers().items()
            if dataset_state.is_stateful(sampler)
        }

    def _load_sampler_states(self, states: Mapping[str, Any]) -> None:
        samplers = self._samplers()
        for role, state in states.items():
            sampler = samplers.get(role)
            if sampler is None or not callable(getattr(sampler, "load_state_dict", None)):
                raise ResumeMismatchError(
                    f"intune.DataLoader: the state holds a {role} state, but this loader's {role} "
                    f"({type(sampler).__qualname__}) has no load_state_dict()"
                )
            sampler.load_state_dict(copy.deepcopy(state))

    # ---- resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this loader is, as JSON-serialisable values (``intune.checkpoint`` stores it).

        Take it between two batches, from the training loop: the batches the loop has received are
        "delivered"; those still in workers or in the prefetch buffer are not, and are fetched again
        after a resume. It holds the configuration it is valid for (``fingerprint``), whether batches are
        fetched in this process or in workers, the count of epochs started and the next ``set_epoch``,
        the loader's seed, the generator's state now (the loader's ``generator``, else torch's global
        one), the epoch in flight (its number, seed, the generator's state at its start, the samplers'
        own ``state_dict()`` if they have one, the batches delivered and a digest of their indices, and
        the dataset's own state: see ``dataset_state``; each worker's, ``worker_state``), or between
        epochs the dataset's state at the end of the last one (``ended``, and persistent workers' in
        ``ended_workers``), the knob values, and the tuner's state. A state loaded and not
        yet resumed (no ``iter()`` since) is returned as it was loaded. See docs/dataloader.md, "Resume".
        """
        if self._pending is not None:
            return copy.deepcopy(self._pending.state)
        epoch = self._epoch
        return {
            "format": STATE_FORMAT,
            "fingerprint": fingerprint(self),
            "fetch": self._fetch_mode,
            "epochs_started": self._epochs,
            "epoch_set": self._epoch_set,
            "seed": self._seed.value,
            "generator": encode_bytes(generator_state(self.generator)),
            "epoch": None if epoch is None else epoch.state(),
            "ended": None if epoch is not None or self._ended is None else self._ended.state(),
            "ended_workers": None if epoch is not None or self._ended_workers is None else self._ended_workers.state(),
            "knobs": {name: knob.value for name, knob in self.knobs.items()},
            "tuner": None if self.tuner is None else json_safe(self.tuner.state_dict()),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict()`` of a loader of the same configuration).

        The next ``iter()`` continues the saved epoch from the batch after the last one delivered (the
        same batches as an uninterrupted run, with the same seeds), and the epochs after it are as
        usual; a state taken between epochs starts the next one as the uninterrupted run would. An epoch
        of this loader still running is ended first. The state is copied: the caller's is never changed,
        and it can be loaded again. The tuner starts from its saved state, its knobs clamped to this
        machine. A state from another configuration raises ``ResumeMismatchError`` naming each field
        that differs; nothing is changed then.
        """
        if self._closed:
            raise ValueError("intune.DataLoader: the loader is closed")
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ResumeMismatchError(
                f"intune.DataLoader.load_state_dict: not a DataLoader state of format {STATE_FORMAT} (format {got!r})"
            )
        state = copy.deepcopy(dict(state))
        check_fingerprint(state["fingerprint"], fingerprint(self), "intune.DataLoader.load_state_dict")
        pending = _Pending.from_state(state, own_generator=self.generator is not None)
        if self.tuner is not None and state["tuner"] is not None:  # an untuned loader keeps its allocation
            self.tuner.load_state_dict(from_json_safe(copy.deepcopy(state["tuner"])))
        self._stop_running()
        self._epochs = int(state["epochs_started"])
        self._epoch_set = None if state["epoch_set"] is None else int(state["epoch_set"])
        self._seed.value = None if state["seed"] is None else int(state["seed"])
        if pending.epoch is None and self.generator is not None:
            set_generator_state(self.generator, decode_bytes(state["generator"], "'generator'"))
        if self.persistent_workers and self.num_workers > 0:
            # as torchdata's: the next iter() starts fresh workers, seeded from the state, and gives each
            # its saved state (persistent ones would go on from where this loader's stood)
            self.pipeline.stage("fetch").end_workers()
        self._epoch, self._ended, self._ended_workers, self._pending = None, None, None, pending

    def _delivered(self, epoch: _Epoch, chunk: Mapping[str, Any]) -> None:
        """Record that ``chunk``'s batch reached the training loop (a failed batch too: its error did)."""
        number = chunk.get(NUMBER)
        if number is None or epoch is not self._epoch:
            return
        number = int(number[0]) if isinstance(number, np.ndarray) else int(number)
        if self.iterable and epoch.workers is not None:  # counted per worker: the requests' numbers have gaps
            if WORKER in chunk:
                epoch.workers.add(chunk)
            epoch.delivered.add(epoch.delivered.count, None)
            return
        digest = None if self.iterable else self._source.digests.pop(number, None)
        keys = None if self.iterable else self._source.keys.pop(number, None)
        if epoch.workers is not None and WORKER in chunk:
            epoch.workers.add(chunk, keys)
        snapshot = chunk.get(DATASET_STATE)
        if snapshot is not None and (epoch.snapshot is None or snapshot.batches >= epoch.snapshot.batches):
            epoch.snapshot = snapshot
        epoch.delivered.add(number, digest)

    def _ended_epoch(self, epoch: _Epoch) -> None:
        """The epoch's iterator ran out: nothing of it is left to resume, but the dataset's state now
        (after its iterator ran out) is what the next epoch starts from."""
        if epoch is not self._epoch:
            return
        # persistent workers carry their states into the next epoch: a state between epochs holds them
        self._ended_workers = epoch.workers if self.persistent_workers else None
        if self.iterable:  # with workers each read its own copy: their states are in ``_ended_workers``
            self._ended = self._stream.end_snapshot if self.num_workers == 0 else None
        elif self._in_process_state():
            self._ended = dataset_state.take(self.dataset, None, epoch.delivered.count)
        self._epoch = None

    def close(self) -> None:
        """Stop tuning and end the workers (an epoch in flight raises ``PipelineClosedError``)."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"intune.DataLoader({dataset_name(self.dataset)}, batch_size={self.batch_size}, workers={self.num_workers})"


def _mode_words(mode: str) -> str:
    return "in the loader's process" if mode == "in-process" else "in worker processes"


class _Batches:
    """One epoch's batches: rebuilt as tensors, or a failed batch's exception raised in its place; each
    one recorded as delivered (for ``state_dict``) when it is handed to the loop."""

    def __init__(
        self, loader: DataLoader, batches: Iterator[Any], epoch: _Epoch | None, reported_len: int | None
    ) -> None:
        self._loader = loader  # keeps the loader (and its workers) alive while its epoch is read
        self._batches = batches
        self._epoch = epoch
        self._reported_len = reported_len  # an iterable dataset's len() when len(loader) was asked
        self._yielded = 0
        self._stopped = False

    def __iter__(self) -> _Batches:
        return self

    def stop(self) -> None:
        """Ended by a newer ``iter(loader)`` or ``load_state_dict``: stop the epoch's threads now."""
        self._stopped = True
        self._batches.close()

    def __next__(self) -> Any:
        if self._stopped:
            raise PipelineClosedError(
                "intune.DataLoader: this epoch's iterator was ended by a newer iter(loader) or "
                "load_state_dict(): what it delivered is not a whole epoch"
            )
        try:
            chunk = next(self._batches)
        except StopIteration:
            if self._epoch is not None:
                self._loader._ended_epoch(self._epoch)
            raise
        if self._epoch is not None:
            self._loader._delivered(self._epoch, chunk)
        if self._reported_len is not None:
            self._yielded += 1
            if self._yielded > self._reported_len:
                self._warn_len()
        if OBJECT in chunk:
            return _pin_tree(chunk[OBJECT]) if self._loader._pin else chunk[OBJECT]
        if FAILURE in chunk:
            raise_failure(chunk[FAILURE])
        if SPEC not in chunk:
            raise RuntimeError(f"intune.DataLoader: a batch came without its spec (columns {sorted(chunk)})")
        return decode(chunk, self._loader._pin)

    def __len__(self) -> int:
        return len(self._loader)

    def _warn_len(self) -> None:
        """More batches than the iterable dataset's reported length: torch's warning, in its words."""
        loader = self._loader
        text = (
            f"Length of IterableDataset {dataset_name(loader.dataset)} was reported to be {self._reported_len} "
            f"(when accessing len(dataloader)), but {self._yielded} samples have been fetched. "
        )
        if loader.num_workers > 0:
            text += (
                "For multiprocessing data-loading, this could be caused by not properly configuring the "
                "IterableDataset replica at each worker (see torch.utils.data.get_worker_info)."
            )
        warnings.warn(text, UserWarning, stacklevel=3)


class _Epoch:
    """The epoch in flight as a resume needs it: its number and seed, whether the seed was drawn at its
    start, the generator's state before that draw, the samplers' own states, the batches delivered, and
    the dataset's own state at the last snapshot delivered (``dataset_state``; None when it keeps none)."""

    def __init__(
        self,
        epoch: int,
        seed: int,
        seed_drawn: bool,
        generator: np.ndarray | None,
        sampler_states: dict[str, Any],
        delivered: Delivered | None = None,
        snapshot: Snapshot | None = None,
        workers: WorkerProgress | None = None,
    ) -> None:
        self.epoch, self.seed, self.seed_drawn = epoch, seed, seed_drawn
        self.generator = generator
        self.sampler_states = sampler_states
        self.delivered = delivered or Delivered()
        self.snapshot = snapshot
        self.workers = workers  # each worker's own state and progress (``worker_state``), when kept

    def state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "seed_drawn": self.seed_drawn,
            "generator": None if self.generator is None else encode_bytes(self.generator),
            "sampler_states": copy.deepcopy(self.sampler_states),
            "delivered": self.delivered.state(),
            "dataset": None if self.snapshot is None else self.snapshot.state(),
            "workers": None if self.workers is None else self.workers.state(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> _Epoch:
        try:
            generator = state["generator"]
            snapshot = state["dataset"]
            workers = state.get("workers")
            return cls(
                int(state["epoch"]),
                int(state["seed"]),
                bool(state["seed_drawn"]),
                None if generator is None else decode_bytes(generator, "the epoch's 'generator'"),
                dict(state["sampler_states"]),
                Delivered.from_state(state["delivered"]),
                None if snapshot is None else Snapshot.from_state(snapshot),
                None if workers is None else WorkerProgress.from_state(workers),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ResumeMismatchError):
                raise
            raise ResumeMismatchError(f"intune.DataLoader state: 'epoch' is malformed ({exc!r})") from exc


class _Pending:
    """A loaded state waiting for the next ``iter()``: the epoch to continue, or (between epochs) the
    dataset's end-of-epoch state and torch's global generator state to start the next epoch from; and
    the state itself, which ``state_dict()`` returns until then."""

    def __init__(
        self,
        state: dict[str, Any],
        fetch_mode: str,
        epoch: _Epoch | None,
        ended: Snapshot | None,
        global_generator: np.ndarray | None,
        ended_workers: WorkerProgress | None = None,
    ) -> None:
        self.state = state
        self.fetch_mode = fetch_mode
        self.epoch = epoch
        self.ended = ended
        self.global_generator = global_generator
        self.ended_workers = ended_workers

    @classmethod
    def from_state(cls, state: dict[str, Any], own_generator: bool) -> _Pending:
        epoch = None if state["epoch"] is None else _Epoch.from_state(state["epoch"])
        try:
            ended = None if state["ended"] is None else Snapshot.from_state(state["ended"])
            workers = state.get("ended_workers")
            ended_workers = None if workers is None else WorkerProgress.from_state(workers)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeMismatchError(f"intune.DataLoader state: 'ended' is malformed ({exc!r})") from exc
        between = epoch is None and not own_generator
        generator = decode_bytes(state["generator"], "'generator'") if between else None
        return cls(copy.deepcopy(state), str(state["fetch"]), epoch, ended, generator, ended_workers)


class _Seed:
    """The seed of the epoch in flight, shared with the fetch stage (which must not hold the loader: the
    loader's finalizer keeps the pipeline alive, so a reference back would keep the loader forever)."""

    def __init__(self) -> None:
        self.value: int | None = None

    def get(self) -> int:
        return self.value or 0


def dataset_name(dataset: Any) -> str:
    """The dataset's class, for messages (``repr`` may be long or costly)."""
    kind = type(dataset)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


_OWN_ITERATOR_READERS: weakref.WeakValueDictionary[int, DataLoader] = weakref.WeakValueDictionary()
"""The loader whose last epoch read a dataset that is its own iterator, by ``id(dataset)``."""

_WARNED: set[tuple[type, str]] = set()
"""(dataset class, attribute) pairs already named by the copy-on-read warning in this process."""


def _warn_copy_on_read(dataset: Any, method: str) -> None:
    """Once per dataset class and attribute: a container big enough that the workers multiply it."""
    for path, words in shared_list.copy_on_read_words(dataset, method):
        if (type(dataset), path) not in _WARNED:
            _WARNED.add((type(dataset), path))
            warnings.warn(words, shared_list.CopyOnReadWarning, stacklevel=3)


def _check_workers(num_workers: Any, timeout: Any, prefetch_factor: Any, persistent_workers: Any) -> None:
    """Torch's checks of the worker arguments, in its words (``ValueError``)."""
    if num_workers != "auto" and (isinstance(num_workers, bool) or not isinstance(num_workers, int)):
        raise ValueError(f'intune.DataLoader: num_workers must be "auto" or an integer >= 0, got {num_workers!r}')
    if isinstance(num_workers, int) and num_workers < 0:
        raise ValueError(
            "intune.DataLoader: num_workers option should be non-negative; use num_workers=0 to disable "
            f"multiprocessing (got {num_workers})"
        )
    if timeout < 0:
        raise ValueError(f"intune.DataLoader: timeout option should be non-negative, got {timeout!r}")
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError(
            "intune.DataLoader: prefetch_factor option could only be specified in multiprocessing: let "
            "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None"
        )
    if prefetch_factor is not None and (isinstance(prefetch_factor, bool) or prefetch_factor < 1):
        raise ValueError(f"intune.DataLoader: prefetch_factor must be a positive integer, got {prefetch_factor!r}")
    if persistent_workers and num_workers == 0:
        raise ValueError("intune.DataLoader: persistent_workers option needs num_workers > 0")


def _start_workers(num_workers: int | str, machine_share: float) -> int:
    """``"auto"``: one worker per CPU of this rank's share of the machine (at least one)."""
    if num_workers == "auto":
        return max(1, round(available_cpus() * machine_share))
    return int(num_workers)


def _worker_range(num_workers: int | str, start: int, max_workers: int | None, tuned: bool) -> tuple[int, int, int]:
    """``(start, floor, ceiling)`` of the workers' knob. An explicit ``num_workers`` is never cut down
    silently: it raises the default ceiling, is the floor of a tuner's range, and only an explicit
    ``max_workers`` below it caps it, with a warning; more workers than CPUs warn as torch warns."""
    ceiling = max_workers if max_workers is not None else max(default_max_workers(), start)
    if start > ceiling and num_workers == "auto":
        start = ceiling  # the CPUs' share, within the bound the caller set
    if start > ceiling:
        warnings.warn(
            f"intune.DataLoader: num_workers={start} is above max_workers={ceiling}: the loader is capped at "
            f"{ceiling} workers (raise max_workers to run {start})",
            UserWarning,
            stacklevel=3,
        )
        start = ceiling
    cpus = available_cpus()
    if num_workers != "auto" and start > cpus:
        warnings.warn(
            f"intune.DataLoader will create {start} worker processes, more than the {cpus:g} CPUs this process "
            "may use (the suggested maximum): excessive worker creation might get DataLoader running slow "
            "or even freeze; lower num_workers, or let num_workers='auto' size it",
            UserWarning,
            stacklevel=3,
        )
    floor = start if tuned and num_workers != "auto" and start > 0 else 1
    return start, floor, ceiling


def _pin_memory(asked: bool) -> bool:
    """Pin only where an accelerator can use it; warn otherwise, as torch's DataLoader does."""
    if not asked:
        return False
    import torch

    if torch.accelerator.is_available():
        return True
    warnings.warn(
        "intune.DataLoader: pin_memory=True but no accelerator is available; batches are not pinned",
        UserWarning,
        stacklevel=3,
    )
    return False


def _pin_tree(batch: Any) -> Any:
    from intune.dataloader import transport

    return transport.decode(transport.encode(batch), pin=True)


def _default_collate() -> Callable[[Any], Any]:
    from torch.utils.data import default_collate

    return default_collate


def _default_convert() -> Callable[[Any], Any]:
    from torch.utils.data import default_convert

    return default_convert


def _shutdown(tuner: Any, pipeline: Pipeline) -> None:
    if tuner is not None:
        tuner.stop()
    pipeline.close()
