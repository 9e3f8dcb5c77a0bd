"""Workload specs: the machine, the consumer and the stages of a simulated pipeline, as data.

Owns the spec dataclasses, loading them from YAML/JSON (a shipped name or a path), validation with
errors that name the file and the field at fault, and variants derived from a base spec by parameters
(CPU count, batch size, a prefix of the complexity ladder). The schema is documented field by field in
``docs/workloads.md``. It must not compute throughput or memory: that is ``intune.sim.model``.

Costs are per row (rows are conserved through the pipeline, so per-row costs add up across stages);
items are chunks of ``chunk_rows`` rows before the batch stage and batches of ``batch_size`` rows from it on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from intune.monitor.observation import observed_kind

WORKLOAD_DIR = Path(__file__).parent / "workloads"
MODES = ("thread", "process")
TAIL_KINDS = ("lognormal", "pareto")
LADDER_PREFIX = "ladder-"


class SpecError(ValueError):
    """A workload spec is invalid; the message names the file and the field."""


@dataclass(frozen=True)
class BufferSpec:
    """A tunable output buffer: knob ``<stage>.buffer_mb`` with these bounds (MB)."""

    min: int = 1
    max: int = 4096
    default: int = 16


@dataclass(frozen=True)
class DriftSpec:
    """Slow drift of a stage's CPU cost: multiplier ``1 + amplitude * sin(2 pi t / period_s + phase)``."""

    amplitude: float = 0.0
    period_s: float = 1800.0


@dataclass(frozen=True)
class CostTailSpec:
    """The family of a stage's per-item CPU cost, sampled item by item in the simulator's ticks.

    Its mean is the stage's ``cpu_us_per_row`` (per row; plus ``item_overhead_us`` per item) and its
    coefficient of variation is the stage's ``cpu_cv``, so the model (which sees only the mean and the
    cv) is unchanged; ``kind`` picks the shape: ``lognormal`` (``sigma^2 = ln(1 + cv^2)``) or
    ``pareto`` (type I, ``alpha = 1 + sqrt(1 + 1 / cv^2)``: a power-law tail with the same mean and cv).
    """

    kind: str = "lognormal"


@dataclass(frozen=True)
class RemotePoolSpec:
    """Workers of a map stage on a remote cluster (knob ``<stage>.remote_workers``, unit ``cpu``).

    ``nodes`` nodes of ``cpus_per_node`` CPUs, one worker per CPU, placed by packing (the first live
    node is filled before the next). A chunk on a remote worker takes its rows' cost times
    ``cost_factor`` (the cluster's CPUs against this machine's), plus ``latency_ms`` and its bytes (in and
    out) over ``bandwidth_mb_s``: each node has a link of that bandwidth, shared by the workers on it.
    ``node_loss`` maps a tick to the nodes lost at its start (the first live nodes, with the workers on
    them). The model is ``intune.sim.remote``.
    """

    nodes: int = 4
    cpus_per_node: int = 16
    bandwidth_mb_s: float = 1000.0
    latency_ms: float = 5.0
    cost_factor: float = 1.0
    node_loss: dict[int, int] = field(default_factory=dict)

    @property
    def cpus(self) -> int:
        return self.nodes * self.cpus_per_node


