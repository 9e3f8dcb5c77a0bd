"""Big Python lists that workers read without copying them: ``SharedList``, and finding such lists.

Why (pytorch#13246): a forked worker starts with its parent's pages shared, but reading a Python
object writes its reference count, so the kernel copies the page it lives on. A dataset holding a
list of millions of strings or numbers is copied page by page into every worker as an epoch reads
it, and the process tree's memory grows toward the list's size once per worker. A spawned worker
gets the list pickled: a full copy at once.

``SharedList`` holds a list of ``str``, ``bytes``, ``int``, ``float`` or ``bool`` as flat arrays in one
shared-memory segment (``pipeline.shm``: ``/dev/shm``, else the fallback directory): numbers as a
numpy array of int64 / float64 / bool, strings and bytes packed end to end with an int64 offset per
item. Indexing builds the Python value from the bytes (an equal value, not the same object), so no
page of the segment is written after it is built: forked workers inherit the mapping, spawned ones map
the segment by name (a ``SharedList`` pickles as that reference, valid on this machine while its
owner lives), and the pages are counted once in the tree's PSS. It is read-only.

Also owns finding big containers in a dataset (``big_containers``: the attributes, and the values of
dict attributes, that hold more than ``WARN_OBJECTS`` Python objects, for the loader's warning) and
``share_lists`` (the loader's ``share_lists=True``: such lists of one supported type become
``SharedList`` in place). It must not know about loaders or workers.
"""

from __future__ import annotations

import itertools
import mmap
import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from intune.pipeline import shm

WARN_OBJECTS = 1_000_000
"""A container with more Python objects than this is named in the loader's copy-on-read warning."""
SHARE_MIN = 1_000
"""``share_lists`` leaves lists shorter than this alone: not worth a segment."""

_KINDS = {str: "str", bytes: "bytes", bool: "bool", int: "int", float: "float"}
_NUMBERS = {"int": np.int64, "float": np.float64, "bool": np.bool_}
_ALIGN = 64
_count = itertools.count()


def list_kind(values: Sequence[Any]) -> str | None:
    """The one supported type of every item (``"str"``, ``"bytes"``, ``"int"``, ``"float"``, ``"bool"``),
    or None when the items are of several types or another type (``bool`` is not ``int`` here)."""
    if not values:
        return None
    kind = _KINDS.get(type(values[0]))
    if kind is None:
        return None
    first = type(values[0])
    return kind if all(type(v) is first for v in values) else None


