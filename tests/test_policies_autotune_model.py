"""tf.data's latency model (autotune_model) against hand-computed values."""

import itertools
import math

import pytest

from intune.policies.autotune_model import (
    BUFFER_SIZE,
    PARALLELISM,
    Node,
    Parameter,
    ReplanSchedule,
    hill_climb,
    input_times,
    maximum_buffered_bytes,
    optimization_times,
    output_time,
    output_times,
    p_buffer_empty,
    wait_time,
)


def test_wait_time_matches_the_mm1k_formula_by_hand():
    # producer slower than consumer: rho = consumer/producer = 1/2, n = 1: P = (1 - 1/2) / (1 - 1/4) = 2/3
    assert p_buffer_empty(2.0, 1.0, 1) == pytest.approx(2 / 3)
    assert wait_time(2.0, 1.0, 1) == pytest.approx(4 / 3)
    # consumer slower: rho = 2: P = (1 - 2) / (1 - 4) = 1/3; wait = 1/3 * producer
    assert p_buffer_empty(1.0, 2.0, 1) == pytest.approx(1 / 3)
    assert wait_time(1.0, 2.0, 1) == pytest.approx(1 / 3)
    # n = 3, rho = 1/4: (3/4) / (1 - 1/256)
    assert p_buffer_empty(4.0, 1.0, 3) == pytest.approx(0.75 / (1 - 1 / 256))
    # no buffer: the consumer always waits for the producer
    assert wait_time(3.0, 1.0, 0) == pytest.approx(3.0)
    assert wait_time(1.0, 3.0, 0) == pytest.approx(1.0)


def test_wait_time_equal_rates_limit_is_one_over_n_plus_one():
    # L'Hopital: (1 - rho) / (1 - rho^(n+1)) -> 1 / (n + 1) as rho -> 1, from both sides
    for n in (0, 1, 3, 10):
        assert p_buffer_empty(1.0, 1.0, n) == pytest.approx(1 / (n + 1))
        assert p_buffer_empty(1.0, 1.0 + 1e-7, n) == pytest.approx(1 / (n + 1), rel=1e-5)
        assert p_buffer_empty(1.0, 1.0 - 1e-7, n) == pytest.approx(1 / (n + 1), rel=1e-5)


def test_wait_time_edge_cases_and_no_overflow():
    assert wait_time(0.0, 5.0, 3) == 0.0  # infinitely fast producer: the buffer is always full
    assert wait_time(2.0, 0.0, 3) == 2.0  # infinitely fast consumer: always waits a whole production
    big = wait_time(1.0, 100.0, 5000)  # rho = 100, n = 5000: rho**5001 would overflow a float
    assert big == 0.0 or (0.0 <= big < 1e-300)
    assert math.isfinite(wait_time(100.0, 1.0, 5000)) and wait_time(100.0, 1.0, 5000) == pytest.approx(99.0)


def test_chain_input_and_output_times_by_hand():
    # read (1 s/elem, 1 worker) -> map (4 s/elem, parallelism 2); the consumer is infinitely fast
    chain = [Node("read", 1.0), Node("map", 4.0, parallelism=2)]
    # top-down: map's input time = (0 + 4/2) / 1 = 2; read's = (2 + 1/1) / 1 = 3
    assert input_times(chain) == pytest.approx([3.0, 2.0])
    # bottom-up: read = 1 (a source waits on nothing); map = 4/2 + wait(producer 1, consumer 2, n 2)
    # rho = 2: P = (1 - 2) / (1 - 8) = 1/7 -> map = 2 + 1/7
    assert output_times(chain) == pytest.approx([1.0, 2 + 1 / 7])
    assert output_time(chain) == pytest.approx(2 + 1 / 7)


def test_ratio_scales_producer_and_consumer_times():
    # a batch node consuming 4 elements per output: producer = 4 * read's output time (0.5) = 2;
    # consumer = 0 + 1/1 = 1; buffer = parallelism / ratio = 1/4; rho = 1/2
    chain = [Node("read", 0.5), Node("batch", 1.0, ratio=4.0)]
    expected_p = (1 - 0.5) / (1 - 0.5 ** 1.25)
    assert output_time(chain) == pytest.approx(1.0 + expected_p * 2.0)
    # a prefetch with an explicit buffer of 0 elements passes its producer's whole time through
    pre = [Node("map", 2.0), Node("prefetch", 0.0, buffer_size=0.0)]
    assert output_time(pre) == pytest.approx(0.0 + 2.0)


