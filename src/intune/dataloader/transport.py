"""How a collated batch crosses from a worker process to the loader: arrays apart, the rest as a spec.

Owns turning any collated structure (tensors and arrays in dicts, lists, tuples, named tuples, with
strings, numbers or other objects beside them) into flat numpy arrays plus a small pickled ``spec``,
and back. The arrays go through the engine's shared-memory transport (no pickling of tensor data);
the spec holds the structure, the torch dtype of each tensor and every non-array value, and is pickled
into one ``uint8`` column. A tensor numpy cannot view (bfloat16, float8, sparse, quantized, one that
requires grad) and any container other than ``dict`` / ``OrderedDict`` / ``list`` / ``tuple`` /
named tuple travels pickled whole inside the spec: correct, only slower.

Classes come back as themselves. One that pickle finds by its module and name (most) travels by that
name. One it cannot find travels as a reference: the attribute path under its module where the
worker finds it (a named tuple kept as a class attribute, ``Dataset.Batch``), and, from a worker
forked from the loader (``FORKED_FROM``), its address, which is where the loader has the class the
worker inherited (one defined in a function too); either is checked against the class's module and
name, so the batch holds the loader's own class and ``isinstance`` holds. A class the loader does
not have (made in the worker after it started) is rebuilt from its definition, which travels once
per worker (cloudpickle): a look-alike, the best there is. It must not know about datasets,
samplers or workers.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

SPEC = "__spec__"
"""The column that holds the pickled spec; the arrays are columns ``"0"``, ``"1"``, ..."""

# spec nodes: ("t", leaf, torch dtype name, view dtype name or ""), ("a", leaf), ("d", kind, keys, nodes),
# ("l", nodes), ("u", nodes), ("n", type, nodes), ("o", value)
_VIEW_AS = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "complex32": "int32"}


def encode(batch: Any) -> dict[str, np.ndarray]:
    """``batch`` as columns: its arrays (a tensor as a numpy view of its memory) and the spec."""
    leaves: list[np.ndarray] = []
    spec = _flatten(batch, leaves)
    out = {str(i): leaf for i, leaf in enumerate(leaves)}
    out[SPEC] = np.frombuffer(_dumps(spec), dtype=np.uint8)
    return out


FORKED_FROM: int | None = None
"""In a worker forked from the loader: the loader's pid (set at the worker's start), whose memory
holds every class the worker inherited at the same address."""

_SENT: set[int] = set()  # classes whose definition this worker has sent (by address)
_CLASSES: dict[tuple, type] = {}  # the loader's side: classes found or rebuilt, by where they came from


def _dumps(spec: tuple) -> bytes:
    """Plain pickle (C speed; classes by name), else a pickler that sends the classes pickle cannot
    name as references (see the module doc)."""
    try:
        return pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        buffer = io.BytesIO()
        _class_pickler()(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(spec)
        return buffer.getvalue()


_PICKLER: type | None = None


def _class_pickler() -> type:
    """cloudpickle's pickler, with a class that cannot be imported by its name sent as a reference to
    ``_class`` (made once: cloudpickle is imported only when a batch needs it)."""
    global _PICKLER
    if _PICKLER is None:
        import cloudpickle

        class ClassPickler(cloudpickle.Pickler):
            def reducer_override(self, obj: Any) -> Any:
                if isinstance(obj, type) and not _importable(obj):
                    address = id(obj)
                    definition = None
                    if address not in _SENT:
                        definition = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
                        _SENT.add(address)
                    where = (FORKED_FROM, os.getpid(), address, _path_of(obj))
                    return _class, (*where, obj.__module__, obj.__qualname__, definition)
                return super().reducer_override(obj)

        _PICKLER = ClassPickler
    return _PICKLER


def _importable(kind: type) -> bool:
    """Whether pickle finds ``kind`` again by its module and qualified name."""
    target: Any = sys.modules.get(kind.__module__)
    for part in kind.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is kind


_PATHS: dict[int, str | None] = {}  # the worker's side: each class's attribute path under its module


def _path_of(kind: type) -> str | None:
    """Where ``kind`` is found under its module: attribute names joined by dots (classes searched three
    levels deep), or None (a class defined in a function)."""
    if id(kind) not in _PATHS:
        _PATHS[id(kind)] = _search(sys.modules.get(kind.__module__), lambda obj: obj is kind)
    return _PATHS[id(kind)]


def _search(module: Any, match: Any) -> str | None:
    """The dotted attribute path of the first class under ``module`` that ``match`` accepts."""
    frontier: list[tuple[str, Any]] = [("", module)]
    seen: set[int] = set()
    for _depth in range(3):
        nested = []
        for prefix, space in frontier:
            for key, value in list(getattr(space, "__dict__", {}).items()):
                if isinstance(value, type) and id(value) not in seen:
                    path = f"{prefix}{key}"
                    if match(value):
                        return path
                    seen.add(id(value))
                    nested.append((f"{path}.", value))
        frontier = nested
    return None


def _class(
    forked_from: int | None,
    worker: int,
    address: int,
    path: str | None,
    module: str,
    name: str,
    definition: bytes | None,
) -> type:
    """The loader's class for a worker's class reference: found by its attribute path, or by address
    (only in the loader the worker was forked from), else rebuilt once per worker from its definition."""
    inherited = (address, path, module, name)
    found = _CLASSES.get(inherited)
    if found is not None:
        return found
    if path is not None:
        target: Any = sys.modules.get(module)
        for part in path.split("."):
            target = getattr(target, part, None)
        if isinstance(target, type) and target.__qualname__ == name and target.__module__ == module:
            _CLASSES[inherited] = target
            return target
    if forked_from == os.getpid():
        found = _find_class(address, module, name)
        if found is not None:
            _CLASSES[inherited] = found
            return found
    rebuilt = (worker, address, module, name)
    if rebuilt not in _CLASSES:
        if definition is None:
            raise pickle.UnpicklingError(f"class {module}.{name} from worker pid {worker} came without its definition")
        import cloudpickle

        _CLASSES[rebuilt] = cloudpickle.loads(definition)
    return _CLASSES[rebuilt]


def _find_class(address: int, module: str, name: str) -> type | None:
    """The class at ``address`` in this process, if it is one named ``module.name``, among every object
    the collector tracks (once per class: the answer is kept)."""

    def match(obj: Any) -> bool:
        return id(obj) == address and isinstance(obj, type) and obj.__qualname__ == name and obj.__module__ == module

    return next((obj for obj in gc.get_objects() if match(obj)), None)


def decode(columns: Mapping[str, np.ndarray], pin: bool = False) -> Any:
    """The batch ``encode`` laid out: tensors share the arrays' memory (pinned when ``pin``)."""
    spec = pickle.loads(np.asarray(columns[SPEC]).tobytes())
    return _build(spec, columns, pin)


