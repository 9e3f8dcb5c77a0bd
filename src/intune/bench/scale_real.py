"""Remote workers on a real (local, multi-node) Ray cluster: what one 1-CPU remote node adds to a trainer
held to 1 CPU. ``run_real_scale`` is the live half of ``intune bench scale`` (the command and the
simulator half live in ``bench/scale``).

The workload: a GIL-bound pure-Python function per row (``map_rows``, process mode) over synthetic
Parquet rows, then ``batch``. Two machines are made of this one's first two CPUs:

- the trainer: a fresh process pinned to the first CPU (``os.sched_setaffinity``; its local process
  workers inherit it), running the pipeline;
- the cluster: a ``ray.cluster_utils.Cluster`` started here before anything is pinned: a head with
  0 CPUs (the trainer's node: its processes are pinned to the trainer's CPU, where they would run),
  and one node of 1 CPU whose processes (raylet, agents, and the actor's worker it starts) are pinned
  to the second CPU. ``psutil`` reads every pinning back into each result row.

Configurations, interleaved round by round (the order rotating): ``local-only`` with 1 and with 2 local
workers (on a CPU shared with other work, 2 processes get a larger share of it, so each side gets its
better count), and ``with-remote``: the same plus ``remote_workers=1``; then once, ``with-remote,
resized``: the remote knob toggled 1 -> 0 -> 1 ... during the window. Each run warms up, then counts
rows/s over a fixed window, then finishes its epoch: every epoch it ran is checked to deliver every row
exactly once (a run that fails the check is reported as such). The summary has each configuration's
median rows/s with its range, and the ratio of the best with-remote configuration's median to the best
local-only one's (and the same two configurations' ratio round by round).
It must not change engine behaviour.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 24_000  # rows per epoch (a run covers several epochs)
ROW_GROUP = 2_000
BATCH = 1_000
LOOP = 1500  # Python loop iterations per row: about 0.1 ms a row on a 2-3 GHz core
TARGET_RATIO = 1.6


def _workers(n: int) -> str:
    return f"{n} local worker{'s' if n > 1 else ''}"


CONFIGS: list[tuple[str, int, int | None]] = [
    (f"{kind}, {_workers(w)}", w, remote) for kind, remote in (("local-only", None), ("with-remote", 1)) for w in (1, 2)
]
"""(name, local workers, remote workers or None for a pipeline without remote workers)."""


def gil_bound_row(row: dict[str, Any]) -> dict[str, Any]:
    """A feature hash computed in pure Python (holds the GIL: threads cannot share it)."""
    acc = int(row["key"])
    for i in range(LOOP):
        acc = (acc * 1_000_003 + i) & 0xFFFFFFFF
    return {"id": row["id"], "h": acc, "x": float(row["x"]) * 0.5}


def write_rows(folder: str, rows: int = ROWS) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    path = os.path.join(folder, "rows.parquet")
    table = pa.table(
        {"id": np.arange(rows, dtype=np.int64), "key": rng.integers(0, 1 << 31, rows), "x": rng.random(rows)}
    )
    pq.write_table(table, path, row_group_size=ROW_GROUP)
    return path


# ---- the cluster (this process) --------------------------------------------------------------------------


def _pin_tree(pid: int, cpu: int) -> dict[int, list[int]]:
    """Pin process ``pid`` and its descendants to ``cpu``; their affinities read back."""
    import psutil

    out: dict[int, list[int]] = {}
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return out
    for proc in procs:
        try:
            proc.cpu_affinity([cpu])
            out[proc.pid] = sorted(proc.cpu_affinity())
        except psutil.Error:
            pass
    return out


def _node_pids(node: Any) -> list[int]:
    """The processes a ``ray.cluster_utils`` node started (raylet, GCS, agents...)."""
    pids = []
    for infos in getattr(node, "all_processes", {}).values():
        for info in infos:
            process = getattr(info, "process", None)
            if process is not None and process.pid:
                pids.append(int(process.pid))
    return pids


def _affinities(pids: Sequence[int]) -> dict[int, list[int]]:
    """Each process's and descendant's CPU affinity now (to show that the pinning held)."""
    import psutil

    out: dict[int, list[int]] = {}
    for pid in pids:
        try:
            top = psutil.Process(pid)
            for proc in [top, *top.children(recursive=True)]:
                out[proc.pid] = sorted(proc.cpu_affinity())
        except psutil.Error:
            pass
    return out


class LocalCluster:
    """A head of 0 CPUs pinned to the trainer's CPU and one 1-CPU node pinned to the other."""

    def __init__(self, trainer_cpu: int, remote_cpu: int) -> None:
        import logging

        import ray
        from ray.cluster_utils import Cluster

        self.trainer_cpu, self.remote_cpu = trainer_cpu, remote_cpu
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": 200 << 20},
        )
        self.node = self.cluster.add_node(num_cpus=1, object_store_memory=200 << 20)
        ray.init(address=self.cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        self.cluster.wait_for_nodes()
        ray.shutdown()  # the trainer processes connect themselves
        self.head_pids = _node_pids(self.cluster.head_node)
        self.node_pids = _node_pids(self.node)
        for pid in self.head_pids:
            _pin_tree(pid, trainer_cpu)
        for pid in self.node_pids:
            _pin_tree(pid, remote_cpu)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def placement(self) -> dict[str, Any]:
        """Where the cluster's processes may run now: the remote node's (raylet and all it started,
        the actors' workers included) and the head's."""
        remote = _affinities(self.node_pids)
        head = _affinities(self.head_pids)
        return {
            "remote_node_procs": len(remote),
            "remote_node_cpus": sorted({c for cpus in remote.values() for c in cpus}),
            "head_procs": len(head),
            "head_cpus": sorted({c for cpus in head.values() for c in cpus}),
        }

    def shutdown(self) -> None:
        self.cluster.shutdown()


# ---- one run (a fresh trainer process) -------------------------------------------------------------------


def trainer_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration in this (fresh) process, pinned to ``spec["trainer_cpu"]``: rows/s over the
    window, and every epoch checked for exactly-once delivery."""
    import psutil

    os.sched_setaffinity(0, {spec["trainer_cpu"]})
    import intune

    remote = spec["remote_workers"] is not None
    if remote:
        import logging

        import ray

        ray.init(address=spec["address"], logging_level=logging.ERROR, log_to_driver=False)
    pipe = intune.Pipeline.from_parquet(spec["path"], chunk_rows=ROW_GROUP)
    options: dict[str, Any] = {"remote": "ray", "remote_workers": spec["remote_workers"]} if remote else {}
    pipe = pipe.map_rows(gil_bound_row, name="udf", workers=spec["workers"], **options).batch(BATCH)
    schedule = list(spec.get("resize", []))  # [(seconds into the window, remote workers)]
    warm_s, window_s = spec["warm_s"], spec["window_s"]
    epochs: list[list[np.ndarray]] = []
    marks: list[tuple[float, int]] = []  # (time, rows delivered so far)
    rows = 0
    start = time.perf_counter()
    window_start = window_end = None
    remote_at_start = remote_at_end = 0
    closed_window = False
    actor_cpus: list[int] = []
    with pipe:
        while window_end is None or time.perf_counter() < window_end:
            epochs.append([])
            for batch in pipe:
                epochs[-1].append(np.asarray(batch["id"]))
                rows += len(batch["id"])
                now = time.perf_counter()
                marks.append((now, rows))
                if window_start is None and now - start >= warm_s:
                    stage = pipe.metrics().stages["udf"]
                    if not remote or stage.remote_items > 0:  # the remote worker is up
                        window_start, window_end = now, now + window_s
                        remote_at_start = stage.remote_rows
                        marks = [(now, rows)]
                if window_start is not None and schedule and now - window_start >= schedule[0][0]:
                    pipe.set_knob("udf.remote_workers", int(schedule.pop(0)[1]))
                if window_end is not None and now >= window_end and not closed_window:
                    closed_window = True
                    remote_at_end = pipe.metrics().stages["udf"].remote_rows
                    if remote:
                        actor_cpus = _actor_cpus(pipe)
                if window_start is None and now - start > 120:
                    raise RuntimeError("the remote worker never delivered a chunk within 120 s")
            # the epoch ran to its end: go on until the window is over
        m = pipe.metrics().stages["udf"]
        local_cpus = sorted({c for pid in pipe.stage("udf").worker_pids() for c in _proc_cpus(psutil, pid)})
    # rows/s over the window: the last mark inside it against its start
    inside = [(t, r) for t, r in marks if window_start is not None and t <= window_end]
    (t0, r0), (t1, r1) = inside[0], inside[-1]
    checks = [_exactly_once(parts) for parts in epochs]
    return {
        "rows_per_s": (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0,
        "window_s": t1 - t0,
        "rows_in_window": r1 - r0,
        "remote_share": (remote_at_end - remote_at_start) / (r1 - r0) if r1 > r0 else 0.0,
        "epochs": len(epochs),
        "exactly_once": all(c is None for c in checks),
        "exactly_once_error": next((c for c in checks if c is not None), None),
        "rows_total": rows,
        "transfer_ms_per_chunk": 1e3 * m.transfer_s / m.remote_items if m.remote_items else 0.0,
        "remote_restarts": m.remote_restarts,
        "trainer_cpus": sorted(os.sched_getaffinity(0)),
        "local_worker_cpus": local_cpus,
        "actor_cpus": actor_cpus,
    }


def _proc_cpus(psutil: Any, pid: int) -> list[int]:
    try:
        return list(psutil.Process(pid).cpu_affinity())
    except psutil.Error:
        return []


def _actor_cpus(pipe: Any) -> list[int]:
    """The CPUs the remote workers' processes may use (their pids from the actors' descriptions)."""
    import psutil

    cpus: set[int] = set()
    registry = pipe.stage("udf").remote
    for actor in list(getattr(registry, "_actors", {}).values()):
        words = actor.where.split()
        if "pid" in words:
            pid = int(words[words.index("pid") + 1].rstrip(","))
            cpus.update(_proc_cpus(psutil, pid))
    return sorted(cpus)


def _exactly_once(parts: list[np.ndarray]) -> str | None:
    """None if the epoch delivered ids 0..ROWS-1 once each, else what went wrong."""
    ids = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)
    if len(ids) == ROWS and np.array_equal(ids, np.arange(ROWS)):
        return None
    values, counts = np.unique(ids, return_counts=True)
    return (
        f"{len(ids)} rows for {ROWS}: repeated {values[counts > 1][:5].tolist()}, "
        f"missing {np.setdiff1d(np.arange(ROWS), ids)[:5].tolist()}"
    )


# ---- the benchmark ----------------------------------------------------------------------------------------


def run_real_scale(quick: bool = False, rounds: int | None = None) -> dict[str, Any]:
    """The live half of ``intune bench scale``: ``{"rows": [one per run], "summary": [...]}`` (JSON-able).

    Needs Ray (``pip install intune[ray]``) and 2 CPUs in this process's affinity; uses the first two.
    """
    from intune.bench.child import run_child
    from intune.pipeline.remote_ray import require_ray

    require_ray("intune bench scale")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError(f"run_real_scale needs 2 CPUs (a trainer's and a remote node's); this process may use {cpus}")
    trainer_cpu, remote_cpu = cpus[0], cpus[1]
    rounds = rounds if rounds is not None else (2 if quick else 5)
    warm_s, window_s = (3.0, 4.0) if quick else (4.0, 8.0)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="intune-scale-real-") as tmp:
        path = write_rows(tmp)
        cluster = LocalCluster(trainer_cpu, remote_cpu)
        try:
            base = {"path": path, "address": cluster.address, "trainer_cpu": trainer_cpu,
                    "warm_s": warm_s, "window_s": window_s}
            for r in range(rounds):
                shift = r % len(CONFIGS)
                for name, workers, remote in CONFIGS[shift:] + CONFIGS[:shift]:
                    spec = {**base, "workers": workers, "remote_workers": remote}
                    rows.append(_run(run_child, name, r, spec, cluster))
            best = _best(summarize(rows), "with-remote")
            workers = next((w for name, w, _ in CONFIGS if name == best), 1)
            step = window_s / 6
            resize = [(step * k, (k + 1) % 2) for k in range(1, 6)]  # 0, 1, 0, 1, 0 after starting at 1
            spec = {**base, "workers": workers, "remote_workers": 1, "resize": resize}
            rows.append(_run(run_child, f"with-remote, resized, {_workers(workers)}", 0, spec, cluster))
        finally:
            cluster.shutdown()
    return {"rows": rows, "summary": summarize(rows)}


def _run(run_child: Any, name: str, round_: int, spec: dict[str, Any], cluster: LocalCluster) -> dict[str, Any]:
    result = run_child("intune.bench.scale_real", spec, timeout_s=300)
    row = {"config": name, "round": round_, "local_workers": spec["workers"],
           "remote_workers": spec["remote_workers"] or 0, **result, **cluster.placement()}
    if spec.get("resize"):
        row["resize"] = [list(step) for step in spec["resize"]]
    return row


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each configuration's median rows/s with its range, and the with-remote / local-only ratio."""
    out: list[dict[str, Any]] = []
    by: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault(row["config"], []).append(row)
    for name, runs in by.items():
        ok = [r for r in runs if "error" not in r]
        rates = [r["rows_per_s"] for r in ok]
        entry: dict[str, Any] = {"config": name, "errors": len(runs) - len(ok),
                                 "exactly_once": all(r["exactly_once"] for r in ok) and len(ok) == len(runs)}
        if rates:
            entry.update({f"rows_per_s_{k}": v for k, v in _spread(rates).items()})
            entry["remote_share_median"] = statistics.median(r["remote_share"] for r in ok)
        out.append(entry)
    local, remote = _best(out, "local-only"), _best(out, "with-remote")
    if local and remote:
        medians = {e["config"]: e["rows_per_s_median"] for e in out if "rows_per_s_median" in e}
        ratio = medians[remote] / medians[local]
        by_round = {name: {r["round"]: r["rows_per_s"] for r in by[name] if "error" not in r} for name in (local, remote)}
        common = sorted(by_round[local].keys() & by_round[remote].keys())
        paired = [by_round[remote][k] / by_round[local][k] for k in common if by_round[local][k] > 0]
        out.append({"config": "with-remote / local-only", "with_remote": remote, "local_only": local,
                    "ratio_of_medians": ratio,
                    **({f"paired_ratio_{k}": v for k, v in _spread(paired).items()} if paired else {}),
                    "target": TARGET_RATIO, "met": ratio >= TARGET_RATIO})
    return out


def _best(summary: Sequence[dict[str, Any]], kind: str) -> str | None:
    """The configuration of ``kind`` (``local-only``, ``with-remote``) with the highest median rows/s."""
    entries = [e for e in summary if e["config"].startswith(kind + ",") and "rows_per_s_median" in e
               and "resized" not in e["config"]]
    return max(entries, key=lambda e: e["rows_per_s_median"])["config"] if entries else None


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    Path(out_path).write_text(json.dumps(trainer_run(spec)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