class SharedList(Sequence[Any]):
    """A read-only list of ``str``, ``bytes``, ``int``, ``float`` or ``bool`` in shared memory.

    ``SharedList(values)`` copies ``values`` (every item of the same one of those types; an int must
    fit in 64 bits) into a new segment; ``len``, indexing (negative indices, slices: a list),
    iteration, ``in``, ``==`` against a sequence and ``tolist()`` behave as on the list. Raises
    ``TypeError`` naming the first item of another type.
    """

    def __init__(self, values: Iterable[Any]) -> None:
        items = values if isinstance(values, list) else list(values)
        kind = _check(items)
        offsets, data = _pack(items, kind)
        size = _aligned(offsets.nbytes) + data.nbytes
        segment = shm.Segment(f"intune-{os.getpid()}-list{next(_count)}-")
        segment.ensure(size)
        assert segment.buffer is not None
        segment.buffer[: offsets.nbytes] = offsets.tobytes()
        start = _aligned(offsets.nbytes)
        segment.buffer[start : start + data.nbytes] = data.tobytes()
        self._owner = weakref.finalize(self, _release, segment, os.getpid())
        self._attach(segment.path, kind, len(items), offsets.nbytes, data.nbytes, segment.buffer)

    def _attach(self, path: str, kind: str, n: int, offsets_bytes: int, data_bytes: int, buffer: Any) -> None:
        self._path, self._kind, self._n = path, kind, n
        self._offsets_bytes, self._data_bytes = offsets_bytes, data_bytes
        self._buffer = buffer
        view = memoryview(buffer)
        start = _aligned(offsets_bytes)
        if kind in _NUMBERS:
            self._values = np.frombuffer(view[start : start + data_bytes], dtype=_NUMBERS[kind])
            self._offsets = None
            self._data = None
        else:
            self._values = None
            self._offsets = np.frombuffer(view[:offsets_bytes], dtype=np.int64)
            self._data = view[start : start + data_bytes]

    @property
    def kind(self) -> str:
        """The items' type: ``"str"``, ``"bytes"``, ``"int"``, ``"float"`` or ``"bool"``."""
        return self._kind

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the items take (values and offsets)."""
        return self._offsets_bytes + self._data_bytes

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(self._n))]
        i = index.__index__()
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"SharedList index {index} out of range for {self._n} items")
        return self._item(i)

    def _item(self, i: int) -> Any:
        if self._values is not None:
            return self._values[i].item()
        assert self._offsets is not None and self._data is not None
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        chunk = self._data[lo:hi]
        return str(chunk, "utf-8") if self._kind == "str" else bytes(chunk)

    def __iter__(self) -> Iterator[Any]:
        if self._values is not None:
            yield from self._values.tolist() if self._n <= 65536 else (v.item() for v in self._values)
            return
        for i in range(self._n):
            yield self._item(i)

    def tolist(self) -> list[Any]:
        return list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (SharedList, list, tuple)):
            return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, which is unhashable

    def __repr__(self) -> str:
        shown = ", ".join(repr(v) for v in self[:3])
        return f"SharedList({self._kind}, {self._n} items: [{shown}{', ...' if self._n > 3 else ''}])"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # a reference to the segment (another process maps the same pages), never the items
        return _mapped, (self._path, self._kind, self._n, self._offsets_bytes, self._data_bytes)


def _check(items: list[Any]) -> str:
    """The items' kind, or ``TypeError`` naming the first item that breaks it."""
    if not items:
        return "str"
    kind = list_kind(items)
    if kind is not None:
        return kind
    first = type(items[0])
    if first not in _KINDS:
        raise TypeError(f"SharedList holds str, bytes, int, float or bool items; item 0 is {first.__name__}")
    bad = next(i for i, v in enumerate(items) if type(v) is not first)
    raise TypeError(
        f"SharedList items must all be of one type: item 0 is {first.__name__}, item {bad} is "
        f"{type(items[bad]).__name__} ({items[bad]!r:.60})"
    )


