"""A remote worker on Ray: the actor class shipped to the nodes and the handle that drives one.

Owns what runs on a Ray node (``IntuneMapWorker``: the stage's function applied to chunks) and the
handle on one such actor (``RayActor``), used by the trainer's own Ray connection (``remote_ray``) and
by the Ray host process (``ray_host``) alike. It must not connect to a cluster or size pools.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from intune.pipeline.chunks import Chunk
from intune.pipeline.remote_pool import RemoteInitError, RemoteLost


def _make_actor_class() -> type:
    """The remote worker's class, defined in a function so that Ray ships it by value: a node needs
    intune importable only for what the stage's function itself uses (paths sent at start help there,
    as for local process workers)."""

    class IntuneMapWorker:
        def __init__(self, fn_blob: bytes, sys_path: list[str]) -> None:
            import os
            import socket
            import sys
            import traceback

            for path in sys_path:
                if path not in sys.path and os.path.isdir(path):
                    sys.path.append(path)
            self._where = f"{socket.gethostname()} pid {os.getpid()}"
            try:
                import ray

                self._where += f", node {ray.get_runtime_context().get_node_id()[:12]}"
            except Exception:  # noqa: BLE001 - the node id is for messages only
                pass
            self._fn: Any = None
            self._error: tuple[str, str] | None = None
            try:
                import cloudpickle

                self._fn = cloudpickle.loads(fn_blob)
            except BaseException as exc:  # noqa: BLE001 - reported by ready()
                self._error = (f"{type(exc).__name__}: {exc}", traceback.format_exc())

        def ready(self) -> tuple:
            if self._error is not None:
                return ("init-error", *self._error)
            return ("ready", self._where)

        def apply(self, chunk: dict) -> tuple:
            import time
            import traceback

            import numpy as np

            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                # the store's arrays are read-only; a local process worker's are writable views
                views = {
                    k: (v.copy() if isinstance(v, np.ndarray) and not v.flags.writeable else v)
                    for k, v in chunk.items()
                }
                result = self._fn(views)
                if not isinstance(result, dict):
                    raise TypeError(f"the map function must return a dict of arrays, got {type(result).__name__}")
                return ("ok", result, time.thread_time() - c0, time.perf_counter() - t0)
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the pipeline
                text = traceback.format_exc()
                return ("error", f"{type(exc).__name__}: {exc}", text, time.thread_time() - c0, time.perf_counter() - t0)

    return IntuneMapWorker


_actor_class: Any = None
_actor_class_lock = threading.Lock()


def actor_class(ray: Any) -> Any:
    """The Ray actor class of remote workers (made once per process)."""
    global _actor_class
    with _actor_class_lock:
        if _actor_class is None:
            _actor_class = ray.remote(_make_actor_class())
        return _actor_class


def lost_words(exc: BaseException) -> str:
    """A one-line cause for a lost actor (Ray's messages run over many lines)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _copy_out(value: Any) -> Any:
    """An array read from the object store as a private copy (the store's copy can then be freed)."""
    import numpy as np

    if isinstance(value, np.ndarray) and not value.flags.writeable:
        return value.copy()
    return value


class RayActor:
    """One remote worker: a Ray actor holding one CPU (see ``remote_pool.RemoteWorker``)."""

    def __init__(self, ray: Any, fn_blob: bytes, sys_path: list[str] | None = None, copy_out: bool = True) -> None:
        """``sys_path``: the import paths to send (this process's by default); ``copy_out=False``: results
        as read from the store (read-only views; the host copies them into shared memory itself)."""
        self._ray = ray
        self._copy_out = copy_out
        if sys_path is None:
            sys_path = [os.path.abspath(p or os.curdir) for p in sys.path]  # "" is the working directory
        cls = actor_class(ray)
        self.handle = cls.options(
            num_cpus=1, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD"
        ).remote(fn_blob, sys_path)
        self._ready_ref: Any = self.handle.ready.remote()
        self.is_ready = False
        self.where = "a Ray actor (starting)"

    def ready(self, timeout: float) -> bool:
        if self.is_ready:
            return True
        ray = self._ray
        try:
            done, _ = ray.wait([self._ready_ref], timeout=timeout)
            if not done:
                return False
            reply = ray.get(self._ready_ref, timeout=10)
        except Exception as exc:
            raise RemoteLost(lost_words(exc)) from exc
        if reply[0] == "init-error":
            raise RemoteInitError(reply[1], reply[2])
        self.where, self.is_ready, self._ready_ref = reply[1], True, None
        return True

    def submit(self, chunk: Chunk) -> Any:
        try:
            ref = self._ray.put(chunk)
            return self.handle.apply.remote(ref)  # Ray keeps ``ref`` alive until the call is done
        except Exception as exc:
            raise RemoteLost(lost_words(exc)) from exc

    def done(self, ticket: Any, timeout: float) -> bool:
        try:
            ready, _ = self._ray.wait([ticket], timeout=timeout)
        except Exception:  # noqa: BLE001 - result() says what happened
            return True
        return bool(ready)

    def result(self, ticket: Any) -> tuple:
        ray = self._ray
        try:
            reply = ray.get(ticket, timeout=10)
        except ray.exceptions.RayTaskError as exc:  # the call itself failed: its output did not serialise
            return ("error", lost_words(exc), str(exc), 0.0, 0.0)
        except Exception as exc:
            raise RemoteLost(lost_words(exc)) from exc
        if reply[0] == "ok" and self._copy_out:
            return ("ok", {k: _copy_out(v) for k, v in reply[1].items()}, reply[2], reply[3])
        return reply

    def kill(self) -> None:
        try:
            self._ray.kill(self.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or Ray shut down
            pass


__all__ = ["RayActor", "actor_class", "lost_words"]
