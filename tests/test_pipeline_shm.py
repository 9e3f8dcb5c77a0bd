"""Shared memory and process workers under stress: a small /dev/shm, a SIGKILLed consumer, a function the
worker cannot load, a hung chunk."""

import importlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from functools import lru_cache

import cloudpickle
import numpy as np
import pytest

import intune
from _processes import still_running
from intune.pipeline import StageError, shm
from intune.pipeline.procworker import ChunkTimeout, ProcessWorker

MiB = 1 << 20


def _child_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


@lru_cache(maxsize=1)
def _no_private_mounts() -> str:
    """Why a private tmpfs cannot be mounted on /dev/shm here ('' if it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = ["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare --mount failed: {exc}"
    if done.returncode != 0:
        return f"unshare --mount / mount tmpfs not permitted: {done.stderr.strip()}"
    return ""


def _run_with_small_shm(script: str, mounts: str, env: dict, timeout: float = 120):
    """Run ``script`` in a private mount namespace after ``mounts`` (shell commands) were run there."""
    why = _no_private_mounts()
    if why:
        pytest.skip(f"needs a private /dev/shm: {why}")
    command = f'{mounts} && exec "$0" -c "$1"'
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", command, sys.executable, script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _ours(directory, prefix="intune-"):
    return sorted(f for f in os.listdir(directory) if f.startswith(prefix))


# ---- a small /dev/shm -------------------------------------------------------------------------------


def test_segments_grow_to_the_exact_size_then_spill_to_the_fallback_dir_then_fail_clearly(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    script = textwrap.dedent(
        f"""
        import os, warnings
        import numpy as np
        from intune.pipeline import shm
        MiB = 1 << 20
        base = f"intune-{{os.getpid()}}-t-"
        a, b, c, d = (shm.Segment(base + x + "-") for x in "abcd")
        a.ensure(3 * MiB)
        b.ensure(int(3.5 * MiB))
        # 5 MiB left: 1.5 x 3.5 MiB does not fit, exactly 4.5 MiB does
        b.ensure(int(4.5 * MiB))
        assert b.path.startswith("/dev/shm/") and b.size == int(4.5 * MiB), (b.path, b.size)
        # 0.5 MiB left: a 1 MiB segment goes to the fallback directory, with one warning
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c.ensure(1 * MiB)
            c.ensure(2 * MiB)
        assert c.path.startswith(os.environ["INTUNE_SHM_FALLBACK_DIR"]), c.path
        assert len(caught) == 1 and "file-backed" in str(caught[0].message), [str(w.message) for w in caught]
        # the reading side finds the segment where it was made
        np.frombuffer(c.buffer, dtype=np.uint8)[:4] = [1, 2, 3, 4]
        reader = shm.Mapping_()
        view = np.frombuffer(reader.follow(c.path, c.size), dtype=np.uint8)
        assert view[:4].tolist() == [1, 2, 3, 4]
        del view
        reader.close()
        # neither place has room: a clear error, no SIGBUS
        os.environ["INTUNE_SHM_FALLBACK_DIR"] = {str(small)!r}
        try:
            d.ensure(2 * MiB)
        except OSError as exc:
            text = str(exc)
            assert "2.0 MiB" in text and "/dev/shm" in text and {str(small)!r} in text, text
        else:
            raise AssertionError("no error for a segment that fits nowhere")
        for s in (a, b, c, d):
            s.close()
        assert not [f for f in os.listdir("/dev/shm") if f.startswith(base)]
        print("OK")
        """
    )
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    done = _run_with_small_shm(
        script,
        f"mount -t tmpfs -o size=8m tmpfs /dev/shm && mount -t tmpfs -o size=1m tmpfs {small}",
        _child_env(INTUNE_SHM_FALLBACK_DIR=str(fallback)),
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "OK" in done.stdout
    assert _ours(fallback) == []


def test_a_pipeline_with_chunks_larger_than_dev_shm_finishes_and_warns(tmp_path):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    script = textwrap.dedent(
        """
        import os
        import numpy as np
        import intune
        MiB = 1 << 20
        sizes = [12, 1, 5, 12, 3, 9, 2, 12]  # MiB of int64 ids per chunk; /dev/shm holds 8
        chunks, start = [], 0
        for size in sizes:
            rows = size * MiB // 8
            chunks.append({"id": np.arange(start, start + rows), "x": np.arange(rows, dtype=np.float32)})
            start += rows

        def fresh_ids(chunk):  # a new id column (written by the child), x passes through
            return {"id": chunk["id"] + 0, "x": chunk["x"]}

        pipe = intune.Pipeline.from_iterable(chunks).map(fresh_ids, mode="process", workers=2)
        with pipe:
            got = [(b["id"].copy(), b["x"].copy()) for b in pipe]
        ids = np.concatenate([g[0] for g in got])
        assert np.array_equal(np.sort(ids), np.arange(start)), "rows lost or repeated"
        assert all(np.array_equal(x, np.arange(len(x), dtype=np.float32)) for _, x in got)
        print("ROWS", len(ids))
        print("LEFT", *[f for f in os.listdir("/dev/shm") if f.startswith("intune-")])
        """
    )
    done = _run_with_small_shm(
        script,
        "mount -t tmpfs -o size=8m tmpfs /dev/shm",
        _child_env(INTUNE_SHM_FALLBACK_DIR=str(fallback)),
    )
    assert done.returncode == 0, f"exit {done.returncode} (-7 is SIGBUS)\n{done.stdout}\n{done.stderr}"
    assert f"ROWS {sum([12, 1, 5, 12, 3, 9, 2, 12]) * MiB // 8}" in done.stdout
    assert "file-backed memory in " + str(fallback) in done.stderr, done.stderr
    assert "LEFT\n" in done.stdout, done.stdout  # nothing left in the private /dev/shm
    assert _ours(fallback) == []


# ---- leftover segments ------------------------------------------------------------------------------


def _segments_of(pid, fallback):
    prefix = f"intune-{pid}-"
    return _ours("/dev/shm", prefix) + _ours(fallback, prefix)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sigkilled_consumer_leaves_no_worker_and_no_segment(tmp_path):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    script = tmp_path / "consumer.py"
    script.write_text(
        textwrap.dedent(
            """
            import time, numpy as np, intune
            def slow(chunk):
                time.sleep(0.02)
                return {"id": chunk["id"] * 1}
            chunks = lambda: ({"id": np.arange(i * 1000, (i + 1) * 1000)} for i in range(10**6))
            pipe = intune.Pipeline.from_iterable(chunks).map(slow, mode="process", workers=2)
            for i, batch in enumerate(pipe):
                if i == 5:
                    print("PIDS", *pipe.stage("map").worker_pids(), flush=True)
            """
        )
    )
    env = _child_env(INTUNE_SHM_FALLBACK_DIR=str(fallback))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        pids = [int(p) for p in line.split()[1:]]
        assert pids and _segments_of(proc.pid, fallback), "the consumer made no segments"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not still_running(pids, within_s=30.0), "workers outlived their SIGKILLed consumer"
    deadline = time.monotonic() + 30
    while _segments_of(proc.pid, fallback) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _segments_of(proc.pid, fallback) == []


def test_sweep_removes_dead_processes_segments_only(tmp_path, monkeypatch):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    monkeypatch.setenv(shm.FALLBACK_ENV, str(fallback))
    dead = _dead_pid()
    sleeper = subprocess.Popen(["sleep", "60"])
    stale = [f"/dev/shm/intune-{dead}-px1-map-w0-in0-0", f"{fallback}/intune-{dead}-px1-map-w0-g1-out1-2"]
    live = [f"/dev/shm/intune-{sleeper.pid}-px1-map-w0-in0-0", f"{fallback}/intune-{os.getpid()}-sweeptest-0"]
    other = [f"{fallback}/intune-notapid-0", f"{fallback}/intune-{dead}-a-directory"]
    try:
        for path in stale + live + other[:1]:
            with open(path, "wb") as f:
                f.write(b"x")
        os.mkdir(other[1])
        assert shm.sweep_stale() >= 2
        assert [p for p in stale if os.path.exists(p)] == []
        assert [p for p in live + other if not os.path.exists(p)] == []
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in stale + live + other[:1]:
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(other[1])


def test_a_fresh_process_sweeps_leftovers_when_its_first_worker_starts(tmp_path):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    dead = _dead_pid()
    stale = [f"/dev/shm/intune-{dead}-px9-map-w1-in1-3", f"{fallback}/intune-{dead}-px9-map-w1-in0-0"]
    live = f"/dev/shm/intune-{os.getpid()}-sweeptest-in0-0"
    for path in [*stale, live]:
        with open(path, "wb") as f:
            f.write(b"x" * 4096)
    script = textwrap.dedent(
        """
        import numpy as np, intune
        pipe = intune.Pipeline.from_iterable([{"id": np.arange(10)}]).map(lambda c: c, mode="process")
        with pipe:
            assert sum(len(b["id"]) for b in pipe) == 10
        """
    )
    try:
        env = _child_env(INTUNE_SHM_FALLBACK_DIR=str(fallback))
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
        assert done.returncode == 0, done.stderr
        assert [p for p in stale if os.path.exists(p)] == []
        assert os.path.exists(live), "a live process's segment was swept"
    finally:
        for path in [*stale, live]:
            if os.path.exists(path):
                os.unlink(path)


# ---- a function the worker cannot load ----------------------------------------------------------------


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_function_the_worker_cannot_import_fails_the_epoch_with_the_real_error(tmp_path, on_error):
    module = f"intune_vanishing_udf_{on_error}"
    (tmp_path / f"{module}.py").write_text("def double(chunk):\n    return {'id': chunk['id'] * 2}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.invalidate_caches()
        fn = importlib.import_module(module).double  # pickled by reference: the child must import it
        chunks = [{"id": np.arange(i, i + 10)} for i in range(0, 100, 10)]
        pipe = intune.Pipeline.from_iterable(chunks).map(fn, name="udf", mode="process", on_error=on_error)
    finally:
        sys.path.remove(str(tmp_path))  # the child gets this process's path: without the module's folder
        sys.modules.pop(module, None)
    with pipe, pytest.raises(StageError) as info:
        list(pipe)
    message = str(info.value)
    assert "ModuleNotFoundError" in message and module in message, message
    assert "stage 'udf'" in message and info.value.remote_traceback
    assert pipe.metrics().stages["udf"].restarts == 0
    assert pipe.metrics().stages["udf"].skipped == 0


# ---- a hung chunk ---------------------------------------------------------------------------------------


def _worker(fn, label):
    return ProcessWorker(cloudpickle.dumps(fn), f"{label}{os.getpid()}")


def test_chunk_timeout_kills_the_hung_child_and_restart_resends_the_chunk(tmp_path):
    marker = tmp_path / "hung"

    def hang_once(chunk):
        if chunk["id"][0] == 0 and not marker.exists():
            marker.write_text("hung")
            time.sleep(3600)
        return chunk

    stop = threading.Event()
    worker = _worker(hang_once, "timeout")
    try:
        worker.submit({"id": np.arange(100, 110)})  # a warm child: its start is not the chunk's time
        assert worker.collect(stop)[0]["id"].tolist() == list(range(100, 110))
        worker.submit({"id": np.arange(0, 10)})
        pid = worker.pid
        t0 = time.monotonic()
        with pytest.raises(ChunkTimeout) as info:
            worker.collect(stop, timeout_s=1.0)
        assert time.monotonic() - t0 < 60  # a hang bound, not a speed requirement
        assert info.value.seconds == 1.0 and marker.exists()
        assert worker.pid is None and not still_running([pid], within_s=5.0)
        assert worker.in_flight == 1  # kept for the restart
        worker.restart()
        assert worker.collect(stop, timeout_s=60.0)[0]["id"].tolist() == list(range(10))
        worker.submit({"id": np.arange(10, 20)})
        assert worker.collect(stop, timeout_s=60.0)[0]["id"].tolist() == list(range(10, 20))
    finally:
        worker.close()
    assert _ours("/dev/shm", f"intune-{os.getpid()}-timeout") == []


def test_a_queued_chunk_is_not_charged_for_the_chunk_ahead_of_it():
    def sleep_as_told(chunk):
        time.sleep(float(chunk["s"][0]))
        return chunk

    stop = threading.Event()
    worker = _worker(sleep_as_told, "queued")
    try:
        worker.submit({"s": np.array([0.0])})
        worker.collect(stop)
        # both sent now; each takes 3 s, so the second one's result comes ~6 s after its send
        worker.submit({"s": np.array([3.0])})
        worker.submit({"s": np.array([3.0])})
        worker.collect(stop, timeout_s=5.0)
        worker.collect(stop, timeout_s=5.0)
    finally:
        worker.close()


def test_after_a_timeout_the_hung_chunk_can_be_dropped_and_the_queued_one_resent():
    def hang_on_zero(chunk):
        if chunk["id"][0] == 0:
            time.sleep(3600)
        return chunk

    stop = threading.Event()
    worker = _worker(hang_on_zero, "drop")
    try:
        worker.submit({"id": np.arange(100, 110)})
        worker.collect(stop)
        worker.submit({"id": np.arange(0, 10)})
        worker.submit({"id": np.arange(10, 20)})
        with pytest.raises(ChunkTimeout):
            worker.collect(stop, timeout_s=1.0)
        assert worker.in_flight == 2 and worker.oldest_deaths() == 1
        worker.drop_oldest()
        worker.restart()
        assert worker.collect(stop, timeout_s=60.0)[0]["id"].tolist() == list(range(10, 20))
        assert worker.in_flight == 0
    finally:
        worker.close()
