"""The shuffle buffer's memory as the memory cgroup sees it (issue 46 items 1, 2 and 11).

A cut of ``shuffle.buffer_mb`` gives the pages back (the cgroup's usage falls by at least 80% of what
was cut, with or without a process forked while the buffer was full); the drain at the end of input
holds the buffer plus one chunk, not a second copy; the default buffer fits a small container, and a
value over the ceiling is refused naming both. Each workload runs in a fresh process inside a child
memory cgroup of its own (``intune.bench.cgroup_memory``); the tests skip where none can be made.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import intune
from intune.bench import cgroup_memory
from intune.pipeline.shuffle import ShuffleBuffer

SRC = str(Path(intune.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def cgroups() -> None:
    reason = cgroup_memory.unavailable()
    if reason:
        pytest.skip(f"no child memory cgroup can be made here: {reason}")


def measured(workload: str, **params) -> dict:
    result = cgroup_memory.run(workload, limit_mb=1024, timeout_s=240, **params)
    assert "error" not in result, result
    return result


@pytest.mark.parametrize("fork_child", [False, True], ids=["alone", "with-a-forked-child"])
def test_cutting_the_buffer_lowers_the_cgroups_usage_by_what_was_cut(cgroups, fork_child):
    """160 -> 8 MB mid-epoch. With the columns in a shared mapping usage did not fall at all
    (``MADV_DONTNEED`` frees no shared page). With a child forked while the buffer is full, the fall is
    counted from before the fork: private pages shared copy-on-write were copied as the shuffle wrote
    (usage 180 -> 350 MB) and the child kept the originals after the cut."""
    r = measured("buffer_cut", from_mb=160, to_mb=8, fork_child=fork_child)
    cut = r["held_before"] - r["held_after"]
    assert cut > 140 << 20, r  # the buffer was full, and the cut took effect
    assert r["freed_fraction"] >= 0.8, (
        f"usage fell {(r['usage_before'] - r['usage_after']) >> 20} MB for a cut of {cut >> 20} MB: {r}"
    )


def test_the_drain_holds_the_buffer_plus_one_chunk(cgroups):
    """The ``ShuffleBuffer`` alone, 120 MB: the peak from the end of input to the last row out is
    within 1.1x the buffer (a chunk is 0.5 MB; the drain's permutation 4 bytes a row). Building every
    chunk before releasing any peaked at twice the buffer."""
    r = measured("drain_peak", buffer_mb=120, through="buffer")
    assert r["peak_ratio"] <= 1.1, r


def test_a_pipelines_drain_adds_no_copy_of_the_buffer(cgroups):
    """Through a ``Pipeline``: the drain adds at most 15% of the buffer to what was held when the
    input ended (chunks in flight between stages, the permutation, a resume anchor taken at the last
    chunk: a copy of the buffer's row ids), where it added a whole copy; the peak is within 1.2x the
    buffer."""
    r = measured("drain_peak", buffer_mb=120, through="pipeline")
    assert r["drain_rise"] <= 0.15 and r["peak_ratio"] <= 1.2, r


def test_the_drain_lets_rows_out_in_the_order_of_one_permutation():
    """Moving rows while they wait changes nothing a consumer or a resume's replay sees: the chunks
    are the slices of ``rng.permutation(size)``, and the generator is left where that draw leaves it."""
    pick = np.random.default_rng(7)
    for _ in range(60):
        n, step, seed = int(pick.integers(1, 3000)), int(pick.integers(1, 400)), int(pick.integers(1 << 30))
        ids = pick.permutation(10**6)[:n]
        buf = ShuffleBuffer(np.random.default_rng(seed), n)
        buf.add({"id": ids.copy(), "pair": np.stack([ids, -ids], 1).astype(np.float32)})
        got = list(buf.drain(step))
        reference = np.random.default_rng(seed)
        perm = reference.permutation(n)
        assert [len(g["id"]) for g in got] == [len(perm[i : i + step]) for i in range(0, n, step)]
        assert np.array_equal(np.concatenate([g["id"] for g in got]), ids[perm]), (n, step)
        assert all(np.array_equal(g["pair"][:, 0], g["id"]) for g in got)  # rows stay whole
        assert buf.size == 0 and buf._rng.random() == reference.random()


def test_a_drain_stopped_early_keeps_the_rest_whole():
    """A consumer that stops taking chunks (an epoch stopped mid-drain) leaves the buffer holding
    exactly the rows not yet let out."""
    buf = ShuffleBuffer(np.random.default_rng(3), 1000)
    buf.add({"id": np.arange(1000)})
    drain = buf.drain(128)
    out = [next(drain)["id"] for _ in range(3)]
    assert buf.size == 1000 - 3 * 128
    rest = buf.column_copy("id")
    assert np.array_equal(np.sort(np.concatenate([*out, rest])), np.arange(1000))


SMALL_CONTAINER = """
import json, os, sys
open(os.path.join(sys.argv[1], "cgroup.procs"), "w").write(str(os.getpid()))
import numpy as np
import intune
chunks = [{"x": np.arange(10)}]
pipe = intune.Pipeline.from_iterable(chunks).shuffle().prefetch()
out = {"max_mb": pipe.max_mb, "shuffle": pipe.knobs["shuffle.buffer_mb"].value,
       "prefetch": pipe.knobs["prefetch.buffer_mb"].value}
with pipe:
    out["rows"] = sum(len(c["x"]) for c in pipe)
try:
    intune.Pipeline.from_iterable(chunks).shuffle(buffer_mb=300)
except ValueError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def test_the_default_buffers_fit_a_400_mb_container_and_a_larger_ask_names_the_ceiling(cgroups):
    from intune.bench.machine_control import MemoryCgroup

    group = MemoryCgroup(400 << 20)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SMALL_CONTAINER, str(group.path)],
            capture_output=True, text=True, timeout=120, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        )
    finally:
        group.cleanup()
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["max_mb"] == 200 and out["shuffle"] == 200 and out["prefetch"] == 200 and out["rows"] == 10
    assert out["error"].startswith("buffer_mb = 300 is out of range, valid range is [1, 200]: "), out
    assert "half the memory this process may use (400 MB, its cgroup's limit)" in out["error"], out


