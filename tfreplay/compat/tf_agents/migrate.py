"""Moving a TF-Agents `TFUniformReplayBuffer` checkpoint into a tfreplay buffer.

TF-Agents saves, under the buffer's key, a data table (one variable per spec
leaf, `batch_size * max_length` rows, segment `b` in rows `[b * max_length,
(b + 1) * max_length)`, item `i` of a segment at `i % max_length`), an id
table (the add index each row holds) and `_last_id` (the newest add, -1 when
empty). The live items are the newest `min(last_id + 1, max_length)` of each
segment; they are added to the tfreplay buffer oldest first.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from tfreplay._src import specs

_LAST_ID = "/_last_id/.ATTRIBUTES/VARIABLE_VALUE"
_WHERE = "restore_tf_agents_checkpoint"


class _Node(tf.Module):
    """A stand-in for TF-Agents' objects: children by name, as TF's tracking names them."""


def _find_key(names: list[str], key: str | None) -> str:
    keys = sorted(n[: -len(_LAST_ID)] for n in names if n.endswith(_LAST_ID))
    if key is not None:
        if key not in keys:
            raise ValueError(f"{_WHERE}: key ({key!r}) must be one of the checkpoint's TF-Agents buffers ({keys}).")
        return key
    if len(keys) != 1:
        raise ValueError(
            f"{_WHERE}: the checkpoint must hold exactly one TF-Agents TFUniformReplayBuffer (it holds {keys}); "
            "name it with key=."
        )
    return keys[0]


def _stand_in(key: str, data_spec: Any) -> tuple[tf.train.Checkpoint, Any, tf.Variable, tf.Variable]:
    """Variables shaped like TF-Agents' tables, tracked under the same names (restored by TF, not parsed here)."""
    buffer = _Node()
    buffer._data_table = _Node()
    buffer._data_table._storage = tf.nest.map_structure(
        lambda s: tf.Variable(tf.zeros([0] + s.shape.as_list(), s.dtype), shape=tf.TensorShape(None)), data_spec
    )
    buffer._id_table = _Node()
    buffer._id_table._storage = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape(None))
    buffer._last_id = tf.Variable(-1, dtype=tf.int64)
    parts = key.split("/")
    root: Any = buffer
    for part in reversed(parts[1:]):
        parent = _Node()
        setattr(parent, part.replace(".S", "/").replace("..", "."), root)
        root = parent
    checkpoint = tf.train.Checkpoint(**{parts[0].replace(".S", "/").replace("..", "."): root})
    return checkpoint, buffer._data_table._storage, buffer._id_table._storage, buffer._last_id


def restore_tf_agents_checkpoint(buffer: Any, path: str, key: str | None = None) -> int:
    """Loads a TF-Agents `TFUniformReplayBuffer` checkpoint's items into `buffer`, replacing its contents.

    Args:
      buffer: a tfreplay `TFUniformReplayBuffer` or `PyUniformReplayBuffer` (or
        their compat classes) built with the TF-Agents buffer's spec,
        `batch_size` and `max_length`.
      path: a checkpoint prefix, or a directory (a TF-Agents `Checkpointer`'s),
        whose latest checkpoint is read.
      key: where the buffer sits in the checkpoint (`replay_buffer` for
        `Checkpointer(..., replay_buffer=rb)`); found when there is one.

    Returns:
      How many items were loaded. Their ids restart at 0 in tfreplay. A
      buffer's rate limiter does not hold the loading back; its counts then
      follow the rule for a checkpoint without counts (`tfreplay.rate_limiting`).

    Raises:
      ValueError: no TF-Agents buffer at `path`, or one whose spec, capacity or
        rows do not fit `buffer`; `buffer` is unchanged then.
    """
    prefix = tf.train.latest_checkpoint(path) if os.path.isdir(path) else path
    if prefix is None:
        raise ValueError(f"{_WHERE}: path ({path!r}) must be a checkpoint prefix or a directory holding one.")
    names = [name for name, _ in tf.train.list_variables(prefix)]
    key = _find_key(names, key)
    saved_leaves = sum(n.startswith(f"{key}/_data_table/_storage") for n in names)
    door = buffer.front_door
    spec = door.spec  # every leaf a tf.TensorSpec (a compat buffer's data_spec is the spec as given)
    if saved_leaves != len(tf.nest.flatten(spec)):
        raise ValueError(
            f"{_WHERE}: the checkpoint's buffer under {key!r} has {saved_leaves} spec leaves; this buffer's spec "
            f"must have as many (it has {len(tf.nest.flatten(spec))})."
        )
    checkpoint, storage, id_table, last_id = _stand_in(key, spec)
    try:
        checkpoint.read(prefix).assert_existing_objects_matched().expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        raise ValueError(
            f"{_WHERE}: the checkpoint's buffer under {key!r} must have this buffer's spec structure ({err})."
        ) from None
    leaves = [np.asarray(v.numpy()) for v in tf.nest.flatten(storage)]
    segments, length = buffer.batch_size, buffer.max_length
    _check_layout(buffer, spec, key, leaves, int(last_id.numpy()), np.asarray(id_table.numpy()))
    num_adds = int(last_id.numpy()) + 1
    live = min(num_adds, length)
    first = num_adds - live
    # TF-Agents' row of (segment b, add i) is b * length + i % length; take the live adds oldest first.
    slots = (first + np.arange(live)) % length
    rows = np.arange(segments)[:, None] * length + slots[None, :]  # [batch_size, live]
    steps = [leaf[rows] for leaf in leaves]  # each [batch_size, live, ...]
    buffer.clear()
    with door.loading():  # a rate limiter counts the loaded items as a restore does
        for t in range(live):
            buffer.add_batch(tf.nest.pack_sequence_as(spec, [x[:, t] for x in steps]))
    return live * segments


def _check_layout(buffer: Any, data_spec: Any, key: str, leaves: list, last_id: int, ids: np.ndarray) -> None:
    """Refuses a checkpoint whose leaves, capacity or id table do not fit `buffer`'s layout (`data_spec`)."""
    segments, length = buffer.batch_size, buffer.max_length
    for path, leaf, spec in zip(specs.leaf_paths(data_spec), leaves, tf.nest.flatten(data_spec)):
        want = [segments * length] + spec.shape.as_list()
        if list(leaf.shape) != want or leaf.dtype != spec.dtype.as_numpy_dtype:
            raise ValueError(
                f"{_WHERE}: the checkpoint's {key}/{path} ({leaf.dtype.name}{list(leaf.shape)}) must be "
                f"{spec.dtype.name}{want}: batch_size ({segments}) x max_length ({length}) rows of the spec."
            )
    if not -1 <= last_id < (1 << 60) // segments:
        raise ValueError(
            f"{_WHERE}: the checkpoint's {key}/_last_id ({last_id}) must be -1 (an empty buffer) or the id of the "
            "newest add; it was altered or written by another library. The buffer is unchanged."
        )
    num_adds = last_id + 1
    live = np.arange(max(0, num_adds - length), num_adds)
    rows = np.arange(segments)[:, None] * length + (live % length)[None, :]
    if ids.shape != (segments * length,) or not np.array_equal(ids[rows], np.broadcast_to(live, rows.shape)):
        raise ValueError(
            f"{_WHERE}: the checkpoint's id table must place add i of segment b at row b * max_length + i % "
            f"max_length for batch_size ({segments}) and max_length ({length}); build the buffer with the "
            "TF-Agents buffer's batch_size and max_length."
        )