def _pack(items: list[Any], kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (int64, one more than the items; empty for numbers) and the packed values."""
    if kind in _NUMBERS:
        try:
            return np.zeros(0, dtype=np.int64), np.array(items, dtype=_NUMBERS[kind])
        except OverflowError as exc:
            raise TypeError(f"SharedList: an int item does not fit in 64 bits ({exc})") from None
    if kind == "str" and all(s.isascii() for s in items):  # one encode for all; lengths are the str lengths
        data = "".join(items).encode("ascii")
        lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
    else:
        encoded = [s.encode("utf-8") for s in items] if kind == "str" else items
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, np.frombuffer(data, dtype=np.uint8)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _release(segment: shm.Segment, owner_pid: int) -> None:
    """Unlink the segment when its owner goes, in the process that made it only (a forked worker
    holds the same object and must not remove it)."""
    if os.getpid() == owner_pid:
        segment.close()


def _mapped(path: str, kind: str, n: int, offsets_bytes: int, data_bytes: int) -> SharedList:
    """A ``SharedList`` of another process's segment, mapped read-only."""
    size = _aligned(offsets_bytes) + data_bytes
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"SharedList segment {path} is gone: the process that made the list ended (a SharedList "
            "pickles as a reference to its shared memory, valid on this machine while its owner lives)"
        ) from None
    try:
        buffer = mmap.mmap(fd, max(size, 1), access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    out = SharedList.__new__(SharedList)
    out._attach(path, kind, n, offsets_bytes, data_bytes, buffer)
    return out


# ---- finding big containers in a dataset ---------------------------------------------------------
def _children(obj: Any) -> list[tuple[str, Any, Any, Any]]:
    """``(name, holder, key, value)`` for an object's attributes (``holder`` the object, ``key`` the
    attribute's name) and the container values of its dict attributes (``holder`` the dict)."""
    try:
        attrs = vars(obj)
    except TypeError:
        return []
    out: list[tuple[str, Any, Any, Any]] = []
    for name, value in list(attrs.items()):
        out.append((name, obj, name, value))
        if type(value) is dict and len(value) <= 1000:
            out += [(f"{name}[{key!r}]", value, key, v) for key, v in value.items() if type(v) in (list, tuple, dict, set)]
    return out


def _walk(dataset: Any, depth: int = 3) -> Iterator[tuple[str, Any, Any, Any]]:
    """``(path, holder, key, value)`` for the attributes of ``dataset`` and of the datasets it holds
    (a ``Subset``'s, a ``ConcatDataset``'s), as ``_children`` gives them."""
    from torch.utils.data import Dataset

    seen: set[int] = set()
    todo = [(type(dataset).__name__, dataset, depth)]
    while todo:
        prefix, obj, left = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for name, holder, key, value in _children(obj):
            yield f"{prefix}.{name}", holder, key, value
            if left > 1 and isinstance(value, Dataset):
                todo.append((f"{prefix}.{name}", value, left - 1))
            elif left > 1 and type(value) in (list, tuple) and len(value) <= 64:
                todo += [(f"{prefix}.{name}[{i}]", v, left - 1) for i, v in enumerate(value) if isinstance(v, Dataset)]


def big_containers(dataset: Any, threshold: int = WARN_OBJECTS) -> list[tuple[str, str, int]]:
    """The dataset's Python containers (list, tuple, dict, set) of more than ``threshold`` items, as
    ``(attribute path, container type, items)``; numpy arrays and ``SharedList`` are not containers."""
    return [
        (path, type(value).__name__, len(value))
        for path, _holder, _key, value in _walk(dataset)
        if type(value) in (list, tuple, dict, set) and len(value) > threshold
    ]


def share_lists(dataset: Any, minimum: int = SHARE_MIN) -> list[tuple[str, SharedList]]:
    """Replace, in place, the dataset's lists (attributes, and values of dict attributes) of at least
    ``minimum`` items all of one of ``str``, ``bytes``, ``int``, ``float``, ``bool`` by ``SharedList``;
    returns ``(attribute path, the SharedList)`` for each. Other lists are left as they are."""
    done: list[tuple[str, SharedList]] = []
    for path, holder, key, value in list(_walk(dataset)):
        if type(value) is not list or len(value) < minimum or list_kind(value) is None:
            continue
        shared = SharedList(value)
        if type(holder) is dict:
            holder[key] = shared
        else:
            setattr(holder, key, shared)
        done.append((path, shared))
    return done


class CopyOnReadWarning(UserWarning):
    """The dataset holds Python containers big enough that worker processes multiply its memory."""


def copy_on_read_words(dataset: Any, start_method: str, threshold: int = WARN_OBJECTS) -> list[tuple[str, str]]:
    """``(attribute path, warning text)`` for each big container of ``dataset`` that workers started by
    ``start_method`` (``"fork"`` or ``"spawn"``) would copy: what happens, and the fix."""
    how = (
        "forked workers copy the pages it lives on as they read it (every read writes the objects' "
        "reference counts, pytorch#13246), so each worker's memory grows toward its size"
        if start_method == "fork"
        else "each spawned worker receives its own pickled copy"
    )
    return [
        (
            path,
            f"intune.DataLoader: {path} is a {kind} of {items:,} Python objects; {how}. Pass "
            "share_lists=True (lists of str, bytes, int, float or bool become intune.SharedList: read-only, "
            "in shared memory, read by every worker without a copy), or hold the data as intune.SharedList or "
            "numpy arrays yourself",
        )
        for path, kind, items in big_containers(dataset, threshold)
    ]


__all__ = [
    "SHARE_MIN",
    "WARN_OBJECTS",
    "CopyOnReadWarning",
    "SharedList",
    "big_containers",
    "copy_on_read_words",
    "list_kind",
    "share_lists",
]
