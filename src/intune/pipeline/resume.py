"""Resuming an epoch mid-way: the contract between stages, the epoch's input log, and its replays.

Owns what the stages share to resume an epoch (docs/resume.md): each stage's role (``SOURCE``,
``ROW_WISE``, ``RECUTS``, ``REORDERS``), the ``Position`` a loaded state is walked back with from the
consumer to the source, and the ``ReadRequest`` a resumed read stage follows; the input log a
recording stage keeps (``ShuffleLog``), its checks against the pipeline's bounds (``check_log``), and
its two replays: on row ids for a slot shuffle (``replay`` -> ``ShufflePlan``) and in input order for a
pipeline without a shuffle (``stream_replay`` -> ``StreamPlan``). A session shuffle's replay is in
``session_resume``. The stages call it: each one's ``state_dict`` / ``load_state_dict`` are its own
(``stages``, ``serial_stages``), and ``state`` composes them into a pipeline's state. It must not read
files, run stages, or import the stages or the engine.

Why the state is small. With ``deterministic=True`` the shuffle's input is a fixed sequence of chunks
(units read in order), and its random draws depend only on sizes: each chunk's row count, the capacity
at each step and the generator ``default_rng([seed, epoch])``, never on values. So the state is the
consumer's position (rows and batches delivered), and the shuffle's log: each input chunk's address
``(unit, i)`` and rows, and every step that changed the capacity or let rows out outside ``add`` (a
``buffer_mb`` change, a shrink, the final drain). Replaying the log on row ids only, up to the step
whose output crosses the consumer's position, gives the buffer's exact contents (ids in slot order) and
the generator's state; a resume reads those rows again ("the refill"), and the source from the chunk
after the last replayed one.

Why every field is checked before the replay. A checkpoint's sha256 detects damage, not intent: anyone
can write a state and its digest. The replay allocates row ids for each chunk and for the buffer, so a
state claiming a 10**10-row chunk would allocate 75 GiB; ``check_log`` bounds every field against the
pipeline first (chunk rows by the source's chunk size, capacities by the shuffle's ``buffer_rows``,
positions by the log's own length) and names the field it refuses.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from intune.checkpoint import CheckpointError, ResumeError, brief
from intune.pipeline.shuffle import IDS, ShuffleBuffer
from intune.rng import rng_from_state, rng_state

# ---- the stages' roles ---------------------------------------------------------------------------
# How a stage's output after the consumer's position is found again (``state.recorder``).
SOURCE = "source"  # reads again what the recording stage asks for (``ReadRequest``)
ROW_WISE = "row-wise"  # each output row comes from one input row, in order: nothing to keep (map, prefetch)
RECUTS = "re-cuts"  # re-cuts rows into chunks: keeps the input log when no stage before it does (batch)
REORDERS = "re-orders"  # re-orders rows by its own state: keeps the input log; one per pipeline (shuffle)
NO_RULE = ""  # a stage intune has no resume rule for (a custom stage): its pipeline cannot be resumed

# event kinds in the shuffle log: (position = chunks added before it, kind, a, b)
INIT, RESIZE, DRAIN = 0, 1, 2
Step = tuple[int, int, int, int]
# A state deeper into its epoch than this many chunks carries an anchor (the buffer's ids in slot order
# and the generator, as they were a buffer's worth of input or less before the position): its replay
# starts there instead of at the epoch's start, so it costs a few buffers' steps wherever the position
# is, for 4 bytes per buffered row in the state (0.8 MB at 200k rows). Below it, replaying from the
# start is cheaper than the anchor's bytes (0.16 ms per 8192-row chunk at a 200k buffer).
ANCHOR_MIN_CHUNKS = 2048
# Anchors are taken every buffer's worth of input (at least every 4 chunks) and the last few kept: the
# shuffle runs ahead of its consumer by the queues downstream, and a state can only use an anchor the
# consumer has passed (a copy of the buffer's ids each: 1.6 MB at 200k rows).
KEPT_ANCHORS, ANCHOR_MIN_SPACING = 6, 4
# The bytes a replay allocates per row of a chunk at most (its ids, and a chunk larger than the buffer
# merged and permuted with it): a source that does not fix its chunk size is bounded by memory with it.
REPLAY_BYTES_PER_ROW = 32
# Row ids and positions are int64 in the engine; a state's numbers beyond this are refused.
MAX_INDEX = 1 << 62

__all__ = [
    "ANCHOR_MIN_CHUNKS",
    "NO_RULE",
    "RECUTS",
    "REORDERS",
    "ROW_WISE",
    "SOURCE",
    "Position",
    "ReadRequest",
    "ResumeError",
    "ShuffleLog",
    "ShufflePlan",
    "SourceBounds",
    "StreamPlan",
    "check_log",
    "replay",
    "stream_replay",
]


# ---- what a loaded state hands from stage to stage ------------------------------------------------


@dataclass(frozen=True)
class SourceBounds:
    """What a state's read addresses and chunk sizes are checked against: the read stage's source."""

    units: int | None  # read units of a parallel source; None for a stream (its length is unknown)
    max_chunk_rows: int  # the most rows a chunk of it holds (or, unknown, what memory allows a replay)


@dataclass
class ReadRequest:
    """What a resumed read stage sends before and instead of its usual input.

    ``refill``: ``{unit: {chunk: (rows read then, local row indices to send again, ascending)}}``, the
    rows the recording stage held at the checkpoint, sent first and marked as refill; ``after``: the
    last chunk the checkpointed run's recorder had taken in (``(unit, chunk)``), read on from the chunk
    after it (None: from the start)."""

    refill: dict[int, dict[int, tuple[int, np.ndarray]]] = field(default_factory=dict)
    after: tuple[int, int] | None = None


@dataclass
class Position:
    """Where a loaded state resumes, handed by ``Pipeline.load_state_dict`` from the consumer's end back
    to the source: each stage loads its own part and may leave a ``read`` request for the read stage."""

    epoch: int
    rows: int  # rows delivered in the epoch before the checkpoint (0: the epoch starts afresh)
    source: SourceBounds
    where: str = "load_state_dict()"
    read: ReadRequest | None = None


@dataclass
class ShufflePlan:
    """What a resumed slot shuffle does before it follows its input (built by ``replay``)."""

    read: ReadRequest
    delivered: int  # rows of the epoch delivered before the checkpoint (the rows let out before it)
    refill_ids: np.ndarray  # ascending: the row ids the refill brings
    buffer_ids: np.ndarray | None  # slot order; None: no buffer yet
    straddle_ids: np.ndarray  # let out at the checkpoint's step, not yet delivered
    rng: np.random.Generator
    capacity: int
    next_id: int  # the row id of the next chunk added
    log: ShuffleLog  # the log up to the replay's stop (the resumed epoch appends to it)
    pending: list[Step]  # logged steps after the stop, applied where they ran
    logged_until: int  # chunks the checkpointed run had added: below it, only logged steps
    chunk_rows: int  # the largest chunk added so far (the shuffle's max_out)


@dataclass
class StreamPlan:
    """What a resumed pipeline without a shuffle does: skip the delivered rows (``stream_replay``)."""

    read: ReadRequest
    log: ShuffleLog


# ---- the input log ----------------------------------------------------------------------------------


def steps(events: Any) -> list[Step]:
    """A log's steps (an ``(n, 4)`` integer array, or rows of four) as tuples of Python ints."""
    return [(int(p), int(k), int(a), int(b)) for p, k, a, b in np.asarray(events, dtype=np.int64).reshape(-1, 4)]


