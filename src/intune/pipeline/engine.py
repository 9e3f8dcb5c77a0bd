"""The ``Pipeline``: the builder users chain, its knobs and metrics, and the epochs it runs.

Owns the public API (``from_parquet`` / ``from_iterable`` / ``from_criteo_tsv``, ``shuffle``, ``map``,
``map_rows``, ``batch``, ``prefetch``, iteration, ``to_tf_dataset``, ``knobs``, ``metrics``, ``close``,
``state_dict`` / ``load_state_dict``: a state is the stages' parts, composed by the rules of ``state``),
starting and ending epochs (``epoch`` runs them) and shutdown. Builder methods append a stage and
return the same pipeline. It must not contain stage algorithms or their resume (``stages``,
``serial_stages``, ``shuffle``, ``batcher``, ``row_map``, ``resume``), source formats or sharding
(``sources``, ``criteo``, ``sharding``), workloads (RecD's session shuffle and dedup are adapters in
``intune.recd``) or adapters (``intune.integrations``).
"""

from __future__ import annotations

import itertools
import numbers
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from intune.knobs import Knob
from intune.pipeline import state as states
from intune.pipeline.channel import Channel
from intune.pipeline.chunks import Chunk
from intune.pipeline.columns import STRINGS
from intune.pipeline.epoch import ConsumerStats, Epoch, EpochIterator
from intune.pipeline.metrics import PipelineMetrics
from intune.pipeline.resume import Position, SourceBounds
from intune.pipeline.schema import Schema
from intune.pipeline.serial_stages import BatchStage, PrefetchStage, ShuffleStage
from intune.pipeline.sharding import Shard, resolve_shard
from intune.pipeline.shm import owner_prefix, remove_prefix
from intune.pipeline.sources import IterableSource, ParquetSource, Source, expand_paths
from intune.pipeline.stages import (
    STALL_AFTER_S,
    MapStage,
    ReadStage,
    Stage,
    check_int,
    check_map_arguments,
    check_remote_arguments,
    check_seconds,
)

_PIPELINE_IDS = itertools.count()


def default_max_workers() -> int:
    """Upper bound of every ``<stage>.workers`` knob: twice the host's CPUs, at least 4."""
    return max(4, 2 * (os.cpu_count() or 1))


DEFAULT_BUFFER_MB = 256  # a buffer_mb not given: this, or the ceiling where that is lower


def default_max_mb() -> int:
    """Upper bound of every ``<stage>.buffer_mb`` knob; see ``memory_ceiling``."""
    return memory_ceiling()[0]


