"""Checkpoint files: one format for every ``state_dict`` in intune (pipeline, DataLoader, tuner, bundles).

Owns the on-disk layout, its atomic write and its checks on load. It must not know what a state
means: callers build the nested structure and check its contents; this module only stores it
faithfully or refuses to load it.

Layout (all integers little-endian)::

    b"INTUNECK"                 8 bytes, the magic
    u64 header_len              length of the JSON header that follows
    header                      UTF-8 JSON: format, kind, intune_version, payload_bytes, sha256, tree
    payload                     the arrays' raw bytes, each at an 8-byte aligned offset

The tree mirrors the state: a JSON value for str/int/float/bool/None, ``{"list": [...]}`` for a
list or tuple, ``{"dict": {...}}`` for a dict (str keys only), ``{"array": {dtype, shape, offset,
nbytes}}`` for a numpy array. Nothing is pickled, so loading a file cannot run code, and nothing is
base64 in the JSON, so a large array costs its bytes and no more. The sha256 covers the kind, the
tree and the payload: a flipped bit anywhere that matters is a ``CheckpointError``, never a state
that loads with other values.

A save is atomic: a temporary file in the same directory, flushed and fsynced, then ``os.replace``
and an fsync of the directory. A process killed at any moment leaves either the old checkpoint or
the new one under the name, never a mix; the temporary file it may leave behind is never read, and the
next save to the same path removes it. The writer holds an exclusive ``flock`` on its temporary file
until the rename, so a temporary file whose lock can be taken has no live writer (a lock, not a pid or
an age: the writer may be in another container, or slow).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import reprlib
import stat
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"INTUNECK"
FORMAT_VERSION = 1
_ALIGN = 8
_HEADER_LEN = struct.Struct("<Q")
# Numeric and boolean dtypes only: an object array could hold anything, a string array is not what
# a state needs (strings go in the tree as JSON).
_ARRAY_KINDS = frozenset("biufc")
# How deep a header's JSON may nest (objects and arrays). A state's tree is two JSON levels per level of
# the state (``{"dict": {...}}``) and no state of intune's nests more than a dozen; the bound is checked
# before the header is parsed, so a crafted file cannot exhaust the parser's or the decoder's recursion.
MAX_HEADER_DEPTH = 200


class CheckpointError(ValueError):
    """A checkpoint cannot be loaded as asked: a file truncated, corrupted, of another format, version
    or kind, or a state whose fields are malformed or out of bounds for what loads it. The message names
    the file or the field and what is wrong."""


class ResumeError(CheckpointError):
    """A state cannot resume this object, or this object cannot give a state that resumes exactly: another
    configuration (pipeline, loader, tuner, policy), or a pipeline whose epochs cannot be resumed. The
    message says why. The one resume error of intune (``intune.DataLoader``'s ``ResumeMismatchError`` is
    this class)."""


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxstring, _BRIEF.maxother = 3, 60, 60


def brief(value: Any) -> str:
    """``value`` in a few words for an error message: at most 3 levels deep and a few items of each, so a
    crafted value of any depth or size costs no recursion and no long line."""
    return _BRIEF.repr(value)


def _intune_version() -> str:
    from intune import __version__

    return __version__


def _encode(value: Any, where: str, arrays: list[np.ndarray]) -> Any:
    """The tree node for ``value``; arrays are appended to ``arrays`` and referenced by index."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return {"float": repr(value)}
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS:
            raise TypeError(f"checkpoint state: {where} is an array of dtype {value.dtype}; only numeric and bool arrays are stored")
        arrays.append(value)
        return {"array": len(arrays) - 1}
    if isinstance(value, np.generic):
        if value.dtype.kind not in _ARRAY_KINDS:
            raise TypeError(f"checkpoint state: {where} is a numpy scalar of dtype {value.dtype}")
        return _encode(value.item(), where, arrays)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"checkpoint state: {where} has a key {key!r} of type {type(key).__name__}; keys must be str")
            out[key] = _encode(item, f"{where}[{key!r}]", arrays)
        return {"dict": out}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(item, f"{where}[{i}]", arrays) for i, item in enumerate(value)]}
    raise TypeError(
        f"checkpoint state: {where} is a {type(value).__name__}; a state holds dicts with str keys, lists, "
        "str, int, float, bool, None and numeric numpy arrays"
    )


