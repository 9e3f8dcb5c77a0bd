"""Functions the remote-worker tests map, in a module of their own so that a worker (a local child or a
Ray actor) that loads them imports neither pytest nor Ray."""

from __future__ import annotations

import glob
import os
import sys
import time

import numpy as np


def on_ray() -> bool:
    """Whether this runs in a Ray worker (an actor), not in a local process worker."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def busy_row(row: dict) -> dict:
    """A row that takes about half a millisecond (a sleep: the tests share two busy cores)."""
    time.sleep(0.0005)
    return {"id": row["id"], "x2": row["x"] * 2.0}


def after_remote_workers_ran(marker: str, fn, arg, remotes: int = 1):
    """``fn(arg)``, where a remote worker first marks that it ran (a file ``<marker>.<its pid>``) and a local
    worker waits until ``remotes`` remote workers did before it runs (within a hang bound): that much of
    the epoch goes to the remote workers however slow they are to start on a busy machine, since the
    local workers cannot do it all first. (With ``remotes`` > 1, the first remote workers may fill the
    output window, held behind the local worker's chunk, before the others are ready for a chunk.)"""
    if on_ray():
        mine = f"{marker}.{os.getpid()}"
        if not os.path.exists(mine):
            open(mine, "w").close()
    else:
        deadline = time.monotonic() + 120
        while len(glob.glob(glob.escape(marker) + ".*")) < remotes and time.monotonic() < deadline:
            time.sleep(0.01)
    return fn(arg)


def busy_chunk(chunk: dict) -> dict:
    """A chunk that takes 20 ms, so that chunks are in flight when a test acts."""
    time.sleep(0.02)
    return {"id": chunk["id"], "x2": chunk["x"] * 2.0}


def held_on_ray(marker: str, node_id: str, chunk: dict) -> dict:
    """``busy_chunk``; until a file at ``marker`` exists, every remote worker holds its chunk after saying
    so with a file ``<marker>.held.<its node>``, and a local worker waits before it runs until the remote
    worker on node ``node_id`` (on any if it is empty) holds one (within hang bounds). A test removes the
    node meanwhile: a chunk is in flight there when it goes, and the epoch cannot end first, however
    slow or fast each side is. (The other remote workers hold theirs too, so that none of them fills
    the output window before the one on ``node_id`` took a chunk.)"""
    deadline = time.monotonic() + 120
    if on_ray():
        open(f"{marker}.held.{_node_id()}", "a").close()
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        held = f"{glob.escape(marker)}.held.{node_id or '*'}"
        while not os.path.exists(marker) and not glob.glob(held) and time.monotonic() < deadline:
            time.sleep(0.01)
    return busy_chunk(chunk)


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def slow_chunk(chunk: dict) -> dict:
    time.sleep(0.05)
    return {"id": chunk["id"], "x2": chunk["x"] * 2.0}


def fails_on_ray(chunk: dict) -> dict:
    """Raises on every chunk in a remote worker, naming the chunk's first id; slow in a local one (so
    that the remote workers get chunks)."""
    if on_ray():
        raise KeyError(f"no feature for id {int(chunk['id'][0])}")
    time.sleep(0.5)
    return {"id": chunk["id"], "x2": chunk["x"] * 2.0}


def fails_row_on_ray(row: dict) -> dict:
    """Raises on row 34 of every 100 in a remote worker; a local worker pauses at each 100th row."""
    if on_ray():
        if row["id"] % 100 == 34:
            raise KeyError(f"no feature for id {int(row['id'])}")
    elif row["id"] % 100 == 0:
        time.sleep(0.3)
    return {"id": row["id"]}


def id_chunks(n: int, rows: int) -> list[dict]:
    """``n // rows`` chunks of rows ``id`` = 0..n-1 and a float ``x``."""
    return [{"id": np.arange(i, min(n, i + rows)), "x": np.arange(i, min(n, i + rows)) * 0.5} for i in range(0, n, rows)]
