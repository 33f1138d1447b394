"""Storage: where items live, in preallocated arrays of `num_rows` rows.

`RowStorage` keeps one array per spec leaf, `[num_rows, *shape]`, and
returns rows as they were written. `FrameStorage` keeps each frame of an
Atari-style stream once and returns `observation`/`next_observation`
history stacks assembled at read time (see `arrays/stacks.py`).

A storage is twin-agnostic: its arrays come from the twin's `make(name,
shape, dtype)` (`tf.Variable`s or NumPy arrays) and every operation goes
through an `ops` namespace. Reading a sample takes two steps: `plan`, cheap
index math (compiled with the draw), and `read`, the bulk copy.

A buffer takes a storage *factory*, `factory(data_spec, num_segments,
max_length, make, where) -> storage`: `rows` or `frames(history_len)`. What
a buffer asks of a storage is `Storage`.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Mapping, Protocol

import tensorflow as tf

from tfreplay._src import specs
from tfreplay._src.index import episodes, ring
from tfreplay._src.specs import Nest

_RESERVED = ("frame", "first")
_STACKS = ("observation", "next_observation")
Make = Callable[[str, list, tf.DType], Any]


class Storage(Protocol):
    """What a buffer asks of a storage.

    Attributes:
      window: what a window needs of the episode index (`lead` items before its first, `history` frames).
      history_len: frames per stacked observation; None for rows.
      item_spec: the spec of one sampled item.
      nbytes: bytes of its arrays.
      by_path: optional: each spec leaf's array by its path, where every leaf is stored as one array of rows
        (what a transform's lookups read, `transforms/lookups.py`); None where items are assembled at read time
        (frames).
    """

    window: episodes.Shape
    history_len: int | None
    by_path: Mapping[str, Any] | None

    @property
    def item_spec(self) -> Nest: ...

    @property
    def nbytes(self) -> int: ...

    def write(self, rows: Any, leaves: list, ops: Any) -> list:
        """The updates that store `leaves` (flat, in spec order) at storage `rows`."""
        ...

    def plan(self, segment: Any, t: Any, step_rows: Any, num_steps: int | None, pos_at: Callable, ops: Any) -> Any:
        """The read plan of windows at local ids `t` of `segment` whose steps are `step_rows`: index math only,
        done with the draw."""
        ...

    def read(self, plan: Any, num_steps: int | None, ops: Any) -> Nest:
        """The items of a read plan: the bulk copy."""
        ...

    def read_steps(self, plan: Any, steps: list, first_rows: Any, last: Any, last_rows: Any, ops: Any) -> Nest:
        """Windows' items with each leaf read at its step only (`steps[i]`: "first", "last" or None)."""
        ...


def spec_nbytes(data_spec: Nest) -> int:
    """Bytes one item of `data_spec` takes."""
    return sum(s.shape.num_elements() * s.dtype.size for s in tf.nest.flatten(data_spec))


class RowStorage:
    """One array per spec leaf; an item is one row of each."""

    window = episodes.Shape(lead=0, history=0)
    history_len = None

    def __init__(self, data_spec: Nest, paths: list[str], num_rows: int, make: Make, prefix: str = "storage"):
        self.data_spec = data_spec
        self.arrays = [
            make(f"{prefix}/{path}", [num_rows] + s.shape.as_list(), s.dtype)
            for s, path in zip(tf.nest.flatten(data_spec), paths)
        ]
        self.by_path = dict(zip(paths, self.arrays))

    @property
    def item_spec(self) -> Nest:
        """The spec of one sampled item."""
        return self.data_spec

    def write(self, rows: Any, leaves: list, ops: Any) -> list:
        return [ops.scatter(a, rows, x) for a, x in zip(self.arrays, leaves)]

    def plan(self, segment: Any, t: Any, step_rows: Any, num_steps: int | None, pos_at: Callable, ops: Any) -> Any:
        return step_rows

    def read(self, plan: Any, num_steps: int | None, ops: Any) -> Nest:
        return tf.nest.pack_sequence_as(self.data_spec, ops.gather_each(self.arrays, plan))

    def read_steps(self, plan: Any, steps: list, first_rows: Any, last: Any, last_rows: Any, ops: Any) -> Nest:
        """Windows' items with each leaf read at its step only (`steps[i]`: "first", "last" or None for the whole
        window): what a transform reads at one step (`Transform.steps`)."""
        rows = {None: plan, "first": first_rows, "last": last_rows}
        return tf.nest.pack_sequence_as(self.data_spec, [ops.gather(a, rows[s]) for a, s in zip(self.arrays, steps)])

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(a) for a in self.arrays)