class ShuffleLog:
    """What a recording stage saw in one epoch: its input chunks and the steps that drew outside ``add``.

    The stage's thread appends; ``snapshot`` (the consumer's thread) copies under the lock. A chunk
    without a read address, or whose rows differ from the rows read (a map before the shuffle that
    drops rows), makes the epoch unresumable: ``problem`` says why, and ``state_dict`` raises it.
    """

    def __init__(self, units: list[int] | None = None, items: list[int] | None = None,
                 rows: list[int] | None = None, events: list[Step] | None = None,
                 row_bytes: int = 0, releases: list[list[int]] | None = None,
                 rng_states: list[dict[str, Any]] | None = None, sessions: bool = False, first_chunk: int = 0,
                 first_event: int = 0, first_id: int = 0, max_rows_before: int = 0) -> None:
        self._lock = threading.Lock()
        # a log may start past the epoch's start (a resumed one whose state carried an anchor): chunk
        # ``first_chunk`` is its first, starting at row id ``first_id``; ``first_event`` steps came before
        self.first_chunk, self.first_event, self.first_id = first_chunk, first_event, first_id
        self.max_rows_before = max_rows_before  # the largest chunk before ``first_chunk``
        self.units = units or []
        self.items = items or []
        self.rows = rows or []
        self.events = events or []
        self.row_bytes = row_bytes
        self.problem = ""
        # a session shuffle's releases (``session_resume``): 8 integers and the generator's state each
        self.sessions = sessions
        self.releases = releases or []
        self.rng_states = rng_states or []
        # a resumed epoch's steps that the checkpointed run had taken but this one has not yet: a state
        # taken now keeps them (after the steps taken), so a second resume applies them where they ran
        self.pending: list[Step] = []
        # the slot buffer's latest anchors: {k, e, emitted, rng, capacity, ids} after a step; a log that
        # starts past the epoch's start pins the anchor it starts from (its newer ones may all lie ahead
        # of the consumer, and without an anchor it could not be replayed)
        self.anchors: list[dict[str, Any]] = []
        self.pinned: dict[str, Any] | None = None

    @property
    def position(self) -> int:
        """Chunks added in the epoch so far (the position of the next step)."""
        return self.first_chunk + len(self.rows)

    def add(self, read_at: tuple[int, int] | None, read_rows: int, rows: int, stage: str) -> None:
        with self._lock:
            if not self.problem:
                if read_at is None:
                    self.problem = f"a chunk reached stage {stage!r} without a read address (a custom source or stage, or a map_rows before the shuffle that skipped rows)"
                elif read_rows != rows:
                    self.problem = (
                        f"a chunk of {read_rows} source rows reached stage {stage!r} with {rows} rows: a map "
                        "before the shuffle changed the row count, so row ids no longer name source rows"
                    )
            unit, item = read_at if read_at is not None else (-1, -1)
            self.units.append(unit)
            self.items.append(item)
            self.rows.append(rows)

    def event(self, kind: int, a: int, b: int = 0) -> None:
        with self._lock:
            self.events.append((self.first_chunk + len(self.rows), kind, a, b))

    def take_pending(self, position: int) -> list[Step]:
        """The pending steps at ``position``, moved to the steps taken (one lock: a snapshot sees each
        step once, taken or pending)."""
        with self._lock:
            due = []
            while self.pending and self.pending[0][0] == position:
                due.append(self.pending.pop(0))
            self.events.extend(due)
            return due

    def anchor(self, emitted: int, rng: np.random.Generator, capacity: int, ids: np.ndarray) -> None:
        """Record the buffer after the step just taken (the shuffle thread, between two steps)."""
        with self._lock:
            self.anchors.append({
                "k": self.first_chunk + len(self.rows), "e": self.first_event + len(self.events), "emitted": int(emitted),
                "rng": rng_state(rng), "capacity": int(capacity), "ids": ids,
            })
            del self.anchors[:-KEPT_ANCHORS]

    def release(self, fields: list[int], state: dict[str, Any]) -> None:
        with self._lock:
            self.releases.append(fields)
            self.rng_states.append(state)

    def snapshot(self, delivered: int | None = None) -> dict[str, Any]:
        """The log as plain arrays; with ``delivered``, the latest anchor at or before that position
        when it is deep enough to be worth its bytes (``ANCHOR_MIN_CHUNKS``)."""
        with self._lock:
            if self.problem:
                raise ResumeError(f"this epoch cannot be resumed: {self.problem}")
            events = np.array(self.events + self.pending, dtype=np.int64).reshape(-1, 4)
            units = np.array(self.units, dtype=np.int64)
            items = np.array(self.items, dtype=np.int32)
            rows = np.array(self.rows, dtype=np.int32)
            first = (self.first_chunk, self.first_event, self.first_id, self.max_rows_before)
            anchor = None
            known = ([self.pinned] if self.pinned is not None else []) + self.anchors
            usable = [a for a in known if delivered is not None and a["emitted"] <= delivered]
            if usable and (usable[-1]["k"] >= ANCHOR_MIN_CHUNKS or self.first_chunk):
                a = usable[-1]
                ids = a["ids"]
                base = int(ids.min()) if len(ids) else self.first_id
                offsets = ids - base
                small = not len(ids) or int(offsets.max()) < 2**32
                anchor = {
                    **{key: a[key] for key in ("k", "e", "emitted", "rng", "capacity")},
                    "base": base,
                    "ids": offsets.astype(np.uint32 if small else np.int64),
                }
                # the chunks before the one holding the anchor's oldest row, and the steps before the
                # anchor, are never needed again: the state drops them, so it stays near the anchor's size
                starts = self.first_id + np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
                c0 = int(np.searchsorted(starts, base, side="right")) - 1
                c0 = max(0, min(c0, a["k"] - self.first_chunk))
                e0 = a["e"] - self.first_event
                first = (
                    self.first_chunk + c0, a["e"], int(starts[c0]),
                    max(self.max_rows_before, int(rows[:c0].max()) if c0 else 0),
                )
                units, items, rows, events = units[c0:], items[c0:], rows[c0:], events[e0:]
            elif self.first_chunk or self.first_event:
                raise ResumeError("a resumed log that starts past the epoch's start has no anchor before this position")
            out: dict[str, Any] = {
                "units": units,
                "items": items,
                "rows": rows,
                "events": events,
                "row_bytes": int(self.row_bytes),
                "first_chunk": first[0],
                "first_event": first[1],
                "first_id": first[2],
                "max_rows_before": first[3],
            }
            if anchor is not None:
                out["anchor"] = anchor
            if self.sessions:
                out["releases"] = np.array(self.releases, dtype=np.int64).reshape(-1, 8)
                out["rng_states"] = [dict(s) for s in self.rng_states]
            return out