def test_maximum_buffered_bytes():
    chain = [Node("read", 1.0, parallelism=3, element_bytes=10), Node("batch", 1.0, ratio=2.0, parallelism=4, element_bytes=100),
             Node("prefetch", 0.0, buffer_size=5, element_bytes=100)]
    assert maximum_buffered_bytes(chain) == pytest.approx(3 * 10 + (4 / 2) * 100 + 5 * 100)


def test_hill_climb_picks_the_best_increment_until_the_ram_budget():
    # (1,1): map = 4 + wait(1, 4, 1) = 4.2; +read -> 4.0556; +map -> 2 + 1/7: map wins -> (1, 2),
    # then 30 bytes > 25: stop
    chain = [Node("read", 1.0, element_bytes=10), Node("map", 4.0, element_bytes=10)]
    params = [Parameter("read", PARALLELISM, 1, 2), Parameter("map", PARALLELISM, 1, 4)]
    assert hill_climb(chain, params, ram_budget=25) == {("read", PARALLELISM): 1, ("map", PARALLELISM): 2}
    # swap the costs: +read -> 2 + wait(2, 1, 1) = 2.333 beats +map -> 4.0068
    chain = [Node("read", 4.0, element_bytes=10), Node("map", 1.0, element_bytes=10)]
    assert hill_climb(chain, params, ram_budget=25) == {("read", PARALLELISM): 2, ("map", PARALLELISM): 1}
    # no RAM limit: the default algorithm (no CPU budget) takes everything to its maximum
    assert hill_climb(chain, params, ram_budget=math.inf) == {("read", PARALLELISM): 2, ("map", PARALLELISM): 4}


def test_hill_climb_starts_from_minimums_and_skips_useless_buffer_growth():
    # map (1 s) -> prefetch (buffer) -> a consumer node taking 0.9 s: rho = 0.9, so each extra element
    # of buffer gains less; the buffer grows only while a +1 gains more than 1 ns
    def chain(size):
        return [Node("map", 1.0, parallelism=7), Node("prefetch", 0.0, buffer_size=size, element_bytes=1),
                Node("train", 0.9)]

    params = [Parameter("prefetch", BUFFER_SIZE, 0, 10_000)]
    n = hill_climb(chain(50.0), params, ram_budget=math.inf)[("prefetch", BUFFER_SIZE)]
    assert 0 < n < 10_000

    def latency(size):
        return output_time(chain(size))

    assert latency(n - 1) - latency(n) > 1e-9 >= latency(n) - latency(n + 1)
    # at the root the consumer is modelled as infinitely fast (model input time 0): a buffer never helps
    root = [Node("map", 1.0), Node("prefetch", 0.0, buffer_size=0.0, element_bytes=1)]
    assert hill_climb(root, params, ram_budget=math.inf)[("prefetch", BUFFER_SIZE)] == 0


def test_hill_climb_rejects_unknown_nodes():
    with pytest.raises(ValueError, match="no node 'nope'"):
        hill_climb([Node("a", 1.0)], [Parameter("nope", PARALLELISM, 1, 2)], 1.0)


def test_optimization_period_doubles_from_10ms_to_a_minute():
    times = list(itertools.islice(optimization_times(0.0), 16))
    expected = [0, 0.02, 0.06, 0.14, 0.30, 0.62, 1.26, 2.54, 5.10, 10.22, 20.46, 40.94, 81.90, 141.90, 201.90, 261.90]
    assert times == pytest.approx(expected)


def test_replan_schedule_collapses_due_times_within_a_tick_and_never_resets():
    sched = ReplanSchedule(100.0)
    due = [t for t in range(100, 400) if sched.due(float(t))]
    assert due == [100, 101, 102, 103, 106, 111, 121, 141, 182, 242, 302, 362]
