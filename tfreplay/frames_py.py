"""`PyFrameReplayBuffer`: the NumPy twin of `TFFrameReplayBuffer` (see `frames.py`)."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import checkpoint, frame_index, specs
from tfreplay.frame_index import rows_of
from tfreplay.frames import FrameReplayBuffer, empty_message
from tfreplay.replay_buffer import BufferInfo
from tfreplay.specs import Nest
from tfreplay.storage import NumpyStorage
from tfreplay.uniform_py import numpy_layout


class PyFrameReplayBuffer(FrameReplayBuffer):
    """Frame replay in NumPy arrays: same API and samples as `TFFrameReplayBuffer`.

    Construct it with one ring, `PyFrameReplayBuffer(data_spec, capacity)`
    (`add_batch` appends any number of rows of one environment, in order),
    or like the TF twin, `PyFrameReplayBuffer(data_spec, batch_size=B,
    max_length=L)` (B segments; each batch has one row per segment). With
    segments, `add_sequence(items, segment)` lets environments advance at
    their own pace (threads each writing their own segment). One lock covers
    every write and sample. `get_next` and `gather_all` return NumPy arrays,
    `as_dataset` tensors. Checkpointable with `tf.train.Checkpoint`.

    Args:
      data_spec: a mapping with `"frame"`, `"first"` and the step's other
        entries; `frame_data_spec()` builds the usual one.
      capacity: total rows, for the one-ring form.
      batch_size, max_length: segments and rows per segment.
      history_len: frames per stacked observation.
      seed: seed of the sampling generator.
    """

    _ops = frame_index.NUMPY_OPS

    def __init__(
        self,
        data_spec: Nest,
        capacity: int | None = None,
        *,
        batch_size: int | None = None,
        max_length: int | None = None,
        history_len: int = 4,
        seed: int | None = None,
        dataset_drop_remainder: bool = False,
        stateful_dataset: bool = False,
        name: str = "PyFrameReplayBuffer",
    ):
        segments, length = numpy_layout(type(self).__name__, capacity, batch_size, max_length)
        super().__init__(
            data_spec,
            segments,
            length,
            history_len,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
            name=name,
        )
        self._lockstep = batch_size is not None
        # One more row than the capacity: the zero row, read for frames before an episode.
        self._frames = NumpyStorage(self._specs.frame, self._capacity + 1)
        self._extras = NumpyStorage(self._specs.extras, self._capacity) if self._specs.extras else None
        self._pos = np.zeros([self._capacity], np.int32)
        self._num_adds = np.zeros([segments], np.int64)
        self._pos_counts = np.zeros([segments, frame_index.POS_BINS], np.int64)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._numpy_state = checkpoint.NumpyState(
            self._lock,
            lambda: {
                "frames": self._frames.arrays[0],
                **{f"steps/{p}": a for p, a in zip(self._specs.extras_paths, getattr(self._extras, "arrays", []))},
                **{"pos": self._pos, "num_adds": self._num_adds, "pos_counts": self._pos_counts},
            },
            self._rng,
            layout=checkpoint.layout(self._data_spec, segments, length, history_len),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of row storage: frames, `pos` and the step entries."""
        return self._frames.nbytes + (self._extras.nbytes if self._extras else 0) + self._pos.nbytes

    def _num_frames(self) -> int:
        return int(np.minimum(self._num_adds, self._max_length).sum())

    def _add_batch(self, items: Nest) -> None:
        rows = self._validated("add_batch", items, self._num_segments if self._lockstep else None)
        with self._lock:
            if not self._lockstep:
                self._append(0, *rows)
                return
            for s in range(self._num_segments):
                self._append(s, *(tf.nest.map_structure(lambda x, s=s: x[s : s + 1], rows)))

    def add_sequence(self, items: Nest, segment: int = 0) -> None:
        """Appends rows (a leading time axis, oldest first) to one segment.

        Raises:
          ValueError: `segment` is not in `[0, batch_size)`, or a bad batch.
          TypeError: a batch of the wrong structure or dtype.
        """
        ok = isinstance(segment, (int, np.integer)) and not isinstance(segment, bool)
        if not ok or not 0 <= segment < self._num_segments:
            raise ValueError(f"add_sequence: segment ({segment!r}) must be an integer in [0, {self._num_segments}).")
        rows = self._validated("add_sequence", items, None)
        with self._lock:
            self._append(int(segment), *rows)

    def _validated(self, where: str, items: Nest, batch_size: int | None) -> tuple[Any, Any, list]:
        arrays = specs.validate_numpy_batch(where, self._data_spec, self._leaf_paths, items, batch_size)
        return self._split_row(arrays)

    def _append(self, segment: int, frame: np.ndarray, first: np.ndarray, extras: list) -> None:
        """Writes `len(first)` rows to one segment; only the newest `max_length` survive."""
        num_new, length = len(first), self._max_length
        if num_new == 0:
            return
        n = int(self._num_adds[segment])
        pos = self._new_pos(segment, n, first)
        skip = max(num_new - length, 0)
        new_min = n + num_new - min(n + num_new, length)
        dropped = np.arange(n - min(n, length), min(new_min, n))
        lost = self._bin_counts(self._pos[self._rows(dropped, segment)])
        rows = self._rows(np.arange(n + skip, n + num_new), segment)
        self._frames.write(rows, [frame[skip:]])
        if self._extras:
            self._extras.write(rows, [x[skip:] for x in extras])
        self._pos[rows] = pos[skip:]
        self._pos_counts[segment] += self._bin_counts(pos[skip:]) - lost
        self._num_adds[segment] = n + num_new

    def _new_pos(self, segment: int, n: int, first: np.ndarray) -> np.ndarray:
        """Episode step index of each new row: 0 at a first frame, else one more than the row before."""
        step = np.arange(len(first), dtype=np.int64)
        prev = int(self._pos[self._rows(n - 1, segment)]) if n > 0 else -1
        last_first = np.maximum.accumulate(np.where(first, step, -1))
        return np.where(last_first >= 0, step - last_first, np.minimum(prev + 1 + step, frame_index.POS_CAP))

    @staticmethod
    def _bin_counts(pos: np.ndarray) -> np.ndarray:
        return np.bincount(frame_index.pos_bin(pos, np), minlength=frame_index.POS_BINS)

    def _rows(self, local: Any, segment: int) -> Any:
        return rows_of(local, segment, self._max_length, self._num_segments)[0]

    def _get_next(
        self, sample_batch_size: int | None, num_steps: int | None, time_stacked: bool
    ) -> tuple[Nest, BufferInfo]:
        items, ids, probs, _ = self._sample(sample_batch_size, num_steps)
        info = BufferInfo(ids=ids, probabilities=probs)
        return self._package(items, info, sample_batch_size is not None, num_steps, time_stacked)

    def _sample_tensors(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Nest, BufferInfo]:
        outer = [] if sample_batch_size is None else [sample_batch_size]
        steps = [] if num_steps is None else [num_steps]

        def sample() -> list:
            items, ids, probs, _ = self._sample(sample_batch_size, num_steps)
            return tf.nest.flatten(items) + [ids, probs]

        out = self._numpy_call(sample, [], outer + steps, [tf.int64, tf.float32])
        out[-2].set_shape(outer + steps)
        out[-1].set_shape(outer)
        items = tf.nest.pack_sequence_as(self.transition_spec, out[:-2])
        return items, BufferInfo(ids=out[-2], probabilities=out[-1])

    def _numpy_call(self, fn: Callable, inputs: list, outer: list, extra: list) -> list:
        """`fn` as a stateful `tf.numpy_function` returning transition leaves plus `extra`."""
        leaf_specs = tf.nest.flatten(self.transition_spec)
        out = list(tf.numpy_function(fn, inputs, [s.dtype for s in leaf_specs] + extra, stateful=True))
        for tensor, spec in zip(out, leaf_specs):
            tensor.set_shape(outer + spec.shape.as_list())
        return out

    def _clear(self) -> None:
        with self._lock:
            self._num_adds[:] = 0
            self._pos_counts[:] = 0

    def _read_num_adds(self) -> np.ndarray:
        return self._num_adds.copy()

    def _read_pos_counts(self) -> np.ndarray:
        return self._pos_counts

    def _pos_at(self, rows: np.ndarray) -> np.ndarray:
        return self._pos[rows].astype(np.int64)

    def _stacks(self, rows: np.ndarray, num_steps: int | None) -> tuple[np.ndarray, np.ndarray]:
        return frame_index.np_stacks(self._frames.arrays[0], rows, self._history_len, num_steps)

    def _gather_extras(self, rows: np.ndarray) -> list:
        return self._extras.gather(rows) if self._extras else []

    def _draw(self, shape: list, total: Any) -> np.ndarray:
        return self._rng.integers(0, total, size=shape, dtype=np.int64)

    def _guard(self, count: Any, value: Any, num_steps: int | None) -> Any:
        if count <= 0:
            raise ValueError(empty_message("get_next", num_steps))
        return value

    def _cond(self, pred: Any, true_fn: Callable, false_fn: Callable) -> Any:
        return true_fn() if pred else false_fn()

    def _exclusive(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            return fn()

    def _valid_starts_tensors(self, n: int) -> tuple[tf.Tensor, tf.Tensor]:
        def starts() -> list:
            return list(self._exclusive(lambda: self._valid_starts(n, aligned=True)))

        segment, t = tf.numpy_function(starts, [], [tf.int64, tf.int64], stateful=True)
        segment.set_shape([None])
        t.set_shape([None])
        return segment, t

    def _window_tensors(self, segment: tf.Tensor, t: tf.Tensor, num_steps: int | None) -> tuple[dict, BufferInfo]:
        def windows(s: np.ndarray, t: np.ndarray) -> list:
            items, ids = self._exclusive(lambda: self._read_windows(s, t, num_steps))
            return tf.nest.flatten(items) + [ids]

        outer = segment.shape.as_list() + ([] if num_steps is None else [num_steps])
        out = self._numpy_call(windows, [segment, t], outer, [tf.int64])
        out[-1].set_shape(outer)
        return tf.nest.pack_sequence_as(self.transition_spec, out[:-1]), BufferInfo(ids=out[-1], probabilities=())
