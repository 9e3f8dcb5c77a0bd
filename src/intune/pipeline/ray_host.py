"""The Ray host: a helper process that is the Ray driver for the connection intune makes itself.

Why a process of its own: a Ray driver shares its node's fate. When the raylet of the driver's node
dies (SIGKILL, the OOM killer), Ray's core worker ends the driver's process the next time it touches the
object store or the raylet (``_Exit(1)`` in C++: no Python exception, no exit handler, nothing printed but
Ray's own log). So intune never makes the trainer a Ray driver: ``RayHost.start`` starts one host per
trainer process, which calls ``ray.init`` (a cluster's address, or ``"local"`` for a local Ray it starts
and that lives in its process group), creates the actors (``ray_actor.RayActor``) and moves chunks
between the trainer and Ray. A Ray this process initialised itself is used in-process instead
(``remote_ray.connect``): the trainer is then a driver by its own choice.

The trainer talks to the host over socket pairs: a control connection (which opens the others, handing
the host one end with ``SCM_RIGHTS``), one connection per actor (``HostedActor``, the
``remote_pool.RemoteWorker`` protocol: ready / submit / done / result; the actor lives as long as its
connection, so closing it kills the actor), and one for the cluster's free CPUs. A chunk travels through
shared-memory segments named with the trainer's owner prefix (``shm``): the trainer writes it, the host
``ray.put``s it from the segment, and writes the result into its output segment for the trainer to copy
out. Every wait on the host is bounded (``ANSWER_S`` beyond the request's own timeout).

When the host dies, every connection ends: the remote workers are lost (their chunks rescued by the local
workers, as for a lost node), the trainer logs once why (the host's exit status, the local raylet gone),
ends whatever the host started (every process whose environment carries the host's marker, which
Ray's processes inherit: SIGTERM, then SIGKILL after ``GRACE_S``; some of Ray's agents ignore SIGTERM),
and remote workers stay off for the rest of the process. The same clean-up runs when the trainer exits
(``close``), and in the host itself (its process group too) when the trainer dies (end-of-file on the
control connection). It must not know about channels or pools.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

from intune.pipeline import shm
from intune.pipeline.chunks import Chunk
from intune.pipeline.remote_pool import RemoteInitError, RemoteLost

log = logging.getLogger("intune.pipeline.remote_ray")

MARKER_ENV = "INTUNE_RAY_HOST"
"""Set in the host's environment (inherited by every process the local Ray starts): how the clean-up
finds the processes that left the host's process group."""
START_S = 180.0
"""How long the host may take to answer its start (``ray.init``; a local Ray starts in seconds)."""
ANSWER_S = 30.0
"""How long the trainer waits for the host's answer beyond the request's own timeout before it gives
the connection up (a hung host must not hang the trainer)."""
GRACE_S = 3.0
"""How long processes left behind get after SIGTERM before SIGKILL (some of Ray's ignore SIGTERM)."""


class HostGone(Exception):
    """The host does not answer (it died, or hung past ``ANSWER_S``)."""


def _send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection, timeout: float | None) -> Any:
    if timeout is not None and not conn.poll(timeout):
        raise HostGone(f"no answer from intune's Ray host within {timeout:g} s")
    return pickle.loads(conn.recv_bytes())


# ---- the processes a host leaves --------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def host_processes(group: int | None, marker: str, exclude: int | None = None) -> list[int]:
    """Live (not zombie) processes whose environment carries ``marker``, or in process group ``group``
    (only the host itself passes its group: once it is gone, its pid may name another group)."""
    wanted = f"{MARKER_ENV}={marker}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        pid = int(entry)
        fields = _stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        if group is not None and int(fields[2]) == group:
            found.append(pid)
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if wanted in handle.read():
                    found.append(pid)
        except OSError:  # gone, or another user's
            continue
    return found


