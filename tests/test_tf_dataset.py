"""Pipeline.to_tf_dataset: element_spec, strings, a short last batch, model.fit, and early exits that
leave no worker process behind."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

import intune
from _processes import still_running

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

pytestmark = [  # Keras's own notes on any tf.data.Dataset of unknown length
    pytest.mark.filterwarnings("ignore:.*shuffle=True. was passed:UserWarning"),
    pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning"),
]

ROWS = 300


def chunks():
    out = []
    for start in range(0, ROWS, 100):
        ids = np.arange(start, start + 100)
        out.append(
            {
                "id": ids,
                "x": np.stack([ids % 7, ids % 5, ids % 3], axis=1).astype(np.float32),
                "y": (ids % 2).astype(np.float32),
                "tag": np.array([f"t{i % 4}".encode() for i in ids]),
                "name": np.array([f"é{i % 3}" for i in ids]),
                "note": np.array([f"n{i}" for i in ids], dtype=object),
            }
        )
    return out


def rows_pipeline(batch=64):
    """A process-mode map_rows pipeline (worker processes to leave behind, or not)."""

    def label_row(row):  # a local function travels by value: the workers do not import this module (and TF)
        return {"x": row["x"], "y": row["y"], "id": row["id"]}

    return intune.Pipeline.from_iterable(chunks()).map_rows(label_row, name="rows").batch(batch)


def test_element_spec_comes_from_the_pipeline_with_strings_and_a_short_last_batch():
    with intune.Pipeline.from_iterable(chunks()).batch(128) as pipe:
        ds = pipe.to_tf_dataset()
        spec = ds.element_spec
        assert spec["id"] == tf.TensorSpec((None,), tf.int64, name="id")
        assert spec["x"] == tf.TensorSpec((None, 3), tf.float32, name="x")
        assert {spec[k].dtype for k in ("tag", "name", "note")} == {tf.string}
        batches = list(ds)
    assert [len(b["id"]) for b in batches] == [128, 128, 44]  # the last one short
    got = np.concatenate([b["id"].numpy() for b in batches])
    assert got.tolist() == list(range(ROWS))  # the peeked first batch is not lost nor repeated
    last = batches[-1]
    assert (
        last["name"][0].numpy().decode() == f"é{256 % 3}" and last["tag"][1].numpy() == f"t{257 % 4}".encode()
    )
    assert last["note"][2].numpy() == b"n258"


def test_label_and_features_shape_the_elements_and_bad_names_are_named():
    with rows_pipeline() as pipe:
        ds = pipe.to_tf_dataset(label="y", features="x")
        assert ds.element_spec == (
            tf.TensorSpec((None, 3), tf.float32, name="x"),
            tf.TensorSpec((None,), tf.float32, name="y"),
        )
        x, y = next(iter(ds))
        assert x.shape == (64, 3) and y.shape == (64,)
    with rows_pipeline() as pipe:
        with pytest.raises(
            ValueError, match=r"no column\(s\) \['label'\]; the pipeline's batches have \['x', 'y', 'id'\]"
        ):
            pipe.to_tf_dataset(label="label")
        assert list(pipe)  # the peeked epoch was ended: the pipeline runs another one
    with intune.Pipeline.from_iterable([{"o": np.array([{1: 2}], dtype=object)}]) as pipe:
        with pytest.raises(TypeError, match=r"column 'o' is an object array of dict"):
            pipe.to_tf_dataset()
    with pytest.raises(ValueError, match=r"column\(s\) \['y'\] are both label and features"):
        rows_pipeline().to_tf_dataset(label="y", features=["x", "y"])


def test_a_given_element_spec_starts_no_epoch_and_an_empty_pipeline_asks_for_one():
    spec = {"id": tf.TensorSpec((None,), tf.int64)}
    with intune.Pipeline.from_iterable([{"id": np.arange(5)}]) as pipe:
        ds = pipe.to_tf_dataset(element_spec=spec)
        assert pipe.metrics().stages["read"].items == 0
        assert [b["id"].numpy().tolist() for b in ds] == [[0, 1, 2, 3, 4]]
    with intune.Pipeline.from_iterable([]) as pipe:
        with pytest.raises(
            ValueError, match="yielded no batch, so its element_spec cannot be learned; pass element_spec="
        ):
            pipe.to_tf_dataset()


def tiny_model():
    inp = keras.Input((3,), name="x")
    model = keras.Model({"x": inp}, keras.layers.Dense(1)(inp))
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_model_fit_trains_over_the_pipeline_for_several_epochs():
    with rows_pipeline() as pipe:
        ds = pipe.to_tf_dataset(label="y", features=["x"])
        history = tiny_model().fit(ds, epochs=2, verbose=0)
        assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))
        assert not pipe.closed  # two whole epochs: none of them ended early
        assert pipe.metrics().rows_out == 2 * ROWS


def test_breaking_out_closes_the_pipeline_and_its_worker_processes():
    pipe = rows_pipeline(batch=32)
    ds = pipe.to_tf_dataset(label="y", features=["x"])
    it = iter(ds)
    next(it)
    pids = pipe.stage("rows").worker_pids()
    assert pids
    del it  # what a break out of a for loop over the dataset does
    gc.collect()
    assert pipe.closed
    assert still_running(pids, within_s=10) == []
    with pytest.raises(
        Exception, match="the pipeline is closed: an earlier iterator of this dataset ended before"
    ):
        next(iter(ds))


def test_keras_stopping_an_epoch_early_leaves_no_worker_process():
    class StopAfterTwo(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                self.model.stop_training = True

    pipe = rows_pipeline(batch=16)
    ds = pipe.to_tf_dataset(label="y", features=["x"])
    tiny_model().fit(ds, epochs=3, verbose=0, callbacks=[StopAfterTwo()])
    pids = pipe.stage("rows").worker_pids()
    gc.collect()  # Keras keeps its iterator in a reference cycle
    assert pipe.closed
    assert still_running(pids, within_s=10) == []


def test_close_on_exit_false_keeps_the_pipeline_for_the_next_iteration():
    with rows_pipeline() as pipe:
        ds = pipe.to_tf_dataset(label="y", features=["x"], close_on_exit=False)
        for _ in ds.take(1):  # a peek at one element ends that iterator early
            pass
        gc.collect()
        assert not pipe.closed
        assert sum(len(y) for _, y in ds) == ROWS  # a whole epoch after it


def test_an_iterator_dropped_right_after_the_last_batch_is_not_an_early_exit():
    # Keras, from its second epoch on, takes exactly as many batches as the first epoch had and drops
    # the iterator without asking for one more; that epoch is whole, so the pipeline stays open
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # no read-ahead by tf.data itself
    with rows_pipeline(batch=100) as pipe:
        ds = pipe.to_tf_dataset(label="y", features=["x"]).with_options(options)
        it = iter(ds)
        assert sum(len(next(it)[1]) for _ in range(3)) == ROWS
        del it
        gc.collect()
        assert not pipe.closed
        assert sum(len(y) for _, y in ds) == ROWS