# ---- a state's log, checked against the pipeline -----------------------------------------------------

_LOG_KEYS = ("units", "items", "rows", "events", "row_bytes")


def int_field(value: Any, name: str, lo: int = 0, hi: int = MAX_INDEX) -> int:
    """``value`` as an int in ``[lo, hi]``, else ``CheckpointError`` naming the field ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise CheckpointError(f"{name}: {brief(value)} is not an integer")
    if not lo <= int(value) <= hi:
        raise CheckpointError(f"{name}: {int(value)} is out of bounds, valid range is [{lo}, {hi}]")
    return int(value)


def int_array(value: Any, name: str, lo: int, hi: int, columns: int | None = None) -> np.ndarray:
    """``value`` as an int64 array (1-D, or ``(n, columns)``) whose every entry is in ``[lo, hi]``."""
    if not isinstance(value, (np.ndarray, list)):
        raise CheckpointError(f"{name}: a {type(value).__name__}, not an array of integers")
    array = np.asarray(value)
    if array.size and array.dtype.kind not in "iu":
        raise CheckpointError(f"{name}: an array of {array.dtype}, not of integers")
    shape_ok = array.ndim == 1 if columns is None else (array.ndim == 2 and array.shape[1] == columns) or array.size == 0
    if not shape_ok:
        want = "a 1-D array" if columns is None else f"an (n, {columns}) array"
        raise CheckpointError(f"{name}: shape {list(array.shape)}, expected {want}")
    if array.size and array.dtype == np.uint64 and int(array.max()) > hi:
        raise CheckpointError(f"{name}: holds {int(array.max())}, out of bounds [{lo}, {hi}]")
    array = array.astype(np.int64).reshape(-1, columns) if columns else array.astype(np.int64)
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < lo or high > hi:
            bad = low if low < lo else high
            raise CheckpointError(f"{name}: holds {bad}, out of bounds [{lo}, {hi}]")
    return array


def check_log(log: Any, source: SourceBounds, max_capacity: int, where: str, *, steps_allowed: bool) -> None:
    """Bound every field of a state's input log (``where`` names it) before anything is replayed.

    Chunk rows by the source's chunk size, read addresses by its units (a stream's chunk is always
    item 0), steps (kinds, capacities up to ``max_capacity``, positions within the log) and an anchor
    (its position, capacity, generator and ids) by the log itself. ``steps_allowed``: a shuffle's log
    has steps; a pipeline without a shuffle logs none.
    """
    if not isinstance(log, Mapping):
        raise CheckpointError(f"{where}: the input log is a {type(log).__name__}, not a dict")
    missing = [k for k in _LOG_KEYS if k not in log]
    if missing:
        raise CheckpointError(f"{where}: the input log lacks {missing}")
    units = int_array(log["units"], f"{where}.units", 0, MAX_INDEX if source.units is None else source.units - 1)
    items = int_array(log["items"], f"{where}.items", 0, 0 if source.units is None else MAX_INDEX)
    rows = int_array(log["rows"], f"{where}.rows", 0, source.max_chunk_rows)
    if not len(units) == len(items) == len(rows):
        raise CheckpointError(
            f"{where}: units, items and rows differ in length ({len(units)}, {len(items)}, {len(rows)})"
        )
    int_field(log["row_bytes"], f"{where}.row_bytes", 0, 1 << 40)
    first_chunk = int_field(log.get("first_chunk", 0), f"{where}.first_chunk")
    first_event = int_field(log.get("first_event", 0), f"{where}.first_event")
    first_id = int_field(log.get("first_id", 0), f"{where}.first_id")
    int_field(log.get("max_rows_before", 0), f"{where}.max_rows_before", 0, source.max_chunk_rows)
    if first_id + int(rows.sum()) > MAX_INDEX:
        raise CheckpointError(f"{where}.rows: {int(rows.sum())} rows from row {first_id} overflow the row ids")
    total = first_chunk + len(rows)
    events = int_array(log["events"], f"{where}.events", 0, MAX_INDEX, columns=4)
    if len(events) and not steps_allowed:
        raise CheckpointError(f"{where}.events: {len(events)} steps in the log of a pipeline without a shuffle")
    if len(events):
        positions, kinds = events[:, 0], events[:, 1]
        # a resumed run's log keeps the steps its checkpointed run took further on (pending): their
        # positions may lie past the log's chunks
        if (positions < first_chunk).any() or (np.diff(positions) < 0).any():
            raise CheckpointError(f"{where}.events: step positions before chunk {first_chunk} or out of order")
        if not np.isin(kinds, (INIT, RESIZE, DRAIN)).all():
            raise CheckpointError(f"{where}.events: unknown step kind {int(kinds[~np.isin(kinds, (INIT, RESIZE, DRAIN))][0])}")
        capacity = events[kinds != DRAIN, 2]
        if len(capacity) and (capacity.min() < 1 or capacity.max() > max_capacity):
            raise CheckpointError(f"{where}.events: a capacity outside [1, {max_capacity}] (the stage's buffer_rows)")
        cuts = np.concatenate([events[kinds == RESIZE, 3], events[kinds == DRAIN, 2]])
        if len(cuts) and (cuts.min() < 1 or cuts.max() > source.max_chunk_rows):
            raise CheckpointError(f"{where}.events: a chunk size outside [1, {source.max_chunk_rows}]")
    anchor = log.get("anchor")
    if anchor is not None:
        check_anchor(anchor, first_chunk, total, first_event, first_event + len(events), first_id, max_capacity, f"{where}.anchor")


def check_anchor(anchor: Any, first_chunk: int, total: int, first_event: int, last_event: int, first_id: int,
                 max_capacity: int, where: str) -> None:
    if not isinstance(anchor, Mapping):
        raise CheckpointError(f"{where}: a {type(anchor).__name__}, not a dict")
    missing = [k for k in ("k", "e", "emitted", "rng", "capacity", "base", "ids") if k not in anchor]
    if missing:
        raise CheckpointError(f"{where}: lacks {missing}")
    int_field(anchor["k"], f"{where}.k", first_chunk, total)
    int_field(anchor["e"], f"{where}.e", first_event, last_event)
    int_field(anchor["emitted"], f"{where}.emitted")
    int_field(anchor["capacity"], f"{where}.capacity", 1, max_capacity)
    base = int_field(anchor["base"], f"{where}.base", first_id)
    ids = int_array(anchor["ids"], f"{where}.ids", 0, MAX_INDEX - base)
    if len(ids) > max_capacity:  # a shrunk buffer may hold more than its capacity, never more than buffer_rows
        raise CheckpointError(f"{where}.ids: {len(ids)} ids in a buffer of at most {max_capacity} rows (buffer_rows)")
    rng_from_state(anchor["rng"], f"{where}.rng")


# ---- the replays --------------------------------------------------------------------------------------


def replay(shuffle: Mapping[str, Any], seed: int, epoch: int, delivered: int, where: str) -> ShufflePlan:
    """Replay a shuffle log on row ids until its output has covered ``delivered`` rows.

    Steps run in the order they ran: the events logged at position ``k`` (chunks added before them),
    then chunk ``k``'s ``add``. The replay stops after the step whose output reaches ``delivered``
    (at once when nothing was delivered); that step's rows past ``delivered`` are the straddle, let
    out but not delivered. The log must have passed ``check_log`` (its sizes are what is allocated).
    """
    units = np.asarray(shuffle["units"], dtype=np.int64)
    items = np.asarray(shuffle["items"], dtype=np.int64)
    rows = np.asarray(shuffle["rows"], dtype=np.int64)
    events = steps(shuffle["events"])
    if not (len(units) == len(items) == len(rows)) or (rows < 0).any():
        raise CheckpointError(f"{where}: the shuffle log's chunk arrays are inconsistent")
    first_chunk, first_event = int(shuffle.get("first_chunk", 0)), int(shuffle.get("first_event", 0))
    first_id, max_before = int(shuffle.get("first_id", 0)), int(shuffle.get("max_rows_before", 0))
    starts = first_id + np.concatenate([[0], np.cumsum(rows)])
    rng = np.random.default_rng([seed, epoch])
    buf: ShuffleBuffer | None = None
    emitted = 0
    straddle = np.empty(0, np.int64)
    k, e = first_chunk, first_event  # absolute: chunks added and steps taken in the epoch
    total = first_chunk + len(rows)
    anchor = shuffle.get("anchor")
    if anchor is None and (first_chunk or first_event):
        raise CheckpointError(f"{where}: the shuffle log starts past the epoch's start but has no anchor")
    if anchor is not None:
        # start from the buffer as it was after the anchor's step, not from the epoch's start
        k, e, emitted = int(anchor["k"]), int(anchor["e"]), int(anchor["emitted"])
        if not (first_chunk <= k <= total and first_event <= e <= first_event + len(events) and emitted <= delivered):
            raise CheckpointError(f"{where}: the shuffle log's anchor lies outside the log or past the position")
        rng = rng_from_state(anchor["rng"], f"{where}.anchor.rng")
        buf = ShuffleBuffer(rng, int(anchor["capacity"]))
        ids = np.asarray(anchor["ids"], dtype=np.int64) + int(anchor["base"])
        buf.restore({IDS: ids})
        anchor_used = {key: anchor[key] for key in ("k", "e", "emitted", "rng", "capacity")} | {"ids": ids}
    else:
        anchor_used = None
    stopped = delivered <= emitted

    def step_out(chunks: list[dict[str, np.ndarray]]) -> None:
        nonlocal emitted, straddle, stopped
        if not chunks:
            return
        ids = np.concatenate([c[IDS] for c in chunks])
        before, emitted = emitted, emitted + len(ids)
        if emitted >= delivered:
            straddle = ids[delivered - before :].copy()
            stopped = True

    while not stopped:
        if e - first_event < len(events) and events[e - first_event][0] == k:
            _, kind, a, b = events[e - first_event]
            e += 1
            if kind == INIT:
                buf = ShuffleBuffer(rng, a)
            elif buf is None:
                raise CheckpointError(f"{where}: the shuffle log resizes a buffer before it exists")
            elif kind == RESIZE:
                step_out(buf.resize(a, max_out=b))
            elif kind == DRAIN:
                step_out(list(buf.drain(a)))
            else:
                raise CheckpointError(f"{where}: unknown shuffle log event {kind}")
            continue
        if k >= total:
            raise CheckpointError(
                f"{where}: the shuffle log covers {emitted} rows let out, fewer than the {delivered} delivered"
            )
        if buf is None:
            raise CheckpointError(f"{where}: the shuffle log adds a chunk before the buffer exists")
        ids = np.arange(starts[k - first_chunk], starts[k - first_chunk + 1], dtype=np.int64)
        k += 1
        step_out(buf.add({IDS: ids}))
    buffer_ids = None
    capacity = 0
    if buf is not None:
        capacity = buf.capacity
        buffer_ids = buf.column_copy(IDS)
    needed = np.sort(np.concatenate([buffer_ids if buffer_ids is not None else np.empty(0, np.int64), straddle]))
    if len(needed) and needed[0] < first_id:
        raise CheckpointError(f"{where}: the shuffle log was cut after a row the buffer still holds")
    kl, el = k - first_chunk, e - first_event  # the stop, in the log's own arrays
    log = ShuffleLog(
        units[:kl].tolist(), items[:kl].tolist(), rows[:kl].tolist(), events[:el], int(shuffle["row_bytes"]),
        first_chunk=first_chunk, first_event=first_event, first_id=first_id, max_rows_before=max_before,
    )
    if anchor_used is not None:
        log.pinned = anchor_used  # a state taken from the resumed run may start from it too
    return ShufflePlan(
        read=ReadRequest(
            refill_map(units, items, rows, starts, needed),
            (int(units[kl - 1]), int(items[kl - 1])) if kl else None,
        ),
        delivered=delivered,
        refill_ids=needed,
        buffer_ids=buffer_ids,
        straddle_ids=straddle,
        rng=rng,
        capacity=capacity,
        next_id=int(starts[kl]),
        log=log,
        pending=events[el:],
        logged_until=total,
        chunk_rows=max(1, max_before, int(rows[:kl].max()) if kl else 1),
    )


def stream_replay(log: Mapping[str, Any], delivered: int, where: str) -> StreamPlan:
    """A pipeline without a shuffle delivers its input in order: the plan skips the first ``delivered``
    rows (the chunk holding the next row is sent again from that row on, as refill)."""
    units = np.asarray(log["units"], dtype=np.int64)
    items = np.asarray(log["items"], dtype=np.int64)
    rows = np.asarray(log["rows"], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(rows)])
    if delivered > starts[-1]:
        raise CheckpointError(f"{where}: the input log covers {int(starts[-1])} rows, fewer than the {delivered} delivered")
    k = int(np.searchsorted(starts, delivered, side="right")) - 1  # the chunk holding row ``delivered``
    if k < len(rows) and delivered > starts[k]:
        kept = k + 1  # its tail is sent again
        refill = {int(units[k]): {int(items[k]): (int(rows[k]), np.arange(delivered - starts[k], rows[k]))}}
    else:
        kept, refill = min(k, len(rows)), {}
    return StreamPlan(
        read=ReadRequest(refill, (int(units[kept - 1]), int(items[kept - 1])) if kept else None),
        log=ShuffleLog(units[:kept].tolist(), items[:kept].tolist(), rows[:kept].tolist(), [], int(log.get("row_bytes", 0))),
    )


def refill_map(
    units: np.ndarray, items: np.ndarray, rows: np.ndarray, starts: np.ndarray, needed: np.ndarray
) -> dict[int, dict[int, tuple[int, np.ndarray]]]:
    """``{unit: {item: (rows, local indices)}}``: where each needed row id (ascending) is read."""
    out: dict[int, dict[int, tuple[int, np.ndarray]]] = {}
    which = np.searchsorted(starts, needed, side="right") - 1
    for chunk in np.unique(which):
        local = needed[which == chunk] - starts[chunk]
        unit, item = int(units[chunk]), int(items[chunk])
        out.setdefault(unit, {})[item] = (int(rows[chunk]), local)
    return out