def nbytes(batch: Any) -> int:
    """Bytes of the tensors and arrays in ``batch`` (for the prefetch buffer's byte bound)."""
    if isinstance(batch, np.ndarray):
        return batch.nbytes
    if isinstance(batch, Mapping):
        return sum(nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(nbytes(v) for v in batch)
    size = getattr(batch, "nbytes", None)  # a tensor
    return size if isinstance(size, int) else 0


def _flatten(value: Any, leaves: list[np.ndarray]) -> tuple:
    import torch

    if isinstance(value, torch.Tensor):
        return _tensor(value, leaves)
    if type(value) is np.ndarray:
        leaves.append(value)
        return ("a", len(leaves) - 1)
    kind = type(value)
    if kind is dict or kind is OrderedDict:
        keys = list(value.keys())
        return ("d", kind is OrderedDict, keys, [_flatten(value[k], leaves) for k in keys])
    if kind is list:
        return ("l", [_flatten(v, leaves) for v in value])
    if kind is tuple:
        return ("u", [_flatten(v, leaves) for v in value])
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return ("n", kind, [_flatten(v, leaves) for v in value])
    return ("o", value)


def _tensor(value: Any, leaves: list[np.ndarray]) -> tuple:
    """A dense CPU tensor as a numpy view (a dtype numpy lacks is viewed as ints of its width)."""
    dtype = str(value.dtype).removeprefix("torch.")
    if (
        value.layout is not _strided()
        or value.requires_grad
        or value.is_quantized
        or value.device.type != "cpu"
    ):
        return ("o", value)
    view = _VIEW_AS.get(dtype, "")
    try:
        array = (value.view(getattr(_torch(), view)) if view else value).numpy()
    except (TypeError, RuntimeError):  # a dtype with neither a numpy type nor a view: pickled
        return ("o", value)
    leaves.append(array)
    return ("t", len(leaves) - 1, dtype, view)


def _build(node: tuple, columns: Mapping[str, np.ndarray], pin: bool) -> Any:
    tag = node[0]
    if tag == "t":
        torch = _torch()
        tensor = torch.from_numpy(np.asarray(columns[str(node[1])]))
        if node[3]:
            tensor = tensor.view(getattr(torch, node[2]))
        return tensor.pin_memory() if pin else tensor
    if tag == "a":
        return columns[str(node[1])]
    if tag == "d":
        pairs = [(k, _build(n, columns, pin)) for k, n in zip(node[2], node[3], strict=True)]
        return OrderedDict(pairs) if node[1] else dict(pairs)
    if tag == "l":
        return [_build(n, columns, pin) for n in node[1]]
    if tag == "u":
        return tuple(_build(n, columns, pin) for n in node[1])
    if tag == "n":
        return node[1](*(_build(n, columns, pin) for n in node[2]))
    value = node[1]
    if pin and _torch_loaded() and isinstance(value, _torch().Tensor):
        return value.pin_memory()
    return value


def _torch() -> Any:
    import torch

    return torch


def _torch_loaded() -> bool:
    import sys

    return "torch" in sys.modules


def _strided() -> Any:
    return _torch().strided
