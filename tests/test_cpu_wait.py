"""The run-queue delay the engine reads (``intune.pipeline.cpu_wait``): checked against the kernel's own
accounting on one CPU shared by two spinning processes, and carried to a stage's metrics.

Each case runs in a child process pinned to one CPU, so that the test process keeps its CPUs.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from intune.pipeline import cpu_wait

pytestmark = pytest.mark.skipif(not cpu_wait.measured(), reason="this kernel reports no run-queue delay")


def _pinned(code: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in a child pinned to one of this process's CPUs."""
    cpu = min(os.sched_getaffinity(0))
    script = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n" + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


SPIN = """
    import json, os, time
    from intune.pipeline import cpu_wait

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def rival(seconds):  # a forked child spinning on the same CPU for ``seconds``; its pid
        pid = os.fork()
        if pid == 0:
            spin(seconds)
            os._exit(0)
        return pid
"""


def test_a_thread_sharing_one_cpu_with_a_spinning_process_waits_for_it_about_half_its_time():
    got = _pinned(SPIN + """
    other = rival(1.5)
    t0, c0, q0 = time.perf_counter(), time.thread_time(), cpu_wait.thread_wait_s()
    spin(1.0)
    wall, cpu, queued = time.perf_counter() - t0, time.thread_time() - c0, cpu_wait.thread_wait_s() - q0
    os.waitpid(other, 0)
    print(json.dumps({"wall": wall, "cpu": cpu, "queued": queued}))
    """)
    # always runnable: every second not on the CPU is one in the run queue, and the rival takes its turns
    assert got["cpu"] + got["queued"] == pytest.approx(got["wall"], rel=0.1)
    assert got["queued"] >= 0.3 * got["wall"]


def test_a_forked_child_reads_its_own_wait_not_its_parents():
    got = _pinned(SPIN + """
    other = rival(0.6)
    spin(0.5)  # the parent's thread has waited for the rival by now
    os.waitpid(other, 0)
    parent = cpu_wait.thread_wait_s()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, json.dumps(cpu_wait.thread_wait_s()).encode())
        os._exit(0)
    os.waitpid(child, 0)
    print(json.dumps({"parent": parent, "child": json.loads(os.read(read, 100))}))
    """)
    assert got["parent"] > 0.1
    assert got["child"] < 0.5 * got["parent"]


def test_process_workers_sharing_one_cpu_report_their_wait_for_it_and_a_sleeping_one_none():
    got = _pinned("""
    import json, time
    import numpy as np
    import intune

    def spin(chunk):
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            pass
        return chunk

    def nap(chunk):
        time.sleep(0.02)
        return chunk

    out = {}
    for name, fn, workers in (("spin", spin, 2), ("nap", nap, 1)):
        chunks = [{"id": np.arange(i, i + 10)} for i in range(0, 400, 10)]
        with intune.Pipeline.from_iterable(chunks).map(fn, name="udf", mode="process", workers=workers).batch(10) as pipe:
            rows = sum(len(b["id"]) for b in pipe)
            m = pipe.metrics().stages["udf"]
        out[name] = {"rows": rows, "cpu": m.cpu_s, "queued": m.cpu_wait_s, "busy": m.busy_s, "measured": m.cpu_wait_measured}
    print(json.dumps(out))
    """)
    spin, nap = got["spin"], got["nap"]
    assert spin["rows"] == nap["rows"] == 400
    assert spin["measured"] and nap["measured"]
    # two workers computing on one CPU: each waits about as long as it runs
    assert spin["queued"] >= 0.5 * spin["cpu"]
    # one that sleeps waits on its own, not for the CPU
    assert nap["queued"] < 0.2 * nap["busy"]
