"""The engine's parts on their own: shuffle buffer, batcher, channel ordering and bounds."""

import threading
import time

import numpy as np
import pytest

from _exactly_once import assert_exactly_once
from intune.pipeline.batcher import Batcher
from intune.pipeline.channel import END, TIMEOUT, Channel, Item
from intune.pipeline.shuffle import ShuffleBuffer


def chunk(lo, hi):
    return {"id": np.arange(lo, hi), "sq": np.arange(lo, hi) ** 2}


def test_shuffle_buffer_fills_then_swaps_one_row_out_per_row_in():
    buf = ShuffleBuffer(np.random.default_rng(0), capacity=250)
    outs = [buf.add(chunk(i, i + 100)) for i in range(0, 1000, 100)]
    # 100, 200 held; the third chunk fills 50 slots and swaps 50 rows out; then 100 out per 100 in
    assert [sum(len(o["id"]) for o in out) for out in outs] == [0, 0, 50] + [100] * 7
    assert buf.size == 250
    rest = list(buf.drain(chunk_rows=64))
    assert [len(o["id"]) for o in rest] == [64, 64, 64, 58]
    rows = [o for out in outs for o in out] + rest
    assert_exactly_once(np.concatenate([o["id"] for o in rows]), range(1000))
    assert all(np.array_equal(o["id"] ** 2, o["sq"]) for o in rows)  # rows stay whole


def test_shuffle_buffer_shrinks_on_request_and_takes_oversized_chunks():
    buf = ShuffleBuffer(np.random.default_rng(1), capacity=500)
    assert buf.add(chunk(0, 400)) == []
    (out,) = buf.resize(150)
    assert len(out["id"]) == 250 and buf.size == 150
    (big,) = buf.add(chunk(400, 1000))  # 600 rows into a 150-row buffer
    assert len(big["id"]) == 600 and buf.size == 150
    ids = np.concatenate([out["id"], big["id"], *[o["id"] for o in buf.drain(100)]])
    assert_exactly_once(ids, range(1000))


def test_shuffle_buffer_never_copies_itself_while_filling_and_grows_once_when_raised():
    """Memory grows with the fill (pages of one array written), never by copying a growing buffer:
    a copy would briefly hold two buffers, enough for an OOM kill under a tight limit."""
    buf = ShuffleBuffer(np.random.default_rng(0), capacity=1000)
    buf.add(chunk(0, 10))
    arrays = {n: id(a) for n, a in buf._buf.items()}
    for lo in range(10, 3000, 10):
        buf.add(chunk(lo, lo + 10))
    assert {n: id(a) for n, a in buf._buf.items()} == arrays and buf.size == 1000
    buf.resize(1500)
    buf.add(chunk(3000, 3100))
    assert all(len(a) == 1500 for a in buf._buf.values()) and buf.size == 1100


def _resident_kib(address: int) -> int:
    """Resident KiB of the mapping that holds ``address`` (Linux /proc/self/smaps)."""
    inside, lines = False, open("/proc/self/smaps").read().splitlines()
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(ch in "0123456789abcdef-" for ch in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1])
    raise AssertionError("address not mapped")


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux smaps")
def test_shuffle_buffer_shrinks_in_place_and_gives_the_memory_back():
    """A shrink must not copy the rows it keeps to a new array (both would be resident at once, under
    memory pressure); the rows past the new capacity go back to the system, and no row is lost."""
    buf = ShuffleBuffer(np.random.default_rng(3), capacity=40_000)
    wide = lambda lo, hi: {"id": np.arange(lo, hi), "pay": np.ones((hi - lo, 64))}  # noqa: E731
    for lo in range(0, 40_000, 1000):
        buf.add(wide(lo, lo + 1000))
    before = {n: id(a) for n, a in buf._buf.items()}
    address = buf._buf["pay"].__array_interface__["data"][0]
    full = _resident_kib(address)  # 40,000 rows x 512 B: about 20 MB
    (out,) = buf.resize(10_000)
    assert {n: id(a) for n, a in buf._buf.items()} == before  # same arrays: nothing copied
    assert _resident_kib(address) < full * 0.3  # three quarters of the pages given back
    assert np.array_equal(buf._buf["pay"][: buf.size], np.ones((buf.size, 64)))  # the kept rows intact
    ids = np.concatenate([out["id"], *[o["id"] for o in buf.drain(5000)]])
    assert_exactly_once(ids, range(40_000))