@dataclass(frozen=True)
class StageSpec:
    name: str
    kind: str = "map"  # read | shuffle | map | udf | batch | prefetch | ... (informative, except "batch")
    mode: str = "thread"  # thread | process
    cpu_us_per_row: float = 1.0  # CPU microseconds per row at the spec's reference GHz
    io_us_per_row: float = 0.0  # I/O wait microseconds per row: no CPU, hidden by more workers
    item_overhead_us: float = 0.0  # CPU microseconds per item, whatever its size
    cpu_cv: float = 0.0  # coefficient of variation of the per-item cost (what buffers absorb)
    contention: float = 0.0  # scaling curve: w workers act like w / (1 + contention * (w - 1))
    gil_fraction: float = 0.0  # share of CPU time holding the GIL (thread stages): rows/s <= 1 / (gil * cpu)
    copies: float = 0.0  # times the stage copies its output bytes (costs bytes / memory bandwidth)
    bytes_per_row: float | None = None  # output bytes per row (None: the workload's bytes_per_row)
    worker_mb: float | None = None  # memory per worker (None: 8 MB thread, 120 MB process)
    fixed_mb: float = 0.0  # memory the stage holds regardless of knobs (e.g. a shuffle buffer)
    inflight_items: float = 2.0  # items a busy worker holds (input and output)
    queue_items: int = 2  # output queue depth of a stage without a buffer knob
    max_workers: int = 128
    buffer: BufferSpec | None = None  # a tunable output buffer (knob "<name>.buffer_mb")
    drift: DriftSpec = field(default_factory=DriftSpec)
    cost_tail: CostTailSpec | None = None  # per-item cost drawn from this family (mean, cv as above)
    size_cv: float = 0.0  # cv of its items' size (bytes, list lengths): cost and bytes scale with it
    remote: RemotePoolSpec | None = None  # workers on a remote cluster beside the local ones (map stages)


@dataclass(frozen=True)
class MachineSpec:
    cpus: int = 32
    memory_limit_gb: float = 64.0  # the cgroup limit: above it the job is killed
    host_memory_gb: float = 256.0  # the host's memory (what tf.data reads, blind to cgroups)
    base_memory_gb: float = 4.0  # used by the trainer and the process itself
    cpu_ghz: float = 3.0
    mem_bandwidth_gbs: float = 20.0
    restart_delay_s: float = 60.0  # after an OOM: zero throughput this long
    oversubscription_cost: float = 0.3  # CPU efficiency 1 / (1 + cost * max(0, workers / cpus - 1))
    thread_switch_share: float = 0.1  # a thread worker's weight in that count, a process worker's 1


@dataclass(frozen=True)
class ConsumerSpec:
    model_latency_s: float = 0.0  # the trainer's step time per batch; 0 = unbounded demand
    stall_every_s: float = 0.0  # the trainer pauses (evaluation, checkpoint) this often; 0 = never
    stall_s: float = 0.0  # for this long: nothing is consumed and the buffers fill


@dataclass(frozen=True)
class ReferenceAllocation:
    """A named allocation quoted by the paper (e.g. Figure 5's hand-tuned job) and its expected share."""

    cpus: int
    workers: dict[str, int]
    buffer_mb: dict[str, int] = field(default_factory=dict)
    demand_share: float | None = None  # expected throughput / consumer demand


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    stages: tuple[StageSpec, ...]
    machine: MachineSpec = field(default_factory=MachineSpec)
    consumer: ConsumerSpec = field(default_factory=ConsumerSpec)
    batch_size: int = 1024
    chunk_rows: int = 1024
    bytes_per_row: float = 256.0
    reference_ghz: float | None = None  # GHz at which costs were measured (None: the machine's)
    description: str = ""
    ladder: tuple[tuple[str, ...], ...] = ()  # stage subsets for the complexity ladder (Figure 8A)
    references: dict[str, ReferenceAllocation] = field(default_factory=dict)
    source: str = ""  # file it came from (for error messages)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def rows_per_item(self) -> list[int]:
        """Rows per emitted item, per stage: chunks before the first batch stage, batches from it on."""
        out, batched = [], False
        for s in self.stages:
            batched = batched or s.kind == "batch"
            out.append(self.batch_size if batched else self.chunk_rows)
        return out


# --------------------------------------------------------------------------------------------- parsing


