"""Surplus thread workers, live and simulated: what a thread stage delivers at many threads against few.

Owns one comparison of ``intune bench fidelity``: a thread-mode map stage whose function holds the GIL
for a share of each chunk (a Python loop) and releases it for the rest (``np.sort``), run live at each of
``THREADS`` workers on the benchmark's CPUs, beside the simulator's model (``model.throughput``) of the
same costs at the same counts, at the twin's oversubscription cost and thread switch share.

Why: the simulator charges computing workers past the CPUs an oversubscription cost, a thread at the
machine's ``thread_switch_share`` of a process's; live, a thread's switch is cheap and surplus threads
mostly wait for input. A policy pretrained on a simulator that overcharges them learns to be frugal with
threads for a cost the engine does not have. This section measures the agreement; a fix belongs in the
simulator. It must not fit the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

CHUNK_ROWS = 256
THREADS = (2, 32)
CASES = ((20_000, 200_000), (60_000, 120_000), (150_000, 60_000))
"""(Python loop iterations, floats sorted) per chunk: about a tenth, a third and three quarters of a
chunk's CPU under the GIL on the development machine (each run measures its own share)."""


def udf_parts(loops: int, sort_n: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """The two parts of a chunk's work: ``loops`` iterations of a Python loop (the GIL held), and a sort
    of ``sort_n`` floats (numpy releases the GIL)."""
    data = np.random.default_rng(0).random(sort_n)

    def held() -> None:
        total = 0
        for i in range(loops):
            total += i

    def released() -> None:
        np.sort(data)

    return held, released


def two_part_udf(loops: int, sort_n: int) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A chunk function doing both parts (``udf_parts``), returning the chunk unchanged."""
    held, released = udf_parts(loops, sort_n)

    def udf(chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        held()
        released()
        return chunk

    return udf


def gil_share(loops: int, sort_n: int, repeats: int = 30) -> tuple[float, float]:
    """(CPU seconds per chunk, the share of it under the GIL), each part timed alone on one thread."""

    def timed(fn: Callable[[], Any]) -> float:
        start = time.thread_time()
        for _ in range(repeats):
            fn()
        return (time.thread_time() - start) / repeats

    held, released = (timed(part) for part in udf_parts(loops, sort_n))
    return held + released, held / (held + released)


def _chunks() -> Iterator[dict[str, np.ndarray]]:
    start = 0
    while True:
        yield {"id": np.arange(start, start + CHUNK_ROWS)}
        start += CHUNK_ROWS


def live_rate(udf: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], threads: int, warmup_s: float,
              seconds: float) -> float:
    """Rows/s of ``udf`` in ``threads`` thread workers behind a cheap source, after ``warmup_s``."""
    from intune import Pipeline

    pipe = Pipeline.from_iterable(_chunks(), max_workers=max(threads, 1)).map(udf, name="udf", mode="thread",
                                                                               workers=threads)
    with pipe:
        it = iter(pipe)
        end = time.monotonic() + warmup_s
        while time.monotonic() < end:
            next(it)
        rows, start = 0, time.monotonic()
        while time.monotonic() < start + seconds:
            rows += len(next(it)["id"])
        elapsed = time.monotonic() - start
        it.close()
    return rows / elapsed


def simulated_rate(cpu_s_per_chunk: float, share: float, threads: int, cpus: int, cost: float,
                   switch_share: float) -> float:
    """Rows/s the simulator's model gives the same stage (behind a one-thread source) at ``threads``, on a
    machine of oversubscription cost ``cost`` and ``thread_switch_share`` ``switch_share``."""
    from intune.sim import model, spec_from_dict

    spec = spec_from_dict({
        "name": "surplus-threads", "chunk_rows": CHUNK_ROWS, "batch_size": CHUNK_ROWS, "bytes_per_row": 8,
        "machine": {"cpus": cpus, "oversubscription_cost": cost, "thread_switch_share": switch_share},
        "stages": [
            {"name": "src", "kind": "read", "mode": "thread", "cpu_us_per_row": 0.01, "max_workers": 1},
            {"name": "udf", "kind": "map", "mode": "thread", "cpu_us_per_row": cpu_s_per_chunk * 1e6 / CHUNK_ROWS,
             "gil_fraction": share, "max_workers": max(THREADS)},
        ],
    })
    return float(model.throughput(model.params_from_spec(spec), [1, threads], [0, 0], cpus))


def compare(cpus: int, cost: float, switch_share: float, warmup_s: float, seconds: float,
            cases: Sequence[tuple[int, int]] = CASES) -> list[dict[str, Any]]:
    """One row per case and thread count: the GIL share, live and simulated rows/s, and each one's
    ratio to its rate at the fewest threads."""
    from intune.bench.machine_control import CpuRestriction

    rows: list[dict[str, Any]] = []
    for loops, sort_n in cases:
        cpu_s, share = gil_share(loops, sort_n)
        udf = two_part_udf(loops, sort_n)
        with CpuRestriction() as restriction:
            restriction.limit(cpus)
            live = {w: live_rate(udf, w, warmup_s, seconds) for w in THREADS}
        sim = {w: simulated_rate(cpu_s, share, w, cpus, cost, switch_share) for w in THREADS}
        few = THREADS[0]
        for w in THREADS:
            rows.append({
                "gil_share": round(share, 2), "threads": w, "live_rows_per_s": live[w], "simulated_rows_per_s": sim[w],
                "live_x_fewest": live[w] / live[few] if live[few] else None,
                "simulated_x_fewest": sim[w] / sim[few] if sim[few] else None,
            })
    return rows


__all__ = ["CASES", "THREADS", "compare", "gil_share", "live_rate", "simulated_rate", "two_part_udf", "udf_parts"]
