"""TensorFlow / Keras adapter: a ``Pipeline`` as a ``tf.data.Dataset`` (``Pipeline.to_tf_dataset``).

Owns the element structure (a dict of tensors, or ``(features, label)`` pairs for ``model.fit``), the
``element_spec`` (from the first batch unless given: numeric columns keep their dtype, string, bytes
and object-text columns become ``tf.string``; the batch dimension is ``None``, so a short last batch
fits), and the iterators' life: each iteration of the dataset is one epoch of the pipeline, fed by its
tuned stages; an iterator that ends early (a ``break``, ``take``, Keras stopping an epoch, or the
iterator being collected) ends its epoch and, with ``close_on_exit=True`` (the default), closes the
pipeline so that no worker process outlives it. TensorFlow is imported only here (the ``tf`` extra).
It must not know about stages or sources.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

_NO_TF = "to_tf_dataset needs TensorFlow: pip install 'intune[tf]' (tensorflow-cpu)"


def _tf() -> Any:
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise ImportError(f"{_NO_TF} ({exc})") from exc
    return tf


def column_spec(tf: Any, name: str, array: np.ndarray) -> Any:
    """The ``tf.TensorSpec`` of a batch column: ``(None, *row_shape)`` of its dtype (text: ``tf.string``)."""
    shape = (None, *array.shape[1:])
    kind = array.dtype.kind
    if kind in "SU":
        return tf.TensorSpec(shape, tf.string, name=name)
    if kind == "O":
        first = next(iter(array.flat), b"")
        if isinstance(first, (bytes, str)):
            return tf.TensorSpec(shape, tf.string, name=name)
        raise TypeError(
            f"to_tf_dataset: column {name!r} is an object array of {type(first).__name__}; TensorFlow "
            "takes numbers, bool, bytes or str (convert it in a map, or leave it out with features=[...])"
        )
    if kind not in "biufc":
        raise TypeError(
            f"to_tf_dataset: column {name!r} has dtype {array.dtype}, which TensorFlow has no tensor for "
            "(convert it in a map, or leave it out with features=[...])"
        )
    return tf.TensorSpec(shape, tf.as_dtype(array.dtype), name=name)


class _Layout:
    """Which columns go where in an element: all of them as a dict, or ``(features, label)``."""

    def __init__(self, label: str | Sequence[str] | None, features: str | Sequence[str] | None) -> None:
        self.label = label
        self.features = features
        self.label_names = [] if label is None else [label] if isinstance(label, str) else list(label)
        self.feature_names = (
            None if features is None else [features] if isinstance(features, str) else list(features)
        )
        both = set(self.label_names) & set(self.feature_names or ())
        if both:
            raise ValueError(f"to_tf_dataset: column(s) {sorted(both)} are both label and features")

    def check(self, columns: Sequence[str]) -> None:
        """Every named column exists (``ValueError`` listing the columns)."""
        wanted = self.label_names + list(self.feature_names or ())
        missing = [n for n in wanted if n not in columns]
        if missing:
            raise ValueError(
                f"to_tf_dataset: no column(s) {missing}; the pipeline's batches have {list(columns)}"
            )

    def split(self, batch: Mapping[str, Any]) -> Any:
        """One element of this layout from a batch (arrays or specs)."""
        names = self.feature_names
        if names is None:
            names = [n for n in batch if n not in self.label_names]
        x = batch[names[0]] if isinstance(self.features, str) else {n: batch[n] for n in names}
        if self.label is None:
            return x
        y = batch[self.label] if isinstance(self.label, str) else {n: batch[n] for n in self.label_names}
        return x, y


class _Feed:
    """The dataset's side of the pipeline: the peeked first epoch, and which iterator is the latest."""

    def __init__(self, pipe: Any, layout: _Layout, close_on_exit: bool) -> None:
        self.pipe = pipe
        self.layout = layout
        self.close_on_exit = close_on_exit
        self.peeked: tuple[Iterator[Any], Any] | None = None  # (epoch iterator, its first batch)
        self.latest = 0
        self.closed_early = False  # this dataset closed the pipeline after an early exit
        self._lock = threading.Lock()

    def peek(self) -> dict[str, np.ndarray]:
        """Run the first batch of an epoch (kept for the first iteration) to learn the columns."""
        it = iter(self.pipe)
        try:
            first = next(it)
        except StopIteration:
            raise ValueError(
                "to_tf_dataset: the pipeline's epoch yielded no batch, so its element_spec cannot be learned; "
                "pass element_spec="
            ) from None
        self.peeked = (it, first)
        return first

    def abandon(self) -> None:
        """End the peeked epoch (the dataset will not be made)."""
        peeked, self.peeked = self.peeked, None
        if peeked is not None:
            peeked[0].close()  # type: ignore[attr-defined]

    def generate(self) -> Iterator[Any]:
        """One epoch of elements (what ``from_generator`` calls for each iterator of the dataset)."""
        with self._lock:
            self.latest += 1
            token = self.latest
            peeked, self.peeked = self.peeked, None
        if peeked is None and self.closed_early and self.pipe.closed:
            raise ValueError(
                "to_tf_dataset: the pipeline is closed: an earlier iterator of this dataset ended before its "
                "epoch did (a break, take(), Keras stopping early), which closes the pipeline with "
                "close_on_exit=True; pass close_on_exit=False to keep it for later iterations"
            )
        it, ahead = peeked if peeked is not None else (iter(self.pipe), None)
        finished = False
        try:
            # one batch ahead, so that the epoch is known to be over before its last batch is handed
            # out: Keras drops an iterator right after the number of batches it counted in epoch 1,
            # without asking for more, and that is not an early exit
            for batch in it:
                if ahead is not None:
                    yield self.layout.split(ahead)
                ahead = batch
            finished = True
            if ahead is not None:
                yield self.layout.split(ahead)
        finally:
            if not finished:
                self._exit(it, token)

    def _exit(self, it: Any, token: int) -> None:
        """An iterator left before its end: end its epoch; close the pipeline if it is the latest."""
        close = getattr(it, "close", None)
        if close is not None:
            close()
        if self.close_on_exit and token == self.latest:
            self.closed_early = True
            self.pipe.close()


