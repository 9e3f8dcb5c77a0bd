"""Taking CPUs away from this process tree, and memory cgroups for child processes (cgroup v1).

How the CPUs are taken away: ``sched_setaffinity`` on every thread of this process
(``/proc/self/task``) and of every descendant process, swept until every task holds the new mask
(threads and processes started later inherit it from the thread that starts them). The cpuset cgroup
would also work here, but this process sits in the root cpuset, and moving it means moving every task
of the container; affinity touches only what we started. The monitor reads the main thread's affinity,
so it sees the new count at its next tick.

A memory cgroup is a child ``intune-bench-XXX`` of this process's own v1 memory cgroup, with
``memory.limit_in_bytes`` set; a child process joins it by writing its pid to ``cgroup.procs``.
This module owns those machine changes and undoing them; it must not know about pipelines or policies.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from intune.units import MB

# -- taking CPUs away from this process ------------------------------------------------------------


def _task_ids() -> list[int]:
    """Every thread of this process and of its descendant processes."""
    import psutil

    pids = [os.getpid()]
    try:
        pids += [c.pid for c in psutil.Process().children(recursive=True)]
    except psutil.Error:
        pass
    tids: list[int] = []
    for pid in pids:
        try:
            tids += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:  # exited meanwhile
            pass
    return tids


def set_process_cpus(cpus: set[int], sweeps: int = 5) -> int:
    """Give this process and its children exactly ``cpus``; returns how many tasks (threads) they have.

    Sweeps until a pass finds every task already on ``cpus`` (a thread started during a sweep may
    have copied the old mask from a thread not yet reached).
    """
    if not cpus:
        raise ValueError("set_process_cpus: the CPU set is empty")
    cpus = set(cpus)
    changed = 0
    for _ in range(sweeps):
        changed = 0
        for tid in _task_ids():
            try:
                if os.sched_getaffinity(tid) != cpus:
                    os.sched_setaffinity(tid, cpus)
                    changed += 1
            except (ProcessLookupError, FileNotFoundError):
                pass
            except PermissionError as exc:
                raise PermissionError(f"cannot set the CPU affinity of task {tid}: {exc}") from exc
        if changed == 0:
            break
    return len(_task_ids())


class CpuRestriction:
    """Restrict this process tree to its first ``n`` CPUs and give them back (``with`` restores)."""

    def __init__(self) -> None:
        self.original = set(os.sched_getaffinity(os.getpid()))

    def limit(self, n: int) -> set[int]:
        if not 1 <= n <= len(self.original):
            raise ValueError(f"cannot restrict to {n} CPUs: this process has {sorted(self.original)}")
        chosen = set(sorted(self.original)[:n])
        set_process_cpus(chosen)
        return chosen

    def restore(self) -> None:
        set_process_cpus(self.original)

    def __enter__(self) -> CpuRestriction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


# -- a memory cgroup (v1) for a child process --------------------------------------------------------


def _own_memory_cgroup() -> Path:
    """This process's v1 memory cgroup directory, from ``/proc/self/cgroup`` and ``mountinfo``."""
    path = next(
        (
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if "memory" in line.split(":", 2)[1].split(",")
        ),
        None,
    )
    if path is None:
        raise OSError("no cgroup-v1 memory controller in /proc/self/cgroup (cgroup v2 only?)")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) >= 3 and tail[0] == "cgroup" and "memory" in tail[2].split(","):
            root, point = fields[3], Path(fields[4])
            rel = path[len(root) :] if root != "/" and path.startswith(root) else path
            own = point / rel.strip("/")
            return own if own.is_dir() else point
    raise OSError("the cgroup-v1 memory hierarchy is not mounted (no 'cgroup ... memory' in mountinfo)")


class MemoryCgroup:
    """A child memory cgroup ``intune-bench-XXX`` under ours with ``memory.limit_in_bytes`` set.

    ``cleanup()`` ends any process still inside (only ours can be there) and removes the directory.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.path = _own_memory_cgroup() / f"intune-bench-{uuid.uuid4().hex[:8]}"
        try:
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(int(limit_bytes)))
        except OSError as exc:
            self.cleanup()
            raise PermissionError(f"cannot create memory cgroup {self.path}: {exc}") from exc
        self.limit_bytes = int((self.path / "memory.limit_in_bytes").read_text())

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def stats(self) -> dict[str, int]:
        """OOM kills, limit hits and peak usage recorded by the kernel for this cgroup."""
        control = dict(
            line.split()
            for line in (self.path / "memory.oom_control").read_text().splitlines()
            if line.strip()
        )
        return {
            "oom_kill": int(control.get("oom_kill", 0)),
            "under_oom": int(control.get("under_oom", 0)),
            "failcnt": int((self.path / "memory.failcnt").read_text()),
            "max_usage_bytes": int((self.path / "memory.max_usage_in_bytes").read_text()),
        }

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except OSError:
            return []

    def cleanup(self, timeout_s: float = 10.0) -> None:
        if not self.path.exists():
            return
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)


def memory_cgroup_unavailable() -> str | None:
    """Why a memory cgroup cannot be made here, or ``None`` if it can (tries one and removes it)."""
    try:
        MemoryCgroup(256 * MB).cleanup()
    except (OSError, ValueError) as exc:
        return str(exc)
    return None