def _layout(arrays: list[np.ndarray]) -> tuple[list[dict[str, Any]], int]:
    """Each array's descriptor (dtype, shape, offset, nbytes) and the payload's total size."""
    specs, offset = [], 0
    for array in arrays:
        offset = -(-offset // _ALIGN) * _ALIGN
        specs.append({"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset, "nbytes": int(array.nbytes)})
        offset += int(array.nbytes)
    return specs, offset


def _digest(kind: str, tree_json: bytes, payload: bytes | bytearray | memoryview) -> str:
    h = hashlib.sha256()
    h.update(kind.encode())
    h.update(b"\0")
    h.update(tree_json)
    h.update(b"\0")
    h.update(payload)
    return h.hexdigest()


def _canonical(tree: Any) -> bytes:
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def dumps_checkpoint(state: Mapping[str, Any], *, kind: str) -> bytes:
    """The bytes of a checkpoint file holding ``state`` (what ``save_checkpoint`` writes)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"checkpoint state must be a mapping with str keys, not {type(state).__name__}")
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"checkpoint kind must be a non-empty str, not {kind!r}")
    arrays: list[np.ndarray] = []
    tree = _encode(state, "state", arrays)
    specs, total = _layout(arrays)
    payload = bytearray(total)
    for array, spec in zip(arrays, specs, strict=True):
        if spec["nbytes"]:
            flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            payload[spec["offset"] : spec["offset"] + spec["nbytes"]] = flat.tobytes()
    body = {"tree": tree, "arrays": specs}
    body_json = _canonical(body)
    header = {
        "format": FORMAT_VERSION,
        "kind": kind,
        "intune_version": _intune_version(),
        "payload_bytes": total,
        "sha256": _digest(kind, body_json, payload),
        "body": body,
    }
    header_json = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return MAGIC + _HEADER_LEN.pack(len(header_json)) + header_json + bytes(payload)


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any], *, kind: str) -> Path:
    """Write ``state`` to ``path`` atomically and durably; returns the path.

    The bytes go to a temporary file beside ``path`` (same directory, so ``os.replace`` is a rename
    on one file system), which is fsynced, renamed over ``path``, and the directory fsynced so the
    rename itself survives a power cut. A failure at any point leaves the previous file intact.
    Temporary files of earlier saves to ``path`` whose writer is gone (killed mid-write) are removed
    first; see ``remove_stale_temporaries``.
    """
    path = Path(path)
    data = dumps_checkpoint(state, kind=kind)
    directory = path.parent if str(path.parent) else Path(".")
    remove_stale_temporaries(path)
    fd, tmp_name = _locked_temporary(directory, path.name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            os.replace(tmp_name, path)  # before the lock goes with the handle: see remove_stale_temporaries
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)
    return path


_NO_LOCKS = (errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL, errno.ENOSYS)  # a file system without flock


def _temporary_pattern(name: str) -> re.Pattern[str]:
    """The names ``tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp")`` gives (its random part has
    no dot, so the temporaries of a checkpoint ``ck.1`` are not those of ``ck``)."""
    return re.compile(rf"\.{re.escape(name)}\.[A-Za-z0-9_]+\.tmp")


def _locked_temporary(directory: Path, name: str) -> tuple[int, str]:
    """A new temporary file for checkpoint ``name`` in ``directory``, exclusively ``flock``ed.

    A concurrent save may take the lock of a file created a moment ago, before its writer locked it,
    and remove it as stale: the writer then finds its name gone (or another file under it) once it
    holds the lock, and makes another. On a file system without ``flock`` the file is not locked.
    """
    while True:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno in _NO_LOCKS:
                return fd, tmp_name
            os.close(fd)
            raise
        try:
            same = os.stat(tmp_name, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, tmp_name
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary files that earlier saves to ``path`` left behind; the names removed.

    A save killed mid-write leaves ``.<name>.<random>.tmp`` as large as the checkpoint. One is stale
    when its ``flock`` can be taken: a live writer holds it until its rename (a file an older intune
    left, which never held one, is stale as well). One whose lock is held, that is not a regular file,
    or whose lock cannot be asked for (a file system without ``flock``) is left alone.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    pattern = _temporary_pattern(path.name)
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if pattern.fullmatch(n)]
    except OSError:
        return removed
    for name in names:
        candidate = os.path.join(directory, name)
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # gone already, a symlink, or not ours to open
            continue
        try:
            if not _is_regular(fd):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by a live writer, or no flock here: not provably stale
                continue
            try:
                if os.stat(candidate, follow_symlinks=False).st_ino != os.fstat(fd).st_ino:
                    continue  # replaced since it was opened
                os.unlink(candidate)
            except FileNotFoundError:
                continue
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _fsync_directory(directory: Path) -> None:
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:  # a platform without directory handles: the rename is still atomic
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _decode(node: Any, arrays: list[np.ndarray], where: str, name: str) -> Any:
    if node is None or isinstance(node, (bool, str, int, float)):
        return node
    if isinstance(node, dict) and len(node) == 1:
        (tag, inner), = node.items()
        if tag == "dict" and isinstance(inner, dict):
            return {key: _decode(item, arrays, f"{where}[{key!r}]", name) for key, item in inner.items()}
        if tag == "list" and isinstance(inner, list):
            return [_decode(item, arrays, f"{where}[{i}]", name) for i, item in enumerate(inner)]
        if tag == "array" and isinstance(inner, int) and 0 <= inner < len(arrays):
            return arrays[inner]
        if tag == "float" and inner in ("nan", "inf", "-inf"):
            return float(inner)
    raise CheckpointError(f"checkpoint {name}: malformed tree at {where}: {str(node)[:80]}")


def loads_checkpoint(data: bytes, *, kind: str | None = None, name: str = "<bytes>") -> dict[str, Any]:
    """The state held by checkpoint bytes ``data``; ``name`` is the file named in errors."""
    view = memoryview(data)
    prefix = len(MAGIC) + _HEADER_LEN.size
    if len(view) < prefix:
        raise CheckpointError(f"checkpoint {name}: truncated ({len(view)} bytes, shorter than the {prefix}-byte prefix)")
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise CheckpointError(f"checkpoint {name}: not an intune checkpoint (magic {bytes(view[:len(MAGIC)])!r}, expected {MAGIC!r})")
    (header_len,) = _HEADER_LEN.unpack_from(view, len(MAGIC))
    if prefix + header_len > len(view):
        raise CheckpointError(f"checkpoint {name}: truncated (header of {header_len} bytes, file of {len(view)})")
    raw = bytes(view[prefix : prefix + header_len])
    depth = json_depth(raw)
    if depth > MAX_HEADER_DEPTH:
        raise CheckpointError(
            f"checkpoint {name}: the header nests {depth} levels deep, more than the {MAX_HEADER_DEPTH} a state may"
        )
    try:
        header = json.loads(raw)
        version = header["format"]
        stored_kind = header["kind"]
        payload_bytes = int(header["payload_bytes"])
        digest = header["sha256"]
        body = header["body"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {name}: corrupted header ({exc})") from None
    if not isinstance(body, dict):
        raise CheckpointError(f"checkpoint {name}: corrupted header (body is a {type(body).__name__}, not an object)")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise CheckpointError(
            f"checkpoint {name}: format version {version!r}, this intune ({_intune_version()}) reads up to "
            f"{FORMAT_VERSION}; it was written by intune {header.get('intune_version')!r}"
        )
    payload = view[prefix + header_len :]
    if len(payload) != payload_bytes:
        raise CheckpointError(f"checkpoint {name}: truncated or extended payload ({len(payload)} bytes, header says {payload_bytes})")
    try:
        body_json = _canonical(body)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {name}: corrupted header ({exc})") from None
    if _digest(str(stored_kind), body_json, payload) != digest:
        raise CheckpointError(f"checkpoint {name}: checksum mismatch, the file is corrupted")
    if kind is not None and stored_kind != kind:
        raise CheckpointError(f"checkpoint {name}: holds a {stored_kind!r} state, expected {kind!r}")
    arrays = []
    specs = body.get("arrays", [])
    if not isinstance(specs, list):
        raise CheckpointError(f"checkpoint {name}: corrupted header (arrays is {type(specs).__name__}, not a list)")
    for i, spec in enumerate(specs):
        dtype, shape, offset, nbytes = _array_spec(spec, i, payload_bytes, name)
        arrays.append(np.frombuffer(payload, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape).copy())
    state = _decode(body.get("tree"), arrays, "state", name)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {name}: the stored state is not a dict")
    return state


def _array_spec(spec: Any, i: int, payload_bytes: int, name: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """Array ``i``'s ``(dtype, shape, offset, nbytes)``, each field checked (a non-negative integer, a
    numeric dtype, the bytes inside the payload) before anything is allocated; the error names the field."""

    def bad(field: str, why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {name}: array {i}'s {field} {why}")

    if not isinstance(spec, dict):
        raise bad("descriptor", f"is a {type(spec).__name__}, not an object")
    for field in ("dtype", "shape", "offset", "nbytes"):
        if field not in spec:
            raise bad(field, "is missing")
    try:
        dtype = np.dtype(spec["dtype"]) if isinstance(spec["dtype"], str) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in _ARRAY_KINDS:
        raise bad("dtype", f"{spec['dtype']!r} is not a numeric or bool dtype")
    shape = spec["shape"]
    if not isinstance(shape, list) or not all(_count(n) for n in shape) or len(shape) > 32:
        raise bad("shape", f"{str(shape)[:80]} is not a list of at most 32 non-negative integers")
    offset, nbytes = spec["offset"], spec["nbytes"]
    if not _count(offset) or offset % _ALIGN:
        raise bad("offset", f"{offset!r} is not a non-negative multiple of {_ALIGN}")
    if not _count(nbytes) or offset + nbytes > payload_bytes:
        raise bad("nbytes", f"{nbytes!r} does not fit the {payload_bytes}-byte payload at offset {offset}")
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise bad("shape", f"{shape} of {dtype} is not {nbytes} bytes")
    return dtype, tuple(shape), offset, nbytes


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_depth(raw: bytes) -> int:
    """How deep the objects and arrays of JSON text ``raw`` nest, without parsing it (strings, which may
    hold brackets, are left out first); malformed text gives some number, and the parser refuses it."""
    skeleton = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = (np.isin(skeleton, (ord("{"), ord("["))).astype(np.int64)
             - np.isin(skeleton, (ord("}"), ord("]"))).astype(np.int64))  # fmt: skip
    return int(np.cumsum(steps).max()) if len(steps) else 0


def load_checkpoint(path: str | os.PathLike[str], *, kind: str | None = None) -> dict[str, Any]:
    """The state stored at ``path``. With ``kind``, a file of another kind raises ``CheckpointError``.

    Arrays come back as writable numpy arrays of the saved dtype and shape, tuples as lists, numpy
    scalars as Python numbers. A missing file raises ``FileNotFoundError``.
    """
    path = Path(path)
    return loads_checkpoint(path.read_bytes(), kind=kind, name=str(path))


def checkpoint_kind(path: str | os.PathLike[str]) -> str:
    """The kind recorded in a checkpoint file, after the same checks as ``load_checkpoint``."""
    path = Path(path)
    data = path.read_bytes()
    loads_checkpoint(data, name=str(path))
    (header_len,) = _HEADER_LEN.unpack_from(data, len(MAGIC))
    return json.loads(data[len(MAGIC) + _HEADER_LEN.size : len(MAGIC) + _HEADER_LEN.size + header_len])["kind"]
