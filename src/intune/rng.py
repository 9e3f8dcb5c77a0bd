"""A numpy random generator's state as plain checkpoint values, and back: the one serialiser of intune.

Owns the format every ``state_dict`` uses for a ``numpy.random.Generator`` (the shuffle's anchors and
session releases, the agent's exploration generator): ``{"bit_generator": "PCG64", "state": str, "inc":
str, "has_uint32": int, "uinteger": int}``, the 128-bit integers as decimal strings (exact in any JSON
reader), and its checks on load: a state from a file is bounded field by field before it becomes a
generator, and a bad one raises ``CheckpointError`` naming the field. It must not know whose generator
it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from intune.checkpoint import CheckpointError, brief

_FIELDS = ("bit_generator", "state", "inc", "has_uint32", "uinteger")


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """``rng``'s state (a PCG64 generator, numpy's default) as plain values (``rng_from_state`` takes it back)."""
    state = rng.bit_generator.state
    if state.get("bit_generator") != "PCG64":
        raise ValueError(f"a generator's state is stored for PCG64 only, got {state.get('bit_generator')!r}")
    inner = state["state"]
    return {
        "bit_generator": "PCG64",
        "state": str(int(inner["state"])),
        "inc": str(int(inner["inc"])),
        "has_uint32": int(state["has_uint32"]),
        "uinteger": int(state["uinteger"]),
    }


def rng_from_state(state: Any, where: str = "generator") -> np.random.Generator:
    """The generator ``rng_state`` described, after checking every field (``where`` names the state in
    errors): PCG64, a 128-bit state, an odd 128-bit increment, a flag and a 32-bit integer."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: a generator's state is a dict of {list(_FIELDS)}, got {type(state).__name__}")
    missing = [f for f in _FIELDS if f not in state]
    if missing:
        raise CheckpointError(f"{where}: the generator's state lacks {missing}")
    if state["bit_generator"] != "PCG64":
        raise CheckpointError(f"{where}.bit_generator: {brief(state['bit_generator'])}, expected 'PCG64'")
    value = _bounded(state["state"], f"{where}.state", 1 << 128)
    inc = _bounded(state["inc"], f"{where}.inc", 1 << 128)
    if not inc & 1:
        raise CheckpointError(f"{where}.inc: {inc} is even; a PCG64 increment is odd")
    has = _bounded(state["has_uint32"], f"{where}.has_uint32", 2)
    word = _bounded(state["uinteger"], f"{where}.uinteger", 1 << 32)
    bits = np.random.PCG64()
    bits.state = {"bit_generator": "PCG64", "state": {"state": value, "inc": inc}, "has_uint32": has, "uinteger": word}
    return np.random.Generator(bits)


def _bounded(value: Any, field: str, limit: int) -> int:
    """``value`` (an int, or its decimal string of at most 40 digits) as an int in ``[0, limit)``."""
    if isinstance(value, str) and 0 < len(value) <= 40 and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise CheckpointError(f"{field}: {brief(value)} is not an integer in [0, {limit})")
    return value


__all__ = ["rng_from_state", "rng_state"]
