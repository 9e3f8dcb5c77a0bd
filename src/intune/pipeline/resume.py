"""Resuming an epoch mid-way: what a pipeline's state holds, and how a resume rebuilds the shuffle.

Owns the shuffle's record of an epoch (``ShuffleLog``), the replay of that record on row ids
(``replay``), the plan a resumed epoch follows (``ResumePlan``: which rows to read again, where the
read stage picks up, the buffer's slots and generator), the pipeline's fingerprint and the rules for
which pipelines can be resumed. The engine calls it (``Pipeline.state_dict`` / ``load_state_dict``);
the stages follow the plan. It must not read files or run stages itself.

Why the state is small. With ``deterministic=True`` the shuffle's input is a fixed sequence of chunks
(units read in order), and its random draws depend only on sizes: each chunk's row count, the capacity
at each step and the generator ``default_rng([seed, epoch])``, never on values. So the state is the
consumer's position (rows and batches delivered), and the shuffle's log: each input chunk's address
``(unit, i)`` and rows, and every step that changed the capacity or let rows out outside ``add`` (a
``buffer_mb`` change, a shrink, the final drain). Replaying the log on row ids only, up to the step
whose output crosses the consumer's position, gives the buffer's exact contents (ids in slot order) and
the generator's state; a resume reads those rows again ("the refill"), and the source from the chunk
after the last replayed one. A session shuffle (RecD) is resumed another way, by redoing one logged
release (``session_resume``); a pipeline without a shuffle delivers its input in order, so its resume
skips the delivered rows (``stream_replay``, the batch stage keeping the log). See docs/resume.md.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from intune.checkpoint import CheckpointError
from intune.pipeline.shuffle import IDS, ShuffleBuffer

if TYPE_CHECKING:
    from intune.pipeline.engine import Pipeline

STATE_VERSION = 1

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


def rng_state(rng: np.random.Generator) -> list[int]:
    """A PCG64 generator's state as four integers (what ``generator_at`` takes back)."""
    state = rng.bit_generator.state
    if state.get("bit_generator") != "PCG64":
        raise ValueError(f"resume needs a PCG64 generator, got {state.get('bit_generator')}")
    return [int(state["state"]["state"]), int(state["state"]["inc"]), int(state["has_uint32"]), int(state["uinteger"])]


def generator_at(values: list[int]) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int(values[0]), "inc": int(values[1])},
        "has_uint32": int(values[2]),
        "uinteger": int(values[3]),
    }
    return rng


def steps(events: Any) -> list[Step]:
    """A log's steps (an ``(n, 4)`` integer array, or rows of four) as tuples of Python ints."""
    return [(int(p), int(k), int(a), int(b)) for p, k, a, b in np.asarray(events, dtype=np.int64).reshape(-1, 4)]


class ResumeError(ValueError):
    """This pipeline cannot take or resume a checkpoint as asked (the message says why)."""


