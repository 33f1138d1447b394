"""The NumPy twin: a composed buffer in NumPy arrays, same API and semantics as the TF twin.

One `threading.Lock` covers every write and every sample, so no item is
ever torn. `get_next` and `gather_all` return NumPy arrays; `as_dataset`
yields tensors through `tf.numpy_function`. With `seed=None` it follows TF's
global seed like the TF twin (an op seed keeps buffers apart).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import native
from tfreplay._src import ring, specs, stacks
from tfreplay._src.api import BufferInfo
from tfreplay._src.buffer import ComposedBuffer, check_priorities
from tfreplay._src.gate import Gate
from tfreplay._src.native_windows import WindowPlanner
from tfreplay._src.numpy_checkpoint import NumpyState
from tfreplay._src.ops import NUMPY_OPS
from tfreplay._src.samplers import View
from tfreplay._src.specs import Nest
from tfreplay._src.twin_tf import resolve_seed

_UNSET = object()


def numpy_layout(where: str, capacity: Any, batch_size: Any, max_length: Any) -> tuple[Any, Any]:
    """`(segments, max_length)` of a NumPy buffer built as `(spec, capacity)` (one ring)
    or `(spec, batch_size=B, max_length=L)`; a conflicting mix is an error."""
    if batch_size is None:
        if capacity is None:
            raise ValueError(f"{where}: capacity (None) must be given, or batch_size and max_length.")
        specs.check_positive_int(where, "capacity", capacity)
        if max_length is not None:
            raise ValueError(
                f"{where}: max_length ({max_length}) must come with batch_size; "
                "with capacity alone the buffer is one ring of capacity rows."
            )
        return 1, capacity
    specs.check_positive_int(where, "batch_size", batch_size)
    if capacity is not None:
        specs.check_positive_int(where, "capacity", capacity)
        if capacity % batch_size:
            raise ValueError(f"{where}: capacity ({capacity}) must be a multiple of batch_size ({batch_size}).")
        if max_length is not None and capacity != batch_size * max_length:
            raise ValueError(
                f"{where}: capacity ({capacity}) must equal batch_size ({batch_size}) * "
                f"max_length ({max_length}), or be left out."
            )
        return batch_size, capacity // batch_size
    return batch_size, 1000 if max_length is None else max_length


class PyBuffer(ComposedBuffer):
    """A composed buffer in NumPy arrays; public classes choose its storage and sampler.

    Built as one ring (`capacity` alone: `add_batch` appends any number of
    items, in order) or with segments (`batch_size`, `max_length`: one item
    per segment per `add_batch`); see `numpy_layout`. `options`:
    `window_shift`, `drop_remainder`, `stateful_dataset`, as `ComposedBuffer`
    takes them. `rate_limiter`: see `core/rate_limiter.py` and `core/gate.py`.
    """

    _dataset_block = 8  # a `tf.numpy_function` call costs more than drawing a batch (see `_sample_dataset`)

    _ops = NUMPY_OPS

    def __init__(
        self,
        data_spec: Nest,
        storage: Callable,
        sampler: Any,
        episode_rule: Any,
        *,
        capacity: int | None = None,
        batch_size: int | None = None,
        max_length: int | None = None,
        seed: Any,
        name: str,
        rate_limiter: Any = None,
        **options: Any,
    ):
        segments, length = numpy_layout(type(self).__name__, capacity, batch_size, max_length)
        seed = resolve_seed(seed)
        object.__setattr__(self, "_rng", np.random.default_rng(seed))
        object.__setattr__(self, "_arrays", {})
        object.__setattr__(self, "_views", {})
        object.__setattr__(self, "_checks_priorities", None)
        object.__setattr__(self, "_planner", _UNSET)  # the compiled window plan: looked up on first use
        super().__init__(data_spec, segments, length, storage, sampler, episode_rule, name=name, **options)
        self._lockstep = batch_size is not None
        insert_size = segments if self._lockstep else 1
        object.__setattr__(self, "_gate", Gate(rate_limiter, type(self).__name__, self._capacity, insert_size))
        self._numpy_state = NumpyState(
            self._lock,
            lambda: dict(self._arrays),
            self._rng,
            layout=self.checkpoint_layout(),
            gate=self._gate,
            stored=self._num_frames,
        )

    @property
    def size(self) -> int:
        """How many items are stored now (TF-Agents' `PyUniformReplayBuffer.size`; also `num_frames()`)."""
        return self._num_frames()

    def _init_state(self) -> None:
        object.__setattr__(self, "_lock", threading.Lock())

    def _make(self, name: str, shape: list, dtype: tf.DType) -> np.ndarray:
        # Aligned to a cache line, as TF aligns tensors: the sum tree's 8-child nodes then take one line each.
        kind = np.dtype(dtype.as_numpy_dtype)
        if kind.hasobject:  # strings: Python objects, never read by address
            array = np.zeros(shape, kind)
        else:
            size = int(np.prod(shape)) * kind.itemsize
            raw = np.zeros(size + 64, np.uint8)
            start = -raw.ctypes.data % 64
            array = raw[start : start + size].view(kind).reshape(shape)
        self._arrays[name] = array
        return array

    def frame_stacks(self, frames: np.ndarray, rows: np.ndarray, history_len: int, num_steps: int | None) -> Any:
        return stacks.np_stacks(frames, rows, history_len, num_steps)

    def _view(self, transform: Any = None, read: Callable[[Any], Any] | None = None) -> View:
        """Views are taken and used under the lock, where no array moves: a NumPy view holds the live arrays,
        so each kind of window's view is made once."""
        key = self._windows(transform)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = super()._view(transform, read=lambda array: array)
        return view

    def _exclusive(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            return fn()

    def _draw(self, shape: list, total: Any) -> np.ndarray:
        return self._rng.integers(0, max(int(total), 1), size=shape, dtype=np.int64)

    def _uniform(self, shape: list) -> np.ndarray:
        return self._rng.random(shape)

    def _check(self, ok: Any, value: Any, message: str) -> Any:
        if not ok:
            raise ValueError(message)
        return value

    def _num_frames(self) -> int:
        return int(np.minimum(self._num_adds, self._max_length).sum())

    def _add_batch(self, items: Nest) -> None:
        rows = self._num_segments if self._lockstep else None
        arrays = specs.validate_numpy_batch("add_batch", self._data_spec, self._leaf_paths, items, rows)
        num_new = 1 if self._lockstep else arrays[0].shape[0]  # one ring: rows in order
        if num_new:  # wait for the rate limiter before taking the lock
            write = lambda: self._write_locked(arrays, num_new)  # noqa: E731
            self._gate.call("add_batch", "insert", num_new * self._num_segments, write, self._exclusive)

    def _append_sequence(self, where: str, items: Nest, segment: Any) -> None:
        """Appends items (a leading time axis, oldest first) to one segment (frame buffers)."""
        ok = isinstance(segment, (int, np.integer)) and not isinstance(segment, bool)
        if not ok or not 0 <= segment < self._num_segments:
            raise ValueError(f"{where}: segment ({segment!r}) must be an integer in [0, {self._num_segments}).")
        arrays = specs.validate_numpy_batch(where, self._data_spec, self._leaf_paths, items, None)
        n = arrays[0].shape[0]
        if n:
            write = lambda: self._write_locked(arrays, n, np.full([1], segment, np.int64))  # noqa: E731
            self._gate.call(where, "insert", n, write, self._exclusive)

    def _get_next(
        self, sample_batch_size: int | None, num_steps: int | None, time_stacked: bool, transform: Any = None
    ) -> tuple[Nest, BufferInfo]:
        size = 1 if sample_batch_size is None else sample_batch_size
        items, ids, probs, count = self._exclusive(lambda: self._read_sample(size, num_steps, transform))
        self._guard(count, None, "get_next", num_steps, transform)
        return self._package(items, ids, probs, sample_batch_size is not None, num_steps, time_stacked, transform)

    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None, transform: Any = None
    ) -> tuple[Nest, BufferInfo]:
        outer = ([] if sample_batch_size is None else [sample_batch_size]) + ([] if num_steps is None else [num_steps])
        probs_shape = [] if sample_batch_size is None else [sample_batch_size]
        item_spec = self._storage.item_spec if transform is None else transform.output_spec(self._storage.item_spec)

        def sample() -> tuple:  # admitted by the dataset's tick; given back if it fails
            draw = lambda: self._get_next(sample_batch_size, num_steps, True, transform)  # noqa: E731
            items, info = self._gate.settled("sample", sample_batch_size or 1, draw)
            return items, info.ids, info.probabilities

        out_specs = (
            tf.nest.map_structure(lambda s: tf.TensorSpec(outer + s.shape.as_list(), s.dtype), item_spec),
            tf.TensorSpec(outer, tf.int64),
            tf.TensorSpec(probs_shape, tf.float32),
        )
        items, ids, probs = self._numpy_call(sample, [], out_specs)
        return items, BufferInfo(ids=ids, probabilities=probs)

    def _sample_plan(
        self, size: int, num_steps: int | None, transform: Any = None, view: View | None = None
    ) -> tuple[Any, Any, Any, Any]:
        """Padded windows, and strict ones through the episode index, planned in compiled code where the kernel
        is built (`core/native_windows.py`), else in array ops (`SamplePath._sample_plan`): the same plan either
        way."""
        window, padded = self._windows(transform)
        planner = self._window_planner() if view is None and (padded or window is not None) else None
        if planner is None or not (padded or planner.draws_strict):
            return super()._sample_plan(size, num_steps, transform, view)
        if transform is None:  # strict windows of `num_steps` items (or single items) through the index
            segment, t, probs, count = planner.starts(size, num_steps or 1, self._draw)
            step_rows, ids = ring.window_rows(segment, t, num_steps, self._max_length, self._num_segments, self._ops)
            return self._storage.plan(segment, t, step_rows, num_steps, self._pos_at, self._ops), ids, probs, count
        n = int(transform.num_steps)
        planned = planner.sample(size, n, self._draw, lambda: self._view(transform), padded)
        (rows, mask, last, last_rows), segment, t, ids, probs, count = planned
        return self._compiled_windows(segment, t, rows, mask, last, last_rows, transform), ids, probs, count

    def _window_planner(self) -> WindowPlanner | None:
        """The compiled window plan of this buffer, or None without the kernel (looked up once)."""
        if self._planner is _UNSET:
            library = native.windows_library()
            index = (self._pos, self._newest, self._pos_counts) if self._rule is not None else None
            planner = None
            if library is not None:
                window = self._storage.window
                planner = WindowPlanner(library, self._num_adds, self._max_length, index, self._sampler, window)
            object.__setattr__(self, "_planner", planner)
        return self._planner

    def _numpy_call(self, fn: Callable, inputs: list, out_specs: Nest) -> Nest:
        """`fn` as a stateful `tf.numpy_function`, its outputs shaped like `out_specs`."""
        flat_specs = tf.nest.flatten(out_specs)

        def call(*args: Any) -> list:
            return [np.asarray(x, s.dtype.as_numpy_dtype) for x, s in zip(tf.nest.flatten(fn(*args)), flat_specs)]

        out = tf.numpy_function(call, inputs, [s.dtype for s in flat_specs], stateful=True)
        for tensor, spec in zip(out, flat_specs):
            tensor.set_shape(spec.shape)
        return tf.nest.pack_sequence_as(out_specs, out)

    def _call_tensors(self, fn: Callable, inputs: list, out_specs: Nest) -> Nest:
        return self._numpy_call(lambda *args: self._exclusive(lambda: fn(*args)), inputs, out_specs)

    def _update_priorities(self, ids: Any, priorities: Any) -> int:
        ids = np.asarray(ids.numpy() if isinstance(ids, tf.Tensor) else ids, np.int64)
        values = priorities.numpy() if isinstance(priorities, tf.Tensor) else priorities
        values = np.asarray(values, np.float64)
        if self._checks_priorities is None:  # whether the compiled update refuses bad values itself: fixed
            object.__setattr__(self, "_checks_priorities", self._update_checks_priorities())
        check_priorities(ids.shape, values.shape, None if self._checks_priorities else values)
        if ids.ndim != 1:
            ids, values = ids.reshape(-1), values.reshape(-1)
        with self._lock:
            return int(self._update_locked(ids, values))

    def _gather_all(self) -> Nest:
        return self._exclusive(self._gather_all_locked)

    def _clear(self) -> None:
        self._exclusive(self._clear_locked)
