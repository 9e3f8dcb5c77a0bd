"""The loader's errors as a training loop sees them: a worker's exception raised again, in order.

Owns the wording and the class of what ``next(loader)`` raises for a batch whose ``__getitem__``,
``__getitems__`` or ``collate_fn`` failed in a worker: the original exception's class where it can be
rebuilt with one message (so ``except KeyError`` still catches a ``KeyError``), else
``DataLoaderWorkerError``; the message names the dataset, the index (or indices) and the worker, and
carries the worker's traceback, as torch's DataLoader does. A failed ``worker_init_fn`` likewise
(``init_failure_words`` in the worker, ``init_failure`` in the loader: the class travels by its
importable name, since a worker that could not start sends only text). Also ``DatasetPickleError``: the dataset,
collate function or ``worker_init_fn`` that cannot be sent to worker processes, named; and
``DataLoaderTimeoutError``: no batch within ``timeout``, torch's ``RuntimeError`` and words with the
batch and worker added. It must not decide when a batch failed (``fetch`` does).
"""

from __future__ import annotations

import builtins
import importlib
import pickle
import re
from typing import Any, NoReturn

from intune.pipeline.errors import StageTimeoutError


class DataLoaderWorkerError(RuntimeError):
    """A worker's exception whose own class could not be rebuilt here (the message has its name)."""


class DatasetPickleError(TypeError):
    """Part of the loader (the dataset, ``collate_fn``, ``worker_init_fn``) cannot be pickled for the
    worker processes; ``num_workers=0`` loads in this process, without pickling."""


class DataLoaderTimeoutError(StageTimeoutError):
    """A worker held a batch longer than the loader's ``timeout`` (the worker was killed).

    A ``RuntimeError`` whose message starts as torch's ("DataLoader timed out after N seconds"), built
    from that one message like torch's, so code that rebuilds an exception from its class and text
    (``torch._utils.ExceptionWrapper``, multiprocessing) gets it back; ``stage``, ``origin`` and
    ``timeout_s`` are there when the loader raised it."""

    def __init__(self, message: str, *, origin: str = "", timeout_s: float | None = None) -> None:
        RuntimeError.__init__(self, message)
        self.stage = "fetch"
        self.origin = origin
        self.remote_traceback = ""
        self.timeout_s = timeout_s


def failure_message(record: dict[str, Any]) -> str:
    worker, pid = record.get("worker"), record.get("pid")
    who = f"worker {worker}" + (f" (pid {pid})" if pid is not None else "") if worker is not None else "the loader's own process"
    return (
        f"Caught {record['class_name']} in intune.DataLoader {who} on {record['where']} of dataset "
        f"{record['dataset']}: {record['message']}\n\nOriginal traceback (in the worker):\n"
        + record["traceback"].rstrip()
    )


def raise_failure(record: dict[str, Any] | bytes | Any) -> NoReturn:
    """Raise the worker's exception described by ``record`` (a dict, or its pickle as bytes / array)."""
    if not isinstance(record, dict):
        record = pickle.loads(bytes(memoryview(record)))
    message = failure_message(record)
    error = _rebuild(record.get("class"), message) or DataLoaderWorkerError(message)
    error.where = record["where"]  # type: ignore[attr-defined]
    error.worker_traceback = record["traceback"]  # type: ignore[attr-defined]
    raise error


def _rebuild(blob: bytes | None, message: str) -> BaseException | None:
    """The original class with ``message``, when it unpickles here and takes one message argument."""
    if blob is None:
        return None
    try:
        kind = pickle.loads(blob)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            return None
        error = kind(message)
        if kind is KeyError or str(error) != message:  # KeyError quotes its argument; others reword it
            return _with_message(kind, message)
        return error
    except Exception:  # noqa: BLE001 - not rebuildable: the caller uses DataLoaderWorkerError
        return None


def _with_message(kind: type, message: str) -> BaseException | None:
    """An instance of a subclass of ``kind`` whose ``str`` is ``message`` (a KeyError prints its
    argument's repr, which would put the traceback on one line)."""
    try:
        sub = type(kind.__name__, (kind,), {"__str__": lambda self: message, "__module__": kind.__module__})
        return sub(message)
    except Exception:  # noqa: BLE001
        return None


_INIT = "worker_init_fn raised in intune.DataLoader worker "
_INIT_WORDS = re.compile(re.escape(_INIT) + r"(\d+): ([\w.]+): (.*)", re.DOTALL)


def init_failure_words(worker_id: int, exc: BaseException) -> str:
    """How a worker says its ``worker_init_fn`` raised ``exc``: its id, the class by an importable name
    (a builtin by its bare name) and the message, which ``init_failure`` reads back."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{_INIT}{worker_id}: {name}: {exc}"


def init_failure(text: str, worker_traceback: str, dataset_name: str) -> BaseException | None:
    """The exception to raise for a worker that could not start, from its words (``init_failure_words``,
    as the start failure's message carries them): the original class when it imports here and takes
    one message, else ``DataLoaderWorkerError``; None when ``text`` is not a ``worker_init_fn`` failure."""
    found = _INIT_WORDS.search(text)
    if found is None:
        return None
    worker, name, message = int(found.group(1)), found.group(2), found.group(3)
    record = {
        "class": _class_blob(name),
        "class_name": name.rsplit(".", 1)[-1],
        "message": message,
        "where": "worker_init_fn",
        "dataset": dataset_name,
        "worker": worker,
        "pid": None,
        "traceback": worker_traceback,
    }
    words = failure_message(record)
    error = _rebuild(record["class"], words) or DataLoaderWorkerError(words)
    error.where = "worker_init_fn"  # type: ignore[attr-defined]
    error.worker_traceback = worker_traceback  # type: ignore[attr-defined]
    return error


def _class_blob(name: str) -> bytes | None:
    """``name``'s class pickled (for ``_rebuild``), or None when it cannot be found here."""
    module, _, attr = name.rpartition(".")
    try:
        owner: Any = importlib.import_module(module) if module else builtins
        kind = owner
        for part in attr.split("."):
            kind = getattr(kind, part)
        return pickle.dumps(kind)
    except Exception:  # noqa: BLE001 - a class that does not import here: DataLoaderWorkerError
        return None
