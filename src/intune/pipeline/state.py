"""A pipeline's state, composed of its stages' parts: the layout, the checks, and who keeps the log.

Owns what ``Pipeline.state_dict`` / ``load_state_dict`` add to the stages' own parts (docs/resume.md):
the layout (``STATE_VERSION``, the keys), the header's checks (every field typed and bounded, the error
naming it), the pipeline's fingerprint (each stage's ``fingerprint``, the shard, ``deterministic``) and
its comparison (a data file rewritten since the checkpoint named first), and the rule that decides
which stage keeps the epoch's input log (``recorder``: the first that re-orders or re-cuts rows) or
that the pipeline cannot be resumed. The stages own their parts (``Stage.state_dict`` /
``load_state_dict``); the engine walks them. It must not import the engine, replay logs or read data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from intune.checkpoint import CheckpointError, ResumeError, brief
from intune.pipeline.resume import MAX_INDEX, NO_RULE, RECUTS, REORDERS, int_field

if TYPE_CHECKING:
    from intune.pipeline.sharding import Shard
    from intune.pipeline.stages import Stage

STATE_VERSION = 2
"""The layout of a pipeline's state. 2: files fingerprinted with their modification time and (Parquet)
footer digest, generator states as ``intune.rng`` writes them. A state of version 1 is refused."""
KEYS = ("version", "fingerprint", "epoch", "rows", "batches", "knobs", "shuffle")
# A fingerprint nests a few levels (stages, a source, its files); deeper is not a fingerprint.
_MAX_DEPTH = 12


def recorder(stages: Sequence[Stage], deterministic: bool) -> Stage:
    """The stage that keeps the epoch's input log, whose state is the pipeline's: the first that
    re-orders rows (a shuffle) or re-cuts them (a batch). ``ResumeError`` for a pipeline whose epochs a
    state cannot resume exactly: ``deterministic=False``, a stage with no resume rule, no such stage,
    or a second shuffle (its order would depend on state nobody keeps)."""
    if not deterministic:
        raise ResumeError(
            "state_dict() needs deterministic=True: with deterministic=False chunks overtake each other, so "
            "the rows after a position depend on timing and cannot be found again"
        )
    found, second = None, False
    for stage in stages:
        role = stage.resume_role
        if role == NO_RULE:
            raise ResumeError(f"state_dict(): stage {stage.name!r} of kind {stage.kind!r} has no resume rule")
        second = second or (role == REORDERS and found is not None)
        if role in (REORDERS, RECUTS) and found is None:
            found = stage
    if found is None or second:
        raise ResumeError(
            "state_dict() needs one shuffle stage, or with no shuffle a batch stage (the stage that records "
            f"the epoch's input); this pipeline is {' -> '.join(s.kind for s in stages)}"
        )
    return found


def fingerprint(deterministic: bool, shard: Shard | None, stages: Sequence[Stage]) -> dict[str, Any]:
    """What a state is only valid for: each stage's facts, the rank's shard, the order's determinism."""
    return {
        "deterministic": deterministic,
        "shard": None if shard is None else {"rank": shard.rank, "world_size": shard.world_size, "uneven": shard.uneven},
        "stages": [s.fingerprint() for s in stages],
    }


