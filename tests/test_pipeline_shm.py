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
        from intune.pipeline import shm
        held = shm.owner_prefix()[:-1] + ".lock"  # this process's lock: held for its life, gone at its exit
        print("LEFT", *[f for f in os.listdir("/dev/shm") if f.startswith("intune-") and f != held])
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


_OWNER_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import intune

    def slow(chunk):
        time.sleep(0.005)
        return {"id": chunk["id"] + 0}

    n = 200_000
    chunks = [{"id": np.arange(i, i + 1000)} for i in range(0, n, 1000)]
    pipe = intune.Pipeline.from_iterable(chunks).map(slow, mode="process", workers=2)
    with pipe:
        batches = iter(pipe)
        ids = [next(batches)["id"].copy() for _ in range(5)]
        label = f"{pipe.label}-"  # its segments' names: <owner prefix><label>...
        [prefix] = {n.split(label)[0] for n in os.listdir("/dev/shm") if label in n}
        print("OWNER", os.getpid(), prefix, *pipe.stage("map").worker_pids(), flush=True)
        sys.stdin.readline()  # the test sweeps now
        ids += [b["id"].copy() for b in batches]
    ids = np.sort(np.concatenate(ids))
    print("EXACTLY_ONCE", bool(np.array_equal(ids, np.arange(n))), flush=True)
    """
)


def _owned(prefix: str, fallback) -> list[str]:
    """The segments of the owner with ``prefix`` (``intune-<pid>-<nonce>-``) and its lock files."""
    lock = prefix[:-1] + ".lock"
    return [n for d in ("/dev/shm", fallback) for n in _ours(d, prefix[:-1]) if n.startswith(prefix) or n == lock]


def _free_pid_run(length: int = 64) -> int:
    """A pid with ``length`` free pids from it in this PID namespace (no such process here)."""
    for start in range(31000, 2000, -length):
        if not any(os.path.exists(f"/proc/{pid}") for pid in range(start, start + length)):
            return start
    pytest.skip("no run of free pids in this PID namespace")


@lru_cache(maxsize=1)
def _no_pid_namespaces() -> str:
    """Why a process cannot be started in a PID namespace of its own here ('' if it can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", "echo 999 > /proc/sys/kernel/ns_last_pid"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare --pid failed: {exc}"
    if done.returncode != 0:
        return f"unshare --pid / ns_last_pid not permitted: {done.stderr.strip()}"
    return ""


def test_the_sweep_spares_a_live_trainer_in_another_pid_namespace_and_removes_it_once_gone(tmp_path, monkeypatch):
    """Two containers sharing /dev/shm: the other trainer's pid names no process here, yet it lives."""
    why = _no_pid_namespaces()
    if why:
        pytest.skip(f"needs a PID namespace: {why}")
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    monkeypatch.setenv(shm.FALLBACK_ENV, str(fallback))  # this process sweeps there too
    script = tmp_path / "owner.py"
    script.write_text(_OWNER_SCRIPT)
    foreign = _free_pid_run()
    # in its own PID namespace, the trainer gets pid ``foreign`` (its workers the pids after it), which
    # no process has in this one; --kill-child: the namespace dies (SIGKILL, workers included) with unshare
    inner = f'echo {foreign - 1} > /proc/sys/kernel/ns_last_pid && "$0" "$1"'
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", inner, sys.executable, str(script)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_child_env(INTUNE_SHM_FALLBACK_DIR=str(fallback)),
    )
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["OWNER"], line
        pid, prefix = int(line[1]), line[2]
        assert pid == foreign and not shm.pid_alive(pid), "the trainer's pid names a process here"
        live = _owned(prefix, fallback)
        assert live, "the trainer made no segments"
        shm.sweep_stale()
        assert [s for s in live if s not in _owned(prefix, fallback)] == [], "a live trainer's segments were swept"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["EXACTLY_ONCE", "True"]
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert _owned(prefix, fallback) == []  # it cleaned up after itself, lock file included
        # now a trainer that is SIGKILLed with its workers: nothing of it can clean up
        proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", inner, sys.executable, str(script)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=_child_env(INTUNE_SHM_FALLBACK_DIR=str(fallback)),
        )
        line = proc.stdout.readline().split()
        assert line[:1] == ["OWNER"], line
        prefix = line[2]
        proc.kill()  # unshare dies, and with it the namespace's every process
        proc.wait(timeout=30)
        left = _owned(prefix, fallback)
        assert any(n.endswith(".lock") for n in left) and any(not n.endswith(".lock") for n in left), left
        deadline = time.monotonic() + 30  # the namespace's processes are gone within moments
        while _owned(prefix, fallback):
            assert time.monotonic() < deadline, f"a gone trainer's files were left: {_owned(prefix, fallback)}"
            shm.sweep_stale()
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


