"""How a loader worker process starts: torch's ``multiprocessing_context``, checked and honoured.

Owns the start method's rules: ``multiprocessing_context`` is ``None`` (the start method Python's
``multiprocessing`` would use at that moment, so a global ``set_start_method`` is honoured as torch
honours it), a method's name, or a ``multiprocessing`` context; with torch's checks and words (a
context needs workers; an unknown name is a ``ValueError``, anything else a ``TypeError``). Also the
two ways a worker starts: ``"fork"`` is the engine's forked child (``intune.pipeline.forked``: the
dataset is inherited, nothing pickled), while ``"spawn"`` and ``"forkserver"`` start through that
context's own ``Process``, which pickles what the worker needs (dataset, ``collate_fn``,
``worker_init_fn``) as the context does for torch's workers: a worker started by a fork server is
forked from that server, not from this process, and something that cannot be pickled fails the start
with torch's warning. It must not know what the worker computes.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import socket
import subprocess
import warnings
from typing import Any

from intune.dataloader.errors import DatasetPickleError

PICKLE_WARNING = (
    "Got pickle error when attempting to start a worker Process. This might be because the worker "
    "Process arguments are not picklable: workers started with 'spawn' or 'forkserver' receive the "
    "dataset, collate_fn and worker_init_fn pickled. You can also try multiprocessing_context='fork'."
)
"""The warning a failed start gives before its error (torch's first words, so filters on them match)."""


def check_context(context: Any, workers: int) -> Any:
    """``multiprocessing_context`` checked as torch checks it: only with workers; a start method's
    name this platform has (``ValueError`` otherwise) or a ``multiprocessing`` context (``TypeError``
    for anything else). Returns the context (a name turned into its context), or None."""
    if context is None:
        return None
    if workers == 0:
        raise ValueError(
            "intune.DataLoader: multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={workers}"
        )
    if isinstance(context, str):
        methods = multiprocessing.get_all_start_methods()
        if context not in methods:
            raise ValueError(
                f"intune.DataLoader: multiprocessing_context option should specify a valid start method in "
                f"{methods!r}, but got multiprocessing_context={context!r}"
            )
        return multiprocessing.get_context(context)
    if not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            "intune.DataLoader: multiprocessing_context option should be a valid context object or a "
            f"string specifying the start method, but got multiprocessing_context={context!r}"
        )
    return context


def resolve(context: Any) -> tuple[str, Any]:
    """The start method now and the context that starts it: the given context, else Python's default
    (``set_start_method`` if it was called, else the platform's first method), read when workers
    start as torch reads it."""
    if context is None:
        method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
        context = multiprocessing.get_context(method)
    return context.get_start_method(), context


class ContextLaunch:
    """A ``procworker.Launch`` through a ``multiprocessing`` context: the child is that context's
    ``Process`` (spawned, or forked by the context's fork server), given the socket and ``payload``
    (the worker's fetcher and ``worker_init_fn``, put where the worker looks it up under ``key``)."""

    def __init__(self, context: Any, key: int, payload: Any) -> None:
        self.context = context
        self.key = key
        self.payload = payload

    def __call__(self, parent: socket.socket, child: socket.socket) -> ContextChild:
        process = self.context.Process(target=_context_child, args=(child, self.key, self.payload), daemon=True)
        try:
            process.start()
        except Exception as exc:
            if not _pickle_error(exc):
                raise
            warnings.warn(PICKLE_WARNING, UserWarning, stacklevel=2)
            raise DatasetPickleError(
                f"intune.DataLoader: {unpicklable_part(self.payload)} cannot be pickled for a worker started "
                f"with {self.context.get_start_method()!r} ({type(exc).__name__}: {exc}); define it at module "
                "level, make it picklable, or use multiprocessing_context='fork'"
            ) from exc
        return ContextChild(process)


def unstartable(context: Any, dataset: Any, collate_fn: Any, worker_init_fn: Any) -> str | None:
    """Why workers started now by ``context`` (None: Python's default) could not get what they need,
    in words, or None: a forked worker inherits everything; another must receive it pickled (checked
    with plain pickle: a lock shared through the start itself may be refused here and pass there)."""
    import pickle

    method, _ = resolve(context)
    if method == "fork":
        return None
    try:
        pickle.dumps((dataset, collate_fn, worker_init_fn))
    except Exception as exc:  # noqa: BLE001 - any failure to pickle is the answer
        return f"{method!r} workers get the dataset, collate_fn and worker_init_fn pickled ({type(exc).__name__}: {exc})"
    return None


def _pickle_error(exc: BaseException) -> bool:
    import pickle

    return isinstance(exc, (pickle.PicklingError, TypeError, AttributeError))


def unpicklable_part(payload: Any) -> str:
    """Which part of ``(fetcher, worker_init_fn)`` fails to pickle on its own, in words (a guess when
    each pickles alone: then it is their combination)."""
    import pickle

    fetcher, init = payload
    parts = [
        (f"worker_init_fn {init!r}", init),
        (f"collate_fn {getattr(fetcher, 'collate_fn', None)!r}", getattr(fetcher, "collate_fn", None)),
        (f"the dataset {getattr(fetcher, 'dataset_name', '')}", getattr(fetcher, "dataset", None)),
    ]
    for what, part in parts:
        try:
            pickle.dumps(part)
        except Exception:  # noqa: BLE001 - this is the part named
            return what
    return "the dataset, collate_fn or worker_init_fn"


def _context_child(child: socket.socket, key: int, payload: Any) -> None:
    """The child's entry: the payload where ``WorkerFetcher`` finds it, then the engine's worker loop."""
    from intune.dataloader.fetch import INHERITED
    from intune.pipeline.procworker import child_main

    INHERITED[key] = payload
    child_main(child.detach())


class ContextChild:
    """A context's ``Process`` with what ``ProcessWorker`` uses of ``subprocess.Popen``."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.pid = process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        code = self.process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
