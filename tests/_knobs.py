"""Test helper: knobs backed by a plain dict, for policies tested without an engine."""

from intune.knobs import Knob


def dict_knobs(spec):
    """``{name: (unit, min, max, value)}`` -> ``(knobs, store)``; setting a knob writes ``store``."""
    store = {name: v for name, (_, _, _, v) in spec.items()}
    knobs = {
        name: Knob(
            name, unit, lo, hi, get=lambda n=name: store[n], set=lambda x, n=name: store.__setitem__(n, x)
        )
        for name, (unit, lo, hi, _) in spec.items()
    }
    return knobs, store


def kind_of(stage: str) -> str:
    """The stage kind a test pipeline's stage name stands for: ``shuffle``/``prefetch``/``batch``/``read``
    by prefix, else ``map`` (what ``StageObservation.kind`` carries from the engine or the simulator)."""
    for kind in ("shuffle", "prefetch", "batch", "read"):
        if stage.startswith(kind):
            return kind
    return "map"
