"""Batches to torch tensors: zero-copy, read-only memory, strings left alone, the prefetch thread."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

from intune.integrations.torch import TorchBatches, to_torch


def test_numeric_columns_share_memory_with_the_arrays() -> None:
    batch = {"dense": np.arange(12, dtype=np.float32).reshape(4, 3), "sparse": np.arange(4, dtype=np.int64)}
    out = to_torch(batch)
    assert out["dense"].data_ptr() == batch["dense"].ctypes.data
    assert out["sparse"].data_ptr() == batch["sparse"].ctypes.data
    assert out["dense"].shape == (4, 3) and out["sparse"].dtype == torch.int64


def test_read_only_shared_memory_converts_without_copy_or_warning() -> None:
    array = np.arange(5, dtype=np.float32)
    array.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = to_torch({"x": array})["x"]
    assert tensor.data_ptr() == array.ctypes.data and tensor.tolist() == [0, 1, 2, 3, 4]


def test_strings_stay_numpy() -> None:
    out = to_torch({"c": np.array(["a", "b"], dtype=object), "s": np.array([b"0a"]), "n": np.zeros(2)})
    assert isinstance(out["c"], np.ndarray) and isinstance(out["s"], np.ndarray)
    assert isinstance(out["n"], torch.Tensor)


@pytest.mark.parametrize("prefetch", [0, 3])
def test_batches_arrive_in_order_through_the_prefetch_thread(prefetch: int) -> None:
    source = [{"x": np.full(3, i, dtype=np.int64)} for i in range(10)]
    got = [int(b["x"][0]) for b in TorchBatches(source, prefetch=prefetch)]
    assert got == list(range(10))


def test_a_source_error_reaches_the_consumer() -> None:
    def source():
        yield {"x": np.zeros(2)}
        raise RuntimeError("stage 'udf' failed on rows 0-9")

    batches = iter(TorchBatches(source(), prefetch=2))
    next(batches)
    with pytest.raises(RuntimeError, match="stage 'udf' failed"):
        next(batches)


def test_close_stops_the_prefetch_thread() -> None:
    def endless():
        while True:
            yield {"x": np.zeros(2)}

    loader = TorchBatches(endless(), prefetch=2)
    it = iter(loader)
    next(it)
    it.close()  # the generator's finally closes the loader
    assert not any(t.name == "intune-torch-prefetch" and t.is_alive() for t in threading.enumerate())


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
        TorchBatches([], prefetch=-1)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
            TorchBatches([], pin_memory=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_copy_to_the_device() -> None:
    source = [{"x": np.arange(6, dtype=np.float32)} for _ in range(3)]
    out = list(TorchBatches(source, device="cuda"))
    assert all(b["x"].is_cuda and b["x"].cpu().tolist() == list(range(6)) for b in out)
