"""Random workloads for pretraining the agent and for held-out benchmarks: many pipelines unlike
each other, all valid specs.

Owns both random generators. ``random_pipeline_spec`` is the second pretraining distribution (see
its docstring). ``random_workload(rng, ...)`` (pretraining and the held-out specs of
``intune bench agent``) draws: stage count, per-row costs and their shares, I/O share, GIL-bound
thread stages, process vs thread workers, contention, variance and drift, item sizes, memory (worker
memory, fixed buffers, a limit that is sometimes tight), CPUs, and a consumer that is sometimes the
bottleneck. Ranges are wide on purpose (a policy pretrained here must not overfit one pipeline).
It must not run simulations beyond the one model evaluation that places the consumer's demand.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from intune.sim import model
from intune.sim.spec import (
    BufferSpec,
    ConsumerSpec,
    DriftSpec,
    MachineSpec,
    StageSpec,
    WorkloadSpec,
    spec_from_dict,
    validate,
    workload_variant,
)

CPU_CHOICES = (8, 16, 32, 48, 64, 96, 128)
BATCH_CHOICES = (1024, 4096, 8192, 16384, 24096, 32768, 65536)


def _kinds(n: int, rng: np.random.Generator) -> list[str]:
    if n == 1:
        return ["read"]
    middle = list(rng.choice(["map", "udf", "shuffle", "map", "udf"], size=max(0, n - 2)))
    if n >= 3:
        middle[int(rng.integers(0, len(middle)))] = "batch"
    return ["read", *middle, "prefetch"]


def random_workload(
    rng: np.random.Generator | int,
    n_stages: int | None = None,
    cpus: int | None = None,
    *,
    min_stages: int = 2,
    max_stages: int = 8,
    consumer_bound_p: float = 0.3,
    tight_memory_p: float = 0.3,
    name: str | None = None,
) -> WorkloadSpec:
    """A random valid ``WorkloadSpec``; ``n_stages`` (default uniform in ``[min_stages, max_stages]``)."""
    rng = np.random.default_rng(rng)
    n = int(n_stages) if n_stages is not None else int(rng.integers(min_stages, max_stages + 1))
    if n < 1:
        raise ValueError(f"n_stages must be >= 1, got {n}")
    kinds = _kinds(n, rng)
    total_us = float(np.exp(rng.uniform(np.log(5.0), np.log(200.0))))  # per-row latency of the pipeline
    shares = rng.dirichlet(np.full(n, 1.0))
    stages = []
    for i, kind in enumerate(kinds):
        latency = total_us * shares[i] + 0.05
        io_share = (
            rng.uniform(0.3, 0.95)
            if kind == "read"
            else (rng.uniform(0.0, 0.5) if rng.random() < 0.2 else 0.0)
        )
        process = kind in ("map", "udf", "batch") and rng.random() < 0.5
        gil = 0.0
        if not process and kind != "read":
            gil = rng.uniform(0.0, 0.2)
            if rng.random() < 0.15:  # a pure-Python thread stage: cheap, or it caps the whole pipeline
                gil, latency = rng.uniform(0.5, 1.0), latency * 0.3
        has_buffer = kind == "prefetch" or rng.random() < 0.2
        buf = None
        if has_buffer:
            hi = int(rng.choice([1024, 4096, 16384, 65536]))
            buf = BufferSpec(min=8, max=hi, default=min(hi, int(rng.choice([16, 32, 64, 128]))))
        stages.append(
            StageSpec(
                name=f"{kind}{i}",
                kind=kind,
                mode="process" if process else "thread",
                cpu_us_per_row=latency * (1.0 - io_share),
                io_us_per_row=latency * io_share,
                item_overhead_us=float(rng.choice([0.0, 0.0, rng.uniform(10.0, 3000.0)])),
                cpu_cv=float(rng.uniform(0.0, 0.8)),
                contention=0.0
                if rng.random() < 0.3
                else float(np.exp(rng.uniform(np.log(1e-4), np.log(0.05)))),
                gil_fraction=float(gil),
                copies=1.0 if kind == "prefetch" else 0.0,
                bytes_per_row=float(rng.uniform(64.0, 1024.0)),
                worker_mb=float(rng.uniform(80.0, 300.0) if process else rng.uniform(4.0, 32.0)),
                fixed_mb=float(rng.uniform(256.0, 8192.0)) if kind == "shuffle" else 0.0,
                queue_items=int(rng.integers(1, 5)),
                max_workers=128,
                buffer=buf,
                drift=DriftSpec(
                    amplitude=float(rng.uniform(0.0, 0.3)) if rng.random() < 0.5 else 0.0,
                    period_s=float(rng.uniform(300.0, 3600.0)),
                ),
            )
        )
    cpus = int(cpus) if cpus is not None else int(rng.choice(CPU_CHOICES))
    base_gb = float(rng.uniform(1.0, 16.0))
    fixed_gb = sum(s.fixed_mb for s in stages) / 1024
    worker_gb = sum(s.worker_mb for s in stages) * min(cpus, 128) / len(stages) / 1024
    headroom = rng.uniform(0.3, 1.0) if rng.random() < tight_memory_p else rng.uniform(1.5, 4.0)
    limit_gb = base_gb + fixed_gb + max(1.0, worker_gb * headroom) + 1.0
    spec = WorkloadSpec(
        name=name or f"random-{n}x{cpus}",
        stages=tuple(stages),
        machine=MachineSpec(
            cpus=cpus,
            memory_limit_gb=limit_gb,
            host_memory_gb=limit_gb * float(rng.uniform(1.5, 8.0)),
            base_memory_gb=base_gb,
            cpu_ghz=float(rng.uniform(2.0, 3.5)),
            mem_bandwidth_gbs=float(rng.uniform(10.0, 40.0)),
            restart_delay_s=float(rng.uniform(20.0, 120.0)),
            oversubscription_cost=float(rng.uniform(0.1, 0.5)),
        ),
        consumer=ConsumerSpec(
            model_latency_s=0.0,
            **(
                {"stall_every_s": float(rng.uniform(120.0, 900.0)), "stall_s": float(rng.uniform(5.0, 40.0))}
                if rng.random() < 0.2
                else {}
            ),
        ),
        batch_size=int(rng.choice(BATCH_CHOICES)),
        chunk_rows=int(rng.choice([256, 1024, 2048, 4096])),
        description="random pretraining workload",
    )
    spec = validate(spec)
    if rng.random() < consumer_bound_p:  # a trainer that the tuned pipeline can outrun
        p = model.params_from_spec(spec)
        none = model.throughput(
            p,
            np.ones(n),
            np.where(p.has_buffer, [s.buffer.default if s.buffer else 0 for s in stages], 0),
            cpus,
        )
        demand = none * float(rng.uniform(2.0, 20.0))
        spec = workload_variant(spec, name=spec.name, model_latency_s=spec.batch_size / demand)
    return spec


def random_pipeline_spec(rng: np.random.Generator, n_stages: int, name: str = "random") -> WorkloadSpec:
    """A random pipeline on a 32-CPU machine with no consumer: read first, prefetch last,
    map/UDF/shuffle/batch stages between.

    The second distribution that pretraining draws from (``intune.agent.env.random_sim``: half its
    pipelines, which then get a memory limit and a consumer there): per-stage costs drawn on their
    own rather than as shares of one pipeline latency, per-row CPU cost and its variance, I/O share,
    GIL-bound thread stages, process workers (~100+ MB each), a shuffle buffer's fixed memory,
    drifting UDF costs. Kept apart from ``random_workload`` because the committed weights were
    pretrained on both draws as they are.
    """

    def log_uniform(lo: float, hi: float) -> float:
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))

    middle = ["batch"] if n_stages >= 3 else []
    while len(middle) < n_stages - 2:
        middle.append(str(rng.choice(["udf", "udf", "map", "shuffle"])))
    rng.shuffle(middle)
    kinds = ["read", *middle, "prefetch"][:n_stages] if n_stages >= 2 else ["read"]
    if n_stages == 2:
        kinds = ["read", "udf"]
    stages = []
    for i, kind in enumerate(kinds):
        stage: dict = {"name": f"{kind}{i}", "kind": kind, "cpu_cv": rng.uniform(0.0, 1.0),
                       "contention": rng.uniform(0.0, 0.02), "queue_items": int(rng.integers(1, 5))}
        if kind == "read":
            stage.update(cpu_us_per_row=log_uniform(0.3, 10.0), io_us_per_row=log_uniform(0.1, 60.0) * (rng.random() < 0.8),
                         worker_mb=log_uniform(4, 32))
        elif kind == "udf":
            stage.update(cpu_us_per_row=log_uniform(1.0, 80.0), drift={"amplitude": rng.uniform(0.0, 0.5),
                                                                   "period_s": log_uniform(100.0, 2000.0)})
        elif kind == "shuffle":
            stage.update(cpu_us_per_row=log_uniform(0.3, 10.0), fixed_mb=log_uniform(64, 4096))
        else:
            stage.update(cpu_us_per_row=log_uniform(0.3, 30.0))
        if kind in ("udf", "map", "batch") and rng.random() < 0.5:
            stage.update(mode="process", worker_mb=log_uniform(60, 300))
        elif kind != "read" and rng.random() < 0.3:
            stage.update(gil_fraction=rng.uniform(0.2, 1.0))
        if kind in ("read", "prefetch") or rng.random() < 0.25:
            stage["buffer"] = {"min": 1, "max": 4096, "default": int(rng.choice([8, 16, 64, 256]))}
        stages.append(stage)
    base = log_uniform(1.0, 12.0)
    limit = base + log_uniform(8.0, 200.0)
    return spec_from_dict({
        "name": name, "stages": stages, "batch_size": int(rng.choice([256, 1024, 4096, 24096])),
        "chunk_rows": int(rng.choice([512, 1024, 4096])), "bytes_per_row": log_uniform(50, 2000),
        "machine": {"cpus": 32, "memory_limit_gb": limit, "host_memory_gb": max(256.0, limit), "base_memory_gb": base,
                    "restart_delay_s": 30.0, "oversubscription_cost": rng.uniform(0.1, 0.5)},
    }, source=f"sim.random_pipeline_spec({name})")


def with_heavy_map_stage(spec: WorkloadSpec, share: float, min_max_workers: int = 0) -> tuple[WorkloadSpec, str] | None:
    """``spec`` with its costliest map stage (kind map or udf, regular: no cost tail, no size spread)
    scaled to take ``share`` of the CPU per row, per-item overhead included, and a ``max_workers`` of at
    least ``min_max_workers``; with that stage's name. None where the spec has no such stage or has
    irregular stages (a remote pool is modelled beside regular stages only).

    The stage a remote pool relieves: where it is light, remote workers never pay and nothing is
    learned or measured about them.
    """
    if any(s.cost_tail is not None or s.size_cv > 0 for s in spec.stages):
        return None
    rows = spec.rows_per_item()
    cost = [s.cpu_us_per_row + s.item_overhead_us / r for s, r in zip(spec.stages, rows, strict=True)]
    maps = [i for i, s in enumerate(spec.stages) if s.kind in ("map", "udf")]
    if not maps or not 0.0 < share < 1.0:
        return None
    i = max(maps, key=cost.__getitem__)
    others = sum(cost) - cost[i]
    if cost[i] <= 0 or others <= 0:
        return None
    factor = share / (1.0 - share) * others / cost[i]
    s = spec.stages[i]
    stage = dataclasses.replace(s, cpu_us_per_row=s.cpu_us_per_row * factor, item_overhead_us=s.item_overhead_us * factor,
                                max_workers=max(s.max_workers, min_max_workers))
    stages = tuple(stage if k == i else t for k, t in enumerate(spec.stages))
    return dataclasses.replace(spec, stages=stages), stage.name


WAITS_ON = ("io", "gil")


def with_waiting_map_stage(spec: WorkloadSpec, index: int, wait_share: float, slowdown: float,
                           worker_mb: float, min_max_workers: int = 0, on: str = "io") -> WorkloadSpec | None:
    """``spec`` with its map stage ``index`` made to wait: thread workers whose per-row time is
    ``slowdown`` times the costliest stage's CPU per row, ``worker_mb`` each and a ``max_workers`` of at
    least ``min_max_workers``. ``on="io"``: ``wait_share`` of that time is an I/O wait (no CPU);
    ``on="gil"``: all of it is CPU, ``wait_share`` of it under the GIL. None where that stage is not a
    regular map or UDF stage after the first (waiting on the GIL, the first stage may be a reader too).

    Waiting on I/O, it is the stage that fetches rows after a cheap source (ids -> fetch from a store):
    busy all the time while it uses almost no CPU, so it needs more workers than CPUs. Only the first
    stage of the other draws waits on I/O, so without this a network never sees a waiting map stage.
    Waiting on the GIL (a pure-Python parser), it looks the same once it has a few workers, busy on
    little CPU each, but it tops at one CPU's worth however many it has: only the response to an added
    worker tells the two apart, so a network shown the first must also be shown the second. A reader
    that parses rows in pure Python threads is the same GIL-bound stage in the first place.
    """
    if on not in WAITS_ON:
        raise ValueError(f"with_waiting_map_stage: on must be one of {WAITS_ON}, got {on!r}")
    first = 0 if on == "gil" else 1
    if not first <= index < len(spec.stages) or not 0.0 <= wait_share < 1.0 or slowdown <= 0:
        return None
    s = spec.stages[index]
    kinds = ("map", "udf", "read") if on == "gil" and index == 0 else ("map", "udf")
    if s.kind not in kinds or s.cost_tail is not None or s.size_cv > 0 or s.remote is not None:
        return None
    total = slowdown * max(t.cpu_us_per_row for t in spec.stages)
    io = wait_share if on == "io" else 0.0
    stage = dataclasses.replace(s, mode="thread", cpu_us_per_row=total * (1.0 - io), io_us_per_row=total * io,
                                gil_fraction=wait_share if on == "gil" else 0.0, worker_mb=worker_mb,
                                max_workers=max(s.max_workers, min_max_workers))
    return dataclasses.replace(spec, stages=tuple(stage if k == index else t for k, t in enumerate(spec.stages)))
