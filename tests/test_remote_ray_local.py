"""The local Ray that intune starts (``address=None``, no cluster to find), under faults: its raylet
SIGKILLed mid-epoch, the trainer SIGKILLed. Each trainer is a fresh process whose environment carries a
tag that every process it starts inherits (Ray's included), so that what outlives it can be found."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install intune[ray])")

HANG_S = 300  # generous bound on one trainer (a local Ray takes ~40 s to start on 2 busy cores)
TAG = "INTUNE_TEST_TAG"

TRAINER = """
import logging, sys, time, numpy as np, intune, _remote_udfs as u
logging.basicConfig(level=logging.WARNING)

def quick(chunk):  # short chunks: the actors are sent a new one every few milliseconds
    time.sleep(0.002)
    return {"id": chunk["id"], "x2": chunk["x"] * 2.0}

n = 100_000
pipe = intune.Pipeline.from_iterable(u.id_chunks(n, 50)).map(
    quick, name="udf", mode="process", remote="ray", remote_workers=2
).batch(100)
with pipe:
    for _ in pipe:  # an epoch that waits for the actors to start: the next epoch has them from the start
        pass
    while pipe.stage("udf").remote_cpus_held() < 2:
        time.sleep(0.1)
    start, told, ids = pipe.metrics().stages["udf"].remote_items, False, []
    for batch in pipe:
        ids.append(batch["id"])
        if not told and pipe.metrics().stages["udf"].remote_items - start >= 20:
            print("REMOTE WORKERS RUN", flush=True)  # chunks are in flight on the actors, more are sent
            told = True
    ids = np.sort(np.concatenate(ids))
    print("EXACTLY_ONCE", bool(np.array_equal(ids, np.arange(n))), flush=True)
"""


def _tagged(tag: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries ``tag`` (pid, name)."""
    wanted = f"{TAG}={tag}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if wanted not in handle.read():
                    continue
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()[0]
        if state not in ("Z", "X"):
            found.append((int(entry), name))
    return found


def _trainer(tag: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "RAY_ADDRESS": "127.0.0.1:1",  # "auto" finds nothing that answers: intune starts a local Ray
        TAG: tag,
    }
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )


def _nothing_left(tag: str, within_s: float = 60.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + within_s
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in left:  # do not leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _wait_for_remote_workers(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    if line != "REMOTE WORKERS RUN\n":
        proc.kill()
        _, err = proc.communicate(timeout=HANG_S)
        raise AssertionError(f"the trainer stopped before its remote workers ran: {line!r}\n{err[-3000:]}")


@pytest.mark.parametrize("round_", range(3))  # the trainer's death was intermittent: several tries
def test_a_local_ray_whose_raylet_is_killed_mid_epoch_leaves_the_epoch_to_the_local_workers(round_):
    tag = uuid.uuid4().hex
    proc = _trainer(tag)
    try:
        _wait_for_remote_workers(proc)
        raylets = [pid for pid, name in _tagged(tag) if name == "raylet"]
        assert len(raylets) == 1, _tagged(tag)
        os.kill(raylets[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"the trainer died (exit {proc.returncode}) after its raylet:\n{err[-4000:]}"
    assert "EXACTLY_ONCE True" in out, out
    # the loss was said: the actor's (its chunks went to the local workers) or the whole connection's
    assert "remote worker lost" in err or "the Ray connection to a local Ray is lost" in err, err[-4000:]
    assert _nothing_left(tag) == [], "processes of the local Ray outlived the trainer"


def test_a_trainer_killed_while_its_local_ray_runs_leaves_no_ray_process():
    tag = uuid.uuid4().hex
    proc = _trainer(tag)
    try:
        _wait_for_remote_workers(proc)
        assert any(name == "raylet" for _, name in _tagged(tag))
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        proc.stdin.close()
    assert _nothing_left(tag) == [], "processes of the local Ray outlived the SIGKILLed trainer"
