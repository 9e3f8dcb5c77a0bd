"""Channel: the bounded queue between two stages, with sequence numbers, reordering and byte accounting.

Owns flow control and delivery order. A pooled producer (several workers) ``reserve``s a slot before
taking input and ``put_at``s its result under the input's sequence number, so it never blocks while
holding a chunk; an ordered channel then releases entries strictly by sequence number (deterministic
order whatever the worker count), a FIFO one as they arrive. A sequential producer ``put``s and blocks
while the channel is over its item or byte bound. Each entry is a list of 0..n items (a skipped chunk
is an empty entry; a read unit yields several chunks), and ``get`` hands items out one by one with a
fresh contiguous sequence number. This module must not know what the items contain.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

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

    # ---- producers -------------------------------------------------------------------------------
    def put(self, items: list[Item]) -> None:
        """Sequential producer: append an entry, blocking while over the item/byte bound."""
        size = sum(i.nbytes for i in items)
        with self._lock:
            while self.items and self._over(len(items), size):
                self._wait(self._not_full)
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
                    return seq, item
                if self._release_one():
                    continue
                if self._total is not None and self._released >= self._total:
                    return END
                if not self._wait(self._not_empty, timeout) and timeout is not None:
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
