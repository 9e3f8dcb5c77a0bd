"""The machine monitor: the CPUs this process may use and the memory it uses against its limit.

Owns reading the kernel's view of the process's resources: CPU affinity, the cgroup CPU quota and
cpuset (v1 and v2), the cgroup memory limit and usage (v1 and v2, minus inactive file cache), host
memory from ``/proc/meminfo``, and the process tree's resident memory. Every reader re-reads the files
on every call (the CPUs or the limit may change while a job runs) and takes a ``root`` so tests can
point it at a fixture tree. A missing or unreadable file falls back to the next best source; a reader
never raises for that reason. It must not know about pipelines, knobs or policies.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

UNLIMITED_MEMORY = 1 << 60
"""Cgroup memory limits at or above this are "no limit" (v1 writes 9223372036854771712)."""


# -- small file helpers ---------------------------------------------------------------------------


def _read(root: str | os.PathLike[str], path: str) -> str | None:
    """The text of ``root/path``, or ``None`` when it is missing or unreadable."""
    try:
        return (Path(root) / path.lstrip("/")).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _parse_key_values(text: str | None) -> dict[str, int]:
    """``key value`` lines (memory.stat) or ``Key: value kB`` lines (meminfo) as a dict of ints."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            try:
                value = int(parts[1])
            except ValueError:
                continue
            out[parts[0]] = value * 1024 if len(parts) >= 3 and parts[2] == "kB" else value
    return out


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list such as ``0-3,8,10-11`` as a set of CPU ids (empty text -> empty set)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


# -- locating the process's cgroups ---------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    point: Path  # where the hierarchy is mounted (under root)
    root: str  # the cgroup path that the mount point shows (field 4 of mountinfo)


def _mounts(root: str | os.PathLike[str]) -> tuple[dict[str, _Mount], _Mount | None]:
    """The v1 mounts by controller name, and the v2 (unified) mount, from ``/proc/self/mountinfo``.

    Without a readable mountinfo, assume the usual layout under ``/sys/fs/cgroup``.
    """
    v1: dict[str, _Mount] = {}
    v2: _Mount | None = None
    base = Path(root)
    text = _read(root, "/proc/self/mountinfo")
    if text is None:
        sysfs = base / "sys/fs/cgroup"
        if (sysfs / "cgroup.controllers").exists():
            return {}, _Mount(sysfs, "/")
        for ctl in ("cpu", "cpuset", "memory"):
            for name in (ctl, "cpu,cpuacct" if ctl == "cpu" else ctl):
                if (sysfs / name).is_dir():
                    v1.setdefault(ctl, _Mount(sysfs / name, "/"))
        unified = sysfs / "unified"
        return v1, (_Mount(unified, "/") if (unified / "cgroup.controllers").exists() else None)
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount = _Mount(base / fields[4].lstrip("/"), fields[3])
        if tail[0] == "cgroup2":
            v2 = mount
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                v1.setdefault(option, mount)
    return v1, v2


