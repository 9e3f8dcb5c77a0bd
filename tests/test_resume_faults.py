"""A training process killed with SIGKILL at 10 random points and restarted from its last checkpoint
loses no row and repeats only the batches after that checkpoint (identical when redone); the killed
run leaves no shared-memory segment and no worker process behind."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from _exactly_once import assert_exactly_once

ROWS, BATCH, EVERY = 12_000, 100, 4
KILLS = 10

CHILD = r"""
import os, sys, time
import numpy as np
import intune
from intune.checkpoint import load_checkpoint, save_checkpoint

data, ckpt, log_path = sys.argv[1:4]


def work(chunk):  # row-wise, in process workers
    return {**chunk, "y": chunk["x"] * 2}


pipe = (
    intune.Pipeline.from_parquet(os.path.join(data, "*.parquet"), chunk_rows=250)
    .map(work, mode="process", workers=2)
    .shuffle(buffer_rows=2000, seed=11)
    .batch(BATCH)
)
position = 0
if os.path.exists(ckpt):
    state = load_checkpoint(ckpt, kind="pipeline")
    pipe.load_state_dict(state)
    position = state["rows"]
log = open(log_path, "a")
for n, batch in enumerate(pipe, start=1):
    assert np.array_equal(batch["y"], batch["x"] * 2)
    # what the trainer did with this batch: its epoch position and rows, one line, flushed
    log.write(f"{position} " + " ".join(map(str, batch["id"].tolist())) + "\n")
    log.flush()
    position += len(batch["id"])
    if n % EVERY == 0:
        save_checkpoint(ckpt, pipe.state_dict(), kind="pipeline")
    time.sleep(0.01)
log.write("done\n")
log.flush()
pipe.close()
""".replace("BATCH", str(BATCH)).replace("EVERY", str(EVERY))


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _segments(pid: int) -> list[str]:
    places = ["/dev/shm", os.environ.get("INTUNE_SHM_FALLBACK_DIR") or tempfile.gettempdir()]
    found = []
    for place in places:
        if os.path.isdir(place):
            found += [os.path.join(place, n) for n in os.listdir(place) if n.startswith(f"intune-{pid}-")]
    return found


def _lines(path: Path) -> list[str]:
    text = path.read_text() if path.exists() else ""
    return [line for line in text.split("\n")[:-1]]  # only complete lines: a torn last line was not trained on


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_sigkill_at_random_points_loses_nothing_and_leaves_nothing(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for f in range(4):
        ids = np.arange(f * ROWS // 4, (f + 1) * ROWS // 4, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float64)}), data / f"p{f}.parquet", row_group_size=1000)
    ckpt, log = tmp_path / "ck.intune", tmp_path / "trained.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent / "src"), *sys.path])}
    rng = random.Random(18)
    runs: list[list[str]] = []  # each run's complete log lines
    kills = with_workers = 0
    while True:
        seen = len(_lines(log))
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(data), str(ckpt), str(log)], env=env)
        if kills < KILLS:
            target = seen + rng.randint(1, 3 * EVERY)  # kill after a random number of batches
            reached = _wait(lambda t=target, c=child: len(_lines(log)) >= t or c.poll() is not None, 60)
            assert reached, "the training process made no progress"
            time.sleep(rng.uniform(0, 0.03))  # anywhere within a batch's step
            if child.poll() is None:
                workers = _children(child.pid)
                with_workers += bool(workers) and bool(_segments(child.pid))
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                kills += 1
                # the orphaned workers notice their parent is gone and exit, removing its segments
                assert _wait(lambda w=workers: not any(_alive(p) for p in w), 10), f"workers {workers} outlived their parent"
                assert _wait(lambda pid=child.pid: not _segments(pid), 10), f"segments left: {_segments(child.pid)}"
                runs.append(_lines(log)[seen:])
                continue
        assert child.wait(timeout=120) == 0
        runs.append(_lines(log)[seen:])
        break
    assert kills == KILLS
    assert with_workers >= KILLS // 2, "too few kills hit a run with live workers and segments to check"
    assert runs[-1][-1] == "done"
    # every (position, ids) line; a position seen twice is a batch redone after a restart: it must be
    # the same batch, and it must lie after the checkpoint the restart resumed from
    by_position: dict[int, list[int]] = {}
    redone = 0
    last = -BATCH  # the position of the last batch trained on before the restart
    for run in runs:
        first = next((int(line.split()[0]) for line in run if line != "done"), None)
        if first is not None:
            # it resumed from a checkpoint (taken every EVERY batches from row 0), the latest one
            assert first % (EVERY * BATCH) == 0 and last + BATCH - EVERY * BATCH <= first <= last + BATCH
        for line in run:
            if line == "done":
                continue
            position, *ids = map(int, line.split())
            if position in by_position:
                assert by_position[position] == ids, f"the batch at row {position} differs when redone"
                redone += len(ids)
            by_position[position] = ids
            last = max(last, position)
    delivered = np.array([i for ids in by_position.values() for i in ids])
    assert_exactly_once(delivered, range(ROWS))
    assert sorted(by_position) == list(range(0, ROWS, BATCH))
    print(f"\n{KILLS} kills ({with_workers} with live workers), {redone} rows redone ({redone // BATCH} batches after the last checkpoints)")