def end_processes(group: int | None, marker: str, exclude: int | None = None, grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM what ``host_processes`` finds, SIGKILL what is left after ``grace_s``; the pids still
    alive after that (none, unless the kernel is slow to take them)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = host_processes(group, marker, exclude)
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and host_processes(group, marker, exclude):
            time.sleep(0.05)
    return host_processes(group, marker, exclude)


# ---- the trainer's side -----------------------------------------------------------------------------


class RayHost:
    """The trainer's handle on its Ray host (one per process: ``remote_ray.connect``)."""

    def __init__(self, proc: subprocess.Popen, control: Connection, marker: str, address: str, info: dict) -> None:
        self._proc = proc
        self._control = control
        self._control_lock = threading.Lock()
        self.marker = marker
        self.address = address  # what the host was asked to connect to ("local" or "host:port")
        self.info = info  # what the host said once connected: cpus, gcs address, raylet pid, session dir
        self.gone: str | None = None  # why the host is gone, once it is
        self._exited = threading.Event()
        self._closing = False
        self._cpus: Connection | None = None
        self._cpus_lock = threading.Lock()
        self._actors = 0
        threading.Thread(target=self._watch, name="intune-ray-host-watch", daemon=True).start()
        atexit.register(self.close)

    @classmethod
    def start(cls, address: str, stage: str) -> RayHost:
        """Start a host connected to ``address`` (``"local"``: a local Ray it starts). Raises
        ``ClusterError`` naming ``stage`` when the host cannot connect."""
        from intune.pipeline.errors import ClusterError

        marker = os.urandom(8).hex()
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env[MARKER_ENV] = marker
        code = "import sys; from intune.pipeline.ray_host import host_main; host_main(int(sys.argv[1]))"
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
                start_new_session=True,  # its own process group: what it starts is ended with it
            )
        finally:
            theirs.close()
        control = Connection(ours.detach())
        try:
            _send(control, (address, logging.getLogger("intune").getEffectiveLevel()))
            reply = _recv(control, START_S)
        except (HostGone, EOFError, OSError) as exc:
            reply = ("error", f"intune's Ray host did not start ({exc}; exit status {proc.poll()})")
        if reply[0] != "ready":
            control.close()
            _stop(proc, marker)
            what = "starting a local Ray" if address == "local" else f"ray.init(address={address!r})"
            raise ClusterError(f"stage {stage!r}: {what} failed: {reply[1]}")
        return cls(proc, control, marker, address, reply[1])

    @property
    def pid(self) -> int:
        return self._proc.pid

    def open(self, kind: str, *args: Any) -> tuple[socket.socket, Connection]:
        """A new connection to the host, served there by a thread of its own (``kind``: ``actor`` or
        ``cpus``); the socket (to end it from any thread) and its ``Connection``. Raises ``HostGone``."""
        if self.gone is not None:
            raise HostGone(self.gone)
        ours, theirs = socket.socketpair()
        try:
            with self._control_lock:
                _send(self._control, ("open", kind, args))
                send_handle(self._control, theirs.fileno(), self._proc.pid)
                reply = _recv(self._control, ANSWER_S)
        except (HostGone, EOFError, OSError) as exc:
            ours.close()
            raise HostGone(self.why_gone() or f"intune's Ray host does not answer ({type(exc).__name__}: {exc})") from exc
        finally:
            theirs.close()
        if reply[0] != "ok":
            ours.close()
            raise HostGone(reply[1])
        return ours, Connection(os.dup(ours.fileno()))

    def actor(self, fn_blob: bytes) -> HostedActor:
        with self._control_lock:
            self._actors += 1
            number = self._actors
        return HostedActor(self, fn_blob, number)

    def free_cpus(self) -> float:
        """The CPUs Ray reports free on the host's cluster (0 once the host is gone)."""
        with self._cpus_lock:
            if self.gone is not None:
                return 0.0
            try:
                if self._cpus is None:
                    self._cpus = self.open("cpus")[1]
                _send(self._cpus, ("cpus",))
                return float(_recv(self._cpus, ANSWER_S))
            except (HostGone, EOFError, OSError):
                if self._cpus is not None:
                    self._cpus.close()
                self._cpus = None
                return 0.0

    def why_gone(self, wait_s: float = 2.0) -> str | None:
        """Why the host is gone, waiting up to ``wait_s`` for its exit to be seen (a connection that
        broke is usually the host's death, seen a moment later); None if it still runs."""
        self._exited.wait(wait_s)
        return self.gone

    def _watch(self) -> None:
        """Wait for the host's exit; one it was not asked for is said once, then cleaned up after."""
        code = self._proc.wait()
        if self._closing:
            self._exited.set()
            return
        raylet = self.info.get("raylet_pid")
        why = f"intune's Ray host process (pid {self._proc.pid}) exited with status {code}"
        if raylet and not _alive(raylet):
            why += (
                f": the local Ray's raylet (pid {raylet}) is gone, and Ray ends every driver whose node's "
                "raylet died"
            )
        if self.info.get("session_dir"):
            why += f" (Ray's logs: {self.info['session_dir']}/logs)"
        self.gone = why
        self._exited.set()
        log.warning(
            "the Ray connection to %s is lost: %s. Remote workers are off for the rest of this process; "
            "every stage goes on with its local workers",
            "a local Ray" if self.address == "local" else self.address,
            why,
        )
        left = end_processes(None, self.marker)
        if left:
            log.warning("processes of the lost local Ray still alive after SIGKILL: %s", left)

    def close(self) -> None:
        """End the host and everything it started (at exit; a later ``connect`` does not restart it)."""
        if self._closing:
            return
        self._closing = True
        self.gone = self.gone or "intune's Ray host was closed"
        try:
            self._control.close()  # the host shuts Ray down on end-of-file, then ends its process group
        except OSError:
            pass
        _stop(self._proc, self.marker)