def test_a_buffer_over_the_ceiling_names_where_the_ceiling_comes_from(monkeypatch):
    import intune.monitor
    from intune.pipeline.engine import memory_ceiling

    monkeypatch.setattr(intune.monitor, "memory_usage", lambda root="/": (100 << 20, 400 << 20))
    assert memory_ceiling() == (200, "half the memory this process may use (400 MB, its cgroup's limit)")
    pipe = intune.Pipeline.from_iterable([{"x": np.arange(4)}])
    assert pipe.shuffle().knobs["shuffle.buffer_mb"].value == 200
    with pytest.raises(ValueError, match=r"buffer_mb = 256 is out of range, valid range is \[1, 200\]: .*half"):
        intune.Pipeline.from_iterable([{"x": np.arange(4)}]).prefetch(buffer_mb=256)
    given = intune.Pipeline.from_iterable([{"x": np.arange(4)}], max_mb=64)
    with pytest.raises(ValueError, match=r"buffer_mb = 100 .* \[1, 64\]: the buffers' ceiling of 64 MB is the pipeline's max_mb"):
        given.shuffle(buffer_mb=100)


def test_bench_engine_reports_the_cgroup_figures_as_skipped_where_no_cgroup_can_be_made(monkeypatch):
    from intune.bench import engine

    monkeypatch.setattr(cgroup_memory, "unavailable", lambda: "cgroup v2 only, not delegated")
    results = [engine.measure_cut(True), *engine.measure_drain(True)]
    rows = engine.table_rows(results)
    assert [r["meets target"] for r in rows] == ["skipped"] * 3
    assert all(r["value"] is None and r["detail"] == "skipped: no child memory cgroup (cgroup v2 only, not delegated)" for r in rows)
    assert "| skipped" in engine.markdown_report(results, quick=True, command="intune bench engine --only cut drain")
