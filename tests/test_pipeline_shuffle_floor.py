"""The user's shuffle window as a floor: no tuner may cut the shuffle buffer below it."""

import numpy as np
import pytest

import intune
from intune.policies import clamp_request


def test_the_shuffle_knob_cannot_go_below_the_floor():
    pipe = intune.Pipeline.from_iterable([{"id": np.arange(10)}]).shuffle(100, buffer_mb=64, min_buffer_mb=48)
    with pipe:
        knob = pipe.knobs["shuffle.buffer_mb"]
        assert (knob.min, knob.value) == (48, 64)
        with pytest.raises(ValueError, match=r"valid range is \[48, "):
            knob.set(16)
        assert clamp_request(pipe.knobs, {"shuffle.buffer_mb": 1}, cpus=2, memory_free_bytes=0).applied == {
            "shuffle.buffer_mb": 48
        }


def test_a_floor_above_the_window_is_refused():
    with pytest.raises(ValueError, match=r"min_buffer_mb = 65 is out of range, valid range is \[1, 64\]"):
        intune.Pipeline.from_iterable([{"id": np.arange(10)}]).shuffle(100, buffer_mb=64, min_buffer_mb=65)
