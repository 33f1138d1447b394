"""Frame replay: each frame stored once, history stacks assembled at sample time.

Atari-style agents observe the last `history_len` frames. Storing stacked
observations (and next observations) keeps every frame up to
`2 * history_len` times; these buffers keep it once, in a ring of rows per
segment (one segment per environment), and stack frames when sampling.

**What `add_batch` takes** (one row per segment, as in `TFUniformReplayBuffer`):
a mapping with

* `"frame"`: the newest frame of the observation the environment just
  returned (after `reset`, or after `step`), e.g. `uint8[84, 84]`;
* `"first"`: `bool[]`, True when that frame is an episode's first (it came
  from `reset`); the row's other entries are then ignored;
* anything else (see `frame_data_spec`): the step that produced the frame,
  e.g. `"action"` (the action taken), `"reward"`, `"terminated"`, `"truncated"`.

So every step is one row holding its *next* frame, and each episode adds one
extra row, its first frame. The final observation of an episode, terminated
or truncated, is the frame of its last step: the next-observation stack of a
truncated episode is right. With a Gymnasium vector env in its default
(next-step) autoreset mode, pass `first = terminated | truncated` of the
previous step: the step after an episode's end returns the reset frame.

**What sampling returns**: `{"observation", "next_observation", **the other
entries of the step}`, the stacks shaped `frame_shape + (history_len,)`
(frames on a new last axis, like `u8[84, 84, 4]`). A row with `first=True`
is not a transition and is never drawn. Frames older than an episode's first
frame are zeros (tensorpack's rule); a transition whose own-episode history
has been overwritten is never drawn (`frame_index.py` has the exact rule), so
no stack mixes episodes or reads across the write head. Sampling is uniform
over valid transitions (or over valid windows of `num_steps` consecutive
transitions of one episode) and gathers the `B * (history_len + num_steps)`
frames it needs in one vectorised read. `BufferInfo.ids` are the global ids
of the transitions' rows (`local id * batch_size + segment`), probabilities
`1 / number of valid windows`.

How it draws: each sample takes four uniform candidates over the rows
that could start a window and keeps the first valid one (a window reaching
back to an episode's first frame is the usual miss); when a sample misses
four times, the whole batch is redrawn exactly from a scan of every row's
episode index, `O(capacity)`. The count of valid windows (for emptiness and
probabilities) comes from per-segment counts of rows by episode position,
kept as rows are written, plus a look at each segment's oldest
`history_len + num_steps - 1` rows; windows of 64 steps or more are counted
by the scan. `gather_all()` returns every valid transition,
`[num_transitions, ...]`, segment by segment, oldest first (rows are not
rectangular once episodes differ); `as_dataset(single_deterministic_pass=True)`
yields the same, or each episode's consecutive, non-overlapping windows.

Twins: `TFFrameReplayBuffer` (`frames_tf.py`) keeps rows in `tf.Variable`s,
compiles each sampling shape's draw with XLA on first use (about a second)
and stacks with the native kernel of `native.py` (XLA stacks without it);
`PyFrameReplayBuffer` (`frames_py.py`) keeps NumPy arrays and can also
append rows to one segment at a time (`add_sequence`), so environments may
advance at their own pace.

Example:
  >>> rb = TFFrameReplayBuffer(frame_data_spec((84, 84)), batch_size=8, max_length=125_000)
  >>> rb.add_batch({"frame": reset_frames, "first": tf.ones([8], tf.bool), ...})
  >>> rb.add_batch({"frame": frames, "first": was_done, "action": a, ...})
  >>> batch, info = rb.get_next(sample_batch_size=32)
  >>> batch["observation"].shape   # (32, 84, 84, 4)
"""

from __future__ import annotations

import abc
import collections.abc
import types
from typing import Any, Callable

import tensorflow as tf

from tfreplay import frame_index, specs
from tfreplay.frame_index import rows_of
from tfreplay.replay_buffer import BufferInfo, SegmentedReplayBuffer
from tfreplay.specs import Nest

_RESERVED = ("frame", "first")
_STACKS = ("observation", "next_observation")


def frame_data_spec(
    frame_shape: tuple[int, ...] = (84, 84), frame_dtype: tf.DType = tf.uint8, action_spec: tf.TensorSpec | None = None
) -> dict[str, tf.TensorSpec]:
    """The usual row spec: frame, first, action, reward, terminated, truncated."""
    return {
        "frame": tf.TensorSpec(frame_shape, frame_dtype, "frame"),
        "first": tf.TensorSpec([], tf.bool, "first"),
        "action": action_spec if action_spec is not None else tf.TensorSpec([], tf.int32, "action"),
        "reward": tf.TensorSpec([], tf.float32, "reward"),
        "terminated": tf.TensorSpec([], tf.bool, "terminated"),
        "truncated": tf.TensorSpec([], tf.bool, "truncated"),
    }


