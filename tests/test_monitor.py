"""The machine monitor on fixture trees for cgroup v1 and v2, and on this machine."""

import os
import shutil
from pathlib import Path

import pytest

from intune import monitor

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
GiB, MiB = 1 << 30, 1 << 20
EIGHT = set(range(8))


@pytest.fixture
def tree(tmp_path):
    """A writable copy of a fixture tree, so a test can change a file between two readings."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst)
        return dst

    return copy


def test_v1_quota_and_cpuset_cap_the_cpus():
    root = FIXTURES / "v1"
    assert monitor.cpuset_cpus(root) == {2, 3, 6}
    assert monitor.cpu_quota(root) == pytest.approx(1.5)  # 150000 / 100000 on the job's cgroup
    assert monitor.available_cpus(root, affinity=EIGHT) == pytest.approx(1.5)
    # affinity narrower than the quota: the affinity wins
    assert monitor.available_cpus(root, affinity={2}) == 1.0


def test_v1_memory_subtracts_inactive_file_of_the_hierarchy():
    used, limit = monitor.memory_usage(FIXTURES / "v1")
    # usage 600 MiB minus total_inactive_file 100 MiB (not the local inactive_file of 1 MiB)
    assert (used, limit) == (500 * MiB, GiB)


def test_v1_unlimited_container_falls_back_to_host_memory():
    root = FIXTURES / "v1-unlimited"
    assert monitor.cpu_quota(root) is None  # quota -1 = unlimited
    assert monitor.cpuset_cpus(root) == {0, 1, 2, 3}  # the mount root is the container's own cgroup
    assert monitor.available_cpus(root, affinity=EIGHT) == 4.0
    # sentinel limit: MemTotal 16 GiB, MemAvailable 12 GiB
    assert monitor.memory_usage(root) == (4 * GiB, 16 * GiB)
    assert monitor.host_free_memory(root) == 12 * GiB


def test_v2_quota_cpuset_and_a_limit_on_the_parent():
    root = FIXTURES / "v2"
    assert monitor.cpuset_cpus(root) == {0, 1, 4}
    assert monitor.cpu_quota(root) == pytest.approx(2.5)
    assert monitor.available_cpus(root, affinity=EIGHT) == pytest.approx(2.5)
    assert monitor.available_cpus(root, affinity={0, 1, 2, 3}) == 2.0  # {0,1,2,3} & {0,1,4}
    # job.scope has memory.max "max"; user.slice holds 2 GiB: usage is read there, 1.5 GiB - 512 MiB
    assert monitor.memory_usage(root) == (GiB, 2 * GiB)


def test_v2_unlimited_without_mountinfo_uses_host():
    root = FIXTURES / "v2-unlimited"
    assert monitor.cpu_quota(root) is None
    assert monitor.available_cpus(root, affinity=set(range(32))) == 16.0
    assert monitor.memory_usage(root) == (4 * GiB, 16 * GiB)


def test_readers_reread_every_call(tree):
    root = tree("v1")
    job = root / "sys/fs/cgroup"
    assert monitor.available_cpus(root, affinity=EIGHT) == pytest.approx(1.5)
    (job / "cpu,cpuacct/jobs/job1/cpu.cfs_quota_us").write_text("50000\n")
    assert monitor.available_cpus(root, affinity=EIGHT) == pytest.approx(0.5)
    (job / "cpu,cpuacct/jobs/job1/cpu.cfs_quota_us").write_text("-1\n")
    assert monitor.available_cpus(root, affinity=EIGHT) == 3.0
    (job / "memory/jobs/job1/memory.limit_in_bytes").write_text(f"{2 * GiB}\n")
    assert monitor.memory_usage(root) == (500 * MiB, 2 * GiB)
    # the process moves to another cgroup (as a benchmark does to apply a limit)
    (job / "memory/jobs/job2").mkdir()
    (job / "memory/jobs/job2/memory.limit_in_bytes").write_text(f"{256 * MiB}\n")
    (job / "memory/jobs/job2/memory.usage_in_bytes").write_text(f"{200 * MiB}\n")
    (root / "proc/self/cgroup").write_text(
        "4:memory:/jobs/job2\n3:cpuset:/jobs/job1\n2:cpu,cpuacct:/jobs/job1\n"
    )
    assert monitor.memory_usage(root) == (200 * MiB, 256 * MiB)  # no memory.stat: nothing subtracted


def test_parent_quota_tighter_than_child_wins(tree):
    root = tree("v1")
    (root / "sys/fs/cgroup/cpu,cpuacct/jobs/cpu.cfs_quota_us").write_text("100000\n")
    assert monitor.cpu_quota(root) == pytest.approx(1.0)


def test_limit_above_host_memory_is_no_limit(tree):
    root = tree("v1")
    (root / "sys/fs/cgroup/memory/jobs/job1/memory.limit_in_bytes").write_text(f"{64 * GiB}\n")
    assert monitor.memory_usage(root) == (4 * GiB, 16 * GiB)


def test_missing_and_garbled_files_fall_back(tree, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert monitor.available_cpus(empty, affinity={0, 1, 2}) == 3.0
    assert monitor.memory_usage(empty) == (0, 0)
    assert monitor.host_free_memory(empty) == 0
    root = tree("v2")
    (root / "sys/fs/cgroup/user.slice/job.scope/cpu.max").write_text("garbage\n")
    (root / "sys/fs/cgroup/user.slice/job.scope/cpuset.cpus.effective").write_text("\n")
    (root / "sys/fs/cgroup/user.slice/job.scope/memory.max").write_text("lots\n")
    assert monitor.memory_usage(root) == (GiB, 2 * GiB)  # the garbled file is skipped, the parent's holds
    (root / "sys/fs/cgroup/user.slice/memory.current").unlink()
    assert monitor.cpu_quota(root) is None
    assert monitor.cpuset_cpus(root) == set(range(8))  # the parent's cpuset
    assert monitor.memory_usage(root) == (4 * GiB, 16 * GiB)  # limit without usage: host figures


def test_parse_cpu_list():
    assert monitor.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert monitor.parse_cpu_list("") == set()


def test_this_machine():
    cpus = monitor.available_cpus()
    assert 0 < cpus <= len(os.sched_getaffinity(0))
    used, limit = monitor.memory_usage()
    assert 0 < used < limit
    assert monitor.host_free_memory() > 0
    assert monitor.process_tree_rss() > 1 * MiB
    sample = monitor.Monitor().sample()
    assert (
        sample.cpus == cpus
        and sample.memory_free_bytes == sample.memory_limit_bytes - sample.memory_used_bytes
    )


def test_process_tree_counts_children_and_shared_memory_once():
    import subprocess
    import sys
    from multiprocessing import shared_memory

    before = monitor.process_tree_rss()
    shm = shared_memory.SharedMemory(create=True, size=64 * MiB)
    try:
        shm.buf[:] = b"\1" * shm.size  # touch every page in this process
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import mmap, sys, time; f = open('/dev/shm/' + sys.argv[1], 'rb');"
                "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ);"
                "sum(m[i] for i in range(0, len(m), 4096)); print('ready', flush=True); time.sleep(30)",
                shm.name,
            ],
            stdout=subprocess.PIPE,
        )
        try:
            assert child.stdout.readline().strip() == b"ready"
            grown = monitor.process_tree_rss() - before
        finally:
            child.kill()
            child.wait()
    finally:
        shm.close()
        shm.unlink()
    # 64 MiB mapped by two processes, plus the child's interpreter (~10-30 MB): PSS counts it once,
    # RSS would count 128 MiB + the interpreter
    assert 64 * MiB < grown < 110 * MiB


def test_real_cgroup_v1_child_with_a_memory_limit():
    """On this machine: a child process moved into a child memory cgroup sees that cgroup's limit."""
    import subprocess
    import sys
    import uuid

    version, dirs = monitor.machine._cgroup_dirs("/", "memory", "memory.max")
    if version != "v1" or not dirs:
        pytest.skip("needs a cgroup v1 memory hierarchy (this machine's layout)")
    child_cg = dirs[0] / f"intune-test-{uuid.uuid4().hex[:8]}"
    try:
        child_cg.mkdir()
        (child_cg / "memory.limit_in_bytes").write_text(str(512 * MiB))
    except OSError as exc:
        pytest.skip(f"cannot create a child memory cgroup under {dirs[0]}: {exc}")
    try:
        code = (
            "import os, sys; from intune import monitor;"
            "open(sys.argv[1], 'w').write(str(os.getpid()));"
            "ballast = bytearray(64 << 20);"  # 64 MiB of anonymous memory, touched
            "print(*monitor.memory_usage())"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(child_cg / "cgroup.procs")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        used, limit = map(int, out.stdout.split())
    finally:
        child_cg.rmdir()
    assert limit == 512 * MiB
    assert 64 * MiB < used < 256 * MiB  # the ballast, charged after the move, plus a little


def test_affinity_change_is_seen_from_another_thread():
    """The tuner reads CPUs on its own thread; the job restricts the main thread's affinity."""
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    # the reading thread exists before the change, so it keeps its own (wider) affinity
    code = """
import os, threading
from intune import monitor
seen, go = [], threading.Event()
def read():
    seen.append(monitor.available_cpus())
    go.wait()
    seen.append(monitor.available_cpus())
th = threading.Thread(target=read)
th.start()
while not seen:
    pass
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
go.set()
th.join()
print(*seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before, after = map(float, out.stdout.split())
    assert before == monitor.available_cpus() and after == 1.0
