"""PyTorch adapter: the engine's numpy batches as torch tensors, without copying where possible.

Owns the conversion of a batch (``dict[str, numpy.ndarray]``) to ``dict[str, torch.Tensor]`` and an
optional prefetch thread that pins host memory and starts the host-to-device copy ahead of the trainer.
Numeric columns become tensors with ``torch.from_numpy`` (the tensor shares the array's memory, which
may be read-only shared memory: the trainer must not write into input tensors in place, and does not).
Non-numeric columns (strings) stay numpy arrays. It must not know about models or pipelines' stages.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

_END = object()


def to_torch(
    batch: Mapping[str, np.ndarray],
    device: str | torch.device | None = None,
    pin_memory: bool = False,
    non_blocking: bool = True,
) -> dict[str, Any]:
    """Tensors sharing the arrays' memory (on CPU); pinned and/or copied to ``device`` if asked."""
    target = torch.device(device) if device is not None else None
    out: dict[str, Any] = {}
    for name, array in batch.items():
        array = np.asarray(array)
        if array.dtype.kind not in "biuf" or array.dtype.byteorder == ">":
            out[name] = array  # strings / objects stay numpy; torch has no tensor for them
            continue
        if not array.flags.writeable:
            with warnings.catch_warnings():  # read-only shared memory: we never write into it
                warnings.simplefilter("ignore", UserWarning)
                tensor = torch.from_numpy(array)
        else:
            tensor = torch.from_numpy(array)
        if pin_memory:
            tensor = tensor.pin_memory()
        if target is not None and target.type != "cpu":
            tensor = tensor.to(target, non_blocking=non_blocking and pin_memory)
        out[name] = tensor
    return out


class TorchBatches:
    """Iterate ``batches`` as tensor dicts, converting (and copying to ``device``) on a prefetch thread.

    ``prefetch=0`` converts inline in the consumer's thread (zero-copy, nothing to overlap on CPU).
    With ``prefetch > 0`` a daemon thread keeps up to ``prefetch`` converted batches ready; errors in
    the source reach the consumer with their original traceback. ``close()`` stops the thread.
    """

    def __init__(
        self,
        batches: Iterable[Mapping[str, np.ndarray]],
        device: str | torch.device | None = None,
        pin_memory: bool | None = None,
        prefetch: int | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        on_gpu = self.device.type == "cuda"
        self.pin_memory = on_gpu if pin_memory is None else bool(pin_memory)
        if self.pin_memory and not torch.cuda.is_available():
            raise ValueError("TorchBatches: pin_memory=True needs CUDA, which this torch build cannot use")
        self.prefetch = (2 if on_gpu else 0) if prefetch is None else int(prefetch)
        if self.prefetch < 0:
            raise ValueError(f"TorchBatches: prefetch must be >= 0, got {self.prefetch}")
        self._batches = batches
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _convert(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        out = to_torch(batch, self.device, self.pin_memory)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the copy is done before handing over
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.prefetch == 0:
            for batch in self._batches:
                yield self._convert(batch)
            return
        ready: queue.Queue[Any] = queue.Queue(maxsize=self.prefetch)
        self._stop.clear()

        def put(item: Any) -> bool:
            """Hand over ``item``; False once the consumer has gone (close())."""
            while not self._stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def fill() -> None:
            try:
                for batch in self._batches:
                    if not put(self._convert(batch)):
                        return
                put(_END)
            except BaseException as exc:  # handed to the consumer, raised there
                put(exc)

        self._thread = threading.Thread(target=fill, name="intune-torch-prefetch", daemon=True)
        self._thread.start()
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