def test_a_shrink_with_max_out_lets_rows_out_a_chunk_at_a_time_and_loses_none():
    """A shrink from 5,000 to 100 rows lets out at most 300 rows a call; rows that arrive meanwhile
    replace buffered ones (the buffer counts as full), and every row comes out exactly once."""
    buf = ShuffleBuffer(np.random.default_rng(5), capacity=5000)
    for lo in range(0, 5000, 100):
        buf.add(chunk(lo, lo + 100))
    out, lo, sizes = [], 5000, []
    while buf.size > 100:
        released = buf.resize(100, max_out=300)
        sizes += [len(c["id"]) for c in released]
        out += released
        out += buf.add(chunk(lo, lo + 100))
        lo += 100
    assert max(sizes) == 300 and buf.size == 100 and len(sizes) == 17  # 4,900 rows, 300 a call
    assert buf.resize(100, max_out=300) == []
    out += buf.drain(100)
    assert_exactly_once(np.concatenate([c["id"] for c in out]), range(lo))


def test_batcher_passes_whole_batches_without_copy_and_splits_the_rest():
    b = Batcher(100, drop_last=False)
    c = chunk(0, 100)
    ((same, _),) = b.add(c, None)
    assert same is c
    assert b.add(chunk(100, 160), None) == []
    ((batch, _),) = b.add(chunk(160, 250), None)
    assert batch["id"].tolist() == list(range(100, 200))
    ((tail, _),) = b.flush()
    assert tail["id"].tolist() == list(range(200, 250))
    assert b.nbytes == 0


def _item(n):
    return Item(n, None, 1, 1000)


def test_ordered_channel_releases_by_sequence_number_and_counts_bytes():
    stop = threading.Event()
    ch = Channel("t", stop, ordered=True, window=lambda: 3)
    for _ in range(3):
        assert ch.reserve(timeout=0.01)
    assert not ch.reserve(timeout=0.01)  # the window is full
    ch.put_at(2, [_item("c")])
    ch.put_at(1, [_item("b1"), _item("b2")])
    assert ch.get(timeout=0.01) is TIMEOUT  # entry 0 is still missing
    assert ch.bytes == 3000 and ch.items == 3
    ch.put_at(0, [])  # a skipped chunk: an empty entry keeps the order
    ch.finish(3)
    got = [ch.get() for _ in range(4)]
    assert [g[1].chunk for g in got[:3]] == ["b1", "b2", "c"] and got[3] is END
    assert [g[0] for g in got[:3]] == [0, 1, 2] and ch.bytes == 0


def test_byte_bounded_channel_blocks_the_producer_until_the_consumer_takes():
    stop = threading.Event()
    ch = Channel("t", stop, ordered=True, max_bytes=lambda: 2500)
    ch.put([_item(0)])
    ch.put([_item(1)])
    done = threading.Event()
    producer = threading.Thread(target=lambda: (ch.put([_item(2)]), done.set()))
    producer.start()
    time.sleep(0.1)
    assert not done.is_set() and ch.bytes == 2000
    assert ch.get()[1].chunk == 0
    producer.join(timeout=2)
    assert done.is_set() and ch.bytes == 2000


def test_a_stopped_channel_wakes_its_waiters():
    from intune.pipeline.channel import Stopped

    stop = threading.Event()
    ch = Channel("t", stop)
    errors = []

    def wait():
        try:
            ch.get()
        except Stopped:
            errors.append("stopped")

    t = threading.Thread(target=wait)
    t.start()
    stop.set()
    ch.wake_all()
    t.join(timeout=1)
    assert errors == ["stopped"]


@pytest.mark.parametrize("n", [1, 7])
def test_fifo_channel_hands_out_in_arrival_order(n):
    stop = threading.Event()
    ch = Channel("t", stop, ordered=False, window=lambda: n)
    ch.reserve(0.01)
    ch.put_at(5, [_item("late-seq-first")])
    assert ch.get(timeout=0.01)[1].chunk == "late-seq-first"
