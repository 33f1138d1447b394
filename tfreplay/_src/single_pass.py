"""The deterministic pass, `as_dataset(single_deterministic_pass=True)`: pure functions of a buffer's parts.

Which windows exist is read when iteration starts; each element is read
under the buffer's lock when the iterator reaches it, and refused if a
writer has overwritten any of its items since (new items never pair with
old ids).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfreplay._src import write
from tfreplay._src.api import BufferInfo
from tfreplay._src.arrays.ops import TF_OPS
from tfreplay._src.backends import Backend
from tfreplay._src.index import episodes, ring
from tfreplay._src.parts import Parts

_OVERWRITTEN = (
    "as_dataset: a writer overwrote items of this single deterministic pass before it read them; "
    "pause writers during the pass, or use gather_all()."
)


def dataset(
    parts: Parts,
    backend: Backend,
    sample_batch_size: int | None,
    num_steps: int | None,
    num_parallel_calls: int | None,
    window_shift: int | None,
    drop_remainder: bool,
) -> tf.data.Dataset:
    """Every stored window once, in order; which windows exist is read when iteration starts.

    Ring windows: segment by segment (or `sample_batch_size` segments side
    by side), `num_steps` items shifted by `window_shift`. Through the
    episode index: every valid window whose end is a multiple of `num_steps`
    into its episode, in `gather_all` order. An element is read whole
    (`Backend.consistent`: under the NumPy lock; by TF without waiting, read
    again if a write tore it), and if a writer has overwritten
    any of its items since the pass began, reading it raises instead of
    pairing new items with old ids.
    """
    single = sample_batch_size is None
    if parts.window is None:
        if drop_remainder and sample_batch_size is not None and sample_batch_size > parts.num_segments:
            raise ValueError(
                f"as_dataset: sample_batch_size ({sample_batch_size}) must be at most batch_size "
                f"({parts.num_segments}) with dataset_drop_remainder=True, or every batch is dropped."
            )
        ds = _ring_pass(parts, backend, sample_batch_size, num_steps, window_shift, drop_remainder)
    else:
        n = num_steps or 1
        spec = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64))
        starts = tf.data.Dataset.range(1).flat_map(
            lambda _: tf.data.Dataset.from_tensor_slices(
                _snapshot(parts, backend, lambda: write.valid_starts(parts, n, True), spec)
            )
        )
        batched = starts.batch(sample_batch_size or 1, drop_remainder=bool(sample_batch_size) and drop_remainder)
        ds = batched.map(lambda s, t: (s, t, _pass_ids(parts, s, t, num_steps, single)))
    return ds.map(
        lambda s, t, ids: _element(parts, backend, s, t, ids, num_steps, single), num_parallel_calls=num_parallel_calls
    )


def _pass_ids(parts: Parts, segment: Any, t: Any, num_steps: int | None, single: bool) -> Any:
    ids = ring.window_rows(segment, t, num_steps, parts.max_length, parts.num_segments, TF_OPS)[1]
    return ids[0] if single else ids


def _ring_pass(
    parts: Parts, backend: Backend, sample_batch_size: int | None, num_steps: int | None, window_shift: Any, drop: bool
) -> tf.data.Dataset:
    """`(segment, start, ids)` of ring windows, TF-Agents' order."""
    size, segments, shift = parts.max_length, parts.num_segments, window_shift or num_steps

    def windows(ds: tf.data.Dataset, drop_last: bool) -> tf.data.Dataset:
        if num_steps is None:
            return ds
        return ds.window(num_steps, shift=shift).flat_map(lambda local: local.batch(num_steps, drop_last))

    def index_dataset(num_adds: tf.Tensor) -> tf.data.Dataset:
        min_id, num_live = ring.live_range(num_adds[0], size, TF_OPS)
        local = min_id + tf.range(num_live, dtype=tf.int64)
        if sample_batch_size is None:
            return tf.data.Dataset.range(segments).flat_map(
                lambda s: windows(tf.data.Dataset.from_tensor_slices(local), drop).map(lambda w: (s, w))
            )

        def group(segs: tf.Tensor) -> tf.data.Dataset:
            return windows(tf.data.Dataset.from_tensor_slices(local), True).map(lambda w: (segs, w))

        return tf.data.Dataset.range(segments).batch(sample_batch_size, drop).flat_map(group)

    num_adds = tf.data.Dataset.range(1).map(
        lambda _: _snapshot(parts, backend, lambda: parts.ops.read(parts.num_adds), tf.TensorSpec([segments], tf.int64))
    )

    def ids_of(s: tf.Tensor, local: tf.Tensor) -> tuple:
        if sample_batch_size is None or num_steps is None:
            ids = ring.local_to_rows(local, s, size, segments)[1]
        else:
            ids = ring.local_to_rows(local[None, :], s[:, None], size, segments)[1]
        return s, local, ids

    return num_adds.flat_map(index_dataset).map(ids_of)


