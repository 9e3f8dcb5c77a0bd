"""The oracle: the best allocation on the simulator's true model, by a provably exact search.

Owns ``optimal_allocation`` (a pure function of the model: most rows/s under a memory budget),
``reward_optimal_allocation`` (the oracle's objective: most rows/s times the reward's memory factor, which
differs only where memory binds), ``search_optimum`` (that for a ``Simulator`` at its current drift) and
``OraclePolicy`` (registry name ``"oracle"``, simulator only; ``safe_oracle``, ``"oracle-safe"``, the same held
to the safety layer's memory margins).

The problem. Choose integer workers ``w_i`` in ``[wmin_i, wmax_i]`` and buffer MB ``b_i`` in
``[bmin_i, bmax_i]`` (stages with a buffer knob) to maximise
``T(w, b) = min(min_i r_i(w_i, b_i), B(Wc), D)`` where ``r_i = cap_i(w_i) * f_i(b_i)`` is stage i's rate
(drift multipliers ``mult_i`` in its CPU cost), ``B(Wc) = eta(Wc) * C / sum_i c_i mult_i`` the CPU bound,
``eta(Wc) = 1 / (1 + k * max(0, Wc / C - 1))``, ``Wc = sum_i a_i(w_i)`` the switching workers
(``model.stage_switching_workers``: ``w c_i / (c_i + o_i)``, drift-free, a GIL-bound stage's GIL share
counting one worker at most, times the mode's weight, a thread's ``thread_switch_share``; not decreasing
in ``w``) and ``D`` the consumer's demand, subject only to worst-case
memory ``M(w, b) = M0 + sum_i m_i(w_i, b_i) <= budget`` (buffers full). There is no cap on the total
``sum_i w_i``: over-subscribed allocations are candidates (the runner grants the CPU that waiting workers
leave unused, and a policy may keep its workers through a CPU shrink), so no allocation within the knob
bounds and the budget does better than the optimum returned.

The search. For a target rate ``tau``, call ``tau`` feasible if some allocation in the constraints has
``T >= tau``. (1) Feasibility is monotone: if ``tau`` is feasible, so is every ``tau' < tau`` (same
witness). So the optimum ``T* = max{tau feasible}`` is found by bisection on ``tau``. (2) The CPU bound
is a constraint on ``Wc``: ``eta`` does not increase with ``Wc``, so ``B(Wc) >= tau`` iff
``tau <= C / sum c mult`` and ``Wc <= Wc_max(tau) = C * (1 + (C / (tau * sum c mult) - 1) / k)``
(any ``Wc`` where ``k = 0``). Hence ``tau <= D`` is feasible iff the least memory of an allocation with
every ``r_i >= tau`` and ``sum_i a_i(w_i) <= Wc_max(tau)`` is within the budget: a choice per stage of
options with two additive costs, compute weight ``a_i(w_i)`` and memory ``m_i``. (3) It is decided
exactly. For a stage and a worker count ``w``, ``f_i`` and ``m_i`` increase with ``b`` and the weight
does not depend on it, so the least ``b`` with ``cap_i(w) * f_i(b) >= tau`` (closed form:
``f_i(b) = 1 - v_i / (1 + n_i(b))``, so ``n_i >= v_i / (1 - tau / cap_i(w)) - 1``) dominates every
other ``b`` for that ``w``. A stage without a buffer knob takes its least qualifying ``w``: it has both
the least weight and the least memory of its qualifying options. For the stages with one, an option
dominated in both costs by another of the same stage can be swapped out of any witness, and so can a
partial sum over the first stages dominated by another partial sum: so the Pareto front of
(weight, memory) is kept, merged stage by stage (every pair of front points summed, dominated sums
dropped, sums that cannot fit beside the other stages' least costs pruned), and the last stage's options
are matched, each, with the least-memory front point that its weight leaves room for. That least memory
is the exact minimum over all choices. Hence the bisection's lower end always holds a witness with
``T >= lo`` and its upper end is infeasible, so the returned allocation is optimal to the bisection's
tolerance (relative 1e-10); the tests check it against exhaustive search on small cases.

The reward's optimum (``reward_optimal_allocation``) maximises ``T(a) * phi(M(a) / L)`` with ``phi`` the
memory factor (1 up to ``MEMORY_SAFE_FRACTION`` of the limit ``L``, falling to 0 at ``L``). With
``M(tau)`` the least memory of an allocation with ``T >= tau`` (the feasibility test's witness under the
budget ``L``), the optimum is ``max_tau tau * phi(M(tau) / L)``: ``<=`` taking ``tau = T(a)``, ``>=``
since the witness reaches ``T >= tau`` with memory ``M(tau)``. ``M`` does not decrease with ``tau``, so
on ``[t1, t2]`` that is at most ``t2 * phi(M(t1) / L)``: a branch and bound on ``tau`` between the
optimum under the safe budget and the one under ``L`` splits the interval with the highest bound until
no bound exceeds the best witness's reward by more than relative ``1e-7`` (a probe's witness also settles
the targets up to its own rows/s: it reaches them with the least memory of the probed one).

Remote pools. With remote capacity ``R_i`` (rows/s, ``intune.sim.remote``) a stage's rate is
``cap_i(w) * f_i(b) + R_i``: it reaches ``tau`` iff its local part reaches ``tau - R_i``, so each stage's
options are those above for the target ``tau - R_i``; and the CPU bound becomes ``need(tau) <= eta(Wc) * C`` with the
local CPU need ``need(tau) = tau * sum c mult - sum_i c_i mult_i min(tau, R_i)`` (remote rows first;
``model.local_cpu_need``): so ``Wc_max(tau) = C * (1 + (C / need(tau) - 1) / k)``. Both keep the
monotonicity the proof above uses (stage rates grow with ``w`` and ``b``; ``need`` grows with ``tau``), so
the search is exact for a given remote capacity. ``fewest_remote_workers`` then searches the worker
count: the optimum's rows/s never falls as remote workers are added (capacity grows, local CPU need
falls), so the fewest workers reaching a target is found by bisection. Its targets: with a known demand,
the demand or, if the whole pool cannot reach it, the most the whole pool reaches; without one, the
shared min-gain rule (``intune.policies.remote_sizing``): the fewest workers past which one more adds
less than ``REMOTE_MIN_GAIN`` of one local worker's rows/s, found by bisection on that marginal gain,
which is exact where the optimum is concave in the worker count (per-node links that saturate break
concavity; then it is the first such point found by bisection).

It must not be used live: it reads the simulator's true model, which no real machine offers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from intune.knobs import Knob
from intune.monitor.observation import MEMORY_SAFE_FRACTION, Observation, memory_factor
from intune.policies.remote_sizing import REMOTE_MIN_GAIN
from intune.policies.safety import WORKER_CEILING
from intune.sim import model
from intune.sim.model import ModelParams
from intune.units import MB

_BISECTIONS = 60
OBJECTIVES = ("reward", "throughput", "reachable", "headroom")  # what ``search_optimum`` may maximise
_REWARD_TOLERANCE = 1e-7  # the reward's branch and bound stops when no interval can beat the best by more
_REWARD_PROBES = 400  # and never probes more targets than this (a guard; the tests never reach it)
HEADROOM_SPARE = 0.15  # the spare capacity the ``headroom`` objective gives every stage that can take it


@dataclass(frozen=True)
class Bounds:
    """Knob bounds per stage (buffer bounds are ignored where ``has_buffer`` is False)."""

    w_min: np.ndarray
    w_max: np.ndarray
    b_min: np.ndarray
    b_max: np.ndarray


def _stage_options(
    p: ModelParams, i: int, tau: float, w: np.ndarray, caps: np.ndarray, b_min: int, b_max: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each worker count ``w`` of stage ``i``: least buffer MB reaching ``tau`` and its memory (inf if none)."""
    v = p.variance_loss[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        need = tau / caps  # required buffer factor
    if not p.has_buffer[i]:
        f = 1.0 - v / (1.0 + p.queue_items[i])
        mem = w * p.worker_bytes[i] + p.queue_items[i] * p.bytes_per_item[i]
        return np.zeros_like(w), np.where(need <= f, mem, np.inf)
    bpi = p.bytes_per_item[i]
    f_of = lambda b: 1.0 - v / (1.0 + b * MB / bpi)  # noqa: E731
    with np.errstate(divide="ignore", invalid="ignore"):
        items = np.where(need < 1.0, v / (1.0 - need) - 1.0, np.inf)
        b = np.ceil(np.maximum(items, 0.0) * bpi / MB)
    b = np.clip(np.nan_to_num(b, nan=b_max, posinf=b_max), b_min, b_max)
    b = np.where(f_of(b) < need, np.minimum(b + 1, b_max), b)  # guard rounding at the boundary
    ok = f_of(b) >= need
    return b, np.where(ok, w * p.worker_bytes[i] + b * MB, np.inf)


def _strictly_below_prefix(m: np.ndarray) -> np.ndarray:
    """Mask of the entries less than every earlier one (the Pareto front of a weight-sorted list)."""
    return m < np.concatenate(([np.inf], np.minimum.accumulate(m)[:-1]))


class _Search:
    """The feasibility test of the module docstring, set up once per (model, CPUs, bounds, drift)."""

    def __init__(
        self,
        p: ModelParams,
        cpus: int,
        bounds: Bounds,
        cpu_mult: np.ndarray | float = 1.0,
        remote_rows: np.ndarray | None = None,
    ) -> None:
        n = p.n_stages
        self.p, self.bounds, self.cpus = p, bounds, cpus
        self.mult = np.broadcast_to(np.asarray(cpu_mult, dtype=float), (n,))
        self.remote = remote_rows
        self.ws = [
            np.arange(int(bounds.w_min[i]), max(int(bounds.w_min[i]), int(bounds.w_max[i])) + 1)
            for i in range(n)
        ]
        self.caps = [model.stage_capacity(_one(p, i), self.ws[i], self.mult[i]) for i in range(n)]
        # the rows/s remote workers add to each stage: its local part must reach tau - R_i
        self.offset = np.zeros(n) if remote_rows is None else np.asarray(remote_rows, dtype=float)
        c = p.cpu_s_per_row
        # each stage's weight in the oversubscription count by worker count (``model.stage_switching_workers``):
        # not decreasing in w
        self.weights = [model.stage_switching_workers(p, i, self.ws[i]) for i in range(n)]
        per_row = float(np.sum(c * self.mult))
        self.cpu_max = float(cpus) / per_row if per_row > 0 else float("inf")  # the CPU bound at eta = 1
        if remote_rows is not None:
            self.cpu_max = model.cpu_limited_rate(c * self.mult, float(cpus), remote_rows)
        self.cost = float(p.oversubscription_cost)
        self.base_mem = p.base_bytes + float(p.fixed_bytes.sum())
        # rate by worker count of the stages without a buffer knob (their queue is fixed),
        # made non-decreasing (searched by bisection)
        self.fixed_rates = [
            np.maximum.accumulate(self.caps[i] * model.buffer_factor(_one(p, i), np.zeros(1))[0])
            for i in range(n)
        ]
        self.tradeoff = [i for i in range(n) if p.has_buffer[i]]
        b_best = np.where(p.has_buffer, bounds.b_max, 0)
        top = min(
            float(self.caps[i].max() * model.buffer_factor(_one(p, i), b_best[i : i + 1])[0]) + float(self.offset[i])
            for i in range(n)
        )
        self.upper = min(top, self.cpu_max, p.demand if p.demand > 0 else np.inf)  # no allocation exceeds it

    def throughput(self, w: np.ndarray, b: np.ndarray) -> float:
        return model.throughput(self.p, w, b, self.cpus, self.mult, self.remote)

    def max_compute_workers(self, tau: float) -> float:
        """``Wc_max(tau)``: the most compute-wanting workers with ``eta(Wc) * C / sum c >= tau`` (-1: none)."""
        if tau > self.cpu_max:
            return -1.0
        if tau <= 0.0 or self.cost <= 0.0 or np.isinf(self.cpu_max):
            return float("inf")
        # eta >= e  <=>  1 + k * max(0, Wc / C - 1) <= 1 / e  <=>  Wc <= C * (1 + (1 / e - 1) / k)
        if self.remote is None:
            return self.cpus * (1.0 + (self.cpu_max / tau - 1.0) / self.cost)
        need = model.local_cpu_need(self.p.cpu_s_per_row * self.mult, tau, self.remote)
        if need <= 0.0:
            return float("inf")
        return self.cpus * (1.0 + (self.cpus / need - 1.0) / self.cost)

    def feasible(self, tau: float, budget: float) -> tuple[np.ndarray, np.ndarray] | None:
        """The least-memory allocation with every stage rate >= tau and the CPU bound >= tau, if its
        worst-case memory is within ``budget``; else None (step (3) of the module docstring)."""
        p = self.p
        room_w = self.max_compute_workers(tau)
        if room_w < 0:
            return None
        w_out, b_out = np.zeros(p.n_stages, dtype=int), np.zeros(p.n_stages, dtype=int)
        used_w, used_mem = 0.0, self.base_mem
        for i in range(p.n_stages):
            if p.has_buffer[i]:
                continue
            j = int(np.searchsorted(self.fixed_rates[i], tau - self.offset[i], side="left"))  # the least qualifying w
            if j == len(self.ws[i]):
                return None
            w_out[i] = int(self.ws[i][j])
            used_w += float(self.weights[i][j])
            used_mem += w_out[i] * p.worker_bytes[i] + p.queue_items[i] * p.bytes_per_item[i]
        room_w, room_mem = room_w - used_w, budget - used_mem
        if room_w < 0 or room_mem < 0:
            return None
        if not self.tradeoff:
            return w_out, b_out
        fronts = []  # per buffer stage: (stage, weights, memories, worker counts, buffer MB), its Pareto front
        for i in self.tradeoff:
            bounds = self.bounds
            b, mem = _stage_options(
                p, i, tau - float(self.offset[i]), self.ws[i], self.caps[i], int(bounds.b_min[i]), int(bounds.b_max[i])
            )
            wt = self.weights[i]
            keep = np.flatnonzero((mem < np.inf) & (mem <= room_mem) & (wt <= room_w))
            if len(keep) == 0:
                return None
            if wt[-1] <= 0.0:  # every option weighs 0: the least memory dominates
                keep = keep[[int(np.argmin(mem[keep]))]]
            else:  # the weight grows with w: keep the options lighter in memory than every lighter one
                keep = keep[_strictly_below_prefix(mem[keep])]
            fronts.append((i, wt[keep], mem[keep], self.ws[i][keep], b[keep]))
        least_w = sum(float(f[1][0]) for f in fronts)  # the least weight and memory the stages add
        least_m = sum(float(f[2][-1]) for f in fronts)  # (a front's memory falls as its weight grows)
        if least_w > room_w or least_m > room_mem:
            return None
        fronts.sort(key=lambda f: len(f[1]))
        # merge all but the last front into one front of sums; links recover each point's choices
        f_w, f_m = np.zeros(1), np.zeros(1)
        links = []
        rest_w, rest_m = least_w, least_m  # least costs of the stages not merged yet
        for _, wt, mem, _, _ in fronts[:-1]:
            rest_w -= float(wt[0])
            rest_m -= float(mem[-1])
            sw = (f_w[:, None] + wt[None, :]).ravel()
            sm = (f_m[:, None] + mem[None, :]).ravel()
            ok = np.flatnonzero((sw + rest_w <= room_w) & (sm + rest_m <= room_mem))
            if len(ok) == 0:
                return None
            order = ok[np.lexsort((sm[ok], sw[ok]))]  # by weight, then memory
            order = order[_strictly_below_prefix(sm[order])]
            f_w, f_m = sw[order], sm[order]
            links.append(np.divmod(order, len(wt)))  # (index in the previous front, option of this stage)
        # the last stage: each option with the least-memory front point its weight leaves room for
        i, wt, mem, ws, bs = fronts[-1]
        j = np.searchsorted(f_w, room_w - wt, side="right") - 1  # f_w ascends, f_m descends along it
        total = np.where(j >= 0, f_m[np.maximum(j, 0)] + mem, np.inf)
        g = int(np.argmin(total))
        if not total[g] <= room_mem:
            return None
        w_out[i], b_out[i] = int(ws[g]), int(bs[g])
        at = int(j[g])
        for k in range(len(fronts) - 2, -1, -1):
            prev, opt = links[k][0][at], links[k][1][at]
            i = fronts[k][0]
            w_out[i], b_out[i] = int(fronts[k][3][opt]), int(fronts[k][4][opt])
            at = int(prev)
        return w_out, b_out

    def maximise(
        self, budget: float, start: tuple[np.ndarray, np.ndarray, float] | None = None
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """The throughput optimum under ``budget``, by bisection on ``tau`` (the minimal allocation if
        nothing fits the budget); ``start``: an allocation known to fit it (the bisection starts there)."""
        p, bounds = self.p, self.bounds
        hi = self.upper
        found = self.feasible(hi, budget)
        if found is None:
            found = start[:2] if start is not None else self.feasible(0.0, budget)
            if found is None:
                w0, b0 = bounds.w_min.astype(int), np.where(p.has_buffer, bounds.b_min, 0).astype(int)
                return w0, b0, self.throughput(w0, b0)
            lo = self.throughput(*found)
            for _ in range(_BISECTIONS):
                if hi - lo <= 1e-10 * hi:
                    break
                mid = 0.5 * (lo + hi)
                got = self.feasible(mid, budget)
                if got is None:
                    hi = mid
                else:  # the witness may reach more than asked: go on from what it reaches
                    found, lo = got, max(mid, self.throughput(*got))
        w, b = found
        return w, b, self.throughput(w, b)


def optimal_allocation(
    p: ModelParams,
    cpus: int,
    bounds: Bounds,
    cpu_mult: np.ndarray | float = 1.0,
    memory_budget: float | None = None,
    remote_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(workers, buffer_mb, rows/s)`` maximising the model's throughput (see the module docstring);
    ``remote_rows``: each stage's remote capacity (rows/s), None without a remote pool.

    Every allocation within the knob bounds and the memory budget is a candidate, over-subscribed ones
    (more workers, or compute-wanting workers, than CPUs) included. ``memory_budget`` defaults to
    ``MEMORY_SAFE_FRACTION`` of the limit, where the reward starts to fall. If even the minimal allocation
    exceeds the budget, the minimal allocation is returned.
    """
    budget = MEMORY_SAFE_FRACTION * p.limit_bytes if memory_budget is None else memory_budget
    return _Search(p, cpus, bounds, cpu_mult, remote_rows).maximise(budget)


def reward_optimal_allocation(
    p: ModelParams,
    cpus: int,
    bounds: Bounds,
    cpu_mult: np.ndarray | float = 1.0,
    remote_rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(workers, buffer_mb, rows/s)`` maximising what the reward pays: rows/s times the memory factor
    of the allocation's worst-case memory (the oracle's objective).

    Where memory does not bind, that is ``optimal_allocation`` under ``MEMORY_SAFE_FRACTION`` of the limit
    (the factor is 1 up to there). Where it binds (a job whose own base takes most of its limit), a few
    more rows/s may be worth a lower factor: a branch and bound on the target rate (module docstring)
    finds the reward's optimum to relative ``_REWARD_TOLERANCE``.
    """
    limit = p.limit_bytes
    s = _Search(p, cpus, bounds, cpu_mult, remote_rows)
    safe = s.maximise(MEMORY_SAFE_FRACTION * limit)
    if limit <= 0:
        return safe
    fits = model.worst_case_memory(p, safe[0], safe[1]) <= limit
    top = s.maximise(limit, start=safe if fits else None)
    if top[2] <= safe[2] * (1 + 1e-9):
        return safe

    def paid(w: np.ndarray, b: np.ndarray, t: float) -> float:
        return t * memory_factor(model.worst_case_memory(p, w, b) / limit)

    best = max((safe, top), key=lambda a: paid(*a))
    best_paid = paid(*best)

    def probe(tau: float) -> tuple[float, float] | None:
        """``(M(tau), T)``: the least memory reaching ``tau`` and the rows/s of its witness, which keeps
        that memory up to ``T`` (None if nothing under the limit reaches ``tau``); keeps the best witness."""
        nonlocal best, best_paid
        got = s.feasible(tau, limit)
        if got is None:
            return None
        t = s.throughput(*got)
        pays = paid(*got, t)
        if pays > best_paid:
            best, best_paid = (got[0], got[1], t), pays
        return model.worst_case_memory(p, *got), max(t, tau)

    def bound(t2: float, m1: float) -> float:  # the most any tau in (t1, t2] pays if M(t1) = m1
        return t2 * memory_factor(m1 / limit)

    first = probe(safe[2]) or probe(safe[2] * (1 - 1e-9))  # (rounding may refuse the exact rate)
    if first is None:
        return best
    # intervals (t1, t2] of targets still open, M(t1) = m1, by their highest bound first
    heap = [(-bound(top[2], first[0]), first[1], top[2], first[0])]
    for _ in range(_REWARD_PROBES):
        if not heap:
            break
        neg, t1, t2, m1 = heapq.heappop(heap)
        if -neg <= best_paid * (1 + _REWARD_TOLERANCE):
            break
        mid = 0.5 * (t1 + t2)
        got = probe(mid)
        halves = [(t1, mid, m1)] + ([(got[1], t2, got[0])] if got is not None else [])
        for a, b, m in halves:
            if a < b and bound(b, m) > best_paid * (1 + _REWARD_TOLERANCE):
                heapq.heappush(heap, (-bound(b, m), a, b, m))
    return best


def fewest_remote_workers(
    p: ModelParams,
    cpus: int,
    bounds: Bounds,
    capacity: Callable[[int], np.ndarray],
    most: int,
    cpu_mult: np.ndarray | float = 1.0,
    min_gain: float = 0.0,
    memory_budget: float | None = None,
) -> tuple[int, float]:
    """``(remote workers, rows/s)``: the fewest remote workers (``0..most``) whose optimum reaches the
    target (module docstring, "Remote pools"), and that optimum's rows/s.

    ``capacity(r)``: each stage's remote capacity with ``r`` workers; ``min_gain``: the rows/s one more
    remote worker must add when the demand is unknown (``REMOTE_MIN_GAIN`` times one local worker's rate,
    ``remote_min_gain``). Optima are the throughput optima under ``memory_budget`` (default
    ``MEMORY_SAFE_FRACTION`` of the limit)."""
    budget = MEMORY_SAFE_FRACTION * p.limit_bytes if memory_budget is None else memory_budget
    memo: dict[int, float] = {}

    def best(r: int) -> float:
        if r not in memo:
            memo[r] = _Search(p, cpus, bounds, cpu_mult, capacity(r)).maximise(budget)[2]
        return memo[r]

    most = max(0, int(most))
    if most == 0:
        return 0, best(0)
    if p.demand > 0:
        target = min(p.demand, best(most)) * (1.0 - 1e-9)
        if best(0) >= target:
            return 0, best(0)
        lo, hi = 0, most  # best(lo) < target <= best(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if best(mid) >= target else (mid, hi)
        return hi, best(hi)

    def pays(r: int) -> bool:  # the (r+1)-th worker adds at least min_gain
        return best(r + 1) - best(r) >= min_gain

    if not pays(0):
        return 0, best(0)
    if pays(most - 1):
        return most, best(most)
    lo, hi = 0, most - 1  # pays(lo), not pays(hi): the answer is the first r that does not pay
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return hi, best(hi)


def remote_min_gain(p: ModelParams, stage: int, cpu_mult: np.ndarray | float = 1.0) -> float:
    """Rows/s one more remote worker of ``stage`` must add to pay (without a known demand):
    ``REMOTE_MIN_GAIN`` times what one local worker of that stage delivers at a full CPU."""
    mult = np.broadcast_to(np.asarray(cpu_mult, dtype=float), (p.n_stages,))
    one = model.stage_capacity(_one(p, stage), np.ones(1), mult[stage])[0]
    return REMOTE_MIN_GAIN * float(one)


def _one(p: ModelParams, i: int) -> ModelParams:
    """Stage ``i`` alone, as a one-stage ModelParams (for per-stage vectorised calls)."""
    sl = slice(i, i + 1)
    arrays = {
        k: getattr(p, k)[sl]
        for k in (
            "cpu_s_per_row",
            "io_s_per_row",
            "contention",
            "gil_fraction",
            "variance_loss",
            "rows_per_item",
            "bytes_per_item",
            "worker_bytes",
            "fixed_bytes",
            "queue_items",
            "has_buffer",
            "drift_amplitude",
            "drift_period_s",
            "switch_weight",
        )
    }
    return ModelParams(
        names=p.names[sl],
        **arrays,
        base_bytes=p.base_bytes,
        limit_bytes=p.limit_bytes,
        host_bytes=p.host_bytes,
        oversubscription_cost=p.oversubscription_cost,
        batch_size=p.batch_size,
        model_latency_s=p.model_latency_s,
    )


def bounds_from_knobs(names: tuple[str, ...], knobs: Mapping[str, Knob]) -> Bounds:
    w_min, w_max, b_min, b_max = [], [], [], []
    for s in names:
        wk, bk = knobs[f"{s}.workers"], knobs.get(f"{s}.buffer_mb")
        w_min.append(wk.min)
        w_max.append(wk.max)
        b_min.append(bk.min if bk else 0)
        b_max.append(bk.max if bk else 0)
    return Bounds(*(np.array(x, dtype=int) for x in (w_min, w_max, b_min, b_max)))


def headroom_allocation(
    p: ModelParams,
    cpus: int,
    bounds: Bounds,
    cpu_mult: np.ndarray | float = 1.0,
    remote_rows: np.ndarray | None = None,
    spare: float = HEADROOM_SPARE,
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(workers, buffer_mb, rows/s)``: the reward's optimum, with each stage given the fewest more
    workers that let it run ``1 + spare`` times the optimum's rows/s, stage by stage in pipeline order,
    where that keeps the rows/s (the CPUs' bound) and the worst-case memory within
    ``MEMORY_SAFE_FRACTION`` of the limit; a stage that cannot get there (capped by the GIL, its
    bound, or its contention) keeps the optimum's workers.

    Why: the reward's optimum is the least memory reaching the most rows/s, so each stage has just
    enough workers and is busy ~0.95-1.0 of the time there, as a stage one worker short is. A teacher
    that holds there labels "hold" in states a learner cannot tell from ones where it must grow, except
    by their history. With spare capacity a stage is busy at most ``1 / (1 + spare)`` of the time at
    the target, so a busy stage that can grow, with free CPUs, is labelled "grow"."""
    w, b, tau = reward_optimal_allocation(p, cpus, bounds, cpu_mult, remote_rows)
    if tau <= 0:
        return w, b, tau
    s = _Search(p, cpus, bounds, cpu_mult, remote_rows)
    budget = MEMORY_SAFE_FRACTION * p.limit_bytes if p.limit_bytes > 0 else np.inf
    w, b = w.copy(), b.copy()
    for i in range(p.n_stages):
        factor = float(model.buffer_factor(_one(p, i), b[i : i + 1])[0])  # a stage without a buffer knob: its queue
        reach = np.flatnonzero((s.ws[i] >= w[i]) & (s.caps[i] * factor >= (1.0 + spare) * tau - s.offset[i]))
        if not len(reach) or s.ws[i][reach[0]] == w[i]:
            continue
        trial = w.copy()
        trial[i] = s.ws[i][reach[0]]
        if s.throughput(trial, b) >= tau * (1.0 - 1e-9) and model.worst_case_memory(p, trial, b) <= budget:
            w = trial
    return w, b, s.throughput(w, b)


def search_optimum(
    sim, cpus: int, objective: str = "reward", margins: tuple[float, float] = (MEMORY_SAFE_FRACTION, 1.0),
    remote_workers: int | None = None,
) -> tuple[dict[str, int], float]:
    """The optimum for a ``Simulator`` on ``cpus`` at its current drift, as knob values, and its rows/s.

    ``objective="reward"``: the most reward (what the oracle policy holds and pretraining scales by).
    ``"throughput"``: the most rows/s of any allocation that cannot OOM (worst-case memory within the
    limit), which is what scores measure against: every allocation the runner may grant is a candidate,
    so no policy's ratio to it exceeds 1, whereas a policy may beat the reward's optimum in rows/s by
    running past the reward's memory margin.
    ``"headroom"``: the reward's optimum rows/s with spare capacity in every stage
    (``headroom_allocation``).
    ``"reachable"``: the most rows/s of any allocation a safety mask with ``margins`` ``(margin,
    ceiling)`` lets a policy reach: worst-case memory under ``margin`` of the limit, or, with every
    buffer at its minimum, under ``ceiling`` (past the margin the mask lets only workers grow).
    With a remote pool, the local optimum beside ``remote_workers`` remote workers (a teacher of the
    local knobs while another rule sizes the remote ones), by default beside the fewest that reach the
    target (``fewest_remote``).
    """
    p = sim.params
    bounds, mult = bounds_from_knobs(p.names, sim.knobs), sim.cpu_multipliers()
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    pool, remote, placed = sim.remote_pool, None, {}
    if pool is not None:  # the fewest remote workers first, then the local optimum beside them
        r = fewest_remote(sim, cpus)[0] if remote_workers is None else int(remote_workers)
        remote = sim.remote_capacity(r, mult)
        placed = {f"{p.names[pool.stage]}.remote_workers": r}
    limit = p.limit_bytes if p.limit_bytes > 0 else np.inf
    if objective == "reward":
        w, b, t = reward_optimal_allocation(p, cpus, bounds, mult, remote)
    elif objective == "headroom":
        w, b, t = headroom_allocation(p, cpus, bounds, mult, remote)
    elif objective == "throughput":
        w, b, t = optimal_allocation(p, cpus, bounds, mult, memory_budget=limit, remote_rows=remote)
    else:
        margin, ceiling = margins
        w, b, t = optimal_allocation(p, cpus, bounds, mult, memory_budget=margin * limit, remote_rows=remote)
        # past the margin, the mask lets only workers grow (to the ceiling), buffers at their minimum
        pinned = replace(bounds, b_max=bounds.b_min.copy())
        w2, b2, t2 = optimal_allocation(p, cpus, pinned, mult, memory_budget=ceiling * limit, remote_rows=remote)
        if t2 > t:
            w, b, t = w2, b2, t2
    alloc = {f"{s}.workers": int(w[i]) for i, s in enumerate(p.names)}
    alloc.update(placed)
    alloc.update(
        {f"{s}.buffer_mb": int(b[i]) for i, s in enumerate(p.names) if f"{s}.buffer_mb" in sim.knobs}
    )
    return alloc, t


def local_best_rows(spec) -> float:
    """The most rows/s a ``WorkloadSpec`` makes on its machine's CPUs alone: no remote worker, no
    consumer, no drift (the base of a demand stated as a multiple of what the trainer can preprocess)."""
    from intune.sim.simulator import Simulator
    from intune.sim.spec import workload_variant

    sim = Simulator(workload_variant(spec, name=spec.name, model_latency_s=0.0), noise=0.0)
    p = sim.params
    return float(optimal_allocation(p, spec.machine.cpus, bounds_from_knobs(p.names, sim.knobs))[2])


def fewest_remote(sim, cpus: int) -> tuple[int, float]:
    """For a ``Simulator`` with a remote pool, on ``cpus`` at its current drift and live nodes: the
    fewest remote workers reaching the oracle's target (``fewest_remote_workers``) and the rows/s."""
    pool = sim.remote_pool
    if pool is None:
        raise ValueError(f"{sim.spec.name}: no stage has a remote pool")
    p = sim.params
    bounds, mult = bounds_from_knobs(p.names, sim.knobs), sim.cpu_multipliers()
    return fewest_remote_workers(
        p, cpus, bounds, lambda r: sim.remote_capacity(r, mult), pool.cpus, mult, remote_min_gain(p, pool.stage, mult)
    )


REMOTE_REFRESH_TICKS = 5
"""With a remote pool the oracle searches again at least this often: the fewest remote workers move with
the drift, and between searches it would hold too few (or too many)."""


class OraclePolicy:
    """Sets the optimum at every CPU change and every ``refresh_ticks`` (drift; ``REMOTE_REFRESH_TICKS``
    at most with a remote pool); simulator only.

    It needs the simulator: pass ``OraclePolicy(sim=...)``, or let ``run_episode`` call
    ``bind_simulator(sim)`` (it does for any policy that has that method).
    """

    name = "oracle"

    def __init__(
        self,
        sim=None,
        refresh_ticks: int = 25,
        objective: str = "reward",
        margins: tuple[float, float] = (MEMORY_SAFE_FRACTION, 1.0),
    ) -> None:
        self.sim = sim
        self.refresh_ticks = refresh_ticks
        self.objective = objective  # as in search_optimum
        self.margins = margins

    def bind_simulator(self, sim) -> None:
        self.sim = sim

    def reset(self, knobs: Mapping[str, Knob], observation: Observation) -> None:
        if self.sim is None:
            raise RuntimeError(
                "the oracle reads the simulator's true model: build OraclePolicy(sim=...) "
                "or run it through intune.sim.run_episode"
            )
        self._knobs = knobs
        self._cpus: float | None = None
        self._pool: tuple[float, float, int | None] | None = None  # (remote CPUs, demand, remote workers) searched for
        self._since = 0
        self._target: dict[str, int] = {}

    def target(self, observation: Observation, remote_workers: int | None = None) -> dict[str, int]:
        """The optimum's knob values, searched again at a CPU change, a change of the remote pool's CPUs,
        of the demand or of ``remote_workers``, and every ``refresh_ticks`` calls. ``remote_workers``:
        the local optimum beside that many remote workers (``search_optimum``), not beside the fewest."""
        self._since += 1
        pool = (observation.remote_cpus, observation.demand, remote_workers)
        every = self.refresh_ticks if observation.remote_cpus <= 0 else min(self.refresh_ticks, REMOTE_REFRESH_TICKS)
        if observation.cpus != self._cpus or self._since >= every or pool != self._pool:
            self._target, _ = search_optimum(self.sim, int(observation.cpus), self.objective, self.margins,
                                             remote_workers=remote_workers)
            self._cpus, self._since, self._pool = observation.cpus, 0, pool
        return self._target

    def step(self, observation: Observation) -> dict[str, int]:
        return {k: v for k, v in self.target(observation).items() if self._knobs[k].value != v}


SAFE_REFRESH_TICKS = 5
"""How often the safe oracle searches again within a phase: it follows the drift nearly as closely as a
search a tick would (the 80 held-out specs: 0.9497 at 1 and at 5 at 150-tick phases, 0.9572 and 0.9571
at 60)."""


def safe_oracle(**kwargs) -> OraclePolicy:
    """The oracle held to the memory margins every policy's safety layer keeps (``objective="reachable"``:
    worst-case memory under ``MEMORY_SAFE_FRACTION`` of the limit, or with every buffer at its least
    under ``WORKER_CEILING``), searched again every ``SAFE_REFRESH_TICKS``: clairvoyant, it reads the
    simulator's model, so no policy held to those margins scores above it. It bounds what the targets
    can ask of a policy that never risks an OOM; ``oracle`` holds the reward's optimum instead."""
    policy = OraclePolicy(**{"refresh_ticks": SAFE_REFRESH_TICKS, "objective": "reachable",
                             "margins": (MEMORY_SAFE_FRACTION, WORKER_CEILING), **kwargs})
    policy.name = "oracle-safe"
    return policy
