"""Adapters from the engine's numpy batches to training frameworks: ``torch`` (tensors, pinned-memory
prefetch to the device) and ``tf`` (a ``tf.data.Dataset`` for Keras). Each imports its framework
lazily; they must not change the batches' content or order.
"""