class FrameStorage:
    """Each frame once; samples show `history_len`-frame stacks (zeros before an episode's first frame).

    Row `t` holds the frame the environment returned at that step and the
    step's other entries (action, reward, ...); `first` marks an episode's
    first frame (from a reset), which is not a transition. The transition of
    row `t` shows frames `t - history_len .. t - 1` as its observation and
    `t - history_len + 1 .. t` as its next observation. One extra row, never
    written, holds zeros: frames older than an episode's first read it.
    """

    def __init__(
        self,
        data_spec: Nest,
        max_length: int,
        num_segments: int,
        history_len: int,
        make: Make,
        where: str,
    ):
        frame, extras = split_frame_spec(where, data_spec)
        self.row_spec, self.frame_spec, self.extras_spec = dict(data_spec), frame, extras
        self.history_len = history_len
        self.window = episodes.Shape(lead=1, history=history_len)
        self.by_path = None  # stacks are assembled at read time: no leaf array to look rows up in
        self.num_layout = (max_length, num_segments)
        num_rows = self.zero_row = max_length * num_segments
        self.frames = make("storage/frame", [num_rows + 1] + frame.shape.as_list(), frame.dtype)
        extras_paths = specs.leaf_paths(extras) if extras else []
        self.extras = RowStorage(extras, extras_paths, num_rows, make) if extras else None

    @property
    def item_spec(self) -> dict:
        stack = tf.TensorSpec(self.frame_spec.shape.as_list() + [self.history_len], self.frame_spec.dtype)
        return {"observation": stack, "next_observation": stack, **self.extras_spec}

    def write(self, rows: Any, leaves: list, ops: Any) -> list:
        row = tf.nest.pack_sequence_as(self.row_spec, leaves)
        extras = tf.nest.flatten({k: row[k] for k in self.extras_spec})
        updates = [ops.scatter(self.frames, rows, row["frame"])]
        return updates + (self.extras.write(rows, extras, ops) if self.extras else [])

    def plan(self, segment: Any, t: Any, step_rows: Any, num_steps: int | None, pos_at: Callable, ops: Any) -> Any:
        """Frame rows `[B, history_len + n]` of the windows at `t`, and their step rows."""
        h, n = self.history_len, num_steps or 1
        length, segments = self.num_layout
        # The first item's episode: a padded window's later items may belong to the next one (masked after).
        episode_start = t - pos_at(ring.local_to_rows(t, segment, length, segments)[0])
        ids = t[:, None] - h + ops.arange(h + n)[None, :]
        rows = ring.local_to_rows(ids, segment[:, None], length, segments)[0]
        rows = ops.where(ids >= episode_start[:, None], rows, ops.zeros_like(rows) + self.zero_row)
        return rows, step_rows

    def read(self, plan: Any, num_steps: int | None, ops: Any) -> dict:
        frame_rows, step_rows = plan
        obs, nxt = ops.frame_stacks(self.frames, frame_rows, self.history_len, num_steps)
        extras = self.extras.read(step_rows, num_steps, ops) if self.extras else {}
        return {"observation": obs, "next_observation": nxt, **extras}

    def read_steps(self, plan: Any, steps: list, first_rows: Any, last: Any, last_rows: Any, ops: Any) -> dict:
        """`RowStorage.read_steps` for stacks: whole windows are read, then each leaf's step picked."""
        items = self.read(plan, plan[1].shape[1], ops)
        n = plan[1].shape[1]
        flat_last = ops.arange(last.shape[0]) * n + last

        def pick(x: Any, step: str | None) -> Any:
            if step is None:
                return x
            return x[:, 0] if step == "first" else ops.gather(ops.reshape(x, [-1] + list(x.shape[2:])), flat_last)

        return tf.nest.pack_sequence_as(items, [pick(x, step) for x, step in zip(tf.nest.flatten(items), steps)])

    @property
    def nbytes(self) -> int:
        return _nbytes(self.frames) + (self.extras.nbytes if self.extras else 0)


def rows(data_spec: Nest, num_segments: int, max_length: int, make: Make, where: str) -> RowStorage:
    """The storage of spec rows: a buffer's `storage` argument."""
    return RowStorage(data_spec, specs.leaf_paths(data_spec), num_segments * max_length, make)


def frames(history_len: int) -> Callable[..., FrameStorage]:
    """The frame storage (each frame once, stacks of `history_len` at sample time): a buffer's `storage` argument."""

    def build(data_spec: Nest, num_segments: int, max_length: int, make: Make, where: str) -> FrameStorage:
        specs.check_positive_int(where, "history_len", history_len)
        if max_length <= history_len:
            raise ValueError(
                f"{where}: max_length ({max_length}) must be greater than history_len "
                f"({history_len}); a transition shows history_len + 1 frames of one segment."
            )
        return FrameStorage(data_spec, max_length, num_segments, history_len, make, where)

    return build


def _nbytes(array: Any) -> int:
    return int(array.shape.num_elements() * array.dtype.size if isinstance(array, tf.Variable) else array.nbytes)


def frame_data_spec(
    frame_shape: tuple[int, ...] = (84, 84), frame_dtype: tf.DType = tf.uint8, action_spec: tf.TensorSpec | None = None
) -> dict[str, tf.TensorSpec]:
    """The usual frame-buffer row spec: frame, first, action, reward, terminated, truncated."""
    return {
        "frame": tf.TensorSpec(frame_shape, frame_dtype, "frame"),
        "first": tf.TensorSpec([], tf.bool, "first"),
        "action": action_spec if action_spec is not None else tf.TensorSpec([], tf.int32, "action"),
        "reward": tf.TensorSpec([], tf.float32, "reward"),
        "terminated": tf.TensorSpec([], tf.bool, "terminated"),
        "truncated": tf.TensorSpec([], tf.bool, "truncated"),
    }


def split_frame_spec(where: str, data_spec: Nest) -> tuple[tf.TensorSpec, dict]:
    """Checks a frame-buffer row spec; returns the frame spec and the other entries."""
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
