"""The live tuner: runs a policy on a running pipeline, one decision per tick, on a background thread.

Owns the online loop (docs/design.md, "Two loops"): every tick it snapshots the engine's metrics and the
machine, builds the Observation, lets the policy decide, has the ``Runner`` clamp the request to the
knobs' bounds and to the free CPUs and memory and apply it (the same runner the simulator uses), and
records the tick. It also feeds rewards to policies that
learn online (an ``observe(observation, reward)`` method), and saves and restores what a restarted job
needs (``state_dict`` / ``load_state_dict``: knob values restored through the same clamp, the policy's
own state handed over after its first reset). It must never raise into the consumer: a
failing policy or monitor leaves the pipeline at its last allocation and is logged once. It must not
hold any policy's algorithm or read cgroup files itself (the monitor does).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from intune.checkpoint import ResumeError
from intune.knobs import Knob
from intune.monitor import MachineSample, Monitor
from intune.monitor.live import observe
from intune.monitor.observation import Observation, reward
from intune.policies import (
    POLICY_NAMES,
    SIMULATOR_ONLY,
    ClampResult,
    Policy,
    StatefulPolicy,
    clamp_request,
    make,
)
from intune.policies.runner import Runner
from intune.tunable import Tunable

log = logging.getLogger(__name__)



class Tuner:
    """A pipeline under a policy. Iterate it for the pipeline's batches; close it (or use ``with``) to stop.

    The tuning thread starts at the first iteration (or ``start()``), so the first tick measures a
    pipeline that is delivering data. The first measured tick with a positive throughput sets the
    reward scale unless ``reward_scale`` is given.
    """

    def __init__(
        self,
        pipe: Tunable,
        policy: Policy,
        tick_s: float = 1.0,
        reward_scale: float | None = None,
        monitor: Monitor | None = None,
    ) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(
                f"policy must be a policy name ({', '.join(POLICY_NAMES)}) or an object with name, reset() "
                f"and step(), got {policy!r}"
            )
        if not isinstance(tick_s, (int, float)) or not math.isfinite(tick_s) or tick_s <= 0:
            raise ValueError(f"tick_s must be a finite number of seconds > 0, got {tick_s!r}")
        if reward_scale is not None and (
            not isinstance(reward_scale, (int, float)) or not math.isfinite(reward_scale) or reward_scale <= 0
        ):
            raise ValueError(f"reward_scale must be a finite number > 0, got {reward_scale!r}")
        self.pipeline = pipe
        self.policy = policy
        self.tick_s = float(tick_s)
        self.reward_scale = reward_scale
        if monitor is None:  # one rank of several on this machine tunes for its share of it
            from intune.pipeline.sharding import monitor_for

            monitor = monitor_for(pipe)
        self.monitor = monitor
        self._history: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures: dict[str, int] = {}  # where -> count; the first one is logged
        self._decision_ms: list[float] = []
        self._decision_cpu_ms: list[float] = []
        self._learn_ms: list[float] = []
        self._thread_cpu_s = 0.0
        self._started_at: float | None = None
        self._stopped_at: float | None = None
        # resume: a tick and a state_dict() never interleave; a loaded policy state waits for the reset
        self._policy_lock = threading.RLock()
        self._policy_started = False
        self._pending_policy_state: Any = None
        self.restored: ClampResult | None = None
        """After ``load_state_dict``: the saved knob values asked for and those applied (clamped)."""

    # -- the consumer's side -----------------------------------------------------------------------

    @property
    def knobs(self) -> Mapping[str, Knob]:
        return self.pipeline.knobs

    def __iter__(self) -> Iterator[Any]:
        self.start()
        yield from self.pipeline

    def start(self) -> Tuner:
        """Start the tuning thread (idempotent; a closed tuner does not restart)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="intune-tuner", daemon=True)
            self._started_at = time.monotonic()
            self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the tuning thread (it wakes at once), then close the pipeline."""
        self.stop(timeout_s)
        self.pipeline.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop tuning but leave the pipeline running at its current allocation."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("intune tuner thread did not stop within %.1f s", timeout_s)

    def __enter__(self) -> Tuner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- results -----------------------------------------------------------------------------------

    def history(self) -> list[dict[str, Any]]:
        """One dict per tick: tick, time, knobs, throughput, memory, cpus, reward, requested, applied, ..."""
        with self._lock:
            return [dict(row) for row in self._history]

    def save(self, path: str | Path) -> Path:
        """Write the history as JSON lines (one tick per line)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as f:
            for row in self.history():
                f.write(json.dumps(row) + "\n")
        return out

    def overhead(self) -> dict[str, float]:
        """What tuning costs: decision time (policy.step + clamp) and the thread's CPU use.

        ``decision_ms_*`` is wall time, which includes waiting for the GIL held by the consumer and
        the engine's threads; ``decision_cpu_ms_mean`` is the CPU the decision itself used.
        ``cpu_fraction`` is the tuning thread's CPU seconds over the wall time it ran (1.0 = a core).
        """
        with self._lock:
            ms = sorted(self._decision_ms)
            cpu_ms = sorted(self._decision_cpu_ms)
            learn = list(self._learn_ms)
            cpu_s = self._thread_cpu_s
        if self._started_at is None:
            wall = 0.0
        else:
            wall = (self._stopped_at or time.monotonic()) - self._started_at
        return {
            "decisions": float(len(ms)),
            "decision_ms_mean": sum(ms) / len(ms) if ms else 0.0,
            "decision_ms_p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else 0.0,
            "decision_ms_max": ms[-1] if ms else 0.0,
            "decision_cpu_ms_mean": sum(cpu_ms) / len(cpu_ms) if cpu_ms else 0.0,
            "decision_cpu_ms_median": cpu_ms[len(cpu_ms) // 2] if cpu_ms else 0.0,
            "learn_ms_mean": sum(learn) / len(learn) if learn else 0.0,
            "thread_cpu_s": cpu_s,
            "wall_s": wall,
            "cpu_fraction": cpu_s / wall if wall > 0 else 0.0,
        }

    @property
    def failures(self) -> dict[str, int]:
        """How many ticks failed, by where (``monitor``, ``policy``, ``apply``, ``learn``, ``tuner``)."""
        with self._lock:
            return dict(self._failures)

    # -- resume ------------------------------------------------------------------------------------

    def state_dict(self, *, replay: bool = False) -> dict[str, Any]:
        """What a restarted job needs to start where this one is, as plain values and numpy arrays.

        The policy's name, each knob's value with its unit and bounds, the reward scale, the ticks run,
        the machine at the last tick, and the policy's own ``state_dict()`` (for ``intune``: its online
        weights and what it measured; ``replay=True`` adds its replay buffer, see
        ``IntunePolicy.state_dict``), or None for a policy without state or one that has not decided
        yet. Safe to call from the training loop while the tuner runs: it waits for a tick in progress.
        """
        with self._policy_lock:
            if self._pending_policy_state is not None:  # loaded, not yet handed to the policy
                policy_state = self._pending_policy_state
            elif self._policy_started and isinstance(self.policy, StatefulPolicy):
                state_of: Any = self.policy.state_dict  # ``replay`` is the intune agent's option
                policy_state = state_of(replay=True) if replay else state_of()
            else:
                policy_state = None
            knobs = {
                name: {"value": knob.value, "unit": knob.unit, "min": knob.min, "max": knob.max}
                for name, knob in self.knobs.items()
            }
        with self._lock:
            last = self._history[-1] if self._history else None
            ticks = len(self._history)
        return {
            "format": TUNER_STATE_FORMAT,
            "policy": self.policy.name,
            "knobs": knobs,
            "reward_scale": self.reward_scale,
            "ticks": ticks,
            "machine": None if last is None else {"cpus": last["cpus"], "memory_limit": last["memory_limit"]},
            "policy_state": policy_state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start from ``state`` (``state_dict()`` of a tuner with the same policy on the same knobs).

        The knobs are set to the saved values now, clamped to their current bounds and to this machine
        by the rule every request passes (``restore_knobs``: workers only into the CPUs this tuner may
        use, buffers only into the free memory), so a job restarted on a smaller machine starts from its
        saved allocation cut to fit, then adapts. What was applied is in
        ``restored``. The policy gets its state right after its first ``reset`` (it skips its warm
        start). Another policy, knob set, or knob unit raises ``ResumeError`` naming it, and nothing is
        changed.
        """
        if not isinstance(state, Mapping) or state.get("format") != TUNER_STATE_FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ResumeError(f"Tuner.load_state_dict: not a tuner state of format {TUNER_STATE_FORMAT} (format {got!r})")
        if state["policy"] != self.policy.name:
            raise ResumeError(
                f"Tuner.load_state_dict: the state is policy {state['policy']!r}'s, this tuner runs {self.policy.name!r}"
            )
        saved, knobs = state["knobs"], self.knobs
        missing, extra = sorted(set(knobs) - set(saved)), sorted(set(saved) - set(knobs))
        if missing or extra:
            raise ResumeError(
                f"Tuner.load_state_dict: the state is from another pipeline: knobs {extra} are in the state "
                f"only, {missing} in this pipeline only"
            )
        units = [f"{n} ({saved[n]['unit']} saved, {knobs[n].unit} here)" for n in knobs if saved[n]["unit"] != knobs[n].unit]
        if units:
            raise ResumeError(f"Tuner.load_state_dict: knobs of another unit: {', '.join(units)}")
        policy_state = state["policy_state"]
        if policy_state is not None and not isinstance(self.policy, StatefulPolicy):
            raise ResumeError(
                f"Tuner.load_state_dict: the state holds policy {self.policy.name!r}'s state, but this policy keeps none"
            )
        with self._policy_lock:
            self.restored = restore_knobs(
                knobs, {n: int(saved[n]["value"]) for n in knobs}, self.monitor.sample(), self._remote_cpus()
            )
            if state["reward_scale"] is not None:
                self.reward_scale = float(state["reward_scale"])
            if policy_state is None:
                return
            if self._policy_started:  # the tuner already runs: the policy takes the state now
                assert isinstance(self.policy, StatefulPolicy)
                self.policy.load_state_dict(policy_state)
            else:
                self._pending_policy_state = policy_state

    # -- the tuning thread -------------------------------------------------------------------------

    def _fail(self, where: str, exc: BaseException) -> None:
        """Count a failure; log the first one of each kind with its traceback, never raise.

        Failures while the pipeline is closing are expected (its knobs and metrics go away): not logged.
        """
        if self._pipeline_closed():
            return
        with self._lock:
            count = self._failures.get(where, 0) + 1
            self._failures[where] = count
        if count == 1:
            log.error(
                "intune tuner: %s failed (%s: %s); the pipeline keeps its current allocation. "
                "Further %s failures are counted in Tuner.failures, not logged.",
                where,
                type(exc).__name__,
                exc,
                where,
                exc_info=exc,
            )

    def _remote_cpus(self) -> float:
        """The remote cluster's CPUs the pipeline may hold now (0 for a pipeline without remote workers)."""
        return float(self.pipeline.remote_cpus())

    def _pipeline_closed(self) -> bool:
        return bool(self.pipeline.closed)

    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            self._loop(cpu0)
        finally:
            with self._lock:
                self._thread_cpu_s = time.thread_time() - cpu0
            self._stopped_at = time.monotonic()

    def _loop(self, cpu0: float) -> None:
        prev = None
        tick = 0
        runner = Runner(self.knobs)
        while True:
            if prev is None:
                try:
                    prev = self.pipeline.metrics()
                except Exception as exc:  # noqa: BLE001 - the consumer must never see it
                    if self._pipeline_closed():
                        return
                    self._fail("monitor", exc)
            if self._stop.wait(self.tick_s) or self._pipeline_closed():
                return
            if prev is None:
                continue
            try:
                cur = self.pipeline.metrics()
                machine = self.monitor.sample()
                obs = observe(
                    prev,
                    cur,
                    self.knobs,
                    tick,
                    machine.cpus,
                    machine.memory_used_bytes,
                    machine.memory_limit_bytes,
                    machine.host_free_bytes,
                )
                obs = runner.observe(obs)
            except Exception as exc:  # noqa: BLE001
                if self._pipeline_closed():
                    return
                self._fail("monitor", exc)
                prev = None
                continue
            prev = cur
            try:
                with self._policy_lock:
                    row = self._tick(runner, obs, first=not self._policy_started)
                    self._policy_started = self._policy_started or row.pop("_reset_ok")
            except Exception as exc:  # noqa: BLE001 - e.g. a knob that cannot be read while recording
                self._fail("tuner", exc)
                continue
            with self._lock:
                self._history.append(row)
                self._thread_cpu_s = time.thread_time() - cpu0
            tick += 1

    def _tick(self, runner: Runner, obs: Observation, first: bool) -> dict[str, Any]:
        """One decision: reward and learning, then policy, clamp and apply. Returns the history row."""
        if self.reward_scale is None and obs.throughput > 0:
            self.reward_scale = obs.throughput
        r = reward(obs, self.reward_scale or 0.0)
        learn = getattr(self.policy, "observe", None)
        if learn is not None and not first:
            t0 = time.perf_counter()
            try:
                learn(obs, r)
            except Exception as exc:  # noqa: BLE001
                self._fail("learn", exc)
            with self._lock:
                self._learn_ms.append((time.perf_counter() - t0) * 1e3)

        requested: dict[str, int] = {}
        applied: dict[str, int] = {}
        decision_ms = decision_cpu_ms = None
        reset_ok = not first
        error = None
        try:
            if first:
                self.policy.reset(self.knobs, obs)  # a one-off, not part of the decision time
                if self._pending_policy_state is not None:  # a resumed job: the policy goes on from its state
                    state, self._pending_policy_state = self._pending_policy_state, None
                    assert isinstance(self.policy, StatefulPolicy)  # checked when the state was loaded
                    self.policy.load_state_dict(state)
                reset_ok = True
            t0, c0 = time.perf_counter(), time.thread_time()
            requested = {k: int(v) for k, v in (self.policy.step(obs) or {}).items()}
            clamped = runner.clamp(obs, requested)
            decision_ms = (time.perf_counter() - t0) * 1e3
            decision_cpu_ms = (time.thread_time() - c0) * 1e3
            with self._lock:
                self._decision_ms.append(decision_ms)
                self._decision_cpu_ms.append(decision_cpu_ms)
        except Exception as exc:  # noqa: BLE001
            self._fail("policy", exc)
            error = f"policy: {type(exc).__name__}: {exc}"
            clamped = None
        if clamped is not None:

            def failed(name: str, value: int, exc: Exception) -> None:
                nonlocal error
                self._fail("apply", exc)
                error = f"apply {name}={value}: {type(exc).__name__}: {exc}"

            applied = runner.set(clamped, on_error=failed).applied
        return {
            "tick": obs.tick,
            "time": time.time(),
            "elapsed_s": time.monotonic() - (self._started_at or time.monotonic()),
            "dt_s": obs.dt_s,
            "knobs": {name: knob.value for name, knob in self.knobs.items()},
            "throughput": obs.throughput,
            "step_time_s": obs.step_time_s,
            "memory_used": obs.memory_used_bytes,
            "memory_limit": obs.memory_limit_bytes,
            "host_free": obs.host_memory_free_bytes,
            "cpus": obs.cpus,
            "cpu_slack": obs.cpu_slack,
            "remote_cpus": obs.remote_cpus,
            "light_stages": list(obs.light_stages()),
            "reward": r,
            "requested": requested,
            "applied": applied,
            "decision_ms": decision_ms,
            "decision_cpu_ms": decision_cpu_ms,
            "error": error,
            "stages": {
                s.name: {
                    "rows_per_s": s.rows_per_s,
                    "busy": round(s.busy, 4),
                    "starved": round(s.starved, 4),
                    "blocked": round(s.blocked, 4),
                    "queue_fill": round(s.queue_fill, 4),
                    "buffered_bytes": s.buffered_bytes,
                    "stalled": s.stalled,
                    **(
                        {
                            "remote_workers": s.remote_workers,
                            "remote_items_per_s": s.remote_items_per_s,
                            "transfer_s_per_item": s.transfer_s_per_item,
                            "transfer_bytes_per_item": s.transfer_bytes_per_item,
                        }
                        if s.remote_workers or s.remote_items_per_s
                        else {}
                    ),
                }
                for s in obs.stages
            },
            "_reset_ok": reset_ok,
        }


TUNER_STATE_FORMAT = 1
"""The layout version of ``Tuner.state_dict()``; a state of another version is refused."""


def restore_knobs(
    knobs: Mapping[str, Knob], values: Mapping[str, int], machine: MachineSample, remote_cpus: float = 0.0
) -> ClampResult:
    """Set ``knobs`` to saved ``values``, cut to fit this machine by the rule every request passes
    (``clamp_request``), applied as if every knob stood at its minimum: workers are granted in the knobs'
    order until the machine's CPUs are used (each knob keeps at least its minimum), buffers until the
    free memory is, remote workers until the cluster's ``remote_cpus`` are; then the knobs are set,
    decreases first.

    From the minimums, not from the values in place: a restored allocation must fit the machine it
    resumes on whatever the knobs hold now (a pipeline's own ``load_state_dict`` restores its knobs to
    its bounds only, and a loader may start with more workers than the saved state had), so a smaller
    machine gets the saved allocation cut to fit, never more than a policy could be granted there.
    """
    request = {name: knobs[name].clamp(v) for name, v in values.items()}
    floor = {name: Knob(name, k.unit, k.min, k.max, get=_constant(k.min), set=_refuse) for name, k in knobs.items()}
    granted = clamp_request(floor, request, machine.cpus, machine.memory_free_bytes, remote_cpus=remote_cpus).applied
    target = {name: granted.get(name, k.min) for name, k in knobs.items()}
    applied = {name: v for name, v in target.items() if v != knobs[name].value}
    done = Runner(knobs).set(ClampResult(requested=dict(values), applied=applied)).applied
    return ClampResult(requested=dict(values), applied=done)


def _constant(value: int) -> Callable[[], int]:
    return lambda: value


def _refuse(value: int) -> None:
    raise RuntimeError("restore_knobs: the floor view of the knobs is read-only")


def tune(
    pipe: Tunable,
    policy: str | Policy = "intune",
    tick_s: float = 1.0,
    reward_scale: float | None = None,
    monitor: Monitor | None = None,
    **policy_kwargs: Any,
) -> Tuner:
    """Run ``policy`` (a name for ``intune.policies.make`` or an instance) on ``pipe`` every ``tick_s``.

    Returns a ``Tuner``: iterate it in place of the pipeline; the policy starts deciding at the first
    batch. ``policy_kwargs`` go to ``make`` and are refused with an instance.
    """
    if isinstance(policy, str):
        if policy in SIMULATOR_ONLY:
            raise ValueError(
                f"policy {policy!r} runs in the simulator only (it needs the workload's true costs); "
                f"live policies are {[p for p in POLICY_NAMES if p not in SIMULATOR_ONLY]}"
            )
        policy = make(policy, **policy_kwargs)
    elif policy_kwargs:
        raise TypeError(
            f"policy arguments {sorted(policy_kwargs)} only apply to a policy name, not to an instance"
        )
    return Tuner(pipe, policy, tick_s=tick_s, reward_scale=reward_scale, monitor=monitor)


__all__ = ["TUNER_STATE_FORMAT", "Tuner", "restore_knobs", "tune"]