class ShuffleLog:
    """What a shuffle stage did in one epoch: its input chunks and the steps that drew outside ``add``.

    The shuffle thread appends; ``snapshot`` (the consumer's thread) copies under the lock. A chunk
    without a read address, or whose rows differ from the rows read (a map before the shuffle that
    drops rows), makes the epoch unresumable: ``problem`` says why, and ``state_dict`` raises it.
    """

    def __init__(self, units: list[int] | None = None, items: list[int] | None = None,
                 rows: list[int] | None = None, events: list[tuple[int, int, int, int]] | None = None,
                 row_bytes: int = 0, releases: list[list[int]] | None = None,
                 rng_states: list[list[int]] | None = None, sessions: bool = False, first_chunk: int = 0,
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
        self.pending: list[tuple[int, int, int, int]] = []
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

    def take_pending(self, position: int) -> list[tuple[int, int, int, int]]:
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

    def release(self, fields: list[int], rng_state: list[int]) -> None:
        with self._lock:
            self.releases.append(fields)
            self.rng_states.append(rng_state)

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
                out["rng_states"] = [list(s) for s in self.rng_states]  # 128-bit integers: in the JSON tree
            return out


@dataclass
class ResumePlan:
    """What a resumed epoch does differently, for the read stage and the shuffle stage."""

    epoch: int
    rows: int  # rows delivered before the checkpoint (epoch-global)
    batches: int
    shuffle_seed: int = 0
    # read stage: {unit: {item: (rows read then, local row indices to send again, ascending)}}
    refill: dict[int, dict[int, tuple[int, np.ndarray]]] = field(default_factory=dict)
    resume_after: tuple[int, int] | None = None  # the last chunk the replay added: read what follows it
    # shuffle stage
    refill_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # ascending
    buffer_ids: np.ndarray | None = None  # slot order; None: no buffer yet
    straddle_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # let out, not delivered
    rng: np.random.Generator | None = None
    capacity: int = 0
    next_id: int = 0  # the row id of the next chunk added
    log: ShuffleLog | None = None  # the log up to the replay's stop (the resumed epoch appends to it)
    pending: list[tuple[int, int, int, int]] = field(default_factory=list)  # logged steps after the stop
    logged_until: int = 0  # chunks the checkpointed run had added: below it, only logged steps
    chunk_rows: int = 1  # the largest chunk added so far (the shuffle's max_out)
    session_redo: dict[str, int] | None = None  # a session shuffle's release to redo (``session_resume``)


def replay(shuffle: Mapping[str, Any], seed: int, epoch: int, delivered: int, where: str) -> ResumePlan:
    """Replay a shuffle log on row ids until its output has covered ``delivered`` rows.

    Steps run in the order they ran: the events logged at position ``k`` (chunks added before them),
    then chunk ``k``'s ``add``. The replay stops after the step whose output reaches ``delivered``
    (at once when nothing was delivered); that step's rows past ``delivered`` are the straddle, let
    out but not delivered.
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
        rng = generator_at(list(anchor["rng"]))
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
    plan = ResumePlan(
        epoch=epoch,
        rows=delivered,
        batches=0,
        shuffle_seed=seed,
        refill_ids=needed,
        buffer_ids=buffer_ids,
        straddle_ids=straddle,
        rng=rng,
        capacity=capacity,
        next_id=int(starts[kl]),
        log=ShuffleLog(
            units[:kl].tolist(), items[:kl].tolist(), rows[:kl].tolist(), events[:el], int(shuffle["row_bytes"]),
            first_chunk=first_chunk, first_event=first_event, first_id=first_id, max_rows_before=max_before,
        ),
        pending=events[el:],
        logged_until=total,
        chunk_rows=max(1, max_before, int(rows[:kl].max()) if kl else 1),
        resume_after=(int(units[kl - 1]), int(items[kl - 1])) if kl else None,
    )
    if anchor_used is not None and plan.log is not None:
        plan.log.pinned = anchor_used  # a state taken from the resumed run may start from it too
    plan.refill = refill_map(units, items, rows, starts, needed)
    return plan


def stream_replay(log: Mapping[str, Any], epoch: int, delivered: int, where: str) -> ResumePlan:
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
    return ResumePlan(
        epoch=epoch,
        rows=delivered,
        batches=0,
        refill=refill,
        resume_after=(int(units[kept - 1]), int(items[kept - 1])) if kept else None,
        next_id=int(starts[kept]),
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


# ---- fingerprints ------------------------------------------------------------------------------------


def _file_facts(paths: list[str]) -> list[list[Any]]:
    import os

    out = []
    for path in paths:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = -1
        out.append([path, size])
    return out


def source_fingerprint(source: Any) -> dict[str, Any]:
    """The facts of a source that must match for a checkpoint to apply: files and sizes, columns,
    chunking (the shuffle's input chunks must be cut where they were)."""
    from intune.pipeline.criteo import CriteoTsvSource
    from intune.pipeline.sources import IterableSource, ParquetSource

    if isinstance(source, ParquetSource):
        return {
            "kind": "parquet",
            "files": _file_facts(source.paths),
            "columns": list(source.columns) if source.columns is not None else None,
            "chunk_rows": source.chunk_rows,
            "strings": source.strings,
        }
    if isinstance(source, CriteoTsvSource):
        return {
            "kind": "criteo_tsv",
            "files": _file_facts(source.paths),
            "chunk_rows": source.chunk_rows,
            "block_bytes": source.block_bytes,
            "on_error": source.on_error,
        }
    if isinstance(source, IterableSource):
        return {"kind": "iterable", "name": source.name}
    return {"kind": type(source).__name__}


def _function_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def stage_fingerprint(stage: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": stage.name, "kind": stage.kind}
    if stage.kind == "read":
        out["source"] = source_fingerprint(stage.source)
    elif stage.kind == "shuffle":
        out.update(buffer_rows=stage.buffer_rows, seed=stage.seed, by=getattr(stage, "by", None))
    elif stage.kind == "batch":
        out.update(batch_rows=stage.batch_rows, drop_last=stage.drop_last)
    elif stage.kind == "prefetch":
        out.update(depth=stage.depth)
    elif hasattr(stage, "fn"):
        out.update(mode=stage.mode, on_error=stage.on_error, fn=_function_name(stage.fn), type=type(stage).__name__)
    else:
        out["type"] = type(stage).__name__
    return out


def fingerprint(pipe: Pipeline) -> dict[str, Any]:
    shard = pipe.shard
    return {
        "deterministic": pipe.deterministic,
        "shard": None if shard is None else {"rank": shard.rank, "world_size": shard.world_size, "uneven": shard.uneven},
        "stages": [stage_fingerprint(s) for s in pipe._stages],
    }


def differences(saved: Any, here: Any, path: str = "") -> list[str]:
    """Where two fingerprints differ, as ``path: saved vs here`` lines."""
    if isinstance(saved, Mapping) and isinstance(here, Mapping):
        out = []
        for key in sorted(set(saved) | set(here)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in here:
                out.append(f"{sub}: {'missing' if key not in saved else repr(saved[key])} in the checkpoint, "
                           f"{'missing' if key not in here else repr(here[key])} here")
            else:
                out.extend(differences(saved[key], here[key], sub))
        return out
    if isinstance(saved, list) and isinstance(here, list) and len(saved) == len(here):
        out = []
        for i, (a, b) in enumerate(zip(saved, here, strict=True)):
            out.extend(differences(a, b, f"{path}[{i}]"))
        return out
    if saved != here:
        return [f"{path}: {saved!r} in the checkpoint, {here!r} here"]
    return []


def _describe_stages(prints: list[dict[str, Any]]) -> str:
    return " -> ".join(f"{p.get('name')}({p.get('kind')})" for p in prints)


def check_fingerprint(saved: Mapping[str, Any], here: Mapping[str, Any]) -> None:
    diffs = differences(saved, here)
    if not diffs:
        return
    if len(saved.get("stages", [])) != len(here.get("stages", [])):
        diffs = [
            f"stages: {_describe_stages(saved.get('stages', []))} in the checkpoint, "
            f"{_describe_stages(here.get('stages', []))} here"
        ] + [d for d in diffs if not d.startswith("stages")]
    shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
    raise CheckpointError(f"the checkpoint is from another pipeline: {shown}")


# ---- what can be resumed -----------------------------------------------------------------------------


def check_resumable(pipe: Pipeline) -> None:
    """Raise ``ResumeError`` for a pipeline whose epochs a checkpoint cannot resume exactly."""
    if not pipe.deterministic:
        raise ResumeError(
            "state_dict() needs deterministic=True: with deterministic=False chunks overtake each other, so "
            "the rows after a position depend on timing and cannot be found again"
        )
    kinds = [s.kind for s in pipe._stages]
    shuffles = [s for s in pipe._stages if s.kind == "shuffle"]
    if len(shuffles) > 1 or (not shuffles and "batch" not in kinds):
        raise ResumeError(
            f"state_dict() needs one shuffle stage, or with no shuffle a batch stage (the stage that records "
            f"the epoch's input); this pipeline is {' -> '.join(kinds)}"
        )
    known = {"read", "map", "shuffle", "batch", "prefetch"}
    for stage in pipe._stages:
        if stage.kind not in known:
            raise ResumeError(f"state_dict(): stage {stage.name!r} of kind {stage.kind!r} has no resume rule")