def _check(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise SpecError(f"{where}: {msg}")


def _number(
    value: Any, where: str, lo: float | None = 0.0, hi: float | None = None, integer: bool = False
) -> Any:
    _check(
        isinstance(value, (int, float)) and not isinstance(value, bool),
        where,
        f"must be a number, got {value!r}",
    )
    _check(math.isfinite(value), where, f"must be finite, got {value!r}")
    if integer:
        _check(float(value).is_integer(), where, f"must be an integer, got {value!r}")
        value = int(value)
    _check(lo is None or value >= lo, where, f"must be >= {lo}, got {value!r}")
    _check(hi is None or value <= hi, where, f"must be <= {hi}, got {value!r}")
    return value


_RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    # field: (lo, hi, integer)
    "cpu_us_per_row": (0.0, None, False),
    "io_us_per_row": (0.0, None, False),
    "item_overhead_us": (0.0, None, False),
    "cpu_cv": (0.0, 5.0, False),
    "size_cv": (0.0, 5.0, False),
    "contention": (0.0, 1.0, False),
    "gil_fraction": (0.0, 1.0, False),
    "copies": (0.0, 10.0, False),
    "bytes_per_row": (1e-3, None, False),
    "worker_mb": (0.0, None, False),
    "fixed_mb": (0.0, None, False),
    "inflight_items": (0.0, None, False),
    "queue_items": (1, None, True),
    "max_workers": (1, 4096, True),
    "cpus": (1, 100000, True),
    "memory_limit_gb": (1e-3, None, False),
    "host_memory_gb": (1e-3, None, False),
    "base_memory_gb": (0.0, None, False),
    "cpu_ghz": (0.1, 10.0, False),
    "mem_bandwidth_gbs": (0.01, None, False),
    "restart_delay_s": (0.0, None, False),
    "oversubscription_cost": (0.0, 100.0, False),
    "thread_switch_share": (0.0, 1.0, False),
    "model_latency_s": (0.0, None, False),
    "stall_every_s": (0.0, None, False),
    "stall_s": (0.0, None, False),
    "amplitude": (0.0, 0.9, False),
    "period_s": (1e-3, None, False),
    "min": (0, None, True),
    "max": (0, None, True),
    "default": (0, None, True),
    "batch_size": (1, None, True),
    "chunk_rows": (1, None, True),
    "reference_ghz": (0.1, 10.0, False),
    "demand_share": (0.0, None, False),
    "nodes": (1, 4096, True),
    "cpus_per_node": (1, 1024, True),
    "bandwidth_mb_s": (1e-3, None, False),
    "latency_ms": (0.0, None, False),
    "cost_factor": (1e-3, 1000.0, False),
}


