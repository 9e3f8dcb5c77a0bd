"""Resuming a shuffle that releases windows (RecD's session shuffle, ``shuffle(by=...)``): its releases
logged, checked, and the one to redo.

Owns ``LoggedSessions`` (a window buffer whose releases are recorded), ``check_sessions`` (a state's
releases bounded before anything is replayed), ``session_replay`` (the ``SessionPlan`` a resumed epoch
follows) and ``redo``. ``intune.recd.session_shuffle.SessionShuffleStage`` calls them from its own
``load_state_dict`` and ``start``. It must not change how sessions are shuffled (``intune.recd`` owns
that) nor read data.

Why not the row-id replay of ``resume``: a session buffer's draw is a permutation of the sessions in a
window, and how many sessions a window holds depends on the session ids' values, which a replay on row
ids cannot see. But its state is simpler than a slot buffer's: what it holds is always a contiguous tail
of its input (a release keeps the rows from the last session's start on), and its generator only moves
at a release. So each release is logged with what it needs to be redone: the rows let out before it,
the window's row ids ``[first, end)``, the generator's state before it, the capacity, and what
triggered it (an ``add``, a shrink with its ``max_out``, the drain). A resume reads that window's rows
again, redoes the release with the same generator state on the same rows (the same permutation), drops
the rows delivered before the checkpoint and continues with the input after the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from intune.checkpoint import CheckpointError
from intune.pipeline.chunks import num_rows
from intune.pipeline.resume import (
    ReadRequest,
    ShuffleLog,
    ShufflePlan,
    SourceBounds,
    check_log,
    int_array,
    refill_map,
    steps,
)
from intune.rng import rng_from_state, rng_state

ADD, SHRINK, DRAIN = 0, 1, 2
_BIG = 1 << 62


@dataclass
class SessionPlan(ShufflePlan):
    """A ``ShufflePlan`` whose refill is one window, and the release to redo on it (``redo``)."""

    session_redo: dict[str, int] = field(default_factory=dict)


class LoggedSessions:
    """A session buffer whose every release is appended to ``log.releases`` before its rows leave.

    ``taken`` counts the row ids taken in (the next chunk's first id) and ``emitted`` the rows let out,
    both epoch-global (a resumed buffer starts at the window it redoes).
    """

    def __init__(self, buf: Any, log: ShuffleLog, rng: np.random.Generator, taken: int = 0, emitted: int = 0) -> None:
        self.buf, self.log, self.rng = buf, log, rng
        self.taken, self.emitted = taken, emitted
        self.quiet = False  # a redone release is in the log already

    @property
    def capacity(self) -> int:
        return self.buf.capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        self.buf.capacity = value

    @property
    def size(self) -> int:
        return self.buf.size

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes

    def add(self, chunk: dict) -> list[dict]:
        rows = num_rows(chunk)
        return self._logged(ADD, rows, 0, lambda: self.buf.add(chunk))

    def resize(self, capacity: int, max_out: int | None = None) -> list[dict]:
        return self._logged(SHRINK, 0, -1 if max_out is None else max_out, lambda: self.buf.resize(capacity, max_out))

    def drain(self, chunk_rows: int) -> list[dict]:
        return self._logged(DRAIN, 0, chunk_rows, lambda: self.buf.drain(chunk_rows))

    def restore(self, rows: dict) -> None:  # the slot buffer's resume hook; a session buffer has no slots
        raise NotImplementedError

    def _logged(self, kind: int, rows_in: int, arg: int, step: Any) -> list[dict]:
        before = rng_state(self.rng)
        first = self.taken - self.buf.size
        capacity = self.buf.capacity
        out = step()
        self.taken += rows_in
        if out:
            let_out = sum(num_rows(c) for c in out)
            if not self.quiet:
                self.log.release(
                    [self.emitted, let_out, first, self.taken, kind, arg, capacity, self.buf.capacity], before
                )
            self.emitted += let_out
        return out


def check_sessions(log: Any, source: SourceBounds, max_capacity: int, where: str) -> None:
    """``check_log``'s checks, and every release bounded: its window inside the log's rows and no wider
    than two buffers and two chunks, its kind and sizes, its generator state; ``where`` names the log."""
    check_log(log, source, max_capacity, where, steps_allowed=True)
    if "releases" not in log or "rng_states" not in log:
        raise CheckpointError(f"{where}: a session shuffle's log lacks its releases (releases, rng_states)")
    releases = int_array(log["releases"], f"{where}.releases", -1, _BIG, columns=8)
    states = log["rng_states"]
    if not isinstance(states, list) or len(states) != len(releases):
        raise CheckpointError(f"{where}.rng_states: {len(states) if isinstance(states, list) else type(states).__name__} states for {len(releases)} releases")
    total = int(np.asarray(log["rows"], dtype=np.int64).sum())
    widest = 2 * (max_capacity + source.max_chunk_rows)  # a window: held rows (a buffer and a session) and a chunk
    for i, (emitted, let_out, first, end, kind, arg, capacity, after) in enumerate(releases.tolist()):
        name = f"{where}.releases[{i}]"
        if min(emitted, let_out, first) < 0 or not first <= end <= total or end - first > widest:
            raise CheckpointError(f"{name}: window [{first}, {end}) outside the log's {total} rows or wider than {widest}")
        if let_out > end - first or kind not in (ADD, SHRINK, DRAIN):
            raise CheckpointError(f"{name}: {let_out} rows let out of a {end - first}-row window, kind {kind}")
        if not (1 <= capacity <= max_capacity and 1 <= after <= max_capacity):
            raise CheckpointError(f"{name}: capacity {capacity} -> {after} outside [1, {max_capacity}]")
        if (kind == ADD and arg != 0) or (kind != ADD and not (arg == -1 and kind == SHRINK or 1 <= arg <= source.max_chunk_rows)):
            raise CheckpointError(f"{name}: argument {arg} for a release of kind {kind}")
        rng_from_state(states[i], f"{where}.rng_states[{i}]")


def session_replay(shuffle: Mapping[str, Any], epoch: int, delivered: int, where: str) -> SessionPlan | None:
    """The plan that redoes the release whose output holds the ``delivered``-th row (the last one that
    starts at or before it) of epoch ``epoch``, or None when nothing was delivered. The log must have
    passed ``check_sessions``."""
    if delivered <= 0:
        return None
    units = np.asarray(shuffle["units"], dtype=np.int64)
    items = np.asarray(shuffle["items"], dtype=np.int64)
    rows = np.asarray(shuffle["rows"], dtype=np.int64)
    releases = np.asarray(shuffle["releases"], dtype=np.int64).reshape(-1, 8)
    states = list(shuffle["rng_states"])
    if len(states) != len(releases):
        raise CheckpointError(f"{where}: the session log's releases and generator states differ in number")
    starts = np.concatenate([[0], np.cumsum(rows)])
    covering = np.flatnonzero((releases[:, 0] <= delivered) & (delivered <= releases[:, 0] + releases[:, 1]))
    if not covering.size:
        raise CheckpointError(f"{where}: no logged session release of epoch {epoch} covers the {delivered} rows delivered")
    r = int(covering[-1])
    emitted, _, first, end, kind, arg, capacity, capacity_after = (int(x) for x in releases[r])
    k = int(np.searchsorted(starts, end)) if end else 0  # chunks added up to the window's end
    if end and starts[k] != end:
        raise CheckpointError(f"{where}: a session release ends inside a chunk (row {end})")
    needed = np.arange(first, end, dtype=np.int64)
    # the shuffle's other steps (capacity changes): those after the redone release run where they ran
    # (the checkpointed run's shuffle was ahead of its consumer); an add's release comes after the steps
    # at its chunk's position, a shrink's or the drain's is itself the first matching step at ``k``
    events = steps(shuffle["events"])
    split = next((i for i, e in enumerate(events) if e[0] >= k), len(events))
    if kind != ADD:
        step = (k, 2, arg, 0) if kind == DRAIN else (k, 1, capacity_after, arg)  # as the stage logs them
        match = next((i for i in range(split, len(events)) if events[i] == step), None)
        if match is None:
            raise CheckpointError(f"{where}: the session release to redo is not among the shuffle's logged steps")
        split = match + 1
    return SessionPlan(
        read=ReadRequest(
            refill_map(units, items, rows, starts, needed), (int(units[k - 1]), int(items[k - 1])) if k else None
        ),
        delivered=delivered,
        refill_ids=needed,
        buffer_ids=None,
        straddle_ids=np.empty(0, np.int64),
        rng=rng_from_state(states[r], f"{where}.rng_states[{r}]"),
        capacity=capacity,
        next_id=end,
        log=ShuffleLog(
            units[:k].tolist(), items[:k].tolist(), rows[:k].tolist(), events[:split], int(shuffle["row_bytes"]),
            releases=releases[: r + 1].tolist(), rng_states=[dict(s) for s in states[: r + 1]], sessions=True,
        ),
        pending=events[split:],
        logged_until=len(rows),
        chunk_rows=max(1, int(rows[:k].max()) if k else 1),
        session_redo={
            "kind": kind, "arg": arg, "capacity_after": capacity_after, "emitted": emitted,
            "skip": delivered - emitted, "last_chunk_rows": int(rows[k - 1]) if kind == ADD and k else 0,
        },
    )


def redo(plan: SessionPlan, buf: LoggedSessions, rows: dict) -> list[dict]:
    """Load the window's rows into ``buf`` and redo its release: the rows it lets out after those
    delivered before the checkpoint."""
    info = plan.session_redo
    n = num_rows(rows) if rows else 0
    tail = info["last_chunk_rows"]  # an add's release: the chunk that triggered it is added last
    buf.taken, buf.emitted = plan.next_id - n, info["emitted"]
    buf.capacity = _BIG
    if n - tail:
        buf.add({k: v[: n - tail] for k, v in rows.items()})
    buf.capacity = plan.capacity
    buf.quiet = True  # the plan's log holds this release already (a state taken before the redo needs it)
    if info["kind"] == ADD:
        out = buf.add({k: v[n - tail :] for k, v in rows.items()})
    elif info["kind"] == SHRINK:
        out = buf.resize(info["capacity_after"], None if info["arg"] < 0 else info["arg"])
    else:
        out = buf.drain(info["arg"])
    buf.quiet = False
    if not out:
        raise CheckpointError("resume: redoing the session release let nothing out (the data changed since the checkpoint?)")
    merged = {k: np.concatenate([c[k] for c in out]) for k in out[0]}
    skip = info["skip"]
    return [{k: v[skip:] for k, v in merged.items()}] if skip < num_rows(merged) else []