def check_header(state: Any, where: str) -> tuple[int, int, int, dict[str, int]]:
    """A state's layout and position checked: ``(epoch, rows, batches, knobs)``. Every field typed and
    bounded before anything uses it; the ``CheckpointError`` names the field."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: a state is a dict, got {type(state).__name__}")
    missing = [k for k in KEYS if k not in state]
    if missing:
        raise CheckpointError(f"{where}: the state lacks {missing}; is it a pipeline's state_dict()?")
    if state["version"] != STATE_VERSION:
        old = " (written before the files' times and footers were fingerprinted)" if state["version"] == 1 else ""
        raise CheckpointError(
            f"{where}: state version {state['version']!r}{old}, this intune reads {STATE_VERSION}; resume from a "
            "state this intune wrote, or start the epoch again"
        )
    epoch = int_field(state["epoch"], f"{where}: epoch")
    rows = int_field(state["rows"], f"{where}: rows")
    batches = int_field(state["batches"], f"{where}: batches", 0, rows)
    knobs = state["knobs"]
    if not isinstance(knobs, Mapping):
        raise CheckpointError(f"{where}: knobs is a {type(knobs).__name__}, not a dict")
    values = {str(name): int_field(value, f"{where}: knobs[{name!r}]", -MAX_INDEX) for name, value in knobs.items()}
    if rows and state["shuffle"] is None:
        raise CheckpointError(f"{where}: {rows} rows delivered but the state has no shuffle log")
    return epoch, rows, batches, values


def differences(saved: Any, here: Any, path: str = "", depth: int = 0) -> list[str]:
    """Where two fingerprints differ, as ``path: saved vs here`` lines."""
    if depth > _MAX_DEPTH:
        raise CheckpointError(f"the checkpoint's fingerprint nests deeper than {_MAX_DEPTH} levels at {path}")
    if isinstance(saved, Mapping) and isinstance(here, Mapping):
        out = []
        for key in sorted(set(saved) | set(here), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in here:
                out.append(f"{sub}: {'missing' if key not in saved else brief(saved[key])} in the checkpoint, "
                           f"{'missing' if key not in here else repr(here[key])} here")
            else:
                out.extend(differences(saved[key], here[key], sub, depth + 1))
        return out
    if isinstance(saved, list) and isinstance(here, list) and len(saved) == len(here):
        out = []
        for i, (a, b) in enumerate(zip(saved, here, strict=True)):
            out.extend(differences(a, b, f"{path}[{i}]", depth + 1))
        return out
    if isinstance(saved, (Mapping, list)) or saved != here:
        return [f"{path}: {brief(saved)} in the checkpoint, {here!r} here"]
    return []


def changed_files(saved: Any, here: Mapping[str, Any]) -> list[str]:
    """Each input file that a state recorded and that is another file now: the same path with another
    size, Parquet footer or modification time (a rewrite keeping the byte size changes the time, and
    the footer records the row groups' sizes and statistics). In words, naming the file."""
    out = []
    stages = saved.get("stages") if isinstance(saved, Mapping) else None
    for old, new in zip(stages if isinstance(stages, list) else [], here["stages"], strict=False):
        now = {f["path"]: f for f in _files(new)}
        for before in _files(old):
            after = now.get(before.get("path"))
            if after is None:
                continue
            if after["size"] < 0:
                out.append(f"{before['path']}: cannot be read now")
            elif before.get("size") != after["size"]:
                out.append(f"{before['path']}: {before.get('size')} bytes at the checkpoint, {after['size']} now")
            elif before.get("footer") != after.get("footer"):
                out.append(f"{before['path']}: rewritten since the checkpoint (same size, another Parquet footer)")
            elif before.get("mtime_ns") != after["mtime_ns"]:
                out.append(
                    f"{before['path']}: modified since the checkpoint (modification time {after['mtime_ns']} ns, "
                    f"{before.get('mtime_ns')} ns at the checkpoint; same size). If only its time changed (a copy "
                    f"without -p), restore it: touch -d @{_seconds(before.get('mtime_ns'))} {before['path']}"
                )
    return out


def _files(stage: Any) -> list[Mapping[str, Any]]:
    """The file facts of a stage's fingerprint (a read stage's source's), or none."""
    source = stage.get("source") if isinstance(stage, Mapping) else None
    files = source.get("files") if isinstance(source, Mapping) else None
    return [f for f in files if isinstance(f, Mapping)] if isinstance(files, list) else []


def _seconds(ns: Any) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}" if isinstance(ns, int) and ns >= 0 else "?"


def check_fingerprint(saved: Any, here: Mapping[str, Any], where: str) -> None:
    """``CheckpointError`` unless ``saved`` (a state's fingerprint) is ``here``'s: data files changed
    since the checkpoint are named first (resuming would mix two data sets), then every other field
    that differs (another pipeline)."""
    changed = changed_files(saved, here)
    if changed:
        raise CheckpointError(
            f"{where}: the data changed since the checkpoint, so its rows are not the ones the state counts: "
            + "; ".join(changed)
        )
    diffs = differences(saved, here)
    if not diffs:
        return
    saved_stages = saved.get("stages", []) if isinstance(saved, Mapping) else []
    if not isinstance(saved_stages, list) or len(saved_stages) != len(here.get("stages", [])):
        diffs = [
            f"stages: {_describe_stages(saved_stages)} in the checkpoint, {_describe_stages(here.get('stages', []))} here"
        ] + [d for d in diffs if not d.startswith("stages")]
    shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
    raise CheckpointError(f"the checkpoint is from another pipeline: {shown}")


def _describe_stages(prints: Any) -> str:
    if not isinstance(prints, list):
        return brief(prints)
    return " -> ".join(f"{p.get('name')}({p.get('kind')})" if isinstance(p, Mapping) else "?" for p in prints)
