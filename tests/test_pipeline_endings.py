"""Honest endings: only a fully delivered epoch ends with StopIteration; a stopped one says so."""

import threading
import warnings

import numpy as np
import pytest

import intune
from _exactly_once import assert_exactly_once, delivered_ids
from intune.pipeline import PipelineClosedError


def chunks(n_chunks: int = 80, rows: int = 1000) -> list[dict]:
    return [{"id": np.arange(i * rows, (i + 1) * rows)} for i in range(n_chunks)]


def slow_identity(chunk: dict) -> dict:
    threading.Event().wait(0.005)
    return chunk


def test_close_from_another_thread_mid_epoch_raises_instead_of_ending_quietly():
    pipe = intune.Pipeline.from_iterable(chunks()).map(slow_identity, name="udf").batch(1000)
    got: list[int] = []
    it = iter(pipe)
    for _ in range(5):
        got.append(len(next(it)["id"]))
    closer = threading.Thread(target=pipe.close)
    closer.start()
    closer.join(10)
    with pytest.raises(PipelineClosedError, match=r"closed.*not a whole epoch"):
        for batch in it:
            got.append(len(batch["id"]))
    assert sum(got) < 80_000
    with pytest.raises(PipelineClosedError):  # and it keeps saying so
        next(it)


def test_a_consumer_blocked_in_next_sees_the_close():
    def hang_after_first(chunk: dict) -> dict:
        if chunk["id"][0] >= 1000:
            threading.Event().wait(30)
        return chunk

    pipe = intune.Pipeline.from_iterable(chunks(5)).map(hang_after_first, name="udf")
    it = iter(pipe)
    next(it)
    timer = threading.Timer(0.5, pipe.close)
    timer.start()
    with pytest.raises(PipelineClosedError):
        next(it)
    timer.join()


def test_a_new_epoch_supersedes_the_running_one():
    pipe = intune.Pipeline.from_iterable(chunks(20)).map(slow_identity, name="udf")
    with pipe:
        first = iter(pipe)
        next(first)
        second = iter(pipe)
        with pytest.raises(PipelineClosedError, match="new epoch"):
            next(first)
        assert_exactly_once(delivered_ids(second), range(20_000))


def test_a_complete_epoch_ends_with_stop_iteration_every_time():
    pipe = intune.Pipeline.from_iterable(chunks(3))
    with pipe:
        it = iter(pipe)
        assert_exactly_once(delivered_ids(it), range(3000))
        with pytest.raises(StopIteration):
            next(it)


def test_closing_ones_own_iterator_is_not_an_error():
    pipe = intune.Pipeline.from_iterable(chunks(10))
    with pipe:
        it = iter(pipe)
        next(it)
        it.close()
        with pytest.raises(StopIteration):
            next(it)


def always_fails(chunk: dict) -> dict:
    raise ValueError("bad chunk")


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_an_epoch_emptied_by_skipping_warns_once_with_the_counts(mode):
    pipe = intune.Pipeline.from_iterable(chunks(6)).map(always_fails, name="udf", mode=mode, on_error="skip")
    with pipe, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(pipe) == []
    messages = [str(w.message) for w in caught if "delivered no rows" in str(w.message)]
    assert len(messages) == 1
    assert "stage 'udf' skipped 6" in messages[0]


def test_an_epoch_with_some_rows_left_does_not_warn():
    def fail_first(chunk: dict) -> dict:
        if chunk["id"][0] == 0:
            raise ValueError("bad")
        return chunk

    pipe = intune.Pipeline.from_iterable(chunks(3)).map(fail_first, name="udf", on_error="skip")
    with pipe, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_exactly_once(delivered_ids(pipe), range(1000, 3000))