def _element(
    parts: Parts, backend: Backend, segment: Any, t: Any, ids: Any, num_steps: int | None, single: bool
) -> tuple:
    """Reads one element of the deterministic pass by its ids, checking none was overwritten since."""
    storage, outer = parts.storage, ids.shape.as_list()

    def read(ids: Any) -> tuple:
        """`(whether every item is still live, items, the rows read, num_adds as read)`."""
        ops, length, segments = parts.ops, parts.max_length, parts.num_segments
        num_adds = ops.read(parts.num_adds)
        flat = ops.reshape(ids, [-1])
        seg, local = flat % segments, flat // segments
        if parts.window is None:
            ok = _still_live(parts, num_adds, seg, local, 1)
            rows = ring.local_to_rows(local, seg, length, segments)[0]
            items = tf.nest.map_structure(lambda x: ops.outer_reshape(x, ids), storage.read(rows, None, ops))
        else:
            if num_steps is not None:  # one (segment, start) per window
                seg, local = seg[::num_steps], local[::num_steps]
            ok = _still_live(parts, num_adds, seg, local, num_steps or 1)
            step_rows, _ = ring.window_rows(seg, local, num_steps, length, segments, ops)
            rows = storage.plan(seg, local, step_rows, num_steps, parts.pos_at, ops)
            items = storage.read(rows, num_steps, ops)
            if single:
                items = tf.nest.map_structure(lambda x: x[0], items)
        return ok, items, rows, num_adds

    out_specs = tf.nest.map_structure(lambda s: tf.TensorSpec(outer + s.shape.as_list(), s.dtype), storage.item_spec)

    def whole(ids: Any) -> Any:
        ok, items = backend.consistent(parts, lambda: _whole_read(read(ids)), "as_dataset")
        return backend.check(ok, items, _OVERWRITTEN)

    return backend.as_tensors(whole, [ids], out_specs), BufferInfo(ids=ids, probabilities=())


def _whole_read(read: tuple) -> tuple:
    ok, items, rows, num_adds = read
    return (ok, items), rows, num_adds


def _snapshot(parts: Parts, backend: Backend, fn: Any, out_specs: Any) -> Any:
    """`fn()` (reads of the state) from a call no write overlapped, as tensors (usable in a dataset map)."""
    read = lambda: (fn(), (), None)  # noqa: E731
    return backend.as_tensors(lambda: backend.consistent(parts, read, "as_dataset", strict=True), [], out_specs)


def _still_live(parts: Parts, num_adds: Any, segment: Any, t: Any, n: int) -> Any:
    """Whether windows at `t` show only items not overwritten since (the deterministic pass's check)."""
    ops = parts.ops
    min_id, _ = ring.live_range(ops.gather(num_adds, segment), parts.max_length, ops)
    window = parts.window or episodes.Shape()
    live = t - window.lead >= min_id
    if window.history:
        end = t + (n - 1)
        end_pos = parts.pos_at(ring.local_to_rows(end, segment, parts.max_length, parts.num_segments)[0])
        live = live & (ops.maximum(t - window.history, end - end_pos) >= min_id)
    return ops.all(live)
