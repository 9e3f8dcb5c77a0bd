"""Ray for a map stage's remote workers: the connection, the actors, the cluster's free CPUs.

Owns everything that touches Ray, which is imported lazily so that intune works without the ``ray``
extra (asking for ``remote="ray"`` without it raises ``ImportError`` naming the extra):

- ``check_address`` / ``require_ray``: the arguments ``map(..., remote="ray")`` is checked with;
- ``connect``: at a remote stage's first epoch. A Ray this process initialised itself is used
  in-process. Otherwise intune's own connection is made once per process, in a helper process (the
  Ray host, ``ray_host``) so that the trainer is never a Ray driver, whose process Ray ends when its
  node's raylet dies: an ``address`` (``"host:port"``) is connected to after a quick check that something
  answers there (Ray itself would retry a dead address for minutes); ``"auto"`` finds a running cluster
  or raises; ``None`` (the default) tries ``"auto"``, else starts a local Ray in the host and says so in
  a log line;
- ``RayActor`` (``ray_actor``): one remote worker, a Ray actor (1 CPU) that loads the stage's pickled function once
  and applies it to chunks that travel through Ray's object store (``ray.put`` / an actor call; the
  result is copied out of the store, so no object outlives its chunk's delivery), driven in-process or
  by the host for a ``ray_host.HostedActor``;
- ``RemoteWorkers``: a stage's actors by index, for the pipeline's life (like parked process
  workers); a retired, hung or lost actor is killed at once, and ``close`` kills them all;
- ``cluster_free_cpus``: the free CPUs Ray reports, read on a background thread at most every
  ``CLUSTER_READ_EVERY_S`` and never waited on for long, so that a dead cluster cannot hang the
  tuner.

It must not know about channels or pools (``remote_pool`` drives the actors).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from intune.pipeline.channel import Stopped
from intune.pipeline.errors import ClusterError
from intune.pipeline.ray_actor import RayActor, lost_words
from intune.pipeline.ray_host import HostedActor, RayHost
from intune.pipeline.remote_pool import RemoteLost

log = logging.getLogger(__name__)

RAY_EXTRA = "pip install intune[ray]"
MAX_REMOTE_WORKERS = 1024
"""Upper bound of every ``<stage>.remote_workers`` knob: generous, since the live bound is the
cluster's CPUs (``Observation.remote_cpus``), which the runner clamps requests to."""
REACH_TIMEOUT_S = 3.0
"""How long ``connect`` waits for a TCP answer from a cluster's address before calling it unreachable."""
CLUSTER_READ_EVERY_S = 0.5
"""A reading of the cluster's free CPUs younger than this is reused (a tuner's tick reads it once)."""
CLUSTER_WAIT_S = 0.25
"""How long a caller waits for a fresh reading before taking the last one."""
CLUSTER_DEAD_AFTER_S = 5.0
"""A reading outstanding this long means the cluster does not answer: it offers 0 CPUs then."""


def require_ray(what: str) -> Any:
    """The ``ray`` module, or an ``ImportError`` naming ``what`` asked for it and the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"{what}: remote='ray' needs Ray, which is not installed ({exc}); install the extra: {RAY_EXTRA}"
        ) from exc
    return ray


def check_address(what: str, address: Any) -> str:
    """``address`` if it is ``"auto"`` or ``"host:port"``; else a ``ValueError`` naming ``what``."""
    if not isinstance(address, str) or not address:
        raise ValueError(f"{what}: address must be None, 'auto' or 'host:port', got {address!r}")
    if address == "auto":
        return address
    if address.startswith("ray://"):
        raise ValueError(
            f"{what}: address={address!r} is a Ray Client address, which intune does not use: run the "
            "trainer on a node of the cluster (ray start --address=<head>:6379) and pass the head's "
            "'host:port', or None to use that node's cluster"
        )
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what}: address must be None, 'auto' or 'host:port', got {address!r}")
    return address


def _reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """Whether something accepts a TCP connection at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def _auto_address() -> str | None:
    """The address ``ray.init(address="auto")`` would use (``RAY_ADDRESS``, the last ``ray start``, a
    running local cluster), or None when there is none."""
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address("auto")
    except Exception:  # noqa: BLE001 - none found (ConnectionError), or another Ray's internals
        return None


