"""Sharding for data-parallel training: which rows each of ``world_size`` ranks reads, and its machine share.

Owns the rule that splits one epoch of a source among ranks, the argument checks of ``rank`` /
``world_size`` / ``uneven`` / ``local_world_size`` (defaults from the ``RANK``, ``WORLD_SIZE`` and
``LOCAL_WORLD_SIZE`` variables that ``torchrun`` sets; without ``LOCAL_WORLD_SIZE`` every rank is taken
to be on this machine, as under ``torch.multiprocessing.spawn``) and the monitor that shows a rank its
share of the machine. The sources apply the rule (``sources``, ``criteo``); this module must not read files.

The rule, the same for every source. Rows are numbered in the source's global order (files in their
sorted / given order, row groups or lines in file order; for ``from_iterable`` the order the chunks
come in) from 0 to ``N - 1``. Rank ``r`` gets ``N // W`` rows, plus one if ``r < N % W`` (the counts
a round-robin deal gives), so ranks never differ by more than one row:

- sources whose row counts are known before the epoch (Parquet: the metadata; Criteo TSV: a line
  count of every block, made once) give rank ``r`` one contiguous range of global rows, so a rank reads
  only the row groups / blocks of its range (a row group on a boundary is read by both ranks, each
  keeping its own rows);
- ``from_iterable`` cannot know ``N`` before the end: every rank iterates every chunk and keeps its
  contiguous share of each (so every chunk is split into about ``n / W`` rows per rank), dealt so that
  after every chunk each rank holds its round-robin count.

Equal counts (so that every rank yields the same number of batches, as DDP needs), as
``torch.utils.data.DistributedSampler`` makes them: ``uneven="pad"`` (the default, like its
``drop_last=False``) gives each rank ``ceil(N / W)`` rows: a rank ``r >= N % W`` adds a copy of global
row ``(r - N % W) % N``, the first rows of the data set, as DistributedSampler pads with the first
indices; ``uneven="drop"`` (its ``drop_last=True``) gives each rank ``N // W`` rows: a rank with one more
leaves out its last row. Either way at most ``W - 1`` rows are repeated or left out per epoch, and
every other row is delivered exactly once across the ranks. What a stage skips later
(``on_error="skip"``) is not made up: a rank that skips rows yields fewer (a Criteo block whose
malformed lines were skipped repeats rows of its own block to keep its count).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from intune.monitor import MachineSample, Monitor
from intune.pipeline.channel import Item
from intune.pipeline.chunks import Origin, Segment, nbytes, num_rows

UNEVEN = ("pad", "drop")


@dataclass(frozen=True)
class Shard:
    """This process's part of the data: rank ``rank`` of ``world_size``, ``uneven`` rows padded or
    dropped, and ``local_world_size`` ranks sharing this machine."""

    rank: int
    world_size: int
    uneven: str = "pad"
    local_world_size: int = 1

    def count(self, total: int) -> int:
        """Rows this rank owns of ``total``, before padding or dropping."""
        return total // self.world_size + (1 if self.rank < total % self.world_size else 0)

    def start(self, total: int) -> int:
        """The global row where this rank's contiguous range of ``total`` rows begins."""
        return self.rank * (total // self.world_size) + min(self.rank, total % self.world_size)

    def pad_row(self, total: int) -> int | None:
        """The global row this rank repeats at its end (``uneven="pad"``), or None."""
        extra = total % self.world_size
        if self.uneven != "pad" or extra == 0 or self.rank < extra or total == 0:
            return None
        return (self.rank - extra) % total

    def drops_last(self, total: int) -> bool:
        """Whether this rank leaves out its last row (``uneven="drop"`` and it owns one more)."""
        return self.uneven == "drop" and self.rank < total % self.world_size

    @property
    def machine_share(self) -> float:
        """The fraction of this machine's CPUs and free memory a rank tunes for."""
        return 1.0 / self.local_world_size


def _env_int(var: str, where: str, argument: str) -> int | None:
    text = os.environ.get(var)
    if text is None or text.strip() == "":
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(
            f"{where}: the environment variable {var}={text!r} is not an integer ({argument} defaults to "
            f"${var}, which torchrun sets); fix {var} or pass {argument}= explicitly"
        ) from None


def _check(where: str, argument: str, value: Any, lo: int, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{where}: {argument}{source} must be an integer >= {lo}, got {value!r}")
    if value < lo:
        raise ValueError(f"{where}: {argument} = {value}{source} is out of range, it must be >= {lo}")
    return int(value)


def resolve_shard(
    where: str,
    rank: int | None = None,
    world_size: int | None = None,
    uneven: str = "pad",
    local_world_size: int | None = None,
) -> Shard | None:
    """The shard for ``rank`` / ``world_size`` (each defaulting to ``$RANK`` / ``$WORLD_SIZE``), or None
    when there is one rank. Errors name ``where`` (the ``from_*`` method), the argument and the variable."""
    if uneven not in UNEVEN:
        raise ValueError(f"{where}: uneven must be one of {list(UNEVEN)}, got {uneven!r}")
    rank_from = world_from = ""
    if world_size is None:
        world_size = _env_int("WORLD_SIZE", where, "world_size")
        world_from = " (from $WORLD_SIZE)"
        if world_size is None:
            world_size, world_from = 1, ""
    if rank is None:
        rank = _env_int("RANK", where, "rank")
        rank_from = " (from $RANK)"
        if rank is None:
            rank, rank_from = 0, ""
    world_size = _check(where, "world_size", world_size, 1, world_from)
    rank = _check(where, "rank", rank, 0, rank_from)
    if rank >= world_size:
        raise ValueError(
            f"{where}: rank = {rank}{rank_from} is out of range for world_size = {world_size}{world_from}: "
            f"valid ranks are 0..{world_size - 1}"
        )
    local_from = ""
    if local_world_size is None:
        local_world_size = _env_int("LOCAL_WORLD_SIZE", where, "local_world_size")
        local_from = " (from $LOCAL_WORLD_SIZE)"
        if local_world_size is None:  # as under torch.multiprocessing.spawn: every rank on this machine
            local_world_size, local_from = world_size, ""
    local_world_size = _check(where, "local_world_size", local_world_size, 1, local_from)
    if world_size == 1:
        return None
    return Shard(rank, world_size, uneven, min(local_world_size, world_size))


# ---- sources whose row counts are known: one contiguous range per rank ---------------------------


def range_slices(unit_rows: Sequence[int], shard: Shard) -> list[tuple[int, int, int]]:
    """This rank's rows as ``(unit, lo, hi)`` slices of the units (rows ``lo..hi-1`` of ``unit``), in
    global order, the padding row (if any) last. ``unit_rows`` are the units' row counts in global order."""
    total = int(sum(unit_rows))
    lo = shard.start(total)
    hi = lo + shard.count(total) - (1 if shard.drops_last(total) else 0)
    slices = _cover(unit_rows, lo, hi)
    pad = shard.pad_row(total)
    if pad is not None:
        slices += _cover(unit_rows, pad, pad + 1)
    return slices


def _cover(unit_rows: Sequence[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """The ``(unit, lo, hi)`` slices that hold global rows ``lo..hi-1``."""
    out: list[tuple[int, int, int]] = []
    first = 0
    for unit, rows in enumerate(unit_rows):
        a, b = max(lo, first), min(hi, first + rows)
        if a < b:
            out.append((unit, a - first, b - first))
        first += rows
        if first >= hi:
            break
    return out


# ---- from_iterable: a contiguous share of every chunk ---------------------------------------------


def _dealt(total: int, rank: int, world_size: int) -> int:
    """Rows of the first ``total`` that a round-robin deal gives ``rank``."""
    return max(0, (total - rank + world_size - 1) // world_size)


def chunk_share(first: int, rows: int, shard: Shard) -> tuple[int, int]:
    """Rows ``a..b-1`` of a chunk of ``rows`` rows starting at global row ``first`` that this rank keeps:
    ranks take consecutive pieces, each as long as its round-robin count grows over the chunk."""
    w = shard.world_size

    def grown(r: int) -> int:
        return _dealt(first + rows, r, w) - _dealt(first, r, w)

    a = sum(grown(r) for r in range(shard.rank))
    return a, a + grown(shard.rank)


def slice_item(item: Item, a: int, b: int) -> Item:
    """Rows ``a..b-1`` of ``item`` (views), with its origin narrowed to them."""
    chunk = {k: v[a:b] for k, v in item.chunk.items()}
    origin = item.origin
    if origin is not None and len(origin.segments) == 1 and origin.row_ids is None:
        s = origin.segments[0]
        origin = Origin((Segment(s.source, s.unit, s.lo + a, s.lo + b),))
    return Item(chunk, origin, b - a, nbytes(chunk))


def shard_stream(items: Iterator[Item], shard: Shard) -> Iterator[Item]:
    """This rank's share of a stream of items (see the module docstring); padding or dropping at its end.

    With ``uneven="pad"`` it keeps a copy of the stream's first ``world_size`` rows (the padding rows); with
    ``uneven="drop"`` it holds back its latest piece until the next one comes (its last row may be the
    one to leave out)."""
    w = shard.world_size
    first = 0
    head: list[Item] = []  # copies of the first w rows of the stream, for padding
    head_rows = 0 if shard.uneven == "pad" else w
    held: Item | None = None
    for item in items:
        rows = item.rows
        if head_rows < w and rows:
            take = min(rows, w - head_rows)
            piece = slice_item(item, 0, take)
            head.append(Item({k: v.copy() for k, v in piece.chunk.items()}, piece.origin, take, piece.nbytes))
            head_rows += take
        a, b = chunk_share(first, rows, shard)
        first += rows
        if a == b:
            continue
        piece = item if (a, b) == (0, rows) else slice_item(item, a, b)
        if shard.uneven == "drop":
            if held is not None:
                yield held
            held = piece
        else:
            yield piece
    if held is not None:
        if shard.drops_last(first):
            held = slice_item(held, 0, held.rows - 1) if held.rows > 1 else None
        if held is not None:
            yield held
    pad = shard.pad_row(first)
    if pad is not None:
        yield _row_of(head, pad)


def _row_of(head: list[Item], row: int) -> Item:
    """Global row ``row`` (< the rows in ``head``) as a one-row item."""
    for item in head:
        if row < item.rows:
            return slice_item(item, row, row + 1)
        row -= item.rows
    raise AssertionError("padding row beyond the kept head rows")


def pad_to(chunk: dict[str, np.ndarray], rows: int, where: str) -> dict[str, np.ndarray]:
    """``chunk`` lengthened to ``rows`` rows by repeating its own rows from the start (a Criteo block
    whose skipped lines left it short of its planned count), so the rank keeps its count."""
    have = num_rows(chunk)
    if have >= rows:
        return chunk
    if have == 0:
        from intune.pipeline.errors import SourceError

        raise SourceError(
            f"{where}: every line of this rank's part was skipped, so it cannot keep the row count the "
            "other ranks have; fix the input (or read it with world_size=1)"
        )
    index = np.arange(rows) % have
    return {k: v[index] for k, v in chunk.items()}


# ---- each rank's share of the machine -------------------------------------------------------------


class ShareMonitor(Monitor):
    """A ``Monitor`` whose samples show ``share`` of the machine's CPUs and of its free memory: one rank
    of several on a machine tunes for its own part, not for the whole machine."""

    def __init__(self, share: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0 < share <= 1:
            raise ValueError(f"ShareMonitor: share must be in (0, 1], got {share!r}")
        self.share = share

    def sample(self) -> MachineSample:
        s = super().sample()
        return dataclasses.replace(
            s,
            cpus=max(1.0, s.cpus * self.share),  # a stage has at least one worker anyway
            memory_limit_bytes=s.memory_used_bytes + int(s.memory_free_bytes * self.share),
            host_free_bytes=int(s.host_free_bytes * self.share),
        )


def monitor_for(pipe: Any) -> Monitor:
    """The monitor a tuner of ``pipe`` uses by default: its rank's share of the machine (the whole
    machine for a pipeline with no shard, or one rank per machine)."""
    shard = getattr(pipe, "shard", None)
    share = shard.machine_share if shard is not None else 1.0
    return Monitor() if share >= 1 else ShareMonitor(share)
