"""Functions the remote-worker tests map, in a module of their own so that a worker (a local child or a
Ray actor) that loads them imports neither pytest nor Ray."""

from __future__ import annotations

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


def busy_chunk(chunk: dict) -> dict:
    """A chunk that takes 20 ms, so that chunks are in flight when a test acts."""
    time.sleep(0.02)
    return {"id": chunk["id"], "x2": chunk["x"] * 2.0}


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