_connect_lock = threading.Lock()
_host: RayHost | None = None  # intune's own Ray connection, made once per process


class InProcessRay:
    """A Ray this process initialised itself, used as it is (the trainer is then a Ray driver)."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray

    def actor(self, fn_blob: bytes) -> RayActor:
        return RayActor(self.ray, fn_blob)

    def free_cpus(self) -> float:
        return float(self.ray.available_resources().get("CPU", 0.0))


def connect(address: str | None, stage: str) -> InProcessRay | RayHost:
    """Connect this process to Ray for ``stage``'s remote workers; what makes its actors.

    A Ray this process initialised is used in-process. Otherwise intune's connection is a Ray host
    (``ray_host``), started once per process: a host that died is not restarted (its stages go on with
    their local workers). Raises ``ClusterError`` naming the stage and the address when it cannot be
    reached, when ``"auto"`` finds no cluster, or when this process is connected to another cluster than
    ``address``.
    """
    global _host
    ray = require_ray(f"stage {stage!r}")
    with _connect_lock:
        if _host is not None:
            wanted = address not in (None, "auto") and _host.address != "local"
            if wanted and not _same_address(_host.address, str(address)):
                raise ClusterError(
                    f"stage {stage!r}: address={address!r}, but this process is already connected to "
                    f"the Ray cluster at {_host.address} (one Ray connection per process)"
                )
            return _host
        if ray.is_initialized():
            if address not in (None, "auto"):
                current = _current_address(ray)
                if current is not None and not _same_address(current, address):
                    raise ClusterError(
                        f"stage {stage!r}: address={address!r}, but this process is already connected to "
                        f"the Ray cluster at {current} (one Ray connection per process)"
                    )
            return InProcessRay(ray)
        if address is None or address == "auto":
            found = _auto_address()
            if found is not None and _reachable(found):
                _host = RayHost.start(found, stage)
                log.info("stage %r: remote workers on the Ray cluster at %s", stage, found)
                return _host
            if address == "auto":
                seen = f" (the last one was at {found}, which does not answer)" if found else ""
                raise ClusterError(
                    f"stage {stage!r}: address='auto' found no running Ray cluster{seen}; start one "
                    "(ray start --head) or pass address=None to have intune start a local Ray"
                )
            _host = RayHost.start("local", stage)
            log.warning(
                "stage %r: no Ray cluster found (address=None tried 'auto'); started a local Ray with this "
                "machine's %g CPUs for the remote workers (pass address='host:port' to use a cluster)",
                stage,
                _host.info.get("cpus", 0.0),
            )
            return _host
        if not _reachable(address):
            raise ClusterError(
                f"stage {stage!r}: no Ray cluster answers at address={address!r} within {REACH_TIMEOUT_S:g} s "
                "(is `ray start --head` running there, and the port open?)"
            )
        _host = RayHost.start(address, stage)
        log.info("stage %r: remote workers on the Ray cluster at %s", stage, address)
        return _host


def _current_address(ray: Any) -> str | None:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - an older Ray without it: nothing to compare
        return None


def _same_address(a: str, b: str) -> bool:
    """Whether two ``host:port`` addresses name the same endpoint (``localhost`` vs its IP)."""
    ha, _, pa = a.rpartition(":")
    hb, _, pb = b.rpartition(":")
    if pa != pb:
        return False
    try:
        return socket.gethostbyname(ha) == socket.gethostbyname(hb) or ha == hb
    except OSError:
        return ha == hb


# ---- the cluster's free CPUs ------------------------------------------------------------------------


class ClusterCpus:
    """The free CPUs Ray reports, re-read on a background thread (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value = 0.0
        self._at = -float("inf")  # monotonic() of the last reading
        self._since: float | None = None  # monotonic() when the reading in progress started
        self._failures = 0

    def free(self) -> float:
        now = time.monotonic()
        with self._cond:
            if self._since is None and now - self._at >= CLUSTER_READ_EVERY_S:
                self._since = now
                threading.Thread(target=self._read, name="intune-ray-cpus", daemon=True).start()
            if self._since is not None:
                self._cond.wait_for(lambda: self._since is None, CLUSTER_WAIT_S)
            if self._since is not None and time.monotonic() - self._since > CLUSTER_DEAD_AFTER_S:
                return 0.0  # the cluster does not answer: it offers nothing now
            return self._value

    def _read(self) -> None:
        value = 0.0
        try:
            session = _connected()
            if session is not None:
                value = session.free_cpus()
        except Exception as exc:  # noqa: BLE001 - a cluster that went away offers 0 CPUs
            if self._failures == 0:
                log.warning("reading the Ray cluster's free CPUs failed (%s: %s); counting 0", type(exc).__name__, exc)
            self._failures += 1
        with self._cond:
            self._value, self._at, self._since = value, time.monotonic(), None
            self._cond.notify_all()


def _connected() -> InProcessRay | RayHost | None:
    """This process's Ray connection: intune's host, else a Ray this process initialised, else None."""
    if _host is not None:
        return _host
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return InProcessRay(ray)
    return None


_cluster_cpus = ClusterCpus()


def cluster_free_cpus() -> float:
    """The CPUs Ray reports free on the cluster now (0 without Ray, or when it does not answer)."""
    return _cluster_cpus.free()


class RemoteWorkers:
    """A map stage's remote workers by index, for the pipeline's life (see ``remote_pool.RemoteRegistry``)."""

    def __init__(self, stage: str, fn_blob: bytes, address: str | None) -> None:
        self.stage = stage
        self.address = address
        self._blob = fn_blob
        self._lock = threading.Lock()
        self._actors: dict[int, RayActor | HostedActor] = {}
        self._ray: InProcessRay | RayHost | None = None
        self._closed = False
        self._told: set[str] = set()  # what was logged already (once per node or cause)

    def connect(self) -> None:
        """Connect to Ray (the stage's first epoch); raises ``ClusterError`` / ``ImportError``."""
        if self._ray is None:
            self._ray = connect(self.address, self.stage)

    @property
    def connected(self) -> bool:
        return self._ray is not None

    def worker(self, index: int) -> RayActor | HostedActor:
        with self._lock:
            if self._closed:
                raise Stopped
            actor = self._actors.get(index)
            if actor is not None:
                return actor
            try:
                assert self._ray is not None
                actor = self._ray.actor(self._blob)
            except Exception as exc:
                failure = exc
            else:
                self._actors[index] = actor
                return actor
        # said outside the lock: ``_tell`` takes it too
        self._tell(
            "create",
            "stage %r: cannot start remote workers (%s); the stage goes on with its local workers",
            lost_words(failure),
        )
        raise RemoteLost(lost_words(failure)) from failure

    def release(self, index: int) -> None:
        with self._lock:
            actor = self._actors.pop(index, None)
        if actor is not None:
            actor.kill()

    def lost(self, index: int, cause: BaseException, chunks: int) -> None:
        with self._lock:
            actor = self._actors.pop(index, None)
        if actor is None or self._closed:
            return
        actor.kill()
        node = actor.where.rpartition("node ")[2] if "node " in actor.where else actor.where
        self._tell(
            f"lost {node}",
            "stage %r: remote worker lost (%s, on %s); its %d chunk(s) in flight go to the other workers",
            str(cause),
            actor.where,
            chunks,
        )

    def _tell(self, key: str, message: str, *args: Any) -> None:
        """Log ``message`` the first time ``key`` happens (a node's loss, the cluster's), then only count."""
        with self._lock:
            first = key not in self._told
            self._told.add(key)
        if first:
            log.warning(message, self.stage, *args)

    def held_cpus(self) -> int:
        """CPUs this stage's actors hold on the cluster now (those that started)."""
        with self._lock:
            return sum(1 for a in self._actors.values() if a.is_ready)

    def live(self) -> int:
        with self._lock:
            return len(self._actors)

    def close(self) -> None:
        """Kill every actor (their chunks' objects are freed with them); no new one starts."""
        with self._lock:
            self._closed = True
            actors, self._actors = list(self._actors.values()), {}
        for actor in actors:
            actor.kill()


__all__ = [
    "MAX_REMOTE_WORKERS",
    "RAY_EXTRA",
    "ClusterCpus",
    "InProcessRay",
    "RayActor",
    "RemoteWorkers",
    "check_address",
    "cluster_free_cpus",
    "connect",
    "require_ray",
]
