"""Ring arithmetic shared by the TF buffer and its NumPy twin.

A buffer has `num_segments` segments of `max_length` rows. The only state is
`num_adds`, how many items each segment has received since the last clear.
Item `i` of segment `s` (its *local id*) lives in storage row
`(i % max_length) * num_segments + s`: time-major, so one `add_batch` writes
`num_segments` contiguous rows. Its *global id*, reported in `BufferInfo.ids`,
is `i * num_segments + s`: the insertion order across the whole buffer.

The functions take an `ops` namespace (`NUMPY_OPS` or `TF_OPS`) so the same
arithmetic runs on NumPy arrays and on tensors (in graphs and under XLA).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import tensorflow as tf

NUMPY_OPS = types.SimpleNamespace(
    minimum=np.minimum,
    maximum=np.maximum,
    arange=lambda n: np.arange(n, dtype=np.int64),
    unstack=lambda x, axis: tuple(np.moveaxis(x, axis, 0)),
    probability=lambda shape, total: np.full(shape, 1.0 / total, np.float32),
)
TF_OPS = types.SimpleNamespace(
    minimum=tf.minimum,
    maximum=tf.maximum,
    arange=lambda n: tf.range(n, dtype=tf.int64),
    unstack=lambda x, axis: tuple(tf.unstack(x, axis=axis)),
    probability=lambda shape, total: tf.fill(shape, tf.math.divide_no_nan(1.0, tf.cast(total, tf.float32))),
)


def live_range(num_adds: Any, max_length: int, ops: Any) -> tuple[Any, Any]:
    """Returns `(min_id, num_live)`: the oldest live local id and how many live."""
    num_live = ops.minimum(num_adds, max_length)
    return num_adds - num_live, num_live


def num_windows(num_adds: Any, max_length: int, num_steps: int, ops: Any) -> Any:
    """Valid window starts per segment.

    A window of `num_steps` consecutive ids must lie inside the live range, so
    it never crosses the write head (never joins the newest item to the oldest).
    """
    _, num_live = live_range(num_adds, max_length, ops)
    return ops.maximum(num_live - num_steps + 1, 0)


def windows_from_draws(
    draws: Any,
    num_adds: Any,
    max_length: int,
    num_segments: int,
    num_steps: int | None,
    ops: Any,
) -> tuple[Any, Any]:
    """Maps uniform draws in `[0, num_segments * num_windows)` to windows.

    Returns `(rows, ids)`, shaped like `draws` plus a trailing time axis of
    `num_steps` (none when `num_steps is None`).
    """
    # Callers refuse an empty buffer first; XLA cannot, so a count of 0 maps
    # every draw to a defined row (and the sample's probability is 0).
    count = ops.maximum(num_windows(num_adds, max_length, num_steps or 1, ops), 1)
    min_id, _ = live_range(num_adds, max_length, ops)
    segment = draws // count
    local = min_id + draws % count
    if num_steps is not None:
        local = local[..., None] + ops.arange(num_steps)
        segment = segment[..., None]
    return local_to_rows(local, segment, max_length, num_segments)


def local_to_rows(local: Any, segment: Any, max_length: int, num_segments: int) -> tuple[Any, Any]:
    """Returns `(storage rows, global ids)` of local ids in their segments."""
    rows = (local % max_length) * num_segments + segment
    return rows, local * num_segments + segment


def all_rows(num_adds: Any, max_length: int, num_segments: int, ops: Any) -> tuple[Any, Any]:
    """Rows and ids of every live item, shaped `[num_segments, num_live]`."""
    min_id, num_live = live_range(num_adds, max_length, ops)
    local = (min_id + ops.arange(num_live))[None, :]
    segment = ops.arange(num_segments)[:, None]
    return local_to_rows(local, segment, max_length, num_segments)


def write_rows(num_adds: Any, num_new: int, max_length: int, num_segments: int, ops: Any) -> Any:
    """Rows written by adding `num_new` items to every segment, oldest first."""
    local = num_adds + ops.arange(num_new)
    rows, _ = local_to_rows(local[:, None], ops.arange(num_segments)[None, :], max_length, num_segments)
    return rows