def _stop(proc: subprocess.Popen, marker: str) -> None:
    """Give the host a moment to shut Ray down after end-of-file, then end what is left of it."""
    try:
        proc.wait(timeout=10.0)
    except subprocess.TimeoutExpired:
        pass
    end_processes(None, marker)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class HostedActor:
    """One remote worker through the host (``remote_pool.RemoteWorker``); its actor lives as long as its
    connection to the host."""

    def __init__(self, host: RayHost, fn_blob: bytes, number: int) -> None:
        self._host = host
        base = f"{shm.owner_prefix()}ray{number}"
        self._input = shm.Segment(f"{base}-in-")
        self._output = shm.Mapping_()
        self.is_ready = False
        self.where = "a Ray actor (starting)"
        sys_path = [os.path.abspath(p or os.curdir) for p in sys.path]  # "" is the working directory
        self._out_prefix = f"{base}-out-"
        try:
            self._socket, self._conn = host.open("actor", fn_blob, sys_path, self._out_prefix)
        except HostGone as exc:
            self._input.close()
            raise RemoteLost(str(exc)) from exc
        self._lock = threading.Lock()  # kill() from another thread against the segments in use
        self._killed = False
        self._lost: str | None = None  # why the connection failed, once it did

    def _ask(self, message: tuple, timeout: float = 0.0) -> tuple:
        if self._lost is not None:
            raise RemoteLost(self._lost)
        try:
            _send(self._conn, message)
            reply = _recv(self._conn, timeout + ANSWER_S)
        except (HostGone, EOFError, OSError) as exc:
            ended = self._killed  # by this process (a release, a close): nothing to find out
            self.kill()
            if ended:
                self._lost = "the remote worker was ended"
            else:
                self._lost = self._host.why_gone() or f"intune's Ray host does not answer ({type(exc).__name__}: {exc})"
            raise RemoteLost(self._lost) from exc
        if reply[0] == "lost":
            raise RemoteLost(reply[1])
        return reply

    def ready(self, timeout: float) -> bool:
        if self.is_ready:
            return True
        reply = self._ask(("ready", timeout), timeout)
        if reply[0] == "init-error":
            raise RemoteInitError(reply[1], reply[2])
        if reply[0] == "wait":
            return False
        self.where, self.is_ready = reply[1], True
        return True

    def submit(self, chunk: Chunk) -> Any:
        layout, size = shm.plan(chunk)
        with self._lock:
            if self._killed:
                raise RemoteLost("the remote worker was ended")
            try:
                self._input.ensure(size)
            except OSError as exc:
                raise RemoteLost(f"no shared memory for the chunk ({exc})") from exc
            shm.write(self._input.buffer, chunk, layout, shm.IN)
            path, size = self._input.path, self._input.size
        return self._ask(("submit", path, size, layout))[1]

    def done(self, ticket: Any, timeout: float) -> bool:
        try:
            return bool(self._ask(("done", ticket, timeout), timeout)[1])
        except RemoteLost:
            return True  # result() says what happened

    def result(self, ticket: Any) -> tuple:
        reply = self._ask(("result", ticket), 10.0)
        if reply[0] != "ok":
            return reply
        _, path, size, layout, cpu_s, wall_s = reply
        with self._lock:
            if self._killed:
                raise RemoteLost("the remote worker was ended")
            output = shm.read((None, self._output.follow(path, size)), layout, copy=True)
        return ("ok", output, cpu_s, wall_s)

    def kill(self) -> None:
        """End the connection, and with it the actor (the host kills it on end-of-file)."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self._lock:
            self._killed = True
            self._output.close()
            self._input.close()
        shm.remove_prefix(self._out_prefix)  # the host's output segment, were the host killed


# ---- the host's side --------------------------------------------------------------------------------


def host_main(fd: int) -> None:
    """The host: connect to Ray, say so (or why not), then serve the trainer until end-of-file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    control = Connection(fd)
    address, level = _recv(control, None)
    marker = os.environ.get(MARKER_ENV, "")
    try:
        import ray

        if address == "local":
            ray.init(address="local", include_dashboard=False, logging_level=max(level, logging.WARNING))
        else:
            ray.init(address=address, logging_level=max(level, logging.WARNING))
        info = _describe(ray)
    except BaseException as exc:  # noqa: BLE001 - the trainer raises it as ClusterError
        _send(control, ("error", f"{type(exc).__name__}: {exc}"))
        _end_host(marker)
        return
    _send(control, ("ready", info))
    try:
        while True:
            try:
                request = _recv(control, None)
                theirs = recv_handle(control)
            except (EOFError, OSError):
                break
            _, kind, args = request
            serve = _serve_actor if kind == "actor" else _serve_cpus
            conn = Connection(theirs)
            try:
                threading.Thread(target=serve, args=(ray, conn, *args), daemon=True).start()
            except Exception as exc:  # noqa: BLE001 - the trainer counts it as a lost remote worker
                conn.close()
                _send(control, ("error", f"{type(exc).__name__}: {exc}"))
                continue
            _send(control, ("ok",))
    finally:
        _end_host(marker, ray)