def empty_message(where: str, num_steps: int | None) -> str:
    what = "transition" if (num_steps or 1) == 1 else f"window of {num_steps} transitions of one episode"
    return f"{where}: the buffer holds no valid {what} yet; add steps after each episode's first frame before sampling."


def split_spec(where: str, data_spec: Nest) -> tuple[tf.TensorSpec, dict]:
    """Checks a row spec; returns the frame spec and the other entries."""
    if not isinstance(data_spec, collections.abc.Mapping) or not all(k in data_spec for k in _RESERVED):
        got = sorted(data_spec) if isinstance(data_spec, collections.abc.Mapping) else type(data_spec).__name__
        raise TypeError(
            f"{where}: data_spec ({got}) must be a mapping with 'frame' and 'first' entries; see frame_data_spec()."
        )
    frame, first = data_spec["frame"], data_spec["first"]
    if not isinstance(frame, tf.TensorSpec):
        raise TypeError(f"{where}: data_spec['frame'] ({frame!r}) must be a single tf.TensorSpec.")
    if not isinstance(first, tf.TensorSpec) or first.dtype != tf.bool or first.shape.rank != 0:
        raise TypeError(f"{where}: data_spec['first'] ({first!r}) must be a scalar tf.bool spec.")
    clash = [k for k in _STACKS if k in data_spec]
    if clash:
        raise ValueError(f"{where}: data_spec entry {clash[0]!r} must be renamed; samples use it for the stacks.")
    return frame, {k: v for k, v in data_spec.items() if k not in _RESERVED}


