"""A sampling dataset that refuses, as an eager iterator starts, a buffer with nothing to draw.

Inside tf.data the same refusal is a graph assertion, which TF reports
wrapped in its pipeline's words (`Error in user-defined function passed to
MapDataset...`, and a `Local rendezvous is aborting` log line). Checked
before the iterator exists, the caller gets tfreplay's `EmptyBufferError`
alone. What still reaches the pipeline (a buffer emptied after the iterator
started, an iterator made inside `tf.function`) keeps TF's wrapping.

The wrapper is the same dataset (it shares the variant tensor, as TF's own
adapters do), so its element spec, options and cardinality are the
original's; a transformation of it (`map`, `batch`) is a plain dataset
without the check.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

try:  # tf.data's base for a dataset of its input's structure: not public API, so optional
    from tensorflow.python.data.ops.dataset_ops import UnaryUnchangedStructureDataset as _Unary
except ImportError:  # pragma: no cover (a TensorFlow without it: datasets go unchecked)
    _Unary = None  # type: ignore[assignment,misc]


def checked(dataset: tf.data.Dataset, check: Callable[[], None]) -> tf.data.Dataset:
    """`dataset`, whose eager `iter()` first calls `check()` (which raises to refuse)."""
    if _Unary is None:  # pragma: no cover
        return dataset
    return _Checked(dataset, check)


def like(source: tf.data.Dataset, derived: tf.data.Dataset) -> tf.data.Dataset:
    """`derived` (made from `source` by `map`, say), with `source`'s check if it has one."""
    check = getattr(source, "_check", None) if _Unary is not None and isinstance(source, _Checked) else None
    return derived if check is None else _Checked(derived, check)


if _Unary is not None:

    class _Checked(_Unary):  # type: ignore[misc,valid-type]
        def __init__(self, dataset: tf.data.Dataset, check: Callable[[], None]):
            self._check = check
            super().__init__(dataset, dataset._variant_tensor)

        def __iter__(self) -> Any:
            if tf.executing_eagerly():
                self._check()
            return super().__iter__()