_FOREIGN_OWNER = textwrap.dedent(
    """
    import os, sys
    dead = int(sys.argv[1])
    os.getpid = lambda: dead  # what a pid of another PID namespace looks like from here
    from intune.pipeline import shm
    segment = shm.Segment(shm.owner_prefix() + "px1-map-w0-in0-")
    segment.ensure(1 << 16)
    print("SEGMENT", segment.path, flush=True)
    sys.stdin.readline()
    """
)


def test_a_segment_whose_pid_is_dead_here_survives_while_its_owner_holds_the_lock():
    """The same without a PID namespace (no root needed): the owner's recorded pid is not a live pid
    here, the owner itself is alive and holds its lock."""
    dead = _dead_pid()
    owner = subprocess.Popen(
        [sys.executable, "-c", _FOREIGN_OWNER, str(dead)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=_child_env(),
    )
    try:
        line = owner.stdout.readline().split()
        assert line[:1] == ["SEGMENT"], line
        path = line[1]
        assert os.path.basename(path).startswith(f"intune-{dead}-") and not shm.pid_alive(dead)
        shm.sweep_stale()
        assert os.path.exists(path), "the segment of a live owner was swept"
    finally:
        owner.kill()
        owner.wait()
    assert os.path.exists(path)  # SIGKILLed: it could not clean up
    assert shm.sweep_stale() >= 1
    assert not os.path.exists(path)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(os.path.basename(path).rsplit("-px1", 1)[0])]


def test_the_sweep_leaves_what_it_cannot_prove_gone(tmp_path, monkeypatch):
    """Names without a lock file beside them (an older intune's, a stranger's), directories, symlinks."""
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    monkeypatch.setenv(shm.FALLBACK_ENV, str(fallback))
    dead = _dead_pid()
    left = [
        f"/dev/shm/intune-{dead}-px1-map-w0-in0-0",  # the old naming: only a pid
        f"{fallback}/intune-{dead}-0badc0de-px1-map-w0-in0-0",  # no lock file beside it
        f"{fallback}/intune-notapid-0",
    ]
    try:
        for path in left:
            with open(path, "wb") as f:
                f.write(b"x")
        os.mkdir(f"{fallback}/intune-{dead}-12345678-a-directory")
        open(f"{fallback}/intune-{dead}-12345678.lock", "wb").close()  # a gone owner's lock
        os.symlink("/etc/hostname", f"{fallback}/intune-{dead}-12345678-link")
        shm.sweep_stale()
        assert [p for p in left if not os.path.exists(p)] == []
        assert os.path.isdir(f"{fallback}/intune-{dead}-12345678-a-directory")
        assert os.path.lexists(f"{fallback}/intune-{dead}-12345678-link") and os.path.exists("/etc/hostname")
        assert not os.path.exists(f"{fallback}/intune-{dead}-12345678.lock")
    finally:
        for path in left:
            if os.path.exists(path):
                os.unlink(path)


def test_a_fresh_process_sweeps_what_a_killed_trainer_and_its_workers_left(tmp_path):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    env = _child_env(INTUNE_SHM_FALLBACK_DIR=str(fallback))
    script = tmp_path / "owner.py"
    script.write_text(_OWNER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["OWNER"], line
        prefix, workers = line[2], [int(p) for p in line[3:]]
        for pid in workers:  # the workers first, so that none is left to clean up after the trainer
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = _owned(prefix, fallback)
    assert any(n.endswith(".lock") for n in left) and any(not n.endswith(".lock") for n in left), left
    script = textwrap.dedent(
        """
        import numpy as np, intune
        pipe = intune.Pipeline.from_iterable([{"id": np.arange(10)}]).map(lambda c: c, mode="process")
        with pipe:
            assert sum(len(b["id"]) for b in pipe) == 10
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert _owned(prefix, fallback) == []


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
    assert _ours("/dev/shm", f"{shm.owner_prefix()}timeout") == []


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