def _fields(cls: type, data: Any, where: str, nested: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Check ``data`` is a mapping of known fields of dataclass ``cls`` and convert numbers."""
    _check(isinstance(data, Mapping), where, f"must be a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)} - {"source"}
    out: dict[str, Any] = {}
    for key, value in data.items():
        _check(key in known, f"{where}.{key}", f"unknown field; known fields are {sorted(known)}")
        if nested and key in nested:
            out[key] = nested[key](value, f"{where}.{key}")
        elif key in _RANGES and value is not None:
            lo, hi, integer = _RANGES[key]
            out[key] = _number(value, f"{where}.{key}", lo, hi, integer)
        else:
            out[key] = value
    return out


def _buffer(data: Any, where: str) -> BufferSpec:
    b = BufferSpec(**_fields(BufferSpec, data, where))
    _check(
        b.min <= b.default <= b.max, where, f"needs min <= default <= max, got {b.min}, {b.default}, {b.max}"
    )
    return b


def _drift(data: Any, where: str) -> DriftSpec:
    return DriftSpec(**_fields(DriftSpec, data, where))


def _cost_tail(data: Any, where: str) -> CostTailSpec | None:
    if data is None:  # spelt-out default: a regular stage
        return None
    tail = CostTailSpec(**_fields(CostTailSpec, data, where))
    _check(tail.kind in TAIL_KINDS, f"{where}.kind", f"must be one of {TAIL_KINDS}, got {tail.kind!r}")
    return tail


def _remote(data: Any, where: str) -> RemotePoolSpec | None:
    if data is None:  # spelt-out default: no remote pool
        return None
    kw = _fields(RemotePoolSpec, data, where, {"node_loss": _node_loss})
    pool = RemotePoolSpec(**kw)
    lost = sum(pool.node_loss.values())
    _check(
        lost <= pool.nodes,
        f"{where}.node_loss",
        f"loses {lost} nodes in all, the pool has {pool.nodes}",
    )
    return pool


def _node_loss(data: Any, where: str) -> dict[int, int]:
    _check(isinstance(data, Mapping), where, "must map a tick to the nodes lost at it")
    out: dict[int, int] = {}
    for tick, lost in data.items():
        t = _number(int(tick) if isinstance(tick, str) and tick.isdigit() else tick, f"{where}[{tick!r}]", 1, None, True)
        out[t] = _number(lost, f"{where}[{tick!r}]", 1, None, True)
    return out


def _stage(data: Any, where: str) -> StageSpec:
    _check(isinstance(data, Mapping) and "name" in data, where, "a stage needs a 'name'")
    where = f"{where} ({data['name']})"
    kw = _fields(
        StageSpec, data, where, {"buffer": _buffer, "drift": _drift, "cost_tail": _cost_tail, "remote": _remote}
    )
    _check(
        isinstance(kw["name"], str) and kw["name"] and "." not in kw["name"],
        f"{where}.name",
        "must be a non-empty string without dots",
    )
    _check(
        kw.get("mode", "thread") in MODES, f"{where}.mode", f"must be one of {MODES}, got {kw.get('mode')!r}"
    )
    _check(
        not (kw.get("mode") == "process" and kw.get("gil_fraction", 0) > 0),
        f"{where}.gil_fraction",
        "applies only to thread stages (process workers do not share a GIL)",
    )
    _check(
        kw.get("cpu_us_per_row", 1.0) + kw.get("io_us_per_row", 0.0) + kw.get("item_overhead_us", 0.0) > 0,
        f"{where}.cpu_us_per_row",
        "a stage must cost something per row (cpu, io or item overhead)",
    )
    if kw.get("cost_tail") is not None:
        _check(
            kw.get("cpu_cv", 0.0) > 0,
            f"{where}.cost_tail",
            "needs cpu_cv > 0 (the tail's coefficient of variation; its mean is cpu_us_per_row)",
        )
        _check(
            kw.get("size_cv", 0.0) == 0,
            f"{where}.cost_tail",
            "and size_cv are exclusive: a stage's per-item cost follows its tail or its items' size",
        )
    if kw.get("remote") is not None:
        _check(
            observed_kind(kw.get("kind", "map")) == "map",
            f"{where}.remote",
            f"a remote pool is for map stages (kind map or udf), this stage's kind is {kw.get('kind')!r}",
        )
        _check(
            kw.get("cost_tail") is None and kw.get("size_cv", 0.0) == 0,
            f"{where}.remote",
            "is modelled for regular stages only (no cost_tail, no size_cv)",
        )
    return StageSpec(**kw)


def _reference(data: Any, where: str) -> ReferenceAllocation:
    kw = _fields(ReferenceAllocation, data, where)
    for key in ("workers", "buffer_mb"):
        _check(isinstance(kw.get(key, {}), Mapping), f"{where}.{key}", "must map stage names to integers")
    return ReferenceAllocation(**kw)


def spec_from_dict(data: Any, source: str = "<dict>") -> WorkloadSpec:
    """Build and validate a spec from parsed YAML/JSON; errors name ``source`` and the field."""
    _check(isinstance(data, Mapping), source, "a workload spec must be a mapping")
    _check("stages" in data, f"{source}: stages", "is required")
    _check("name" in data, f"{source}: name", "is required")
    nested = {
        "stages": lambda v, w: _stages(v, w),
        "machine": lambda v, w: MachineSpec(**_fields(MachineSpec, v, w)),
        "consumer": lambda v, w: ConsumerSpec(**_fields(ConsumerSpec, v, w)),
        "references": lambda v, w: {k: _reference(r, f"{w}.{k}") for k, r in _mapping(v, w).items()},
        "ladder": lambda v, w: tuple(tuple(step) for step in v),
    }
    kw = _fields(WorkloadSpec, data, f"{source}:", nested)
    spec = WorkloadSpec(**kw, source=source)
    return validate(spec)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    _check(isinstance(value, Mapping), where, "must be a mapping")
    return value


def _stages(value: Any, where: str) -> tuple[StageSpec, ...]:
    _check(isinstance(value, list) and len(value) >= 1, where, "must be a non-empty list of stages")
    return tuple(_stage(s, f"{where}[{i}]") for i, s in enumerate(value))


def validate(spec: WorkloadSpec) -> WorkloadSpec:
    """Cross-field checks (unique names, references and ladder name real stages); returns ``spec``."""
    where = spec.source or spec.name
    names = spec.stage_names
    dup = sorted({n for n in names if names.count(n) > 1})
    _check(not dup, f"{where}: stages", f"stage names must be unique, repeated: {dup}")
    for ref_name, ref in spec.references.items():
        for key in ("workers", "buffer_mb"):
            unknown = sorted(set(getattr(ref, key)) - set(names))
            _check(
                not unknown,
                f"{where}: references.{ref_name}.{key}",
                f"unknown stage(s) {unknown}; stages are {list(names)}",
            )
    for i, step in enumerate(spec.ladder):
        unknown = sorted(set(step) - set(names))
        _check(not unknown, f"{where}: ladder[{i}]", f"unknown stage(s) {unknown}; stages are {list(names)}")
    remote = [s.name for s in spec.stages if s.remote is not None]
    _check(
        len(remote) <= 1,
        f"{where}: stages",
        f"one remote pool per workload (the Observation carries one remote_cpus), stages {remote} declare one",
    )
    irregular = [s.name for s in spec.stages if s.cost_tail is not None or s.size_cv > 0]
    _check(
        not (remote and irregular),
        f"{where}: stages",
        f"a remote pool ({remote[0] if remote else ''}) is modelled in workloads of regular stages only; "
        f"irregular: {irregular}",
    )
    m = spec.machine
    _check(
        m.base_memory_gb < m.memory_limit_gb,
        f"{where}: machine.base_memory_gb",
        f"must be below memory_limit_gb ({m.memory_limit_gb}), got {m.base_memory_gb}",
    )
    _check(
        m.memory_limit_gb <= m.host_memory_gb,
        f"{where}: machine.memory_limit_gb",
        f"must not exceed host_memory_gb ({m.host_memory_gb}), got {m.memory_limit_gb}",
    )
    return spec


# ----------------------------------------------------------------------------------- loading, variants


def list_workloads() -> list[str]:
    """Names ``load_workload`` accepts: shipped files, plus ``ladder-K`` for each ladder step."""
    names = sorted(p.stem for p in WORKLOAD_DIR.glob("*.y*ml")) + sorted(
        p.stem for p in WORKLOAD_DIR.glob("*.json")
    )
    extra = []
    for name in names:
        spec = _load_file(_path_of(name))
        if spec.ladder:
            extra += [f"{LADDER_PREFIX}{len(step)}" for step in spec.ladder]
    return names + extra


def _path_of(name: str) -> Path:
    for ext in (".yaml", ".yml", ".json"):
        p = WORKLOAD_DIR / f"{name}{ext}"
        if p.exists():
            return p
    raise SpecError(
        f"no shipped workload {name!r}; choose one of {list_workloads()} or give a .yaml/.json path"
    )


def _load_file(path: Path) -> WorkloadSpec:
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e})") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from e
    return spec_from_dict(data, source=str(path))


def load_workload(name_or_path: str | Path, **overrides: Any) -> WorkloadSpec:
    """A shipped workload by name (``criteo``, ``production``, ``ladder-5``, a variant's name such as
    ``production@mem=48@cpus=64``) or a .yaml/.json path.

    ``overrides`` go to ``workload_variant`` (``cpus=``, ``batch_size=``, ``memory_limit_gb=``...).
    """
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml", ".json")) or "/" in text:
        spec = _load_file(Path(text))
    elif "@" in text:  # a variant's name, e.g. "production@mem=48@cpus=64"
        base, *parts = text.split("@")
        keys = {"cpus": "cpus", "batch": "batch_size", "mem": "memory_limit_gb", "latency": "model_latency_s"}
        params: dict[str, Any] = {}
        for part in parts:
            key, _, value = part.partition("=")
            _check(
                key in keys and value != "",
                f"workload {text!r}",
                f"unknown variant {part!r}; use {sorted(keys)}",
            )
            params[keys[key]] = float(value) if key in ("mem", "latency") else int(value)
        spec = workload_variant(load_workload(base), **params)
    elif text.startswith(LADDER_PREFIX):
        spec = ladder_workload(int(text[len(LADDER_PREFIX) :]))
    else:
        spec = _load_file(_path_of(text))
    return workload_variant(spec, **overrides) if overrides else spec


def ladder_workload(n_stages: int, base: str = "ladder") -> WorkloadSpec:
    """The complexity-ladder step with ``n_stages`` stages (Figure 8A), from the shipped ``base`` spec."""
    spec = _load_file(_path_of(base))
    for step in spec.ladder:
        if len(step) == n_stages:
            return workload_variant(spec, stages=step, name=f"{LADDER_PREFIX}{n_stages}")
    raise SpecError(
        f"{spec.source}: ladder has no step with {n_stages} stages; sizes are {[len(s) for s in spec.ladder]}"
    )


def workload_variant(
    spec: WorkloadSpec,
    *,
    name: str | None = None,
    cpus: int | None = None,
    batch_size: int | None = None,
    memory_limit_gb: float | None = None,
    model_latency_s: float | None = None,
    stages: tuple[str, ...] | list[str] | None = None,
) -> WorkloadSpec:
    """A copy of ``spec`` with another CPU count, batch size, memory limit, consumer, or stage subset.

    A stage subset keeps the spec's stage order. Per-row costs do not change with the batch size; per-item
    overheads and item bytes do (that is how batch size matters, Figure 8C).
    """
    machine, consumer, kept = spec.machine, spec.consumer, spec.stages
    if cpus is not None:
        machine = dataclasses.replace(machine, cpus=int(_number(cpus, "cpus", 1, None, True)))
    if memory_limit_gb is not None:
        machine = dataclasses.replace(machine, memory_limit_gb=float(memory_limit_gb))
    if model_latency_s is not None:
        consumer = dataclasses.replace(consumer, model_latency_s=float(model_latency_s))
    if stages is not None:
        unknown = sorted(set(stages) - set(spec.stage_names))
        _check(
            not unknown,
            f"{spec.name}: stages",
            f"unknown stage(s) {unknown}; stages are {list(spec.stage_names)}",
        )
        kept = tuple(s for s in spec.stages if s.name in set(stages))
    suffix = "".join(  # a name that load_workload() reads back
        f"@{k}={v:g}"
        for k, v in (
            ("cpus", cpus),
            ("batch", batch_size),
            ("mem", memory_limit_gb),
            ("latency", model_latency_s),
        )
        if v is not None
    )
    out = dataclasses.replace(
        spec,
        name=name or (spec.name + suffix),
        machine=machine,
        consumer=consumer,
        stages=kept,
        batch_size=int(batch_size) if batch_size is not None else spec.batch_size,
        ladder=spec.ladder if stages is None else (),
        references=spec.references if stages is None else {},
    )
    return validate(out)
