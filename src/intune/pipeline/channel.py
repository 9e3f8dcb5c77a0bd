"""Channel: the bounded queue between two stages, with sequence numbers, reordering and byte accounting.

Owns flow control and delivery order. A pooled producer (several workers) ``reserve``s a slot before
taking input and ``put_at``s its result under the input's sequence number, so it never blocks while
holding a chunk; an ordered channel then releases entries strictly by sequence number (deterministic
order whatever the worker count), a FIFO one as they arrive. A sequential producer ``put``s and blocks
while the channel is over its item or byte bound. Each entry is a list of 0..n items (a skipped chunk
is an empty entry; a read unit yields several chunks), and ``get`` hands items out one by one with a
fresh contiguous sequence number. A sequential producer's channel may also be ``adopt``ed by the stage
after it (prefetch): its bounds become that stage's, and the channel keeps the stage's counters
(items and bytes handed out, time the consumer waited on it empty and the producer waited on it full),
so a stage that only buffers costs no thread and no hand-over. This module must not know what the items
contain.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

END: Any = object()  # returned by get() when the producer has finished and everything was taken
TIMEOUT: Any = object()  # returned by get() when its timeout passed


class Stopped(Exception):
    """The epoch was stopped (close, error elsewhere): unwind this thread."""


class Item:
    """One chunk in flight with its provenance, row count and bytes (computed once)."""

    __slots__ = ("chunk", "origin", "rows", "nbytes")

    def __init__(self, chunk: Any, origin: Any, rows: int, nbytes: int) -> None:
        self.chunk = chunk
        self.origin = origin
        self.rows = rows
        self.nbytes = nbytes


Bound = Callable[[], int]


class Counters(Protocol):
    """What an adopting stage counts through the channel (its ``WorkerStats``)."""

    items: int
    rows: int
    bytes_out: int
    starved_s: float
    blocked_s: float


class Channel:
    """A queue of items between stages; see the module docstring for the two producer kinds."""

    def __init__(
        self,
        name: str,
        stop: threading.Event,
        *,
        ordered: bool = True,
        max_items: Bound | None = None,
        max_bytes: Bound | None = None,
        window: Bound | None = None,
    ) -> None:
        self.name = name
        self._stop = stop
        self._ordered = ordered
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._window = window
        lock = threading.Lock()
        self._not_empty = threading.Condition(lock)
        self._not_full = threading.Condition(lock)
        self._lock = lock
        self._entries: dict[int, list[Item]] = {}
        self._fifo: deque[list[Item]] = deque()
        self._ready: deque[Item] = deque()
        self._next_release = 0  # next entry sequence number to release (ordered)
        self._released = 0  # entries moved to ready
        self._put_seq = 0  # next sequence number of a sequential put
        self._handed_out = 0  # items handed out by get (their sequence numbers)
        self._total: int | None = None  # number of entries the producer will deliver
        self._outstanding = 0  # reserved slots not yet released (pooled producers)
        self.items = 0  # items held now
        self.bytes = 0  # bytes held now
        self.counters: Counters | None = None  # set by ``adopt``

    @property
    def sequential(self) -> bool:
        """True for a sequential producer's channel (bounded by items/bytes, not by a window)."""
        return self._window is None

    def adopt(self, max_items: Bound, max_bytes: Bound | None, counters: Counters) -> None:
        """Make this channel the next stage's buffer: its bounds, its counters (see the module doc)."""
        if not self.sequential:
            raise ValueError(f"channel {self.name!r}: a pooled producer's channel cannot be adopted")
        with self._lock:
            self._max_items, self._max_bytes, self.counters = max_items, max_bytes, counters
            self._not_full.notify_all()

    @property
    def adopted(self) -> bool:
        return self.counters is not None

    def full(self) -> bool:
        """At its item or byte bound (no room for one more item)."""
        return bool(self.items) and self._over(1, 0)

    # ---- producers -------------------------------------------------------------------------------
    def put(self, items: list[Item]) -> None:
        """Sequential producer: append an entry, blocking while over the item/byte bound."""
        size = sum(i.nbytes for i in items)
        with self._lock:
            if self.items and self._over(len(items), size):
                t0 = time.perf_counter()
                while self.items and self._over(len(items), size):
                    self._wait(self._not_full)
                if self.counters is not None:
                    self.counters.blocked_s += time.perf_counter() - t0
            self._add(self._put_seq, items, size)
            self._put_seq += 1

    def reserve(self, timeout: float) -> bool:
        """Pooled producer: claim a slot in the window before taking input; False on timeout."""
        with self._lock:
            if self._window is not None and self._outstanding >= max(1, self._window()):
                self._wait(self._not_full, timeout)
                if self._outstanding >= max(1, self._window()):
                    return False
            self._outstanding += 1
            return True

    def unreserve(self) -> None:
        with self._lock:
            self._outstanding -= 1
            self._not_full.notify()

    def put_at(self, seq: int, items: list[Item]) -> None:
        """Pooled producer: deliver the entry for input ``seq`` (never blocks: the slot was reserved)."""
        size = sum(i.nbytes for i in items)
        with self._lock:
            self._add(seq, items, size)

    def finish(self, total: int | None = None) -> None:
        """The producer will deliver no more: ``total`` entries in all (a sequential producer: its puts)."""
        with self._lock:
            self._total = self._put_seq if total is None else total
            self._not_empty.notify_all()

    # ---- consumer --------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Any:
        """Next ``(seq, item)``, or ``END`` when finished, or ``TIMEOUT``; raises ``Stopped``."""
        with self._lock:
            while True:
                if self._ready:
                    item = self._ready.popleft()
                    self.items -= 1
                    self.bytes -= item.nbytes
                    seq = self._handed_out
                    self._handed_out += 1
                    self._not_full.notify()
                    counters = self.counters
                    if counters is not None:
                        counters.items += 1
                        counters.rows += item.rows
                        counters.bytes_out += item.nbytes
                    return seq, item
                if self._release_one():
                    continue
                if self._total is not None and self._released >= self._total:
                    return END
                t0 = time.perf_counter()
                notified = self._wait(self._not_empty, timeout)
                if self.counters is not None:
                    self.counters.starved_s += time.perf_counter() - t0
                if not notified and timeout is not None:
                    if not self._ready and not self._releasable():
                        return TIMEOUT

    @property
    def handed_out(self) -> int:
        """How many items ``get`` has handed out (the downstream sequence numbers used)."""
        return self._handed_out

    # ---- internals -------------------------------------------------------------------------------
    def _over(self, n: int, size: int) -> bool:
        if self._max_items is not None and self.items + n > max(1, self._max_items()):
            return True
        return self._max_bytes is not None and self.bytes + size > self._max_bytes()

    def _add(self, seq: int, items: list[Item], size: int) -> None:
        if self._ordered:
            self._entries[seq] = items
        else:
            self._fifo.append(items)
        self.items += len(items)
        self.bytes += size
        self._not_empty.notify()

    def _releasable(self) -> bool:
        return bool(self._fifo) if not self._ordered else self._next_release in self._entries

    def _release_one(self) -> bool:
        """Move the next releasable entry to the ready deque; frees one window slot."""
        if self._ordered:
            entry = self._entries.pop(self._next_release, None)
            if entry is None:
                return False
            self._next_release += 1
        elif self._fifo:
            entry = self._fifo.popleft()
        else:
            return False
        self._released += 1
        self._ready.extend(entry)
        if self._window is not None:
            self._outstanding -= 1
            self._not_full.notify()
        return True

    def _wait(self, condition: threading.Condition, timeout: float | None = None) -> bool:
        if self._stop.is_set():
            raise Stopped
        notified = condition.wait(0.2 if timeout is None else min(timeout, 0.2))
        if self._stop.is_set():
            raise Stopped
        return notified

    def wake_all(self) -> None:
        """Wake every waiter (used on stop so that threads notice at once)."""
        with self._lock:
            self._not_empty.notify_all()
            self._not_full.notify_all()
