"""The serial stages: shuffle, batch and prefetch, one thread each.

Owns how each turns its input channel into its output channel for an epoch, and the ``buffer_mb``
knobs of shuffle and prefetch: the shuffle's capacity in rows is ``min(buffer_rows, buffer_mb of
rows)`` (re-read at every chunk, so a smaller knob lets rows out at once) and the prefetch queue holds
at most ``depth`` items and ``buffer_mb`` bytes. Each owns its part of a pipeline's state: the shuffle
keeps the epoch's input log, and its ``load_state_dict`` checks a state's log against its bounds and
replays it (``resume``); a batch stage does the same for a pipeline without a shuffle; prefetch keeps
nothing. A subclass of the shuffle changes its buffer and how a resume rebuilds it (``new_buffer``,
``restore``, ``replay_log``: RecD's session shuffle, ``intune.recd.session_shuffle``). The algorithms
themselves are in ``shuffle`` and ``batcher``. It must not know about pools or processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from intune.knobs import Knob
from intune.pipeline.batcher import Batcher
from intune.pipeline.channel import Channel, Item
from intune.pipeline.chunks import Origin, nbytes, num_rows
from intune.pipeline.errors import PipelineError
from intune.pipeline.resume import (
    ANCHOR_MIN_SPACING,
    DRAIN,
    INIT,
    RECUTS,
    REORDERS,
    RESIZE,
    ROW_WISE,
    Position,
    ResumeError,
    ShuffleLog,
    ShufflePlan,
    StreamPlan,
    check_log,
    replay,
    stream_replay,
)
from intune.pipeline.shuffle import IDS, ShuffleBuffer
from intune.pipeline.stages import EpochContext, Stage, sequential_loop
from intune.units import MB


def input_log_state(stage: Stage, epoch: EpochContext, delivered: int) -> dict[str, Any]:
    """The epoch's input log at the consumer's position ``delivered``, for the stage that keeps it."""
    log = epoch.shuffle_log
    if log is None:
        raise ResumeError(f"epoch {epoch.index} has no input log to resume from (stage {stage.name!r} keeps none)")
    return log.snapshot(delivered)


class ShuffleStage(Stage):
    """tf.data-style buffered shuffle; capacity = min(buffer_rows, buffer_mb of rows)."""

    kind = "shuffle"
    resume_role = REORDERS

    def __init__(self, name: str, buffer_rows: int, seed: int, buffer_mb: int, max_mb: int, min_mb: int = 1) -> None:
        super().__init__(name)
        self.buffer_rows = buffer_rows
        self.seed = seed
        self._mb = buffer_mb
        self._buffer: Any = None  # the epoch's buffer (a ``ShuffleBuffer``, or a subclass's)
        self._resume: ShufflePlan | None = None  # loaded (``load_state_dict``), taken by the next start
        self.knobs.append(Knob(f"{name}.buffer_mb", "mb", min_mb, max_mb, lambda: self._mb, self._set_mb))

    # ---- its part of a pipeline's state ---------------------------------------------------------------
    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "buffer_rows": self.buffer_rows, "seed": self.seed}

    def state_dict(self, epoch: EpochContext, delivered: int) -> dict[str, Any]:
        return input_log_state(self, epoch, delivered)

    def load_state_dict(self, state: Mapping[str, Any] | None, position: Position) -> None:
        """Check a state's log against this stage (capacities up to ``buffer_rows``) and the source
        (chunk sizes, read addresses), replay it, and keep the plan for the next epoch; the read stage
        gets the rows to read again (``position.read``)."""
        self._resume = None
        if state is None:
            return
        plan = self.replay_log(state, position)
        position.read = plan.read
        self._resume = plan

    def replay_log(self, state: Mapping[str, Any], position: Position) -> ShufflePlan:
        """A state's log checked, then replayed on row ids (``resume.replay``)."""
        where = f"{position.where}: shuffle"
        check_log(state, position.source, self.buffer_rows, where, steps_allowed=True)
        if "releases" in state:
            raise ResumeError(f"{where}: the log of a session shuffle (shuffle(by=...)); this stage shuffles rows")
        return replay(state, self.seed, position.epoch, position.rows, position.where)

    # ---- what a subclass changes ------------------------------------------------------------------
    def new_buffer(self, rng: np.random.Generator, capacity: int, log: ShuffleLog, taken: int) -> Any:
        """The epoch's buffer (``taken``: row ids added before it, for a buffer that counts them)."""
        return ShuffleBuffer(rng, capacity)

    def restore(self, plan: ShufflePlan, rng: np.random.Generator, log: ShuffleLog, rows: dict) -> tuple[Any, list[dict], bool]:
        """A resume's buffer rebuilt from the refill ``rows`` (ids ascending): ``(buffer or None, the
        rows to let out first, whether the drain is done)``. The slot buffer takes its rows in the
        replay's slot order; the straddle (let out, not delivered) goes first."""
        released = []
        if len(plan.straddle_ids):
            at = np.searchsorted(plan.refill_ids, plan.straddle_ids)
            released.append({n: c[at] for n, c in rows.items()})
        buf = None
        if plan.buffer_ids is not None:
            buf = ShuffleBuffer(rng, plan.capacity)
            if len(plan.buffer_ids):
                at = np.searchsorted(plan.refill_ids, plan.buffer_ids)
                buf.restore({n: c[at] for n, c in rows.items()})
        return buf, released, False

    def _set_mb(self, value: int) -> None:
        self._mb = value

    def capacity(self, row_bytes: int) -> int:
        return max(1, min(self.buffer_rows, self._mb * MB // max(1, row_bytes)))

    def detach(self) -> None:
        super().detach()
        self._buffer = None

    def internal_bytes(self) -> int:
        buf = self._buffer
        return buf.nbytes if buf is not None else 0

    def queue_capacity(self) -> int:
        return 2

    def queue_fill(self) -> float:
        buf = self._buffer
        if buf is None or not buf.size:
            return 0.0
        return min(1.0, buf.size / max(1, buf.capacity))

    def start(self, epoch: EpochContext, inp: Channel | None) -> Channel:
        """Run the shuffle for an epoch, recording its steps in a ``ShuffleLog`` (``resume``).

        Every step that draws from the generator outside ``add`` (the buffer's creation, a capacity
        change or a shrink's release, the drain) is logged before its rows leave, and every input
        chunk's read address and rows before it is added. A resumed epoch (the plan ``load_state_dict``
        kept) first takes the refill rows the read stage sends, rebuilds the buffer in the replay's slot order,
        lets out the straddle (rows let out but not delivered before the checkpoint), then applies
        the logged steps at their positions up to where the checkpointed run had got (a knob change
        it saw is applied where it applied it), and only then follows the live knob.
        """
        assert inp is not None
        out = epoch.channel(f"{self.name}.out", max_items=lambda: 2)
        self._out = out
        plan, self._resume = self._resume, None
        rng = plan.rng if plan is not None else np.random.default_rng([self.seed, epoch.index])
        log = plan.log if plan is not None else ShuffleLog()
        epoch.shuffle_log = log
        if plan is not None:
            log.pending = list(plan.pending)  # steps the checkpointed run had taken ahead of its consumer
        logged_until = plan.logged_until if plan is not None else 0
        state: dict = {
            "buffer": None,
            "chunk_rows": plan.chunk_rows if plan is not None else 1,
            "row_bytes": log.row_bytes,
            "drained": any(e[1] == DRAIN for e in log.events),
            "refilled": plan is None,
            "refill": [],
            "emitted": plan.delivered if plan is not None else 0,  # rows let out so far, epoch-global
            "anchor_k": log.position,  # chunks added when the last anchor was taken
        }
        table = epoch.table
        if plan is not None:
            table.total = plan.next_id

        def emit(chunks: list[dict]) -> list[Item]:
            items = []
            for chunk in chunks:
                ids = chunk.pop(IDS)
                state["emitted"] += len(ids)
                items.append(Item(chunk, Origin((), ids, table), len(ids), nbytes(chunk)))
            return items

        def new_buffer(capacity: int, logged: bool = False) -> Any:
            if not logged:
                log.event(INIT, capacity)
            buf = self.new_buffer(rng, capacity, log, table.total)
            state["buffer"] = self._buffer = buf
            return buf

        def resize(buf: Any, capacity: int) -> list[dict]:
            # a shrink lets rows out a chunk's worth at a time (see ShuffleBuffer.resize)
            if capacity == buf.capacity and buf.size <= capacity:
                return []  # draws nothing, changes nothing: not a step
            log.event(RESIZE, capacity, state["chunk_rows"])
            return buf.resize(capacity, max_out=state["chunk_rows"])

        def live(position: int) -> bool:
            return position >= logged_until and not log.pending

        def apply_pending(position: int) -> Iterator[dict]:
            """The logged steps due at ``position``, applied in order as the rows they let out are taken."""
            for _, kind, a, b in log.take_pending(position):
                if kind == INIT:
                    new_buffer(a, logged=True)
                    continue
                buf = state["buffer"]
                if buf is None:
                    raise PipelineError(f"stage {self.name!r}: the resumed log resizes a buffer that does not exist")
                if kind == RESIZE:
                    yield from buf.resize(a, max_out=b)
                else:
                    state["drained"] = True
                    yield from buf.drain(a)

        def finish_refill() -> list[dict]:
            """The rows a resume read again: the buffer in its slots, and the straddle let out first."""
            state["refilled"] = True
            assert plan is not None
            chunks, state["refill"] = state["refill"], []
            got = sum(num_rows(c) for c in chunks)
            if got != len(plan.refill_ids):
                raise PipelineError(
                    f"stage {self.name!r}: the resume's refill brought {got} rows, the checkpoint needs "
                    f"{len(plan.refill_ids)}: a stage before the shuffle skipped or changed rows of the refill"
                )
            rows: dict = {}
            if chunks:
                names = chunks[0].keys()
                rows = {n: np.concatenate([c[n] for c in chunks]) for n in names}
                rows[IDS] = plan.refill_ids
            buf, released, drained = self.restore(plan, rng, log, rows)
            if buf is not None:
                state["buffer"] = self._buffer = buf
            state["drained"] = state["drained"] or drained
            return released

        def on_item(item: Item) -> list[Item]:
            if item.origin is not None and item.origin.refill:
                if state["refilled"]:
                    raise PipelineError(f"stage {self.name!r}: refill rows came after new input")
                state["refill"].append(dict(item.chunk))
                return []
            released = [] if state["refilled"] else finish_refill()
            chunk = dict(item.chunk)
            if IDS in chunk:
                raise PipelineError(f"stage {self.name!r}: column name {IDS!r} is reserved")
            rows = num_rows(chunk)  # the chunk's own length (a map upstream may have changed it)
            position = log.position  # chunks added before this one
            if not live(position):
                released += apply_pending(position)
            if not state["row_bytes"]:  # the buffer's row: the chunk's columns and the 8-byte row id
                state["row_bytes"] = log.row_bytes = 8 + sum(
                    c.itemsize * int(np.prod(c.shape[1:], dtype=np.int64)) for c in chunk.values()
                )
            buf = state["buffer"]
            if buf is None:
                if not live(position):
                    raise PipelineError(f"stage {self.name!r}: the resumed log adds a chunk before the buffer exists")
                buf = new_buffer(self.capacity(state["row_bytes"]))
            state["chunk_rows"] = max(state["chunk_rows"], rows)
            if live(position):
                released += resize(buf, self.capacity(state["row_bytes"]))
            log.add(item.origin.read_at if item.origin is not None else None, item.rows, rows, self.name)
            start = table.add(item.origin, rows) if item.origin is not None else table.total
            if item.origin is None:
                table.total += rows
            chunk[IDS] = np.arange(start, start + rows, dtype=np.int64)
            try:
                released += buf.add(chunk)
            except ValueError as exc:
                raise PipelineError(f"stage {self.name!r}: {exc}") from None
            spacing = max(ANCHOR_MIN_SPACING, buf.capacity // state["chunk_rows"])
            if isinstance(buf, ShuffleBuffer) and log.position - state["anchor_k"] >= spacing:
                # about a buffer's worth of input since the last anchor: the buffer after this step, so a
                # deep resume replays from here (``resume.ANCHOR_MIN_CHUNKS``); a copy of its ids only
                state["anchor_k"] = log.position
                emitted = state["emitted"] + sum(len(c[IDS]) for c in released)
                log.anchor(emitted, rng, buf.capacity, buf.column_copy(IDS))
            return emit(released)

        def on_idle() -> list[Item]:
            buf = state["buffer"]
            if buf is None or not state["refilled"] or not live(log.position):
                return []
            return emit(resize(buf, self.capacity(state["row_bytes"])))

        def on_end() -> Iterator[Item]:
            """The end of input, one item at a time: each chunk of the drain is built only once the one
            before it is handed over, so the buffer gives its rows back as they leave (``drain``)."""
            released = [] if state["refilled"] else finish_refill()
            yield from emit(released)
            if log.pending:
                for chunk in apply_pending(log.position):
                    yield from emit([chunk])
            buf = state["buffer"]
            if buf is not None and not state["drained"]:
                log.event(DRAIN, state["chunk_rows"])
                state["drained"] = True
                for chunk in buf.drain(state["chunk_rows"]):
                    yield from emit([chunk])

        stats = self.stats.worker(0)
        epoch.spawn(lambda: sequential_loop(stats, inp, out, on_item, on_end, on_idle), self.name)
        return out


class BatchStage(Stage):
    """Rebatches to exactly ``batch_rows`` rows (the last batch short unless ``drop_last``)."""

    kind = "batch"
    resume_role = RECUTS

    def __init__(self, name: str, batch_rows: int, drop_last: bool) -> None:
        super().__init__(name)
        self.batch_rows = batch_rows
        self.drop_last = drop_last
        self._batcher: Batcher | None = None
        self._resume: StreamPlan | None = None  # loaded (``load_state_dict``), taken by the next start

    # ---- its part of a pipeline's state (a pipeline without a shuffle) --------------------------------
    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "batch_rows": self.batch_rows, "drop_last": self.drop_last}

    def state_dict(self, epoch: EpochContext, delivered: int) -> dict[str, Any]:
        return input_log_state(self, epoch, delivered)

    def load_state_dict(self, state: Mapping[str, Any] | None, position: Position) -> None:
        """The input log of a pipeline without a shuffle: checked against the source, then the plan
        that skips the delivered rows (``resume.stream_replay``); None for a batch stage after a shuffle
        (its batches are cut again from the shuffle's resumed output)."""
        self._resume = None
        if state is None:
            return
        check_log(state, position.source, 1, f"{position.where}: shuffle", steps_allowed=False)
        plan = stream_replay(state, position.rows, position.where)
        position.read = plan.read
        self._resume = plan

    def detach(self) -> None:
        super().detach()
        self._batcher = None

    def internal_bytes(self) -> int:
        b = self._batcher
        return b.nbytes if b is not None else 0

    def queue_capacity(self) -> int:
        return 2

    def start(self, epoch: EpochContext, inp: Channel | None) -> Channel:
        assert inp is not None
        out = epoch.channel(f"{self.name}.out", max_items=lambda: 2)
        self._out = out
        batcher = self._batcher = Batcher(self.batch_rows, self.drop_last)
        plan, self._resume = self._resume, None
        log: ShuffleLog | None = None
        if epoch.shuffle_log is None:  # no stage before it keeps the epoch's input log: this one does
            log = epoch.shuffle_log = plan.log if plan is not None else ShuffleLog()

        def wrap(pairs: list[tuple[dict, Origin]]) -> list[Item]:
            return [Item(c, o, num_rows(c), nbytes(c)) for c, o in pairs]

        def on_item(item: Item) -> list[Item]:
            lengths = {len(c) for c in item.chunk.values()}
            if len(lengths) > 1:
                sizes = {k: len(v) for k, v in item.chunk.items()}
                raise PipelineError(f"stage {self.name!r}: input chunk has unequal column lengths {sizes}")
            if log is not None and not (item.origin is not None and item.origin.refill):
                # a resumed chunk's tail (refill) is in the log already, as the whole chunk
                log.add(item.origin.read_at if item.origin is not None else None, item.rows, num_rows(item.chunk), self.name)
            try:
                return wrap(batcher.add(item.chunk, item.origin))
            except ValueError as exc:
                raise PipelineError(f"stage {self.name!r}: {exc}") from None

        def on_end() -> list[Item]:
            try:
                return wrap(batcher.flush())
            except ValueError as exc:
                raise PipelineError(f"stage {self.name!r}: {exc}") from None

        stats = self.stats.worker(0)
        epoch.spawn(lambda: sequential_loop(stats, inp, out, on_item, on_end), self.name)
        return out


class PrefetchStage(Stage):
    """A buffer of ready batches in front of the consumer: ``depth`` items and ``buffer_mb`` bytes at most.

    After a one-thread stage it adopts that stage's output channel (no thread of its own; its starved
    time is the consumer's wait on an empty buffer, its blocked time the producer's wait on a full one);
    after a pool it runs a thread that moves items into its own bounded channel.
    """

    kind = "prefetch"
    resume_role = ROW_WISE

    def __init__(self, name: str, depth: int, buffer_mb: int, max_mb: int) -> None:
        super().__init__(name)
        self.depth = depth
        self._mb = buffer_mb
        self.knobs.append(Knob(f"{name}.buffer_mb", "mb", 1, max_mb, lambda: self._mb, self._set_mb))

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "depth": self.depth}

    def _set_mb(self, value: int) -> None:
        self._mb = value

    def queue_capacity(self) -> int:
        return self.depth

    def queue_fill(self) -> float:
        out = self._out
        if out is None:
            return 0.0
        return min(1.0, max(out.items / self.depth, out.bytes / (self._mb * MB)))

    def held_out(self) -> Channel | None:
        return self._out  # also when it is the adopted channel of the stage before

    def start(self, epoch: EpochContext, inp: Channel | None) -> Channel:
        assert inp is not None
        stats = self.stats.worker(0)
        if inp.sequential:
            # after a one-thread stage (batch, shuffle), the prefetch buffer is that stage's output
            # channel with this stage's bounds: the same overlap, without a thread that only moves items
            # (each hand-over between threads costs a wake-up and a GIL switch per batch)
            inp.adopt(lambda: self.depth, lambda: self._mb * MB, stats)
            self._out = inp
            return inp
        out = epoch.channel(
            f"{self.name}.out", max_items=lambda: self.depth, max_bytes=lambda: self._mb * MB
        )
        self._out = out
        epoch.spawn(lambda: sequential_loop(stats, inp, out, lambda item: [item], lambda: []), self.name)
        return out
