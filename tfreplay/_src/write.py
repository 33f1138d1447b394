"""Writes, clears and whole-buffer reads, as pure functions of a buffer's parts (run under its lock).

`write` appends items to segments: the rows they land in, the episode index
(each new row's `pos`, its bin, the bin of the live row it overwrites, each
segment's newest item), the sampler's rows. Reads come first, then every
write, then the counters move, then the sampler's rows: a priority update
that takes no buffer lock (the TF twin's compiled one) then finds an
overwritten item stale before its row gets the new item's priority. The
writes are the steps of one `ops.commit`, each assigning values computed
before the first, so a NumPy write an exception (Ctrl-C) interrupts anywhere
is whole or undone (see `ops._np_commit`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src.arrays.ops import NUMPY_OPS
from tfreplay._src.index import episodes, ring
from tfreplay._src.parts import Parts

PRIORITIES_RULE = (
    "update_priorities: every priority must be finite and non-negative, and small enough that priority ** alpha "
    "summed over every row stays finite; nothing was updated."
)


def priority_dtypes(ids_dtype: Any, priorities_dtype: Any) -> None:
    """Ids must be integers and priorities real numbers; `TypeError` naming the dtype otherwise."""
    ids_dtype, priorities_dtype = tf.as_dtype(ids_dtype), tf.as_dtype(priorities_dtype)
    if not ids_dtype.is_integer:
        raise TypeError(
            f"update_priorities: ids ({ids_dtype.name}) must be integers: the BufferInfo.ids of a sample "
            "(a float id would name another item once truncated)."
        )
    if not (priorities_dtype.is_floating or priorities_dtype.is_integer):
        raise TypeError(f"update_priorities: priorities ({priorities_dtype.name}) must be real numbers (any float).")


def check_priorities(ids_shape: Any, priorities_shape: Any, values: Any, limit: float = np.inf) -> None:
    """Refuses priorities of another shape than their ids, or (when known) negative, NaN or infinite ones, or
    ones above `limit` (the largest whose `priority ** alpha` keeps the sum tree's sums finite)."""
    if tuple(ids_shape) != tuple(priorities_shape):
        raise ValueError(
            f"update_priorities: priorities (shape {tuple(priorities_shape)}) must have the shape of ids "
            f"({tuple(ids_shape)}), one priority per id."
        )
    if values is not None:
        values = np.asarray(values, np.float64)
        bad = ~np.isfinite(values) | NUMPY_OPS.negative(values) | (values > limit)
        if bad.any():
            bound = f" and at most {limit:.4g} (larger ones overflow the sum of priority ** alpha)" * (limit < np.inf)
            raise ValueError(
                f"update_priorities: priorities ({values[bad][:3].tolist()} among them) must be finite and "
                f"non-negative{bound}; nothing was updated."
            )


def numpy_priorities(ids: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """A NumPy buffer's `update_priorities` arguments as int64 ids and float64 priorities; `TypeError` for graph
    tensors, non-integer ids and non-numeric priorities, `ValueError` for ids past int64."""
    arrays = []
    for name, value in (("ids", ids), ("priorities", priorities)):
        if isinstance(value, (tf.Tensor, tf.Variable)):
            if not tf.executing_eagerly():
                raise TypeError(
                    f"update_priorities: {name} is a graph tensor; a NumPy buffer stores values, so call it eagerly "
                    "(inside tf.function, use TFPrioritizedReplayBuffer)."
                )
            value = value.numpy()
        arrays.append(np.asarray(value))
    ids, values = arrays
    if ids.dtype == object or values.dtype == object:  # Python ints past 64 bits, or mixed values
        raise TypeError("update_priorities: ids and priorities must be numeric arrays (ids within int64).")
    priority_dtypes(ids.dtype, values.dtype)
    if ids.dtype == np.uint64 and ids.size and ids.max() > np.iinfo(np.int64).max:
        raise ValueError(f"update_priorities: ids ({int(ids.max())} among them) must be within int64.")
    return ids.astype(np.int64, copy=False), values.astype(np.float64, copy=False)


def tensor_priorities(ids: Any, priorities: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """A TF buffer's `update_priorities` arguments as int64 and float64 tensors (`TypeError` as `priority_dtypes`)."""
    ids, priorities = tf.convert_to_tensor(ids), tf.convert_to_tensor(priorities)
    priority_dtypes(ids.dtype, priorities.dtype)
    return tf.cast(ids, tf.int64), tf.cast(priorities, tf.float64)


def write(parts: Parts, leaves: list, num_new: int, segments: Any = None) -> Any:
    """Appends `num_new` items to each segment (or each of `segments`), oldest first; returns the counters.

    Leaves are time-major, `[num_new * number of segments, ...]`: one
    lockstep add is `[batch_size, ...]` as given. Only the newest
    `max_length` of a segment's items survive.
    """
    ops, length, num_segments = parts.ops, parts.max_length, parts.num_segments
    skip = max(num_new - length, 0)
    adds = ops.read(parts.num_adds)
    n = adds if segments is None else ops.gather(adds, segments)
    seg = ops.arange(num_segments) if segments is None else segments
    if num_new == 1:  # the usual add: one item per segment, no time axis to build
        local = n
        rows, _ = ring.local_to_rows(n, seg, length, num_segments)
    else:
        local = n[None, :] + skip + ops.arange(num_new - skip)[:, None]
        rows, _ = ring.local_to_rows(local, seg[None, :], length, num_segments)
        rows = ops.reshape(rows, [-1])
    index = _index_updates(parts, leaves, num_new, seg, n, local, rows, skip) if parts.rule is not None else None
    kept = leaves if not skip else [x[skip * len(seg) :] for x in leaves]
    # The index's bin counts change by a step made now (NumPy: their sums taken before any write).
    add_bins = (lambda: None) if index is None else ops.bin_add(parts.pos_counts, *index[1], index[2])

    def writes() -> list:
        updates = parts.storage.write(rows, kept, ops)
        if index is not None:
            pos, _, _, newest = index
            updates.append(ops.scatter(parts.pos, rows, ops.to_int32(ops.reshape(pos, [-1]))))
            updates.append(add_bins())
            if segments is None:
                updates.append(ops.assign(parts.newest, newest))
            else:
                updates.append(ops.scatter(parts.newest, segments, newest))
        return updates

    def move() -> Any:
        if segments is None:
            return ops.assign(parts.num_adds, adds + num_new)
        return ops.scatter(parts.num_adds, segments, n + num_new)

    def sampler_writes() -> list:
        # Rows that can never start a window (a frame buffer's first frames), for samplers that weigh rows.
        lead = parts.storage.window.lead
        startable = ops.reshape(index[0], [-1]) >= lead if index is not None and lead else None
        return parts.sampler.on_write(ops, rows, startable)

    reads = [rows] + ([] if index is None else [index[0], *index[1], *index[2:]])  # every read before any write
    return ops.commit(reads, [writes, move, sampler_writes], lambda: ops.read(parts.num_adds))


def _index_updates(
    parts: Parts, leaves: list, num_new: int, segments: Any, n: Any, local: Any, rows: Any, skip: int
) -> tuple:
    """`(pos of the new rows, (segment, bin) pairs, +1/-1 weights, newest)` for the episode index
    (`newest`: the written segments' new `[pos, ended]`, `[len(segments), 2]`)."""
    ops, length, rule = parts.ops, parts.max_length, parts.rule
    assert rule is not None
    wanted = ([rule.start] if rule.start else []) + list(rule.ends)
    time_major = {p: ops.reshape(x, [num_new, -1]) for p, x in zip(parts.leaf_paths, leaves) if p in wanted}
    starts, ends = rule.flags(time_major, ops)
    if num_new == 1:
        local, rows = local[None, :], rows[None, :]
    has_prev = n > 0
    prev = ops.read(parts.newest) if segments is None else ops.gather(ops.read(parts.newest), segments)
    if ends is not None:  # an item after an episode's last starts the next
        prev_ended = (prev[:, 1] > 0) & has_prev
        shifted = ops.where(ops.arange(ends.shape[0])[:, None] == 0, prev_ended[None, :], _shift_down(ends, ops))
        starts = shifted if starts is None else starts | shifted
    all_pos = episodes.new_pos(ops.to_int64(prev[:, 0]), has_prev, starts, ops)
    ended = ops.zeros_like(all_pos[-1]) if ends is None else ops.to_int64(ends[-1])
    newest = ops.to_int32(ops.stack([all_pos[-1], ended], 1))
    pos = all_pos[skip:]
    old_min = n - ops.minimum(n, length)
    # The row of new id `w` held the newest older id of its residue (skipped ids never landed).
    held = local - length * ((local - n[None, :]) // length + 1)
    overwritten = held >= old_min[None, :]
    old_pos = parts.pos_at(rows)
    # Each new row joins its bin; the live row it overwrites leaves its own.
    seg = ops.reshape(segments[None, :] + ops.zeros_like(local), [-1])
    bins = ops.concat([ops.reshape(episodes.pos_bin(p, ops), [-1]) for p in (pos, old_pos)])
    added = ops.reshape(ops.ones_like(local), [-1])
    weights = ops.concat([added, -ops.reshape(ops.to_int64(overwritten), [-1])])
    return pos, (ops.concat([seg, seg]), bins), weights, newest


def _shift_down(x: Any, ops: Any) -> Any:
    """`x` moved one step later along axis 0 (row 0 keeps its value; callers replace it)."""
    return x if x.shape[0] == 1 else ops.gather(x, ops.maximum(ops.arange(x.shape[0]) - 1, 0))


def clear(parts: Parts) -> Any:
    """Forgets every item (counters, index bins, the sampler's state); returns the counters."""
    ops = parts.ops
    updates = [ops.assign(parts.num_adds, ops.zeros_like(ops.read(parts.num_adds)))]
    if parts.rule is not None:
        updates.append(ops.assign(parts.pos_counts, ops.zeros_like(ops.read(parts.pos_counts))))
    updates = updates + ops.after(updates, lambda: parts.sampler.clear(ops))  # after the counters, as in a write
    return ops.after(updates, lambda: ops.read(parts.num_adds))


def num_frames(parts: Parts) -> Any:
    """How many items are stored."""
    ops = parts.ops
    return ops.sum(ops.minimum(ops.read(parts.num_adds), parts.max_length))


def valid_starts(parts: Parts, n: int, aligned: bool) -> tuple[Any, Any]:
    """Segments and starts of every valid window of `n` through the index, segment by segment, oldest first."""
    ops, window = parts.ops, parts.window
    assert window is not None
    mask, t = window.grid(ops.read(parts.num_adds), parts.pos_at, parts.max_length, n, aligned, ops)
    flat = ops.flatnonzero(ops.reshape(mask, [-1]))
    return flat // parts.max_length, ops.gather(ops.reshape(t, [-1]), flat)


def gather_all(parts: Parts) -> Any:
    """Every stored item (`[batch_size, time, ...]`, whatever the sampler's windows), or for frames every valid
    transition (`[num_transitions, ...]`, built through the index)."""
    ops, storage = parts.ops, parts.storage
    if storage.window.lead == 0:  # rows are the items
        rows, _ = ring.all_rows(ops.read(parts.num_adds), parts.max_length, parts.num_segments, ops)
        return storage.read(rows, None, ops)
    segment, t = valid_starts(parts, 1, aligned=False)
    step_rows, _ = ring.window_rows(segment, t, None, parts.max_length, parts.num_segments, ops)
    return storage.read(storage.plan(segment, t, step_rows, None, parts.pos_at, ops), None, ops)


def update_priorities(parts: Parts, view: Any, ids: Any, priorities: Any) -> Any:
    """Under the lock: gives items new priorities; returns how many ids were stale."""
    updates, stale = parts.sampler.update(view, ids, priorities)
    return parts.ops.after(updates, lambda: stale)
