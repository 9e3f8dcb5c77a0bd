"""How a collated batch crosses from a worker process to the loader: arrays apart, the rest as a spec.

Owns turning any collated structure (tensors and arrays in dicts, lists, tuples, named tuples, with
strings, numbers or other objects beside them) into flat numpy arrays plus a small pickled ``spec``,
and back. The arrays go through the engine's shared-memory transport (no pickling of tensor data);
the spec holds the structure, the torch dtype of each tensor and every non-array value, and is pickled
into one ``uint8`` column. A tensor numpy cannot view (bfloat16, float8, sparse, quantized, one that
requires grad) and any container other than ``dict`` / ``OrderedDict`` / ``list`` / ``tuple`` /
named tuple travels pickled whole inside the spec: correct, only slower. It must not know about
datasets, samplers or workers.
"""

from __future__ import annotations

import pickle
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


def _dumps(spec: tuple) -> bytes:
    """Plain pickle, else cloudpickle (a class the worker rebuilt from the loader's ``__main__``:
    cloudpickle hands back the loader's own class for it)."""
    try:
        return pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle

        return cloudpickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)


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
