"""The running epoch and the consumer's end of it.

Owns ``Epoch`` (one pass over the data: the stages' threads and channels, the stop event, the first
failure), ``EpochIterator`` (what ``iter(pipeline)`` returns: it raises a stage's failure with its
own cause, ends the epoch at the end of data, raises ``PipelineClosedError`` when the epoch was
stopped from outside (close, a newer epoch), warns when every row was skipped, and shuts the
pipeline down on Ctrl-C) and ``ConsumerStats`` (the consumer-side counters and the arithmetic behind
``rows_per_s`` and ``consumer_step_s``), and the epoch's position that ``Pipeline.state_dict`` reads
(rows and batches delivered, whether it completed). It must not build stages, and it reaches the
pipeline only through what the pipeline hands the iterator (its consumer counters, how to end the
epoch, how to close).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from intune.pipeline.channel import END, Channel, Stopped
from intune.pipeline.chunks import Chunk, RowTable
from intune.pipeline.errors import PipelineClosedError
from intune.pipeline.pool import PoolRun

if TYPE_CHECKING:
    from intune.pipeline.resume import ShuffleLog


class Epoch:
    """One pass over the data: the stages' threads and channels, a stop event, the first failure."""

    def __init__(self, index: int, label: str, deterministic: bool) -> None:
        self.index = index
        self.label = label
        self.deterministic = deterministic
        self.stop = threading.Event()
        self.table = RowTable()
        self.pools: list[PoolRun] = []
        self.error: BaseException | None = None
        self.stop_reason = ""  # why the epoch was stopped: "failed", "closed", "superseded", "ended"
        self.skipped_at_start: dict[str, int] = {}  # each stage's skip count before the epoch started
        # resume: the epoch's input log (kept by the first stage that re-orders or re-cuts rows, whose
        # ``state_dict`` snapshots it), and the consumer's position
        self.shuffle_log: ShuffleLog | None = None
        self.delivered_rows = 0  # epoch-global: a resumed epoch starts at the checkpoint's position
        self.delivered_batches = 0
        self.completed = False  # every row delivered (the consumer saw the end)
        self._threads: list[threading.Thread] = []
        self._channels: list[Channel] = []
        self._lock = threading.Lock()

    def channel(self, name: str, **kwargs: Any) -> Channel:
        ch = Channel(name, self.stop, **kwargs)
        self._channels.append(ch)
        return ch

    def spawn(self, target: Callable[[], None], name: str) -> None:
        def guarded() -> None:
            try:
                target()
            except Stopped:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported to the consumer
                self.fail(exc)

        thread = threading.Thread(target=guarded, name=f"intune-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def fail(self, exc: BaseException) -> None:
        """Record the first failure and stop everything; the consumer raises it.

        Failures after a stop (close, a new epoch) are consequences of stopping and are not recorded.
        """
        with self._lock:
            if self.error is None and not self.stop.is_set():
                self.error = exc
        self.halt("failed")

    def halt(self, reason: str = "ended") -> None:
        """Stop every thread of the epoch; the first ``reason`` given is the one kept."""
        with self._lock:
            if not self.stop_reason:
                self.stop_reason = reason
        self.stop.set()
        for ch in self._channels:
            ch.wake_all()
        for pool in self.pools:
            pool.wake()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        threads = list(self._threads)
        for pool in self.pools:
            threads.extend(pool.threads())
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


class ConsumerStats:
    """What the consumer's thread did, and the rates of its last second.

    Owns the consumer-side counters (rows and batches taken, time waited on the pipeline, time the
    training step took between two ``next()`` calls) and their arithmetic. The consumer's thread
    writes (``stepped``, ``waited``, ``took``); ``metrics()`` reads (``recent``) without locks.
    """

    def __init__(self) -> None:
        self.rows = 0
        self.batches = 0
        self.wait_s = 0.0
        self.step_sum = 0.0
        self.step_count = 0
        # (time, rows, step_sum, step_count) about every 0.25 s, for the rates of the last second
        self.marks: deque[tuple[float, int, float, int]] = deque(maxlen=12)
        self.marks.append((time.monotonic(), 0, 0.0, 0))

    def stepped(self, seconds: float) -> None:
        """The consumer came back after a training step of ``seconds``."""
        self.step_sum += seconds
        self.step_count += 1

    def waited(self, seconds: float) -> None:
        """The consumer waited ``seconds`` on the pipeline for a batch or for the epoch's end."""
        self.wait_s += seconds

    def took(self, rows: int, now: float) -> None:
        """The consumer got a batch of ``rows``."""
        self.rows += rows
        self.batches += 1
        if now - self.marks[-1][0] >= 0.25:
            self.marks.append((now, self.rows, self.step_sum, self.step_count))

    def recent(self, now: float) -> tuple[float, float]:
        """``(rows/s, mean step seconds)`` over about the last second (since the oldest mark >= 1 s old)."""
        marks = tuple(self.marks)
        base = next((m for m in reversed(marks) if now - m[0] >= 1.0), marks[0])
        dt = now - base[0]
        rate = (self.rows - base[1]) / dt if dt > 0 else 0.0
        steps = self.step_count - base[3]
        step_s = (self.step_sum - base[2]) / steps if steps > 0 else 0.0
        return rate, step_s


class EpochIterator:
    """What ``iter(pipeline)`` returns: the consumer's end of the last channel."""

    def __init__(
        self,
        epoch: Epoch,
        final: Channel,
        consumer: ConsumerStats,
        end_epoch: Callable[[Epoch], None],
        close_pipeline: Callable[[], None],
        skipped: Callable[[], Mapping[str, int]],
    ) -> None:
        self._end_epoch = end_epoch  # the pipeline's: detach the stages once the epoch ended
        self._close_pipeline = close_pipeline  # on an exception in the consumer (Ctrl-C)
        self._consumer = consumer
        self._epoch = epoch
        self._final = final
        self._last_return: float | None = None
        self._done = False
        self._closed_error: PipelineClosedError | None = None
        self._rows = 0
        self._skipped = skipped

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> Chunk:
        if self._done:
            if self._closed_error is not None:
                raise self._closed_error
            raise StopIteration
        stats = self._consumer
        t0 = time.monotonic()
        if self._last_return is not None:
            stats.stepped(t0 - self._last_return)
        try:
            # a stopped epoch hands out nothing more, not even what is already buffered
            got = None if self._epoch.stop.is_set() else self._final.get()
        except Stopped:
            got = None
        except BaseException:  # Ctrl-C in the consumer: shut everything down, then let it through
            self._done = True
            self._close_pipeline()
            raise
        if got is None:  # stopped: by a failure (raise it, with its own cause) or from outside
            self._finish()
            if self._epoch.error is not None:
                raise self._epoch.error
            if self._epoch.stop_reason in ("closed", "superseded"):
                self._closed_error = PipelineClosedError(self._stopped_message())
                raise self._closed_error
            raise StopIteration
        now = time.monotonic()
        stats.waited(now - t0)
        if got is END:
            self._epoch.completed = True
            self._finish()
            self._warn_if_all_skipped()
            raise StopIteration
        item = got[1]
        self._rows += item.rows
        self._epoch.delivered_rows += item.rows
        self._epoch.delivered_batches += 1
        stats.took(item.rows, now)
        self._last_return = now
        return item.chunk

    def _finish(self) -> None:
        self._done = True
        self._end_epoch(self._epoch)

    def _stopped_message(self) -> str:
        why = (
            "the pipeline was closed"
            if self._epoch.stop_reason == "closed"
            else "a new epoch was started on the same pipeline"
        )
        return (
            f"epoch {self._epoch.index} was stopped before its end ({why}) after {self._rows} rows: "
            "what this iterator delivered is not a whole epoch"
        )

    def _warn_if_all_skipped(self) -> None:
        """An epoch that delivered nothing because every chunk or line was skipped says so, once:
        an empty epoch is otherwise indistinguishable from an empty data set."""
        if self._rows:
            return
        now = self._skipped()
        skipped = {s: n - self._epoch.skipped_at_start.get(s, 0) for s, n in now.items()}
        skipped = {s: n for s, n in skipped.items() if n > 0}
        if skipped:
            counts = ", ".join(f"stage {s!r} skipped {n}" for s, n in skipped.items())
            warnings.warn(
                f"epoch {self._epoch.index} delivered no rows: {counts} (on_error='skip'); "
                "check the input and the functions, or use on_error='raise' to see the first error",
                RuntimeWarning,
                stacklevel=3,
            )

    def close(self) -> None:
        if not self._done:
            self._finish()
