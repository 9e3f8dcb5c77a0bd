"""What a DataLoader checkpoint holds about an epoch, and the checks that keep a resume honest.

Owns the pieces of ``intune.DataLoader.state_dict()`` that are not the loader's plumbing:

- ``Delivered``: which batches of the epoch reached the training loop (a prefix count, plus the
  numbers past it when ``in_order=False`` let batches overtake) and a digest of their dataset indices.
  A batch still in a worker or in the prefetch buffer at checkpoint time is *not* delivered: after the
  resume it is fetched again, so every row of the epoch reaches the loop once.
- ``batch_digest``: a 64-bit hash of one batch's number and indices. The digests of the delivered
  batches are combined with XOR (order-free, so overtaking batches give the same digest); on resume the
  sampler's order is regenerated and the batches skipped must give the same digest, or the resume
  raises. That is the guard against a sampler with hidden randomness, a changed dataset, or another
  generator: the order is checked, not assumed.
- ``fingerprint`` / ``check_fingerprint``: the loader's configuration that must match (dataset type
  and length, batch size, drop_last, sampler, rank and world size, seed, ...); a mismatch raises
  ``ResumeMismatchError`` naming every field that differs.
- ``generator_state`` / ``replaying``: the random generator's state at the epoch's start, and a context
  that replays the epoch's draws from it (the loader's own ``generator`` is set to it, as the
  uninterrupted run's was; torch's global generator is only borrowed, then given back, since the
  training loop owns its state).
- ``encode_bytes`` / ``decode_bytes`` and ``json_safe`` / ``from_json_safe``: a state is JSON (as
  torchdata's is): a generator's state travels as base64 text, and numpy arrays inside the tuner's state
  as tagged base64 records, restored on load.

It must not fetch samples, run samplers or hold the loader's epochs (``loader`` and ``sampling`` do).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from intune.checkpoint import ResumeError

STATE_FORMAT = 2
"""The layout version of ``DataLoader.state_dict()``; a state of another version is refused."""

ResumeMismatchError = ResumeError
"""A state that cannot resume this loader: another configuration, or an epoch whose order cannot be
regenerated (the message names what differs). The name the DataLoader has always raised; the class is
intune's one resume error, ``intune.checkpoint.ResumeError``."""


class FetchModeMismatchError(ResumeMismatchError, AssertionError):
    """A state taken with ``num_workers=0`` resumed with worker processes, or the reverse: the two hold
    different things (in-process, the dataset's own ``state_dict()`` and draws from this process's
    generators; with workers, per-batch seeds). Raised by ``iter(loader)``, where torchdata's
    ``StatefulDataLoader`` raises ``AssertionError`` for it, so it is one too."""


def batch_digest(number: int, keys: np.ndarray) -> int:
    """A 64-bit hash of batch ``number`` and its dataset indices (integers as their bytes, other keys
    by ``repr``)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(int(number).to_bytes(8, "little", signed=True))
    if keys.dtype == object:
        h.update(repr(keys.tolist()).encode())
    else:
        h.update(np.ascontiguousarray(keys, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


class Delivered:
    """The batches of one epoch delivered to the training loop, and the XOR of their digests.

    Kept as the count of the prefix ``0..prefix-1`` all delivered plus the numbers delivered past it
    (empty with ``in_order=True``, a few with ``in_order=False``), so the state stays small."""

    def __init__(self, prefix: int = 0, beyond: set[int] | None = None, digest: int = 0) -> None:
        self.prefix = prefix
        self.beyond = set(beyond or ())
        self.digest = digest

    def add(self, number: int, digest: int | None) -> None:
        """Record batch ``number`` (``digest``: its ``batch_digest``, None for an iterable's batch)."""
        if number < self.prefix or number in self.beyond:
            raise RuntimeError(f"intune.DataLoader: batch #{number} delivered twice in one epoch")
        self.beyond.add(number)
        while self.prefix in self.beyond:
            self.beyond.discard(self.prefix)
            self.prefix += 1
        if digest is not None:
            self.digest ^= digest

    def __contains__(self, number: int) -> bool:
        return number < self.prefix or number in self.beyond

    @property
    def count(self) -> int:
        return self.prefix + len(self.beyond)

    @property
    def frontier(self) -> int:
        """One past the highest delivered number: the batches a resume must regenerate to skip them."""
        return max(self.beyond) + 1 if self.beyond else self.prefix

    def state(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "beyond": sorted(self.beyond), "digest": f"{self.digest:016x}"}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Delivered:
        try:
            return cls(int(state["prefix"]), {int(n) for n in state["beyond"]}, int(str(state["digest"]), 16))
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeMismatchError(f"intune.DataLoader state: 'delivered' is malformed ({exc!r})") from exc


def fingerprint(loader: Any) -> dict[str, Any]:
    """What a loader's state is only valid for: a resume under any other value would deliver other rows."""
    from intune.dataloader.loader import dataset_name

    plan = loader._plan
    sampler = plan.sampler
    try:
        length = len(loader.dataset)
    except TypeError:
        length = None
    shuffle = getattr(sampler, "shuffle", None)
    if shuffle is None:
        from torch.utils.data import RandomSampler

        shuffle = isinstance(sampler, RandomSampler)
    return {
        "dataset": dataset_name(loader.dataset),
        "dataset_len": length,
        "iterable": loader.iterable,
        "batch_size": plan.batch_size,
        "drop_last": plan.drop_last,
        "shuffle": bool(shuffle),
        "sampler": _type_name(sampler),
        "batch_sampler": _type_name(plan.batch_sampler),
        "rank": loader.rank,
        "world_size": loader.world_size,
        "seed": loader.seed,
        "generator": loader.generator is not None,
        "persistent_workers": loader.persistent_workers,
        "in_order": loader.pipeline.deterministic if not loader.iterable else True,
        "tune": None if loader.tuner is None else loader.tuner.policy.name,
    }


def _type_name(obj: Any) -> str | None:
    if obj is None:
        return None
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def check_fingerprint(saved: Mapping[str, Any], current: Mapping[str, Any], what: str) -> None:
    """Raise ``ResumeMismatchError`` naming every field of ``saved`` that differs from ``current``.

    The tuning policy counts only when both loaders are tuned: an untuned one (``tune=None``, or
    ``num_workers=0``, which fetches in this process) neither holds nor needs a tuner's state, and the
    rows do not depend on it."""
    fields = sorted(set(saved) | set(current))
    if saved.get("tune") is None or current.get("tune") is None:
        fields = [f for f in fields if f != "tune"]
    differ = [f for f in fields if saved.get(f, "<absent>") != current.get(f, "<absent>")]
    if differ:
        words = "; ".join(f"{f}: saved {saved.get(f, '<absent>')!r}, now {current.get(f, '<absent>')!r}" for f in differ)
        raise ResumeMismatchError(f"{what}: the state is from another configuration ({words})")


def encode_bytes(array: np.ndarray) -> str:
    """A uint8 array (a generator's state) as base64 text, for a JSON state."""
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.uint8).tobytes()).decode("ascii")


