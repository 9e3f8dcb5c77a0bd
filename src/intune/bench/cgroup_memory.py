"""The shuffle buffer's memory as its memory cgroup sees it: what a cut gives back, what the drain peaks at.

Owns two workloads, each run in a fresh child process inside a child memory cgroup of its own
(``machine_control.MemoryCgroup``; the process joins it before it allocates anything it measures), and
the figures they report from the cgroup's own files, not from the engine's bookkeeping:

- ``buffer_cut``: a pipeline's shuffle buffer filled to ``from_mb``, then ``shuffle.buffer_mb`` cut to
  ``to_mb`` mid-epoch; ``freed_fraction`` is the fall of ``memory.usage_in_bytes`` over the bytes the
  buffer let go (target >= 0.8). With ``fork_child`` a child process is forked while the buffer is full
  and lives on through the cut, as a process worker forked by a tuner would, and the fall is counted
  from the usage before the fork (pages the fork made the shuffle copy, or that the child kept, count
  against it).
- ``drain_peak``: a buffer of ``buffer_mb`` filled by the whole input, ``memory.max_usage_in_bytes``
  reset when the input ends, then the drain taken to the end. ``peak_ratio``: the peak's rise over
  the usage before the epoch, against the buffer's bytes (the buffer plus one chunk and the drain's
  indices, 8 bytes a row; in a pipeline also what the epoch keeps beside the buffer: a resume anchor
  holds a copy of the buffer's row ids, 8 bytes a row). ``over_start``: the same peak against what
  was held when the drain began, and ``drain_rise``: the peak over that, against the buffer's bytes
  (what the drain itself adds). ``through="pipeline"`` runs a ``Pipeline``; ``"buffer"`` the
  ``ShuffleBuffer`` alone.

Usage is the cgroup's: its process's interpreter, threads and in-flight chunks count too, which is why
the workloads use buffers of hundreds of MB beside chunks of half a MB.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from intune.units import MB

ROWS = 4096  # rows per input chunk
FLOATS = 15  # float64 columns beside the int64 id: 128 bytes a row, 136 in the buffer with its row id
ROW_BYTES = 8 * (1 + FLOATS) + 8


def unavailable() -> str | None:
    """Why no child memory cgroup can be made here, or ``None``."""
    from intune.bench.machine_control import memory_cgroup_unavailable

    return memory_cgroup_unavailable()


def run(workload: str, limit_mb: int = 1024, timeout_s: float = 300.0, **params: Any) -> dict[str, Any]:
    """``workload`` with ``params`` in a fresh process inside a new memory cgroup of ``limit_mb``;
    its figures, or ``{"error": ...}``. Raises ``PermissionError`` where no cgroup can be made."""
    import intune
    from intune.bench.child import run_child
    from intune.bench.machine_control import MemoryCgroup

    group = MemoryCgroup(limit_mb * MB)
    src = str(Path(intune.__file__).resolve().parents[1])
    path = os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        spec = {"workload": workload, "cgroup": str(group.path), "params": params}
        return run_child(__name__, spec, timeout_s, env={"PYTHONPATH": path})
    finally:
        group.cleanup()


# ---- in the child --------------------------------------------------------------------------------------
class Cgroup:
    """The child's view of its own cgroup's files."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def join(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def usage(self) -> int:
        return int((self.path / "memory.usage_in_bytes").read_text())

    def peak(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def reset_peak(self) -> None:
        (self.path / "memory.max_usage_in_bytes").write_text("0")

    def settled_usage(self) -> int:
        gc.collect()
        time.sleep(0.3)  # the pipeline's threads come to rest against their full channels
        return self.usage()


def _chunk(i: int, rows: int = ROWS) -> dict[str, np.ndarray]:
    return {
        "id": np.arange(i * ROWS, i * ROWS + rows, dtype=np.int64),
        **{f"f{k}": np.full(rows, float(i)) for k in range(FLOATS)},
    }


def buffer_cut(group: Cgroup, from_mb: int = 256, to_mb: int = 10, fork_child: bool = False) -> dict[str, Any]:
    from intune.pipeline import Pipeline

    def source() -> Iterator[dict]:
        for i in range(10**9):
            yield _chunk(i)

    pipe = Pipeline.from_iterable(source).shuffle(buffer_rows=10**9, seed=0, buffer_mb=from_mb)
    stage = pipe.stage("shuffle")
    child = 0
    with pipe:
        it = iter(pipe)
        for _ in range(40):  # the first comes once the buffer is full; then the steady state
            next(it)
        before, held_before = group.settled_usage(), stage.internal_bytes()
        if fork_child:
            child = os.fork()
            if child == 0:
                time.sleep(3600)
                os._exit(0)
            for _ in range(40):  # the shuffle writes into the buffer after the fork
                next(it)
        try:
            at_cut = group.settled_usage()
            pipe.knobs["shuffle.buffer_mb"].set(to_mb)
            while stage.internal_bytes() > to_mb * MB:  # a shrink lets a chunk's worth out per input
                next(it)
            for _ in range(40):
                next(it)
            after, held_after = group.settled_usage(), stage.internal_bytes()
        finally:
            if child:
                os.kill(child, 9)
                os.waitpid(child, 0)
    cut = held_before - held_after
    return {
        "usage_before": before,
        "usage_at_cut": at_cut,
        "usage_after": after,
        "held_before": held_before,
        "held_after": held_after,
        "freed_fraction": (before - after) / max(1, cut),
    }


def drain_peak(group: Cgroup, buffer_mb: int = 200, through: str = "pipeline") -> dict[str, Any]:
    from intune.pipeline import Pipeline
    from intune.pipeline.shuffle import IDS, ShuffleBuffer

    capacity = buffer_mb * MB // ROW_BYTES
    sizes = [min(ROWS, capacity - lo) for lo in range(0, capacity, ROWS)]  # the input fills it exactly

    start = [0]

    def source() -> Iterator[dict]:
        for i, rows in enumerate(sizes):
            yield _chunk(i, rows)
        start[0] = group.usage()  # the input has ended: from here on, the drain
        group.reset_peak()

    delivered = 0
    if through == "buffer":
        buf = ShuffleBuffer(np.random.default_rng(0), capacity)
        base = group.settled_usage()
        for chunk in source():
            chunk[IDS] = chunk["id"]
            buf.add(chunk)
        for out in buf.drain(ROWS):
            delivered += len(out["id"])
    elif through == "pipeline":
        pipe = Pipeline.from_iterable(source).shuffle(buffer_rows=capacity, seed=0, buffer_mb=buffer_mb)
        with pipe:
            if pipe.stage("shuffle").capacity(ROW_BYTES) != capacity:
                raise AssertionError("the shuffle's capacity is not the one the input was sized to")
            base = group.settled_usage()
            for out in pipe:
                delivered += len(out["id"])
    else:
        raise ValueError(f"through must be 'pipeline' or 'buffer', got {through!r}")
    if delivered != capacity:
        raise AssertionError(f"{delivered} rows delivered of {capacity}")
    peak = group.peak()
    held = capacity * ROW_BYTES
    return {
        "usage_before": base,
        "usage_at_drain": start[0],
        "peak": peak,
        "held": held,
        "peak_ratio": (peak - base) / held,
        "drain_rise": (peak - start[0]) / held,
        "over_start": (peak - base) / max(1, start[0] - base),
    }


WORKLOADS: dict[str, Callable[..., dict[str, Any]]] = {"buffer_cut": buffer_cut, "drain_peak": drain_peak}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    group = Cgroup(spec["cgroup"])
    group.join()
    result = WORKLOADS[spec["workload"]](group, **spec["params"])
    Path(argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
