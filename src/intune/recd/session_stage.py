"""RecD's session shuffle as a stage of the engine (``Pipeline.shuffle(by=...)``): an adapter beside it.

Owns ``SessionShuffleStage``: the engine's ``ShuffleStage`` whose buffer releases whole sessions
(``session_shuffle.SessionShuffleBuffer``) with every release logged (``pipeline.session_resume``), and
whose part of a pipeline's state is resumed by redoing one logged release rather than by the row-id
replay (a session window's draws depend on the session ids' values, which a replay on row ids cannot
see). The engine's shuffle stage knows nothing of sessions; this subclass changes its buffer, how a
resume rebuilds it, and how a state's log is checked and replayed. It must not batch or deduplicate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from intune.pipeline.resume import Position, ShuffleLog
from intune.pipeline.serial_stages import ShuffleStage
from intune.pipeline.session_resume import (
    DRAIN,
    LoggedSessions,
    SessionPlan,
    check_sessions,
    redo,
    session_replay,
)
from intune.recd.session_shuffle import SessionShuffleBuffer


class SessionShuffleStage(ShuffleStage):
    """A shuffle of whole sessions (runs of equal ``by`` values), so in-batch duplication survives for
    ``dedup``; knobs, capacity and logging as the engine's shuffle stage."""

    def __init__(
        self, name: str, buffer_rows: int, seed: int, buffer_mb: int, max_mb: int, min_mb: int = 1, *, by: str
    ) -> None:
        super().__init__(name, buffer_rows, seed, buffer_mb, max_mb, min_mb)
        self.by = by

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "by": self.by}

    def replay_log(self, state: Mapping[str, Any], position: Position) -> SessionPlan:
        """A state's log and releases checked, then the plan that redoes the release the position is in."""
        check_sessions(state, position.source, self.buffer_rows, f"{position.where}: shuffle")
        plan = session_replay(state, position.epoch, position.rows, position.where)
        assert plan is not None  # a state is only loaded into a stage when rows were delivered
        return plan

    def new_buffer(self, rng: np.random.Generator, capacity: int, log: ShuffleLog, taken: int) -> LoggedSessions:
        log.sessions = True
        return LoggedSessions(SessionShuffleBuffer(rng, capacity, key=self.by), log, rng, taken=taken)

    def restore(
        self, plan: Any, rng: np.random.Generator, log: ShuffleLog, rows: dict
    ) -> tuple[LoggedSessions, list[dict], bool]:
        """The window read again, and its release redone: the rows it let out after those delivered."""
        sessions = LoggedSessions(SessionShuffleBuffer(rng, plan.capacity, key=self.by), log, rng)
        return sessions, redo(plan, sessions, rows), plan.session_redo["kind"] == DRAIN