def decode_bytes(text: str, what: str) -> np.ndarray:
    """``encode_bytes``'s text back to a uint8 array; anything else raises naming ``what``."""
    try:
        return np.frombuffer(base64.b64decode(text.encode("ascii"), validate=True), dtype=np.uint8).copy()
    except (AttributeError, TypeError, ValueError, binascii.Error) as exc:
        raise ResumeMismatchError(f"intune.DataLoader state: {what} is not base64 bytes ({exc!r})") from exc


_ARRAY = "__ndarray__"


def json_safe(value: Any) -> Any:
    """``value`` with numpy arrays as ``{"__ndarray__": base64, "dtype", "shape"}`` records, numpy
    scalars as Python numbers and tuples as lists, so ``json.dumps`` takes it; ``from_json_safe``
    restores the arrays. Dict keys must be strings already (JSON would turn others into strings)."""
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("intune.DataLoader state: an object array cannot be stored as JSON")
        data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
        return {_ARRAY: data, "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"intune.DataLoader state: key {key!r} is not a string (JSON would change it)")
            out[key] = json_safe(item)
        return out
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def from_json_safe(value: Any) -> Any:
    """The inverse of ``json_safe``: its array records back to numpy arrays."""
    if isinstance(value, Mapping):
        if _ARRAY in value and set(value) == {_ARRAY, "dtype", "shape"}:
            raw = base64.b64decode(str(value[_ARRAY]).encode("ascii"))
            return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
        return {key: from_json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json_safe(v) for v in value]
    return value


def generator_state(generator: Any) -> np.ndarray:
    """The state of ``generator`` (torch's global CPU generator when None) as a uint8 array."""
    import torch

    state = torch.get_rng_state() if generator is None else generator.get_state()
    return state.numpy().copy()


def set_generator_state(generator: Any, state: np.ndarray) -> None:
    """Set ``generator`` (torch's global CPU generator when None) to ``state``, for good."""
    import torch

    tensor = torch.from_numpy(np.ascontiguousarray(state, dtype=np.uint8).copy())
    if generator is None:
        torch.set_rng_state(tensor)
    else:
        generator.set_state(tensor)


@contextlib.contextmanager
def replaying(generator: Any, state: np.ndarray | None) -> Iterator[None]:
    """Run the block with ``generator`` at ``state`` (the epoch's start), so its draws are the
    uninterrupted epoch's.

    The loader's own ``generator`` keeps the state the replay leaves: that is the state the
    uninterrupted run had after those draws, so the epochs after the resumed one draw alike. Torch's
    global generator belongs to the training loop (which restores its own state on resume): it is set
    for the block only and given back after it."""
    import torch

    if state is None:
        yield
        return
    tensor = torch.from_numpy(np.ascontiguousarray(state, dtype=np.uint8))
    if generator is not None:
        generator.set_state(tensor)
        yield
        return
    saved = torch.get_rng_state()
    torch.set_rng_state(tensor)
    try:
        yield
    finally:
        torch.set_rng_state(saved)


__all__ = [
    "STATE_FORMAT",
    "Delivered",
    "FetchModeMismatchError",
    "ResumeMismatchError",
    "batch_digest",
    "check_fingerprint",
    "decode_bytes",
    "encode_bytes",
    "fingerprint",
    "from_json_safe",
    "generator_state",
    "json_safe",
    "replaying",
    "set_generator_state",
]
