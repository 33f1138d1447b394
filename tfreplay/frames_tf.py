"""`TFFrameReplayBuffer`: frame replay in `tf.Variable`s (see `frames.py`)."""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from tfreplay import frame_index, native, specs
from tfreplay.frame_index import rows_of
from tfreplay.frames import FrameReplayBuffer, empty_message
from tfreplay.replay_buffer import BufferInfo
from tfreplay.specs import Nest
from tfreplay.storage import TFStorage
from tfreplay.uniform_tf import EagerFunctions, locked_call, tf_exclusive, under_xla


class TFFrameReplayBuffer(FrameReplayBuffer):
    """Frame replay in `tf.Variable`s: graph- and checkpoint-friendly.

    `batch_size` segments (environments) of `max_length` rows (frames);
    `add_batch` writes row `b` to segment `b`. Sampling returns stacked
    `observation`/`next_observation` (see `frames.py` for the row layout).
    Writes and samples run in one `tf.CriticalSection`. Checkpoint it with
    `tf.train.Checkpoint(buffer=rb)`: frames, counters and generator are variables.

    Args:
      data_spec: a mapping with `"frame"`, `"first"` and the step's other
        entries; `frame_data_spec()` builds the usual one.
      batch_size: number of segments (parallel environments).
      max_length: rows (frames) per segment.
      history_len: frames per stacked observation.
      scope: name scope of its variables and ops.
      device: where the variables live.
      dataset_drop_remainder: drop an incomplete last batch in the single pass.
      stateful_dataset: mark datasets as carrying external state.
      seed: seed of the sampling generator; default TF's global seed if set.

    Raises:
      ValueError: a non-positive size, or `max_length <= history_len`.
      TypeError: a spec without a `"frame"` leaf or a scalar bool `"first"`.
    """

    _ops = frame_index.TF_OPS

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int = 1000,
        history_len: int = 4,
        scope: str = "TFFrameReplayBuffer",
        device: str = "cpu:*",
        dataset_drop_remainder: bool = False,
        stateful_dataset: bool = False,
        seed: int | None = None,
    ):
        super().__init__(
            data_spec,
            batch_size,
            max_length,
            history_len,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
            name=scope,
        )
        self._device, self._scope = device, scope
        if seed is None:
            seed = tf.compat.v1.get_seed(None)[0]
        with tf.device(device), tf.name_scope(scope):
            # One more row than the capacity: the zero row, read for frames before an episode.
            self._frames = TFStorage(self._specs.frame, self._capacity + 1, ["frame"], name="frames")
            self._extras = (
                TFStorage(self._specs.extras, self._capacity, self._specs.extras_paths, name="steps")
                if self._specs.extras
                else None
            )
            self._pos = tf.Variable(tf.zeros([self._capacity], tf.int32), trainable=False, name="pos")
            self._num_adds = tf.Variable(tf.zeros([batch_size], tf.int64), trainable=False, name="num_adds")
            self._pos_counts = tf.Variable(
                tf.zeros([batch_size, frame_index.POS_BINS], tf.int64), trainable=False, name="pos_counts"
            )
            self._rng = (
                tf.random.Generator.from_non_deterministic_state()
                if seed is None
                else tf.random.Generator.from_seed(seed)
            )
        self._lock = tf.CriticalSection(name="lock")
        self._eager = EagerFunctions()
        self._native_stacks = True  # tests turn it off to check the XLA stacks

    @property
    def nbytes(self) -> int:
        """Bytes of row storage: frames, `pos` and the step entries."""
        extras = self._extras.nbytes if self._extras else 0
        return self._frames.nbytes + extras + self._capacity * 4

    def _num_frames(self) -> tf.Tensor:
        return tf.reduce_sum(tf.minimum(self._num_adds.read_value(), self._max_length))

    def _add_batch(self, items: Nest) -> Any:
        leaves, asserts = specs.validate_tensor_batch(
            "add_batch", self._data_spec, self._leaf_paths, items, self._num_segments
        )
        frame, first, extras = self._split_row(leaves)
        if tf.executing_eagerly():
            signature = tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape, x.dtype), (frame, first, extras))
            return self._eager.get("add", self._write, *signature)(frame, first, extras)
        with tf.control_dependencies(asserts):
            return self._write(frame, first, extras)

    def _write(self, frame: tf.Tensor, first: tf.Tensor, extras: list) -> tf.Tensor:
        """Appends one row to every segment; keeps `pos` and the live rows' counts by `pos`."""
        length, segments = self._max_length, self._num_segments

        def body() -> tf.Tensor:
            num_adds = self._num_adds.read_value()
            segment = tf.range(segments, dtype=tf.int64)
            rows = rows_of(num_adds, segment, length, segments)[0]
            prev = self._pos_at(rows_of(num_adds - 1, segment, length, segments)[0])
            pos = tf.where(first | (num_adds == 0), tf.zeros_like(prev), tf.minimum(prev + 1, frame_index.POS_CAP))
            # The row written over (when the segment is full) leaves the counts; the new one joins them.
            bins = tf.stack(
                [frame_index.pos_bin(pos, self._ops), frame_index.pos_bin(self._pos_at(rows), self._ops)], 1
            )
            counted = tf.stack([tf.ones_like(num_adds), -tf.cast(num_adds >= length, tf.int64)], 1)
            with tf.control_dependencies([pos, bins]):
                updates = self._frames.write(rows, [frame])
                updates += self._extras.write(rows, extras) if self._extras else []
                updates.append(self._pos.scatter_update(tf.IndexedSlices(tf.cast(pos, tf.int32), rows)))
                at = tf.stack([tf.tile(segment[:, None], [1, 2]), bins], -1)
                updates.append(self._pos_counts.scatter_nd_add(tf.reshape(at, [-1, 2]), tf.reshape(counted, [-1])))
            with tf.control_dependencies(updates):
                return self._num_adds.assign_add(tf.ones_like(num_adds)).read_value()

        with tf.device(self._device), tf.name_scope(self._scope):
            return self._exclusive(body)

    def _get_next(
        self, sample_batch_size: int | None, num_steps: int | None, time_stacked: bool
    ) -> tuple[Nest, BufferInfo]:
        if not tf.executing_eagerly():
            items, info = self._sample_tensors(sample_batch_size, num_steps)
        else:
            # Eagerly the emptiness check is a Python test of the count: cheaper than graph assertions.
            items, ids, probs, count = self._sample(sample_batch_size, num_steps)
            if count.numpy() == 0:
                raise ValueError(empty_message("get_next", num_steps))
            info = BufferInfo(ids=ids, probabilities=probs)
        return self._package(items, info, sample_batch_size is not None, num_steps, time_stacked)

    def _sample_tensors(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Nest, BufferInfo]:
        with tf.device(self._device), tf.name_scope(self._scope):
            items, ids, probs, count = self._sample(sample_batch_size, num_steps)
            items, ids, probs = self._guard(count, (items, ids, probs), num_steps)
        return items, BufferInfo(ids=ids, probabilities=probs)

    def _clear(self) -> Any:
        def body() -> tf.Tensor:
            with tf.control_dependencies([self._pos_counts.assign(tf.zeros_like(self._pos_counts))]):
                return self._num_adds.assign(tf.zeros_like(self._num_adds)).read_value()

        return self._exclusive(body)

    def _sample_exclusive(self, size: int, num_steps: int | None) -> tuple[dict, tf.Tensor, tf.Tensor, tf.Tensor]:
        """The sample under the lock: counting and drawing as one XLA program, then stacking.

        One argument-free concrete function per `(size, num_steps)`, compiled on
        first use: fewer, fused kernels, and no argument binding per call. The
        stacks come from the native kernel (`native.py`) when it is built, else
        from the XLA program itself (always under an outer `jit_compile`). The
        lock and the emptiness check (XLA has neither) stay outside.
        """
        stack = native.frame_stack() if self._native_stacks else None
        if stack is None or under_xla():
            xla_stacks = lambda rows: self._stacks(rows, num_steps)  # noqa: E731
            call = self._eager.get(
                f"sample/{size}/{num_steps}",
                lambda: self._stacked(self._draw_rows(size, num_steps), xla_stacks),
                jit_compile=True,
            )
            if tf.executing_eagerly():  # lock, call and release in one function execution (see locked_call)
                locked = self._eager.get(f"locked/{size}/{num_steps}", lambda: locked_call(self._lock, call))
                return tuple(locked())
            return tuple(locked_call(self._lock, call))
        return tuple(
            self._eager.get(f"native/{size}/{num_steps}", lambda: self._native_sample(stack, size, num_steps))()
        )

    def _native_sample(self, stack: Any, size: int, num_steps: int | None) -> tuple:
        """Graph body: under the lock, the compiled draw gives frame rows, the kernel stacks them."""
        draw = self._eager.get(f"rows/{size}/{num_steps}", lambda: self._draw_rows(size, num_steps), jit_compile=True)

        def kernel(rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            frames = self._frames.variables_by_leaf[0]
            time_axis = num_steps is not None
            return stack(frames.handle, rows, T=frames.dtype, history_len=self._history_len, time_axis=time_axis)

        return locked_call(self._lock, lambda: self._stacked(draw(), kernel))

    def _draw_rows(self, size: int, num_steps: int | None) -> tuple:
        """`(frame rows, step entries, ids, probabilities, count of valid windows)`.

        XLA cannot raise, so with no valid window nothing is drawn: the rows are
        the zero row and the entries, ids and probabilities are zeros.
        """
        num_adds = self._num_adds.read_value()
        count = self._count_windows(num_adds, num_steps or 1)
        found, zeros = count > 0, tf.zeros([size], tf.int64)
        segment, t = tf.cond(
            found, lambda: self._draw_windows(size, num_steps or 1, num_adds, count), lambda: (zeros, zeros)
        )
        rows, extras, ids = self._window_parts(segment, t, num_steps)
        rows = tf.where(found, rows, tf.constant(self._capacity, tf.int64))
        extras, ids = tf.nest.map_structure(lambda x: tf.where(found, x, tf.zeros_like(x)), (extras, ids))
        return rows, extras, ids, self._ops.probability([size], count), count

    @staticmethod
    def _stacked(drawn: tuple, stacks: Callable) -> tuple:
        """`(items, ids, probabilities, count)` from `_draw_rows`, the frame rows stacked by `stacks`."""
        rows, extras, ids, probs, count = drawn
        obs, nxt = stacks(rows)
        return {"observation": obs, "next_observation": nxt, **extras}, ids, probs, count

    def _read_num_adds(self) -> tf.Tensor:
        return self._num_adds.read_value()

    def _read_pos_counts(self) -> tf.Tensor:
        return self._pos_counts.read_value()

    def _pos_at(self, rows: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.gather(self._pos, rows), tf.int64)

    def _stacks(self, rows: tf.Tensor, num_steps: int | None) -> tuple[tf.Tensor, tf.Tensor]:
        return frame_index.tf_stacks(self._frames.variables_by_leaf[0], rows, self._history_len, num_steps)

    def _gather_extras(self, rows: tf.Tensor) -> list:
        return self._extras.gather(rows) if self._extras else []

    def _draw(self, shape: list, total: tf.Tensor) -> tf.Tensor:
        return self._rng.uniform(shape, minval=0, maxval=total, dtype=tf.int64)

    def _guard(self, count: tf.Tensor, value: Any, num_steps: int | None) -> Any:
        check = tf.debugging.assert_positive(count, message=empty_message("get_next", num_steps))
        with tf.control_dependencies([check]):
            return tf.nest.map_structure(tf.identity, value)

    def _cond(self, pred: tf.Tensor, true_fn: Callable, false_fn: Callable) -> Any:
        return tf.cond(pred, true_fn, false_fn)

    def _exclusive(self, fn: Callable[[], Any]) -> Any:
        return tf_exclusive(self._lock, fn)

    def _valid_starts_tensors(self, n: int) -> tuple[tf.Tensor, tf.Tensor]:
        return self._exclusive(lambda: self._valid_starts(n, aligned=True))

    def _window_tensors(self, segment: tf.Tensor, t: tf.Tensor, num_steps: int | None) -> tuple[dict, BufferInfo]:
        items, ids = self._exclusive(lambda: self._read_windows(segment, t, num_steps))
        return items, BufferInfo(ids=ids, probabilities=())