def memory_ceiling() -> tuple[int, str]:
    """(MB, why in words) of the default upper bound of every ``<stage>.buffer_mb`` knob: half the
    memory this process may use, the cgroup's limit where one is set (a container's limit, not the
    host's RAM: a buffer sized from the host gets the job OOM-killed before any tuner could react)."""
    from intune.monitor import host_memory, memory_usage

    try:
        _, limit = memory_usage()
    except OSError:
        limit = 0
    if limit <= 0:
        return 4096, "the default where this process's memory limit cannot be read"
    try:
        host = host_memory()[1]
    except OSError:
        host = 0
    whose = "the host's memory" if limit == host else "its cgroup's limit"
    mb = max(16, int(limit // (2 << 20)))
    return mb, f"half the memory this process may use ({limit >> 20} MB, {whose})"


class Pipeline:
    """A stage-parallel input pipeline whose workers and buffers can be resized while data flows.

    Build it with ``from_parquet`` / ``from_iterable`` / ``from_criteo_tsv`` and chain ``shuffle``,
    ``map``, ``batch``, ``prefetch``. Iterating yields chunks (``dict[str, numpy.ndarray]``); each
    ``iter()`` is a new epoch, and the shuffle is reproducible from ``seed`` and the epoch number.
    With ``deterministic=True`` (the default) the order depends only on the seed and the shuffle
    buffer's size, never on worker counts or timing; ``deterministic=False`` lets chunks overtake.
    """

    def __init__(
        self,
        source: Source,
        *,
        deterministic: bool = True,
        max_workers: int | None = None,
        max_mb: int | None = None,
        name: str = "read",
        stall_after_s: float = STALL_AFTER_S,
        shard: Shard | None = None,
    ) -> None:
        self.shard = shard  # this rank's part of the data and of the machine (``sharding``); None: all
        self.deterministic = bool(deterministic)
        self.stall_after_s = check_seconds("stall_after_s", stall_after_s)
        self.max_workers = check_int(
            "max_workers", default_max_workers() if max_workers is None else max_workers, 1
        )
        if max_mb is None:
            self.max_mb, self._max_mb_why = memory_ceiling()
        else:
            self.max_mb, self._max_mb_why = check_int("max_mb", max_mb, 1), "the pipeline's max_mb"
        self.label = f"p{os.getpid()}x{next(_PIPELINE_IDS)}"
        self._stages: list[Stage] = []
        self._knobs: dict[str, Knob] = {}
        self._epoch: Epoch | None = None
        self._epochs = 0
        self._closed = False
        self._lock = threading.RLock()
        self._consumer = ConsumerStats()
        self._last_epoch: Epoch | None = None  # the latest epoch started: what state_dict() describes
        # set by load_state_dict, taken by the next epoch: the position it resumes at (rows, batches)
        # and the state itself (state_dict() gives it back until then); the stages keep their own parts
        self._resume_at: tuple[int, int] | None = None
        self._loaded_state: dict[str, Any] | None = None
        self._add(ReadStage(source, name, self.max_workers))
        self._running = _Running(self._stages)
        self._finalizer = weakref.finalize(self, self._running.shutdown)  # at exit or when collected

    # ---- sources ---------------------------------------------------------------------------------
    @classmethod
    def from_parquet(
        cls,
        glob_or_paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        columns: Sequence[str] | None = None,
        chunk_rows: int = 8192,
        strings: str = "bytes",
        schema: Mapping[str, Any] | None = None,
        widen: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "pad",
        local_world_size: int | None = None,
        **options: Any,
    ) -> Pipeline:
        """Parquet files (a glob or paths), read a row group per unit in chunks of <= ``chunk_rows``.

        Files are read in sorted-glob / given order; a chunk never spans two row groups. Numeric
        columns come as pyarrow converts them (with nulls: float with NaN). String and binary columns
        come as fixed-width numpy arrays that travel to process workers through shared memory:
        ``strings="bytes"`` (default) gives ``S`` arrays of UTF-8 bytes, ``"str"`` gives ``U`` arrays,
        ``"object"`` the object arrays pyarrow makes (pickled to process workers: slow). In ``S`` /
        ``U`` arrays a null is the empty value; see ``intune.pipeline.columns`` for the exceptions
        (values ending in NUL, very uneven lengths) that stay object arrays. A missing file raises
        ``FileNotFoundError`` here; an unreadable one ``SourceError`` naming it when read.

        Every chunk has the files' schema (``intune.pipeline.schema``): a requested column that the
        first file lacks raises ``SchemaError`` here; files with other columns or types raise it when
        the first epoch starts, naming both files, the column and both types. An integer column with a
        null anywhere is float64 (NaN for null) in every chunk. ``widen=True`` reads files whose types
        differ as one type that holds every value exactly (int32 and int64 as int64); ``schema``
        (``{column: dtype}``) states the types to read, converted where every value survives.
        Options: ``deterministic``, ``max_workers``, ``max_mb`` (see ``Pipeline``).

        Data-parallel training: ``rank`` of ``world_size`` (default ``$RANK`` / ``$WORLD_SIZE``, as
        ``torchrun`` sets them) reads one contiguous range of the files' rows, the same number of rows
        on every rank (``uneven="pad"`` repeats a first row on the ranks one short, ``"drop"`` leaves out
        the last row of the ranks one long, as ``DistributedSampler`` does); ``local_world_size``
        (default ``$LOCAL_WORLD_SIZE``, else ``world_size``) ranks share this machine, and each one's
        tuner budgets its share of it. See ``intune.pipeline.sharding``.
        """
        shard = resolve_shard("from_parquet", rank, world_size, uneven, local_world_size)
        chunk_rows = check_int("chunk_rows", chunk_rows, 1)
        if strings not in STRINGS:
            raise ValueError(f"from_parquet: strings must be one of {list(STRINGS)}, got {strings!r}")
        given = Schema.given(schema) if schema is not None else None
        if given is not None and columns is not None and list(columns) != list(given.columns):
            raise ValueError(f"from_parquet: columns {list(columns)} and schema {list(given.columns)} differ")
        source = ParquetSource(
            expand_paths(glob_or_paths), columns, chunk_rows, strings, given, bool(widen), shard
        )
        return cls(source, shard=shard, **options)

    @classmethod
    def from_iterable(
        cls,
        chunks: Iterable[Mapping[str, Any]] | Callable[[], Iterable[Mapping[str, Any]]],
        name: str = "read",
        schema: Mapping[str, Any] | None = None,
        widen: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "pad",
        local_world_size: int | None = None,
        **options: Any,
    ) -> Pipeline:
        """Any chunks: an iterable re-iterated each epoch, or a callable returning one per epoch.

        The first chunk fixes the schema (or ``schema`` states it); a later chunk with other columns or
        types raises ``SchemaError`` naming it, unless ``widen`` (or a given schema) allows a type that
        holds every value exactly.

        ``rank`` / ``world_size`` / ``uneven`` / ``local_world_size``: as in ``from_parquet``; every rank
        iterates every chunk and keeps its contiguous share of each (about ``1 / world_size`` of its
        rows), so chunks should hold many times ``world_size`` rows. A callable that already yields only
        this rank's data should be read with ``world_size=1``."""
        shard = resolve_shard("from_iterable", rank, world_size, uneven, local_world_size)
        given = Schema.given(schema) if schema is not None else None
        return cls(IterableSource(chunks, name, given, bool(widen), shard), name=name, shard=shard, **options)

    @classmethod
    def from_criteo_tsv(
        cls,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        chunk_rows: int = 8192,
        on_error: str = "raise",
        block_bytes: int = 8 << 20,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "pad",
        local_world_size: int | None = None,
        **options: Any,
    ) -> Pipeline:
        """Raw Criteo TSV files; see ``intune.pipeline.criteo`` for the columns produced.

        ``rank`` / ``world_size`` / ``uneven`` / ``local_world_size``: as in ``from_parquet``. The rows
        of every block are counted first (one read of every file, once per pipeline), because a TSV file
        does not say how many rows it holds; Parquet does."""
        from intune.pipeline.criteo import CriteoTsvSource

        shard = resolve_shard("from_criteo_tsv", rank, world_size, uneven, local_world_size)
        chunk_rows = check_int("chunk_rows", chunk_rows, 1)
        block_bytes = check_int("block_bytes", block_bytes, 1024)
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        source = CriteoTsvSource(expand_paths(paths), chunk_rows, on_error, block_bytes, shard)
        return cls(source, shard=shard, **options)

    # ---- stages ----------------------------------------------------------------------------------
    def shuffle(
        self,
        buffer_rows: int = 200_000,
        seed: int = 0,
        buffer_mb: int | None = None,
        name: str = "shuffle",
        by: str | None = None,
        min_buffer_mb: int = 1,
    ) -> Pipeline:
        """Buffered shuffle of up to ``buffer_rows`` rows and ``buffer_mb`` MB (the knob; default 256, or
        the pipeline's ``max_mb`` where that is lower: half the memory limit of a small container).

        ``min_buffer_mb`` is the knob's floor: a tuner short of memory may cut the window down to it,
        not below (a smaller window mixes rows less; set it to the window your training needs).

        ``by`` names a session column: runs of equal values (sessions) are shuffled as wholes, so that
        in-batch duplication survives for ``dedup`` (RecD, ``intune.recd.session_stage``).
        """
        buffer_rows = check_int("buffer_rows", buffer_rows, 1)
        seed = check_int("seed", seed, 0)
        buffer_mb = self._buffer_mb(buffer_mb)
        min_buffer_mb = check_int("min_buffer_mb", min_buffer_mb, 1, buffer_mb)
        if by is not None:  # RecD's adapter: the engine's shuffle stage over whole sessions
            from intune.recd.session_stage import SessionShuffleStage

            return self._add(SessionShuffleStage(name, buffer_rows, seed, buffer_mb, self.max_mb, min_buffer_mb, by=by))
        return self._add(ShuffleStage(name, buffer_rows, seed, buffer_mb, self.max_mb, min_buffer_mb))

    def map(
        self,
        fn: Callable[[Chunk], Chunk],
        name: str | None = None,
        mode: str = "thread",
        on_error: str = "raise",
        workers: int = 1,
        timeout_s: float | None = None,
        remote: str | None = None,
        address: str | None = None,
        remote_workers: int | None = None,
    ) -> Pipeline:
        """Apply ``fn`` (chunk -> chunk) in ``thread`` or ``process`` workers (``<name>.workers``).

        ``fn`` returns a dict of arrays of equal lengths (lengths may differ after ``batch``), with the
        same columns and types for every chunk (the stage's schema, fixed by its first output; another
        raises ``SchemaError``). ``timeout_s``: a chunk held longer fails the epoch with
        ``StageTimeoutError`` naming the stage and the chunk (off by default: a slow function is not a
        hung one). In process mode the hung child is killed, and under ``on_error="skip"`` the chunk is
        skipped and counted instead; a thread cannot be killed, so in thread mode the error always
        ends the epoch (use ``mode="process"`` for functions that may hang).

        Threads suit code that releases the GIL (numpy, pyarrow); processes suit pure-Python code.
        In process mode ``fn`` is sent with cloudpickle (closures work) and chunks travel through
        shared memory in ``/dev/shm`` (Linux). A map placed after ``batch`` may change column lengths (e.g. deduplication); rows are still
        counted as the source rows the chunk came from. ``on_error="skip"`` drops a failing chunk and
        counts it in the stage's ``skipped`` metric.

        ``remote="ray"`` (process mode, the ``ray`` extra) also runs the function on Ray actors of 1 CPU
        each beside the local workers: ``remote_workers`` of them (default 1; the knob
        ``<name>.remote_workers``), on the cluster at ``address`` (``"host:port"``, ``"auto"``, or None:
        the Ray this process uses, else ``"auto"``, else a local Ray started for it). Chunks travel
        through Ray's object store; order, errors, ``on_error`` and ``timeout_s`` are those of process
        mode, and a lost actor or node loses no chunk. See docs/remote.md.
        """
        workers, timeout_s = check_map_arguments("map", fn, mode, on_error, workers, timeout_s, self.max_workers)
        n_remote = check_remote_arguments("map", mode, remote, address, remote_workers)
        name = name if name is not None else self._fresh_name("map")
        return self._add(
            MapStage(
                fn, name, mode, on_error, self.max_workers, workers, timeout_s, remote, address, n_remote
            )
        )

    def map_rows(
        self,
        fn: Callable[[dict[str, Any]], Mapping[str, Any]],
        name: str | None = None,
        mode: str = "process",
        on_error: str = "raise",
        workers: int = 1,
        timeout_s: float | None = None,
        remote: str | None = None,
        address: str | None = None,
        remote_workers: int | None = None,
    ) -> Pipeline:
        """Apply ``fn`` (one row -> one row) to every row, in ``process`` (default) or ``thread`` workers.

        ``fn`` gets a dict of the row's values (numpy scalars; array views for array columns) and
        returns a dict of scalars or fixed-size arrays, the same keys and types for every row; the
        outputs are stacked into columns. It runs over whole chunks in the stage's workers
        (``<name>.workers``, a knob the tuner sets as for ``map``). A row whose function raises fails
        the epoch with ``StageError`` naming the stage, the row's source and values and the function's
        traceback, or with ``on_error="skip"`` is left out and counted (``skipped`` counts rows). A
        broken contract (not a dict; keys or types that change between rows) always raises. See
        ``intune.pipeline.row_map``. ``remote``, ``address``, ``remote_workers``: remote workers on a Ray
        cluster, as for ``map``.
        """
        from intune.pipeline.row_map import RowMapStage

        workers, timeout_s = check_map_arguments("map_rows", fn, mode, on_error, workers, timeout_s, self.max_workers)
        n_remote = check_remote_arguments("map_rows", mode, remote, address, remote_workers)
        name = name if name is not None else self._fresh_name("map_rows")
        return self._add(
            RowMapStage(
                fn, name, mode, on_error, self.max_workers, workers, timeout_s, remote, address, n_remote
            )
        )

    def dedup(
        self, groups: Mapping[str, Sequence[str]], name: str = "dedup", mode: str = "thread", workers: int = 1
    ) -> Pipeline:
        """RecD in-batch deduplication, after ``batch``: each group's columns become its unique rows
        (``<group>.unique.<col>``) and ``<group>.inverse`` (``intune.recd.IKJT.from_chunk`` reads them);
        ``intune.recd.GroupUDF`` maps placed after it run on unique rows only."""
        from intune.recd.dedup import dedup_transform

        if "batch" not in [s.kind for s in self._stages]:
            raise ValueError("dedup(groups) must come after batch(): it deduplicates rows within a batch")
        return self.map(dedup_transform(groups), name=name, mode=mode, workers=workers)

    def batch(self, n: int, drop_last: bool = False, name: str = "batch") -> Pipeline:
        """Batches of exactly ``n`` rows (the last one shorter unless ``drop_last``)."""
        n = check_int("batch size n", n, 1)
        return self._add(BatchStage(name, n, bool(drop_last)))

    def prefetch(self, depth: int = 2, buffer_mb: int | None = None, name: str = "prefetch") -> Pipeline:
        """Keep up to ``depth`` ready items (and ``buffer_mb`` MB, the knob; default as ``shuffle``'s)
        ahead of the consumer."""
        depth = check_int("prefetch depth", depth, 1)
        return self._add(PrefetchStage(name, depth, self._buffer_mb(buffer_mb), self.max_mb))

    def _buffer_mb(self, buffer_mb: int | None) -> int:
        """A stage's ``buffer_mb``: ``DEFAULT_BUFFER_MB`` or the ceiling where lower when not given;
        one asked above the ceiling raises ``ValueError`` naming both and where the ceiling comes from."""
        if buffer_mb is None:
            return min(DEFAULT_BUFFER_MB, self.max_mb)
        if isinstance(buffer_mb, numbers.Integral) and not isinstance(buffer_mb, bool) and buffer_mb > self.max_mb:
            raise ValueError(
                f"buffer_mb = {buffer_mb} is out of range, valid range is [1, {self.max_mb}]: the buffers' "
                f"ceiling of {self.max_mb} MB is {self._max_mb_why}; ask for at most {self.max_mb}, or "
                "set the ceiling with max_mb=... where the pipeline is made"
            )
        return check_int("buffer_mb", buffer_mb, 1, self.max_mb)

    def _fresh_name(self, base: str) -> str:
        """``base``, or ``base<i>`` (``i`` the stage's position) when a stage already has that name."""
        return base if base not in self.stage_names() else f"{base}{len(self._stages)}"

    def add_stage(self, stage: Stage) -> Pipeline:
        """Append a custom ``Stage`` (for extensions such as a dedup stage)."""
        return self._add(stage)

    def _add(self, stage: Stage) -> Pipeline:
        with self._lock:
            if self._epochs or self._closed:
                raise ValueError("stages must be added before the pipeline is first iterated")
            if not stage.name or "." in stage.name:
                raise ValueError(f"stage name {stage.name!r} must be non-empty and contain no '.'")
            if stage.name in self.stage_names():
                raise ValueError(f"stage name {stage.name!r} is already used; pass name=")
            stage.stall_after_s = self.stall_after_s
            if isinstance(stage, MapStage):
                stage.after_batch = "batch" in [s.kind for s in self._stages]
            self._stages.append(stage)
            for knob in stage.knobs:
                self._knobs[knob.name] = knob
        return self

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def stage_names(self) -> list[str]:
        return [s.name for s in self._stages]

    def stage(self, name: str) -> Stage:
        for s in self._stages:
            if s.name == name:
                return s
        raise ValueError(f"no stage named {name!r}; stages are {self.stage_names()}")

    def to_tf_dataset(
        self,
        label: str | Sequence[str] | None = None,
        features: str | Sequence[str] | None = None,
        element_spec: Any = None,
        close_on_exit: bool = True,
    ) -> Any:
        """This pipeline as a ``tf.data.Dataset`` (needs the ``tf`` extra): each iteration is an epoch.

        Elements are dicts of tensors, or ``(features, label)`` pairs with ``label`` for ``model.fit``.
        Without ``element_spec`` the first batch is run to learn the columns' types and shapes (the
        batch dimension is ``None``). An iterator closed before its end closes the pipeline (its
        workers end) unless ``close_on_exit=False``. See ``intune.integrations.tf``.
        """
        from intune.integrations.tf import to_tf_dataset

        return to_tf_dataset(
            self, label=label, features=features, element_spec=element_spec, close_on_exit=close_on_exit
        )

    # ---- knobs and metrics -----------------------------------------------------------------------
    @property
    def knobs(self) -> Mapping[str, Knob]:
        """Every knob by name: ``<stage>.workers`` (cpu) and ``<stage>.buffer_mb`` (mb). Read-only;
        an unknown name raises ``UnknownKnobError`` (a ``KeyError`` and a ``ValueError``) listing them."""
        return KnobMap(self._knobs)

    def set_knob(self, name: str, value: int) -> None:
        """``knobs[name].set(value)`` with an error listing the knobs when ``name`` is unknown."""
        self.knobs[name].set(value)

    def remote_cpus(self) -> float:
        """The cluster's CPUs this pipeline's remote workers may hold now: the free CPUs Ray reports plus
        those its remote workers hold (0 without remote stages or before they connected). Never waits
        long on the cluster (``remote_ray.cluster_free_cpus``)."""
        remote = [s for s in self._stages if isinstance(s, MapStage) and s.remote is not None]
        if not any(s.remote.connected for s in remote if s.remote is not None):
            return 0.0
        from intune.pipeline.remote_ray import cluster_free_cpus

        return cluster_free_cpus() + sum(s.remote_cpus_held() for s in remote)

    def metrics(self) -> PipelineMetrics:
        """A cheap snapshot: per-stage counters and gauges, rows out, recent rate and step time, and the
        remote cluster's CPUs (``remote_cpus``)."""
        remote_cpus = self.remote_cpus()
        c = self._consumer
        now = time.monotonic()
        rate, step_s = c.recent(now)
        stages = {s.name: s.snapshot() for s in self._stages}
        return PipelineMetrics(
            time_s=now,
            rows_out=c.rows,
            batches_out=c.batches,
            rows_per_s=rate,
            consumer_step_s=step_s,
            consumer_wait_s=c.wait_s,
            buffered_bytes=sum(m.buffered_bytes for m in stages.values()),
            stages=stages,
            remote_cpus=remote_cpus,
        )

    # ---- epochs ----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Chunk]:
        with self._lock:
            if self._closed:
                raise ValueError("the pipeline is closed")
            if self._epoch is not None:
                self._end_epoch(self._epoch, reason="superseded")
            epoch = Epoch(self._epochs, self.label, self.deterministic)
            resume_at, self._resume_at, self._loaded_state = self._resume_at, None, None
            if resume_at is not None:  # the stages follow their loaded parts (``load_state_dict``)
                epoch.delivered_rows, epoch.delivered_batches = resume_at
            self._last_epoch = epoch
            # counted before any stage starts: a fast stage may skip chunks before the iterator exists
            epoch.skipped_at_start = self._skipped_counts()
            self._epochs += 1
            self._epoch = self._running.epoch = epoch
            channel: Channel | None = None
            try:
                for stage in self._stages:
                    channel = stage.start(epoch, channel)
            except BaseException:
                self._end_epoch(epoch)
                raise
            assert channel is not None
            return EpochIterator(
                epoch, channel, self._consumer, self._end_epoch, self.close, self._skipped_counts
            )

    def _skipped_counts(self) -> dict[str, int]:
        """Chunks (and malformed lines) each stage has skipped so far, for the empty-epoch warning."""
        return {s.name: s.snapshot().skipped for s in self._stages}

    def _end_epoch(self, epoch: Epoch, reason: str = "ended") -> None:
        epoch.halt(reason)
        epoch.join(timeout=3.0)
        with self._lock:
            if self._epoch is epoch:
                self._epoch = None
                for stage in self._stages:
                    stage.detach()

    # ---- checkpoints (``state``: the stages' parts composed) -----------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this pipeline is: the epoch, the rows and batches delivered in it, the shuffle's log and
        the knob values, as plain values and numpy arrays (``intune.checkpoint.save_checkpoint`` stores it).

        Take it from the training loop between two batches (it reads the consumer's counters, then copies
        the shuffle's log under its lock; the stages keep running, resizes included). A few KB plus 16
        bytes per input chunk the epoch has read so far, and deep into an epoch an anchor of 4 bytes per
        buffered row (``resume.ANCHOR_MIN_CHUNKS``); no row data. Before the first epoch, or after an
        epoch's end, it points at the start of the next epoch. Raises ``ResumeError`` for a pipeline a
        checkpoint cannot resume exactly (``deterministic=False``, neither a shuffle nor a batch stage, a
        custom stage, a map before the shuffle that changed row counts; see docs/resume.md).

        The log is the part of the stage that keeps it (``state.recorder``: the shuffle, or the batch
        stage of a pipeline without one); every other stage's output after the position is found again
        from its input, so it adds nothing but its fingerprint.
        """
        recorder = states.recorder(self._stages, self.deterministic)
        with self._lock:
            if self._loaded_state is not None:  # loaded and not yet iterated: still that position
                return dict(self._loaded_state)
            epoch = self._last_epoch
            next_epoch = self._epochs
        state: dict[str, Any] = {
            "version": states.STATE_VERSION,
            "fingerprint": states.fingerprint(self.deterministic, self.shard, self._stages),
            "knobs": {name: knob.value for name, knob in self._knobs.items()},
            "shuffle": None,
        }
        if epoch is None or epoch.completed:
            state.update(epoch=next_epoch if epoch is None else epoch.index + 1, rows=0, batches=0)
            return state
        # the consumer's position first: every row it counts was let out by the shuffle before, so the
        # log copied afterwards covers it
        rows, batches = epoch.delivered_rows, epoch.delivered_batches
        state.update(epoch=epoch.index, rows=rows, batches=batches)
        if rows:
            state["shuffle"] = recorder.state_dict(epoch, rows)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` (``state_dict()``'s, or ``load_checkpoint``'s): the next ``iter(pipe)``
        continues that epoch with exactly the rows not delivered before it, in the order the
        uninterrupted run would have delivered them; later epochs are as usual.

        Call it before iterating (on a pipeline whose epoch runs it raises). A state from another
        pipeline (sources, stages, seed, batch size, rank) raises ``CheckpointError`` naming what
        differs; a data file rewritten since the checkpoint (another size, time or Parquet footer)
        raises it naming the file. Every field is checked against this pipeline before anything is
        allocated (a malformed or out-of-bounds one raises ``CheckpointError`` naming it). Knob values
        are restored, clamped to this pipeline's bounds. The shuffle is replayed on row ids here (no data
        read), so a bad log fails now, not in the epoch.

        Each stage takes its own part, from the consumer's end back to the source (``Stage.load_state_dict``):
        the stage that keeps the log replays it and leaves the rows to read again for the read stage.
        """
        where = "load_state_dict()"
        recorder = states.recorder(self._stages, self.deterministic)
        with self._lock:
            if self._closed:
                raise ValueError("load_state_dict(): the pipeline is closed")
            if self._epoch is not None:
                raise ValueError(
                    "load_state_dict() must be called before iterating: an epoch of this pipeline is running "
                    "(load the state into a new pipeline, or close this iterator first)"
                )
        epoch, rows, batches, knobs = states.check_header(state, where)
        here = states.fingerprint(self.deterministic, self.shard, self._stages)
        states.check_fingerprint(state["fingerprint"], here, where)
        read = self._stages[0]
        assert isinstance(read, ReadStage)
        position = Position(epoch, rows, read.bounds() if rows else SourceBounds(None, 0), where)
        try:
            for stage in reversed(self._stages):
                stage.load_state_dict(state["shuffle"] if rows and stage is recorder else None, position)
        except BaseException:
            fresh = Position(epoch, 0, position.source, where)
            for stage in self._stages:  # nothing half-loaded: every stage starts its next epoch afresh
                stage.load_state_dict(None, fresh)
            raise
        for name, value in knobs.items():
            knob = self._knobs.get(name)
            if knob is not None:
                knob.set(min(max(value, knob.min), knob.max))
        with self._lock:
            self._epochs = epoch
            self._resume_at = (rows, batches) if rows else None
            self._loaded_state = dict(state)

    def close(self) -> None:
        """Stop the epoch in flight and end every worker process (returns within a few seconds)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            epoch = self._epoch
        if epoch is not None:
            epoch.halt("closed")
        self._close_stages(self._stages)
        if epoch is not None:
            epoch.join(timeout=2.0)
            self._epoch = None
        self._finalizer.detach()
        remove_prefix(f"{owner_prefix()}{self.label}-")

    @staticmethod
    def _close_stages(stages: list[Stage]) -> None:
        for stage in stages:
            stage.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Pipeline({' -> '.join(self.stage_names())})"


class UnknownKnobError(KeyError, ValueError):
    """A knob name the pipeline does not have (both a ``KeyError`` and a ``ValueError``)."""

    def __str__(self) -> str:
        return str(self.args[0])


class KnobMap(Mapping[str, Knob]):
    """A read-only view of the pipeline's knobs whose missing-key error lists the valid names."""

    def __init__(self, knobs: dict[str, Knob]) -> None:
        self._knobs = knobs

    def __getitem__(self, name: str) -> Knob:
        try:
            return self._knobs[name]
        except KeyError:
            raise UnknownKnobError(f"unknown knob {name!r}; valid knobs are {sorted(self._knobs)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._knobs)

    def __len__(self) -> int:
        return len(self._knobs)

    def __repr__(self) -> str:
        return f"KnobMap({list(self._knobs.values())!r})"


class _Running:
    """What the finalizer needs to shut a pipeline down without holding the pipeline itself."""

    def __init__(self, stages: list[Stage]) -> None:
        self.stages = stages  # the pipeline's own list: stages added later are included
        self.epoch: Epoch | None = None

    def shutdown(self) -> None:
        """Stop the epoch first (so no worker restarts a child), then end the workers."""
        if self.epoch is not None:
            self.epoch.halt("closed")
        for stage in self.stages:
            stage.close()