def _describe(ray: Any) -> dict:
    """What the trainer says about this connection: the cluster's CPUs, where it is, the raylet's pid
    when this process started the local Ray (so that its death can be named)."""
    info: dict[str, Any] = {"cpus": float(ray.cluster_resources().get("CPU", 0.0))}
    try:
        node = ray._private.worker._global_node
        info["session_dir"] = node.get_session_dir_path()
        raylets = node.all_processes.get("raylet") or []
        if raylets:
            info["raylet_pid"] = raylets[0].process.pid
    except Exception:  # noqa: BLE001 - for messages only
        pass
    try:
        info["gcs_address"] = str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - for messages only
        pass
    return info


def _end_host(marker: str, ray: Any = None) -> None:
    """Shut Ray down (bounded), end everything this host started, and exit."""
    me = os.getpid()
    timer = threading.Timer(20.0, lambda: (end_processes(me, marker, exclude=me, grace_s=0.0), os._exit(1)))
    timer.daemon = True
    timer.start()
    if ray is not None:
        try:
            ray.shutdown()
        except BaseException:  # noqa: BLE001 - what is left is ended below
            pass
    end_processes(me, marker, exclude=me)
    os._exit(0)


def _serve_cpus(ray: Any, conn: Connection) -> None:
    while True:
        try:
            _recv(conn, None)
        except (EOFError, OSError):
            return
        try:
            value = float(ray.available_resources().get("CPU", 0.0))
        except Exception:  # noqa: BLE001 - a cluster that went away offers 0 CPUs
            value = 0.0
        try:
            _send(conn, value)
        except OSError:
            return


def _serve_actor(ray: Any, conn: Connection, fn_blob: bytes, sys_path: list[str], out_prefix: str) -> None:
    """One actor for as long as its connection lasts: requests answered in order."""
    from intune.pipeline.ray_actor import RayActor, lost_words

    served: _Served | None = None
    failure = ""
    try:
        served = _Served(RayActor(ray, fn_blob, sys_path=sys_path, copy_out=False), out_prefix)
    except Exception as exc:  # noqa: BLE001 - the trainer sees a lost remote worker
        failure = lost_words(exc)
    try:
        while True:
            try:
                request = _recv(conn, None)
            except (EOFError, OSError):
                return
            try:
                reply = served.answer(request) if served is not None else ("lost", failure)
            except RemoteLost as exc:
                reply = ("lost", str(exc))
            except RemoteInitError as exc:
                reply = ("init-error", exc.message, exc.remote_traceback)
            except Exception as exc:  # noqa: BLE001 - e.g. no room for the output segment
                reply = ("lost", f"{type(exc).__name__}: {exc} (in intune's Ray host)")
            try:
                _send(conn, reply)
            except OSError:
                return
    finally:
        if served is not None:
            served.close()
        conn.close()


class _Served:
    """The host's side of one ``HostedActor``: the actor, its calls in flight, its segments."""

    def __init__(self, actor: Any, out_prefix: str) -> None:
        self.actor = actor
        self.tickets: dict[int, Any] = {}
        self.next_ticket = 0
        self.inputs = shm.Mapping_()
        self.output = shm.Segment(out_prefix)

    def answer(self, request: tuple) -> tuple:
        actor, what = self.actor, request[0]
        if what == "ready":
            return ("ready", actor.where) if actor.ready(request[1]) else ("wait",)
        if what == "submit":
            _, path, size, layout = request
            chunk = shm.read((self.inputs.follow(path, size), None), layout, copy=False)
            ticket = actor.submit(chunk)  # ray.put has copied the chunk into the object store
            del chunk
            self.next_ticket += 1
            self.tickets[self.next_ticket] = ticket
            return ("ok", self.next_ticket)
        if what == "done":
            return ("ok", actor.done(self.tickets[request[1]], request[2]))
        if what == "result":
            reply = actor.result(self.tickets.pop(request[1]))
            if reply[0] != "ok":
                return reply
            _, result, cpu_s, wall_s = reply
            layout, size = shm.plan(result, shm.OUT)
            self.output.ensure(size)
            shm.write(self.output.buffer, result, layout, shm.OUT)
            return ("ok", self.output.path, self.output.size, layout, cpu_s, wall_s)
        raise ValueError(f"unknown request {what!r}")

    def close(self) -> None:
        self.actor.kill()
        self.tickets.clear()
        self.inputs.close()
        self.output.close()