class FrameReplayBuffer(SegmentedReplayBuffer):
    """What both twins share: checks, sampling, stacking. Twins supply the hooks.

    Every array operation goes through `_ops`, so the NumPy twin runs the same
    lines on arrays that the TF twin runs on tensors.
    """

    _ops: Any
    # Candidates drawn per sample before falling back to an exact scan.
    _ROUNDS = 4

    def __init__(
        self,
        data_spec: Nest,
        num_segments: int,
        max_length: int,
        history_len: int,
        *,
        drop_remainder: bool,
        stateful_dataset: bool,
        name: str,
    ):
        where = type(self).__name__
        specs.check_positive_int(where, "history_len", history_len)
        specs.check_positive_int(where, "max_length", max_length)
        if max_length <= history_len:
            raise ValueError(
                f"{where}: max_length ({max_length}) must be greater than history_len "
                f"({history_len}); a transition shows history_len + 1 frames of one segment."
            )
        super().__init__(data_spec, num_segments, max_length, stateful_dataset, name=name)
        frame, extras = split_spec(where, self._data_spec)
        # A namespace, not attributes: tf.Module would wrap dicts in slow trackable proxies.
        self._specs = types.SimpleNamespace(
            frame=frame,
            extras=extras,
            row=dict(self._data_spec),
            extras_paths=specs.leaf_paths(extras) if extras else [],
        )
        self._frame_shape = frame.shape.as_list()
        self._history_len = int(history_len)
        self._drop_remainder = bool(drop_remainder)

    @property
    def history_len(self) -> int:
        return self._history_len

    @property
    def transition_spec(self) -> dict:
        """The spec of one sampled transition."""
        stack = tf.TensorSpec(self._frame_shape + [self._history_len], self._specs.frame.dtype)
        return {"observation": stack, "next_observation": stack, **self._specs.extras}

    def num_transitions(self) -> Any:
        """How many stored transitions can be drawn now (single steps)."""

        return self._exclusive(lambda: self._count_windows(self._read_num_adds(), 1))

    def _max_window(self) -> int:
        return self._max_length - 1

    def _check_sample_args(self, where: str, sample_batch_size: Any, num_steps: Any) -> None:
        specs.check_positive_int(where, "sample_batch_size", sample_batch_size, allow_none=True)
        specs.check_positive_int(where, "num_steps", num_steps, allow_none=True)
        if num_steps is not None and num_steps > self._max_window():
            raise ValueError(
                f"{where}: num_steps ({num_steps}) must be at most max_length - 1 "
                f"({self._max_window()}); a window also needs the frame before it."
            )

    def _split_row(self, leaves: list) -> tuple[Any, Any, list]:
        row = tf.nest.pack_sequence_as(self._specs.row, leaves)
        extras = tf.nest.flatten({k: row[k] for k in self._specs.extras})
        return row["frame"], row["first"], extras

    # Sampling: the same lines on both twins.
    def _sample(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[dict, Any, Any, Any]:
        """`(items, ids, probabilities, count of valid windows)`, drawn under the lock.

        Unbatched: one item. The TF twin checks `count > 0` afterwards (see `_guard`).
        """
        size = 1 if sample_batch_size is None else sample_batch_size
        items, ids, probs, count = self._sample_exclusive(size, num_steps)
        if sample_batch_size is None:
            items, ids, probs = tf.nest.map_structure(lambda x: x[0], (items, ids, probs))
        return items, ids, probs, count

    def _sample_exclusive(self, size: int, num_steps: int | None) -> tuple[dict, Any, Any, Any]:
        return self._exclusive(lambda: self._sample_locked(size, num_steps))

    def _sample_locked(self, size: int, num_steps: int | None) -> tuple[dict, Any, Any, Any]:
        """Counts, draws `size` windows uniformly among the valid ones and reads them.

        The TF twin compiles the same steps with XLA (`frames_tf._draw_rows`).
        """
        num_adds = self._read_num_adds()
        count = self._count_windows(num_adds, num_steps or 1)
        count = self._guard(count, count, num_steps)
        items, ids = self._read_windows(*self._draw_windows(size, num_steps or 1, num_adds, count), num_steps)
        return items, ids, self._ops.probability([size], count), count

    def _count_windows(self, num_adds: Any, n: int) -> Any:
        """How many valid windows of `n` transitions exist (a scan of `pos` when `n >= POS_BINS`)."""
        ops, length, h = self._ops, self._max_length, self._history_len
        if n < frame_index.POS_BINS:
            return frame_index.count_valid_windows(num_adds, self._read_pos_counts(), self._pos_at, length, h, n, ops)
        mask, _ = frame_index.valid_grid(num_adds, self._pos_at, length, h, n, False, ops)
        return ops.sum(ops.to_int64(mask))

    def _draw_windows(self, size: int, n: int, num_adds: Any, count: Any) -> tuple[Any, Any]:
        """`(segment, t)` of `size` windows of `n` steps, uniform among the `count > 0` valid ones."""
        start, counts = frame_index.draw_range(num_adds, self._max_length, n, self._ops)
        segment, t, found = self._reject_draw(size, n, start, counts)
        return self._cond(found, lambda: (segment, t), lambda: self._scan_draw(size, num_adds, n, count))

    def _reject_draw(self, size: int, n: int, start: Any, counts: Any) -> tuple[Any, Any, Any]:
        """`_ROUNDS` uniform candidates per sample over window starts; the first valid wins.

        Each winner is uniform over the valid transitions; `found` is False when
        a sample had no valid candidate (the caller then redraws exactly).
        """
        ops, rounds = self._ops, self._ROUNDS
        draws = self._draw([rounds * size], ops.sum(counts))
        segment, offset = frame_index.locate(draws, counts, ops)
        first_start = ops.gather(start, segment)
        t = first_start + offset
        end_pos = self._pos_at(rows_of(t + (n - 1), segment, self._max_length, self._num_segments)[0])
        ok = ops.reshape(frame_index.is_valid(t, end_pos, first_start - 1, self._history_len, n), [rounds, size])
        pick = ops.argmax0(ok) * size + ops.arange(size)
        return ops.gather(segment, pick), ops.gather(t, pick), ops.all(ops.any0(ok))

    def _scan_draw(self, size: int, num_adds: Any, n: int, count: Any) -> tuple[Any, Any]:
        """Exact uniform draws over all `count` valid windows (reads `pos` of every row)."""
        ops = self._ops
        mask, t = frame_index.valid_grid(num_adds, self._pos_at, self._max_length, self._history_len, n, False, ops)
        # The u-th valid window is where the running count of valid ones first exceeds u.
        pick = ops.searchsorted(ops.cumsum(ops.to_int64(ops.reshape(mask, [-1]))), self._draw([size], count))
        return pick // self._max_length, ops.gather(ops.reshape(t, [-1]), pick)

    def _valid_starts(self, n: int, aligned: bool) -> tuple[Any, Any]:
        """Segments and starts of every valid window, segment by segment, oldest first."""
        ops = self._ops
        mask, t = frame_index.valid_grid(
            self._read_num_adds(), self._pos_at, self._max_length, self._history_len, n, aligned, ops
        )
        flat = ops.flatnonzero(ops.reshape(mask, [-1]))
        return flat // self._max_length, ops.gather(ops.reshape(t, [-1]), flat)

    def _read_windows(self, segment: Any, t: Any, num_steps: int | None) -> tuple[dict, Any]:
        """Under the lock: the windows' transitions and global ids.

        The frames come in one gather of `B * (history_len + n)` rows.
        """
        rows, extras, step_ids = self._window_parts(segment, t, num_steps)
        obs, nxt = self._stacks(rows, num_steps)
        return {"observation": obs, "next_observation": nxt, **extras}, step_ids

    def _window_parts(self, segment: Any, t: Any, num_steps: int | None) -> tuple[Any, dict, Any]:
        """Under the lock: the windows' frame rows (`frame_index.frame_rows`), step entries and global ids."""
        ops, h, n = self._ops, self._history_len, num_steps or 1
        length, segments = self._max_length, self._num_segments
        end = t + (n - 1)
        episode_start = end - self._pos_at(rows_of(end, segment, length, segments)[0])
        rows = frame_index.frame_rows(t, segment, episode_start, self._capacity, h, n, length, segments, ops)
        step_rows, step_ids = rows_of(t[:, None] + ops.arange(n)[None, :], segment[:, None], length, segments)
        if num_steps is None:
            step_rows, step_ids = step_rows[:, 0], step_ids[:, 0]
        extras = tf.nest.pack_sequence_as(self._specs.extras, self._gather_extras(step_rows))
        return rows, extras, step_ids

    def _package(
        self, items: dict, info: BufferInfo, batched: bool, num_steps: int | None, time_stacked: bool
    ) -> tuple[Nest, BufferInfo]:
        if num_steps is None or time_stacked:
            return items, info
        axis = 1 if batched else 0
        leaves = tf.nest.flatten(items)
        steps = zip(*[self._ops.unstack(x, axis) for x in leaves])
        by_step = tuple(tf.nest.pack_sequence_as(items, list(step)) for step in steps)
        return by_step, BufferInfo(ids=self._ops.unstack(info.ids, axis), probabilities=info.probabilities)

    def _gather_all(self) -> Nest:
        """Every valid transition, segment by segment, oldest first: `[num, ...]`."""
        return self._exclusive(lambda: self._read_windows(*self._valid_starts(1, aligned=False), None)[0])

    def _single_pass_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        """Every valid transition once (or every episode's consecutive windows of
        `num_steps`, a trailing partial window dropped), in `gather_all` order.
        Which windows exist is read when iteration starts."""
        n = num_steps or 1
        ds = tf.data.Dataset.range(1).flat_map(
            lambda _: tf.data.Dataset.from_tensor_slices(self._valid_starts_tensors(n))
        )
        if sample_batch_size is not None:
            ds = ds.batch(sample_batch_size, drop_remainder=self._drop_remainder)
            return ds.map(lambda s, t: self._window_tensors(s, t, num_steps), num_parallel_calls=num_parallel_calls)

        def one(s: tf.Tensor, t: tf.Tensor) -> tuple[dict, BufferInfo]:
            return tf.nest.map_structure(lambda x: x[0], self._window_tensors(s[None], t[None], num_steps))

        return ds.map(one, num_parallel_calls=num_parallel_calls)

    # Hooks each twin implements with its own array operations.
    @abc.abstractmethod
    def _read_num_adds(self) -> Any: ...

    @abc.abstractmethod
    def _read_pos_counts(self) -> Any:
        """Live rows per segment and `frame_index.pos_bin`, `[num_segments, POS_BINS]`."""

    @abc.abstractmethod
    def _pos_at(self, rows: Any) -> Any:
        """`pos` of storage rows, as int64."""

    @abc.abstractmethod
    def _stacks(self, rows: Any, num_steps: int | None) -> tuple[Any, Any]:
        """Observation and next-observation stacks of frame rows (`frame_index.np_stacks`)."""

    @abc.abstractmethod
    def _gather_extras(self, rows: Any) -> list: ...

    @abc.abstractmethod
    def _draw(self, shape: list, total: Any) -> Any: ...

    @abc.abstractmethod
    def _guard(self, count: Any, value: Any, num_steps: int | None) -> Any:
        """`value`, once `count > 0` is checked (raises, or asserts in a graph)."""

    @abc.abstractmethod
    def _cond(self, pred: Any, true_fn: Callable, false_fn: Callable) -> Any: ...

    @abc.abstractmethod
    def _exclusive(self, fn: Callable[[], Any]) -> Any: ...

    @abc.abstractmethod
    def _valid_starts_tensors(self, n: int) -> tuple[tf.Tensor, tf.Tensor]: ...

    @abc.abstractmethod
    def _window_tensors(self, segment: tf.Tensor, t: tf.Tensor, num_steps: int | None) -> tuple[dict, BufferInfo]: ...
