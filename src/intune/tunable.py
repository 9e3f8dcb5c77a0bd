"""What a tuner needs of what it tunes: the ``Tunable`` protocol, and a view that shows only the knobs
that can move.

Owns the contract between ``intune.tuner`` and the things it tunes (``intune.Pipeline``, the pipeline
behind ``intune.DataLoader``): knobs to set, a metrics snapshot per tick, the remote cluster's CPUs, the
rank's shard (for the machine share a tuner budgets), whether it is closed, and close. ``Pipeline``
satisfies it as it is; ``MovableKnobs`` wraps one to hide its fixed knobs. It must not import the
tuner, the DataLoader or any policy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from intune.knobs import Knob

if TYPE_CHECKING:
    from intune.pipeline.metrics import PipelineMetrics
    from intune.pipeline.sharding import Shard


@runtime_checkable
class Tunable(Protocol):
    """A running pipeline as a tuner sees it."""

    @property
    def knobs(self) -> Mapping[str, Knob]:
        """Every knob a policy may set, by name."""
        ...

    @property
    def closed(self) -> bool:
        """True once closed: the tuner stops at its next tick and reports no failure while closing."""
        ...

    @property
    def shard(self) -> Shard | None:
        """This rank's part of the data and of the machine (None: one process owns the machine)."""
        ...

    def metrics(self) -> PipelineMetrics:
        """A cheap snapshot of the stages' counters, taken once per tick."""
        ...

    def remote_cpus(self) -> float:
        """The cluster's CPUs its remote workers may hold now (0.0 without remote workers)."""
        ...

    def close(self) -> None: ...

    def __iter__(self) -> Iterator[Any]:
        """The data, for a loop that iterates the tuner in place of the pipeline."""
        ...


class MovableKnobs:
    """A ``Tunable`` showing only the knobs of ``inner`` whose bounds leave room to move.

    A knob fixed by its bounds (``min == max``, such as the single thread of the DataLoader's sampler
    stage) is not a decision; a policy that saw it would count its stage as one to give CPUs to (an
    even split would halve the fetch workers on 2 CPUs). Without it, that stage reads as an inline one,
    as the batch stage does."""

    def __init__(self, inner: Tunable) -> None:
        self.inner = inner

    @property
    def knobs(self) -> Mapping[str, Knob]:
        return {name: knob for name, knob in self.inner.knobs.items() if knob.min < knob.max}

    @property
    def closed(self) -> bool:
        return self.inner.closed

    @property
    def shard(self) -> Shard | None:
        return self.inner.shard

    def metrics(self) -> PipelineMetrics:
        return self.inner.metrics()

    def remote_cpus(self) -> float:
        return self.inner.remote_cpus()

    def close(self) -> None:
        self.inner.close()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.inner)


__all__ = ["MovableKnobs", "Tunable"]
