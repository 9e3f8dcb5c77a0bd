"""tf.data's analytical latency model, its hill-climbing optimiser and its re-planning schedule, as pure functions.

Re-derived (read, not copied) from TensorFlow's ``tensorflow/core/framework/model.cc``:

- ``Node::ComputeWaitTime``: the expected time a consumer waits on a finite buffer, modelled as an
  M/M/1/K queue: ``wait = P(buffer empty) * producer_time`` with ``P = (1 - rho) / (1 - rho**(n + 1))``
  where ``rho = consumer_time / producer_time`` (the producer fills the buffer at rate 1/producer_time,
  the consumer drains it at rate 1/consumer_time) and ``n`` the buffer size in elements. The ``rho == 1``
  limit is ``1 / (n + 1)`` (L'Hopital on numerator and denominator in ``rho``).
- ``AsyncKnownRatio::InputTimeLocked`` / ``OutputTimeLocked``: input times are computed top-down (root
  first) and output times bottom-up (sources first). For an asynchronous node with self time ``s`` per
  output element, parallelism ``p`` and ratio ``r`` (input elements per output element):
  ``input_time = (inherited_input_time + s / p) / r``; ``consumer_time = inherited_input_time + s / p``;
  ``producer_time = r * sum(output times of inputs)``; buffer size ``p / r`` for a parallel node (or its
  own ``buffer_size`` parameter for a prefetch-like node); ``output_time = s / p + wait``.
- ``Model::OptimizeHillClimbHelper`` with the stop rule of ``OptimizeMaxParallelism``, which is what
  ``AutotuneAlgorithm::DEFAULT`` runs in current TensorFlow: every tunable parameter starts at its
  minimum, then the one whose +1 most reduces the modelled output time is incremented (a buffer-size
  parameter only if it gains more than ``kBufferSizeMinDelta`` = 1 ns), until every parameter is at
  its maximum or the maximum buffered bytes exceed the RAM budget. The CPU budget is not consulted.
- ``Model::OptimizeLoop``: the first optimisation runs at once, then the period starts at
  ``kOptimizationPeriodMinMs`` = 10 ms and doubles after every optimisation up to
  ``kOptimizationPeriodMaxMs`` = 60 s; it is never reset.

Times are seconds here (TensorFlow uses nanoseconds; the 1 ns threshold is kept as 1e-9 s).
Pipelines are chains, listed source first and root (the stage the consumer reads) last.
This module owns the arithmetic only: it must not read observations or knobs (``autotune.py`` maps
those onto nodes and parameters).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

PARALLELISM = "parallelism"
BUFFER_SIZE = "buffer_size"
BUFFER_SIZE_MIN_DELTA_S = 1e-9  # kBufferSizeMinDelta: 1 ns
OPTIMIZATION_PERIOD_MIN_S = 0.010  # kOptimizationPeriodMinMs
OPTIMIZATION_PERIOD_MAX_S = 60.0  # kOptimizationPeriodMaxMs


# ------------------------------------------------------------------------------------ the buffer model

def p_buffer_empty(producer_time: float, consumer_time: float, buffer_size: float) -> float:
    """Probability that a consumer finds a buffer of ``buffer_size`` elements empty (M/M/1/K).

    ``rho = consumer_time / producer_time``; ``P = (1 - rho) / (1 - rho**(n+1))``, ``1 / (n+1)`` at
    ``rho == 1``, 0 for an infinitely fast producer, 1 for an infinitely fast consumer. The two
    ``rho != 1`` branches are the same formula arranged so that no power overflows.
    """
    if producer_time <= 0.0:
        return 0.0
    if consumer_time <= 0.0:
        return 1.0
    n = max(0.0, buffer_size)
    if consumer_time == producer_time:
        return 1.0 / (n + 1.0)
    if consumer_time > producer_time:
        # rho > 1: multiply through by (1/rho)**(n+1) to keep the powers below 1
        inv = producer_time / consumer_time
        inv_pow = inv**n
        return inv_pow * (1.0 - inv) / (1.0 - inv_pow * inv)
    rho = consumer_time / producer_time
    return (1.0 - rho) / (1.0 - rho ** (n + 1.0))


def wait_time(producer_time: float, consumer_time: float, buffer_size: float) -> float:
    """Expected wait of a consumer on the buffer: ``P(empty) * producer_time`` (``ComputeWaitTime``)."""
    return p_buffer_empty(producer_time, consumer_time, buffer_size) * max(0.0, producer_time)


# ------------------------------------------------------------------------------------- the node model

@dataclass(frozen=True)
class Node:
    """One asynchronous tf.data node (``AsyncKnownRatio``): a parallel map/batch, or a prefetch.

    ``buffer_size`` None means the buffer follows the parallelism (``parallelism / ratio`` elements, as
    for ParallelMap/ParallelBatch); a number is an explicit buffer (PrefetchDataset's ``buffer_size``).
    """

    name: str
    self_time: float  # wall seconds per output element (tf.data's self processing time)
    ratio: float = 1.0  # input elements consumed per output element; 0 = a source
    parallelism: float = 1.0
    buffer_size: float | None = None
    element_bytes: float = 0.0  # average bytes of an output element

    def buffer_elements(self, parallelism: float | None = None, buffer_size: float | None = None) -> float:
        """Elements the node buffers (``MaximumBufferedBytes`` / element size)."""
        p = self.parallelism if parallelism is None else parallelism
        b = self.buffer_size if buffer_size is None else buffer_size
        if b is not None:
            return b
        return p / self.ratio if self.ratio > 0 else p


def _times(
    chain: Sequence[Node], par: Sequence[float], buf: Sequence[float | None], model_input_time: float
) -> tuple[list[float], list[float]]:
    """Input times (top-down) and output times (bottom-up) for parameter values ``par``/``buf``."""
    n = len(chain)
    inputs = [0.0] * n
    inherited = model_input_time
    for i in range(n - 1, -1, -1):  # root first
        node = chain[i]
        own = node.self_time / par[i]
        inputs[i] = (inherited + own) / node.ratio if node.ratio > 0 else inherited + own
        inherited = inputs[i]
    outputs = [0.0] * n
    for i in range(n):  # sources first
        node = chain[i]
        own = node.self_time / par[i]
        if node.ratio > 0:
            consumer = inputs[i] * node.ratio
            producer = node.ratio * outputs[i - 1] if i > 0 else 0.0
        else:
            consumer, producer = inputs[i], 0.0
        size = buf[i] if buf[i] is not None else (par[i] / node.ratio if node.ratio > 0 else par[i])
        outputs[i] = own + wait_time(producer, consumer, size)
    return inputs, outputs


def input_times(chain: Sequence[Node], model_input_time: float = 0.0) -> list[float]:
    """Per node, the time between two requests it makes to its input (index-aligned with ``chain``)."""
    return _times(chain, [nd.parallelism for nd in chain], [nd.buffer_size for nd in chain], model_input_time)[0]


def output_times(chain: Sequence[Node], model_input_time: float = 0.0) -> list[float]:
    """Per node, the modelled time to produce one output element (index-aligned with ``chain``)."""
    return _times(chain, [nd.parallelism for nd in chain], [nd.buffer_size for nd in chain], model_input_time)[1]


def output_time(chain: Sequence[Node], model_input_time: float = 0.0) -> float:
    """The pipeline's modelled output latency: the root's output time (0 for an empty chain)."""
    return output_times(chain, model_input_time)[-1] if chain else 0.0


def maximum_buffered_bytes(chain: Sequence[Node]) -> float:
    """``TotalMaximumBufferedBytes``: buffered elements times element size, summed over the nodes."""
    return sum(nd.buffer_elements() * nd.element_bytes for nd in chain)


# ------------------------------------------------------------------------------------ the optimiser

@dataclass(frozen=True)
class Parameter:
    """A tunable parameter of node ``node``: ``PARALLELISM`` or ``BUFFER_SIZE``, within [min, max]."""

    node: str
    name: str
    min: float
    max: float


def hill_climb(
    chain: Sequence[Node],
    parameters: Sequence[Parameter],
    ram_budget: float,
    model_input_time: float = 0.0,
) -> dict[tuple[str, str], float]:
    """tf.data's default optimisation: greedy +1 steps from the minimums (MAX_PARALLELISM stop rule).

    Parameters are tried in the order given (tf.data collects them sources first), ties going to the
    first. Stops when every parameter is at its maximum, when the maximum buffered bytes exceed
    ``ram_budget`` (checked before each step, so the last step may overshoot, as in tf.data) or when no
    parameter qualifies. Returns ``{(node, parameter name): value}``.
    """
    index = {nd.name: i for i, nd in enumerate(chain)}
    for p in parameters:
        if p.node not in index:
            raise ValueError(f"parameter {p.node}.{p.name}: no node {p.node!r} in the chain {list(index)}")
        if p.name not in (PARALLELISM, BUFFER_SIZE):
            raise ValueError(f"parameter {p.node}.{p.name}: name must be {PARALLELISM!r} or {BUFFER_SIZE!r}")
    par = [nd.parallelism for nd in chain]
    buf: list[float | None] = [nd.buffer_size for nd in chain]
    for p in parameters:
        _assign(par, buf, index[p.node], p.name, p.min)

    def buffered_bytes() -> float:
        return sum(nd.buffer_elements(par[i], buf[i]) * nd.element_bytes for i, nd in enumerate(chain))

    def current(p: Parameter) -> float:
        i = index[p.node]
        return par[i] if p.name == PARALLELISM else float(buf[i] or 0.0)

    while True:
        now = _times(chain, par, buf, model_input_time)[1][-1]
        if all(current(p) >= p.max for p in parameters) or buffered_bytes() > ram_budget:
            break
        best_delta, best = -1e-9, None  # tf.data starts at -1 (ns)
        for p in parameters:
            value = current(p)
            if value >= p.max:
                continue
            i = index[p.node]
            _assign(par, buf, i, p.name, value + 1)
            delta = now - _times(chain, par, buf, model_input_time)[1][-1]
            _assign(par, buf, i, p.name, value)
            if delta > best_delta and (delta > BUFFER_SIZE_MIN_DELTA_S or p.name != BUFFER_SIZE):
                best_delta, best = delta, p
        if best is None:
            break
        _assign(par, buf, index[best.node], best.name, current(best) + 1)
    return {(p.node, p.name): current(p) for p in parameters}


def _assign(par: list[float], buf: list[float | None], i: int, name: str, value: float) -> None:
    if name == PARALLELISM:
        par[i] = value
    else:
        buf[i] = value


def with_values(chain: Sequence[Node], values: Mapping[tuple[str, str], float]) -> list[Node]:
    """The chain with parameter values applied (to evaluate a plan)."""
    out = []
    for nd in chain:
        p = values.get((nd.name, PARALLELISM), nd.parallelism)
        b = values.get((nd.name, BUFFER_SIZE), nd.buffer_size)
        out.append(Node(nd.name, nd.self_time, nd.ratio, p, b, nd.element_bytes))
    return out


# ------------------------------------------------------------------------------- re-planning schedule

def optimization_times(start_s: float) -> Iterator[float]:
    """When ``Model::OptimizeLoop`` optimises: at ``start_s``, then after 20 ms, 40 ms, ... capped at 60 s.

    The period starts at 10 ms and doubles after each optimisation, so the first wait is 20 ms.
    """
    t, period = start_s, OPTIMIZATION_PERIOD_MIN_S
    while True:
        yield t
        period = min(period * 2, OPTIMIZATION_PERIOD_MAX_S)
        t += period


class ReplanSchedule:
    """Tells, at observation times, whether an optimisation fell due since the last call.

    Several optimisations that fall due within one tick collapse into one (they would see the same
    measurements); the schedule still advances through all of them, so the doubling is never reset.
    """

    def __init__(self, start_s: float) -> None:
        self._times = optimization_times(start_s)
        self.next_s = next(self._times)

    def due(self, now_s: float) -> bool:
        if now_s + 1e-9 < self.next_s:
            return False
        while self.next_s <= now_s + 1e-9:
            self.next_s = next(self._times)
        return True


__all__ = [
    "BUFFER_SIZE",
    "PARALLELISM",
    "Node",
    "Parameter",
    "ReplanSchedule",
    "hill_climb",
    "input_times",
    "maximum_buffered_bytes",
    "optimization_times",
    "output_time",
    "output_times",
    "p_buffer_empty",
    "wait_time",
    "with_values",
]
