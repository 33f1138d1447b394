"""What a sample returns: `ReplaySample(info, data)`, with `SampleInfo` about the drawn item."""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf


class SampleInfo(NamedTuple):
    """About one drawn item, as it was when drawn.

    `key` identifies the item (for `update_priorities`), `probability` is the
    chance the sampler had of drawing it, `table_size` the items in the table,
    `priority` the item's priority and `times_sampled` its draws, this one
    included.
    """

    key: Any
    probability: Any
    table_size: Any
    priority: Any
    times_sampled: Any

    @classmethod
    def tf_dtypes(cls) -> SampleInfo:
        return cls(tf.uint64, tf.float64, tf.int64, tf.float64, tf.int32)

    @classmethod
    def tf_shapes(cls) -> SampleInfo:
        return cls(*[tf.TensorShape([]) for _ in range(5)])

    @classmethod
    def zeros(cls) -> SampleInfo:
        return cls(0, 0.0, 0, 0.0, 0)


class ReplaySample(NamedTuple):
    """A drawn item: its `info` and its `data` (nested as the table's signature, or flat without one)."""

    info: Any
    data: Any
