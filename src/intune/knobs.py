"""Knob: a named integer setting of a pipeline, with bounds and a unit, applied live.

Owns the one definition of a knob that every policy sees, whatever engine is underneath (the native
engine, the simulator, an adapter). It must not know about stages, policies or machines: the engine
that creates a knob passes in how to read and apply the value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

Unit = Literal["cpu", "mb"]
UNITS: tuple[str, ...] = ("cpu", "mb")
REMOTE_SETTING = "remote_workers"
"""The setting of a knob whose workers run on a remote cluster (``<stage>.remote_workers``)."""


class Knob:
    """One tunable integer: ``<stage>.workers`` (unit ``cpu``), ``<stage>.remote_workers`` (unit ``cpu``:
    workers on a remote cluster, bounded by the cluster's CPUs rather than this machine's, see
    ``remote``) or ``<stage>.buffer_mb`` (unit ``mb``).

    ``set`` validates against the bounds and applies through the engine's setter, from any thread.
    """

    __slots__ = ("name", "unit", "min", "max", "_get", "_set")

    def __init__(
        self,
        name: str,
        unit: Unit,
        min: int,
        max: int,
        get: Callable[[], int],
        set: Callable[[int], None],
    ) -> None:
        if unit not in UNITS:
            raise ValueError(f"knob {name!r}: unit must be one of {UNITS}, got {unit!r}")
        if "." not in name:
            raise ValueError(f"knob name {name!r} must look like '<stage>.<setting>'")
        if not (isinstance(min, int) and isinstance(max, int)) or min > max:
            raise ValueError(f"knob {name!r}: bounds must be integers with min <= max, got [{min}, {max}]")
        self.name = name
        self.unit: Unit = unit
        self.min = min
        self.max = max
        self._get = get
        self._set = set

    @property
    def stage(self) -> str:
        """The stage this knob belongs to (the part of the name before the last dot)."""
        return self.name.rsplit(".", 1)[0]

    @property
    def setting(self) -> str:
        """What the knob sets: ``workers``, ``remote_workers`` or ``buffer_mb``."""
        return self.name.rsplit(".", 1)[1]

    @property
    def remote(self) -> bool:
        """Whether the knob's CPUs are a remote cluster's (``<stage>.remote_workers``): they count
        against ``Observation.remote_cpus``, never against this machine's CPUs."""
        return self.setting == REMOTE_SETTING

    @property
    def value(self) -> int:
        return int(self._get())

    def set(self, value: int) -> None:
        """Apply ``value`` live; raise ``ValueError`` naming the valid range if it is out of bounds."""
        if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
            raise ValueError(f"knob {self.name!r}: value must be an integer, got {value!r}")
        value = int(value)
        if not self.min <= value <= self.max:
            raise ValueError(
                f"knob {self.name!r}: value {value} out of bounds, valid range is [{self.min}, {self.max}]"
            )
        self._set(value)

    def clamp(self, value: float) -> int:
        """The nearest in-bounds integer to ``value``."""
        return int(min(self.max, max(self.min, round(value))))

    def __repr__(self) -> str:
        return f"Knob({self.name!r}, value={self.value}, range=[{self.min}, {self.max}], unit={self.unit!r})"