def _own_cgroups(root: str | os.PathLike[str]) -> tuple[dict[str, str], str | None]:
    """The process's cgroup paths from ``/proc/self/cgroup``: v1 by controller, and the v2 path."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in (_read(root, "/proc/self/cgroup") or "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path:
            continue
        if hier == "0" and controllers == "":
            v2 = path
        else:
            for ctl in controllers.split(","):
                v1[ctl] = path
    return v1, v2


def _resolve(mount: _Mount, path: str) -> list[Path]:
    """The cgroup directory for ``path`` under ``mount`` and its ancestors up to the mount point.

    In a container the mount often shows the process's own cgroup as its root (the path is then
    relative to ``mount.root``, or not visible at all): fall back to the mount point.
    """
    rel = path
    if mount.root != "/" and (path == mount.root or path.startswith(mount.root.rstrip("/") + "/")):
        rel = path[len(mount.root.rstrip("/")) :]
    leaf = mount.point / rel.strip("/")
    if not leaf.is_dir():
        leaf = mount.point
    chain = [leaf]
    while chain[-1] != mount.point and mount.point in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def _cgroup_dirs(root: str | os.PathLike[str], controller: str, v2_file: str) -> tuple[str, list[Path]]:
    """(``"v1"`` or ``"v2"``, directories from the process's cgroup upwards) for a controller.

    A v1 hierarchy with the controller wins (hybrid systems mount an empty v2 beside it); v2 is used
    when its directory has ``v2_file`` (the controller is enabled there). ``("", [])`` if neither.
    """
    mounts_v1, mount_v2 = _mounts(root)
    own_v1, own_v2 = _own_cgroups(root)
    if controller in mounts_v1 and controller in own_v1:
        return "v1", _resolve(mounts_v1[controller], own_v1[controller])
    if mount_v2 is not None and own_v2 is not None:
        dirs = _resolve(mount_v2, own_v2)
        if any((d / v2_file).exists() for d in dirs):
            return "v2", dirs
    return "", []


# -- CPUs ----------------------------------------------------------------------------------------


def _affinity() -> set[int]:
    """The CPUs the process's main thread may run on (pid, not 0: 0 would be the calling thread)."""
    if hasattr(os, "sched_getaffinity"):
        try:
            return set(os.sched_getaffinity(os.getpid()))
        except OSError:
            pass
    return set(range(os.cpu_count() or 1))


def cpu_quota(root: str | os.PathLike[str] = "/") -> float | None:
    """The cgroup CPU quota in CPUs (the tightest over the cgroup and its ancestors), ``None`` if unlimited."""
    version, dirs = _cgroup_dirs(root, "cpu", "cpu.max")
    limits: list[float] = []
    for d in dirs:
        if version == "v1":
            quota, period = _read_int(d / "cpu.cfs_quota_us"), _read_int(d / "cpu.cfs_period_us")
        else:
            try:
                q, _, p = (d / "cpu.max").read_text().strip().partition(" ")
                quota = -1 if q == "max" else int(q)
                period = int(p or 100000)
            except (OSError, ValueError):
                continue
        if quota is not None and period and quota > 0:
            limits.append(quota / period)
    return min(limits) if limits else None


def cpuset_cpus(root: str | os.PathLike[str] = "/") -> set[int] | None:
    """The CPUs of the process's cpuset (v1 ``cpuset.effective_cpus``/``cpuset.cpus``, v2 ``cpuset.cpus.effective``)."""
    version, dirs = _cgroup_dirs(root, "cpuset", "cpuset.cpus.effective")
    names = ("cpuset.effective_cpus", "cpuset.cpus") if version == "v1" else ("cpuset.cpus.effective",)
    for d in dirs:  # the nearest directory that states it
        for name in names:
            try:
                text = (d / name).read_text()
            except OSError:
                continue
            try:
                cpus = parse_cpu_list(text)
            except ValueError:
                continue
            if cpus:
                return cpus
    return None


def available_cpus(root: str | os.PathLike[str] = "/", affinity: set[int] | None = None) -> float:
    """The CPUs this process may use now: affinity ∩ cpuset, capped by the CFS quota.

    ``affinity`` defaults to the main thread's ``sched_getaffinity``; pass one for fixture trees.
    Never below 1/1000 of a CPU; re-read on every call.
    """
    cpus = set(_affinity() if affinity is None else affinity)
    cpuset = cpuset_cpus(root)
    if cpuset is not None and cpus & cpuset:
        cpus &= cpuset
    count = float(len(cpus) or (os.cpu_count() or 1))
    quota = cpu_quota(root)
    if quota is not None:
        count = min(count, quota)
    return max(count, 0.001)


# -- memory --------------------------------------------------------------------------------------


def host_memory(root: str | os.PathLike[str] = "/") -> tuple[int, int]:
    """(used, total) bytes of the host from ``/proc/meminfo``: used = MemTotal - MemAvailable."""
    info = _parse_key_values(_read(root, "/proc/meminfo"))
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    return max(0, total - available), total


def host_free_memory(root: str | os.PathLike[str] = "/") -> int:
    """MemAvailable of the host, blind to cgroups: what tf.data's AUTOTUNE budget reads."""
    info = _parse_key_values(_read(root, "/proc/meminfo"))
    return info.get("MemAvailable", info.get("MemFree", 0))


def _cgroup_memory(root: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(used, limit) of the tightest memory limit over the process's cgroup and its ancestors.

    Usage is read in the cgroup that holds the limit (siblings there share it), minus its inactive
    file cache (the kernel reclaims that before it kills anything). ``None`` when no limit is set.
    """
    version, dirs = _cgroup_dirs(root, "memory", "memory.max")
    best: tuple[int, Path] | None = None
    for d in dirs:
        if version == "v1":
            limit = _read_int(d / "memory.limit_in_bytes")
        else:
            try:
                text = (d / "memory.max").read_text().strip()
                limit = None if text == "max" else int(text)
            except (OSError, ValueError):
                continue
        if limit is not None and limit < UNLIMITED_MEMORY and (best is None or limit < best[0]):
            best = (limit, d)
    if best is None:
        return None
    limit, d = best
    stat = _parse_key_values(_read(d, "memory.stat"))
    if version == "v1":
        usage = _read_int(d / "memory.usage_in_bytes")
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    else:
        usage = _read_int(d / "memory.current")
        inactive = stat.get("inactive_file", 0)
    if usage is None:
        return None
    return max(0, usage - inactive), limit


def memory_usage(root: str | os.PathLike[str] = "/") -> tuple[int, int]:
    """(used, limit) bytes for this process: its cgroup's when a limit is set, else the host's.

    A cgroup limit above the host's memory is no limit at all, so the host's figures are used then.
    """
    host_used, host_total = host_memory(root)
    cg = _cgroup_memory(root)
    if cg is not None and (host_total == 0 or cg[1] < host_total):
        return cg
    return host_used, host_total


def process_tree_rss(pid: int | None = None) -> int:
    """Memory of the process ``pid`` (default: this one) and all its children, in bytes.

    Sums PSS, which shares each shared-memory page among the processes that map it, so chunks in
    shared memory are counted once; falls back to RSS where PSS cannot be read.
    """
    import psutil

    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            full = proc.memory_full_info()
            total += getattr(full, "pss", 0) or full.rss
        except psutil.AccessDenied:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        except psutil.Error:  # the process exited meanwhile
            pass
    return total


# -- the sampler ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MachineSample:
    """One reading of the machine, as the tuner uses it each tick."""

    time_s: float  # time.monotonic()
    cpus: float
    memory_used_bytes: int
    memory_limit_bytes: int
    host_free_bytes: int
    process_tree_bytes: int | None = None  # only when the monitor was asked to (PSS is costly)

    @property
    def memory_free_bytes(self) -> int:
        return max(0, self.memory_limit_bytes - self.memory_used_bytes)


class Monitor:
    """Samples the machine readers above; one instance per tuner.

    ``process_tree=True`` adds the process tree's PSS to every sample (a few ms per process, so off
    by default). ``root`` points every reader at another file tree (tests).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        process_tree: bool = False,
        affinity: set[int] | None = None,
    ) -> None:
        self.root = root
        self.process_tree = process_tree
        self.affinity = affinity  # None: the live sched_getaffinity, re-read each sample

    def sample(self) -> MachineSample:
        used, limit = memory_usage(self.root)
        return MachineSample(
            time_s=time.monotonic(),
            cpus=available_cpus(self.root, self.affinity),
            memory_used_bytes=used,
            memory_limit_bytes=limit,
            host_free_bytes=host_free_memory(self.root),
            process_tree_bytes=process_tree_rss() if self.process_tree else None,
        )


__all__ = [
    "MachineSample",
    "Monitor",
    "available_cpus",
    "cpu_quota",
    "cpuset_cpus",
    "host_free_memory",
    "host_memory",
    "memory_usage",
    "parse_cpu_list",
    "process_tree_rss",
]