def to_tf_dataset(
    pipe: Any,
    label: str | Sequence[str] | None = None,
    features: str | Sequence[str] | None = None,
    element_spec: Any = None,
    close_on_exit: bool = True,
) -> Any:
    """``pipe`` as a ``tf.data.Dataset`` whose every iteration is one epoch of the pipeline.

    ``label``: a column name (elements are ``(features, label_tensor)``, for ``model.fit``) or several
    (``(features, {name: tensor})``); ``None`` gives a dict of every column. ``features``: the columns
    of the features part (default: every column but the label; one name gives a tensor, not a dict).
    ``element_spec``: the spec of that structure; without it the first batch is run now (an epoch
    starts here; the first iteration of the dataset continues it, so nothing is read twice) and the
    spec is read from it, with ``None`` as the batch dimension. ``close_on_exit``: an iterator that
    ends before its epoch does (a break, ``take``, Keras stopping early, the iterator being collected)
    closes the pipeline, so that its worker processes end at once; iterating the dataset again then
    raises, naming the closed pipeline. With ``False`` such an exit only ends its epoch (workers stay
    parked for the next iteration until ``pipe.close()``). Only the dataset's latest iterator closes the
    pipeline; one pipeline runs one epoch at a time, so two live iterators of one dataset do not mix.
    """
    tf = _tf()
    layout = _Layout(label, features)
    feed = _Feed(pipe, layout, bool(close_on_exit))
    if element_spec is None:
        first = feed.peek()
        try:
            layout.check(list(first))
            specs = {name: column_spec(tf, name, np.asarray(column)) for name, column in first.items()}
        except BaseException:
            feed.abandon()
            raise
        element_spec = layout.split(specs)
    return tf.data.Dataset.from_generator(feed.generate, output_signature=element_spec)
