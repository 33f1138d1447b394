"""Uniform replay: `TFUniformReplayBuffer` and its NumPy twin.

Both are the same ring (see `ring.py`) over a storage; they differ only in
their array operations, their lock and their random source.
"""

from __future__ import annotations

import abc
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import ring, specs
from tfreplay.replay_buffer import BufferInfo, ReplayBuffer, SegmentedReplayBuffer
from tfreplay.specs import Nest
from tfreplay.storage import NumpyCheckpointState, NumpyStorage, TFStorage

try:  # XLA has no mutex op: inside jit_compile the critical section is skipped.
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla_graph
except ImportError:  # pragma: no cover

    def _in_xla_graph(graph: Any) -> bool:
        return False


def empty_message(where: str, num_steps: int | None) -> str:
    if num_steps is None or num_steps == 1:
        return f"{where}: the buffer is empty; add items before sampling."
    return (
        f"{where}: no segment holds {num_steps} consecutive items yet (num_steps={num_steps}); "
        "add more items before sampling."
    )


class _RingBuffer(SegmentedReplayBuffer):
    """The ring shared by both twins; variants supply the hooks at the bottom."""

    _ops: Any

    def __init__(
        self,
        data_spec: Nest,
        num_segments: int,
        max_length: int,
        *,
        window_shift: int | None,
        drop_remainder: bool,
        stateful_dataset: bool,
        name: str,
    ):
        specs.check_positive_int(type(self).__name__, "dataset_window_shift", window_shift, allow_none=True)
        super().__init__(data_spec, num_segments, max_length, stateful_dataset, name=name)
        self._window_shift = window_shift
        self._drop_remainder = bool(drop_remainder)

    def _sample(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[list, Any, Any]:
        """Draws windows uniformly over (segment, start) pairs; under the lock."""

        def body() -> tuple[list, Any, Any]:
            num_adds = self._read_num_adds()
            count = ring.num_windows(num_adds, self._max_length, num_steps or 1, self._ops)
            total = count * self._num_segments
            shape = [] if sample_batch_size is None else [sample_batch_size]
            draws = self._draw(shape, total, num_steps)
            rows, ids = ring.windows_from_draws(
                draws, num_adds, self._max_length, self._num_segments, num_steps, self._ops
            )
            return self._gather(rows), ids, self._ops.probability(shape, total)

        return self._exclusive(body)

    def _package(
        self, leaves: list, ids: Any, probs: Any, batched: bool, num_steps: int | None, time_stacked: bool
    ) -> tuple[Nest, BufferInfo]:
        items = tf.nest.pack_sequence_as(self._data_spec, leaves)
        if num_steps is not None and not time_stacked:
            axis = 1 if batched else 0
            items = tuple(
                tf.nest.pack_sequence_as(self._data_spec, list(step))
                for step in zip(*[self._ops.unstack(x, axis) for x in leaves])
            )
            ids = self._ops.unstack(ids, axis)
        return items, BufferInfo(ids=ids, probabilities=probs)

    def _gather_all(self) -> Nest:
        def body() -> list:
            rows, _ = ring.all_rows(self._read_num_adds(), self._max_length, self._num_segments, self._ops)
            return self._gather(rows)

        return tf.nest.pack_sequence_as(self._data_spec, self._exclusive(body))

    def _single_pass_dataset(
        self, sample_batch_size: int | None, num_steps: int | None, num_parallel_calls: int | None
    ) -> tf.data.Dataset:
        """Windows of each segment in order; ids are read when iteration starts."""
        if self._drop_remainder and sample_batch_size is not None and sample_batch_size > self._num_segments:
            raise ValueError(
                f"as_dataset: sample_batch_size ({sample_batch_size}) must be at most batch_size "
                f"({self._num_segments}) with dataset_drop_remainder=True, or every batch is dropped."
            )
        size, shift = self._max_length, self._window_shift or num_steps

        def windows(ds: tf.data.Dataset, drop: bool) -> tf.data.Dataset:
            if num_steps is None:
                return ds
            return ds.window(num_steps, shift=shift).flat_map(
                lambda rows, ids: tf.data.Dataset.zip((rows.batch(num_steps, drop), ids.batch(num_steps, drop)))
            )

        def index_dataset(_: Any) -> tf.data.Dataset:
            num_adds = self._num_adds_tensor()
            min_id, num_live = ring.live_range(num_adds, size, ring.TF_OPS)
            local = min_id + tf.range(num_live, dtype=tf.int64)
            segments = tf.data.Dataset.range(self._num_segments)
            if sample_batch_size is None:
                return segments.flat_map(
                    lambda s: windows(
                        tf.data.Dataset.from_tensor_slices(ring.local_to_rows(local, s, size, self._num_segments)),
                        self._drop_remainder,
                    )
                )

            def group(segs: tf.Tensor) -> tf.data.Dataset:
                pairs = ring.local_to_rows(local[:, None], segs[None, :], size, self._num_segments)
                ds = windows(tf.data.Dataset.from_tensor_slices(pairs), True)
                return ds if num_steps is None else ds.map(lambda r, i: (tf.transpose(r), tf.transpose(i)))

            return segments.batch(sample_batch_size, self._drop_remainder).flat_map(group)

        def fetch(rows: tf.Tensor, ids: tf.Tensor) -> tuple[Nest, BufferInfo]:
            leaves = self._gather_tensors(rows)
            return tf.nest.pack_sequence_as(self._data_spec, leaves), BufferInfo(ids=ids, probabilities=())

        return tf.data.Dataset.range(1).flat_map(index_dataset).map(fetch, num_parallel_calls=num_parallel_calls)

    # Hooks each twin implements with its own array operations.
    @abc.abstractmethod
    def _read_num_adds(self) -> Any: ...

    @abc.abstractmethod
    def _num_adds_tensor(self) -> tf.Tensor: ...

    @abc.abstractmethod
    def _draw(self, shape: list, total: Any, num_steps: int | None) -> Any: ...

    @abc.abstractmethod
    def _gather(self, rows: Any) -> list: ...

    @abc.abstractmethod
    def _gather_tensors(self, rows: tf.Tensor) -> list: ...

    @abc.abstractmethod
    def _exclusive(self, fn: Callable[[], Any]) -> Any: ...


class TFUniformReplayBuffer(_RingBuffer):
    """A uniform replay buffer in `tf.Variable`s: graph-, XLA- and checkpoint-friendly.

    `batch_size` segments of `max_length` rows; `add_batch` writes row `b` of
    its batch to segment `b`, overwriting the oldest when full. Reads and
    writes run in one `tf.CriticalSection`, so concurrent writers and samplers
    never see a torn item (XLA has no mutex: under `jit_compile` the caller
    must not race). XLA cannot raise either: there, sampling an empty buffer
    returns defined rows with `probabilities` 0 instead of an error.
    Checkpoint it with `tf.train.Checkpoint(buffer=rb)`: the rows, the ring
    counter and the random generator are all variables.

    Args:
      data_spec: a nest of `tf.TensorSpec`.
      batch_size: number of segments (parallel environments).
      max_length: rows per segment.
      scope: name scope of its variables and ops.
      device: where the variables live.
      dataset_drop_remainder: drop incomplete batches/windows in the single pass.
      dataset_window_shift: window shift in the single pass (default: num_steps).
      stateful_dataset: mark datasets as carrying external state.
      seed: seed of the sampling generator; default TF's global seed if set
        (`tf.random.set_seed`), else nondeterministic.
    """

    _ops = ring.TF_OPS
    _TF_MODULE_IGNORED_PROPERTIES = frozenset(["_eager_fns"]).union(ReplayBuffer._TF_MODULE_IGNORED_PROPERTIES)

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int = 1000,
        scope: str = "TFUniformReplayBuffer",
        device: str = "cpu:*",
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        seed: int | list[int] | None = None,
    ):
        super().__init__(
            data_spec,
            batch_size,
            max_length,
            window_shift=dataset_window_shift,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
            name=scope,
        )
        self._device = device
        self._scope = scope
        if seed is None:  # TF's global seed, with an op seed so two buffers draw apart
            global_seed, op_seed = tf.compat.v1.get_seed(None)
            seed = None if global_seed is None else [global_seed, op_seed]
        with tf.device(device), tf.name_scope(scope):
            self._storage = TFStorage(self._data_spec, self._capacity, self._leaf_paths)
            self._num_adds = tf.Variable(0, dtype=tf.int64, trainable=False, name="num_adds")
            self._rng = (
                tf.random.Generator.from_non_deterministic_state()
                if seed is None
                else tf.random.Generator.from_seed(seed)
            )
        self._lock = tf.CriticalSection(name="lock")
        # Eager calls go through concrete functions traced once, on first use:
        # a polymorphic tf.function re-checks its signature on every call.
        object.__setattr__(self, "_eager_fns", {})  # untracked: not checkpoint state

    @property
    def device(self) -> str:
        return self._device

    @property
    def nbytes(self) -> int:
        """Bytes of item storage (the counters and generator add a few more)."""
        return self._storage.nbytes

    def _num_frames(self) -> tf.Tensor:
        return tf.minimum(self._num_adds.read_value(), self._max_length) * self._num_segments

    def _add_batch(self, items: Nest) -> Any:
        leaves, asserts = specs.validate_tensor_batch(
            "add_batch", self._data_spec, self._leaf_paths, items, self._num_segments
        )
        if tf.executing_eagerly():
            return self._eager_fn(
                "add",
                lambda: tf.function(self._write, autograph=False).get_concrete_function(
                    [tf.TensorSpec(x.shape, x.dtype) for x in leaves]
                ),
            )(leaves)
        with tf.control_dependencies(asserts):
            return self._write(leaves)

    def _write(self, leaves: list) -> tf.Tensor:
        def body() -> tf.Tensor:
            rows = ring.write_rows(self._num_adds.read_value(), 1, self._max_length, self._num_segments, self._ops)
            with tf.control_dependencies(self._storage.write(rows[0], leaves)):
                return self._num_adds.assign_add(1).read_value()

        with tf.device(self._device), tf.name_scope(self._scope):
            return self._exclusive(body)

    def _get_next(
        self, sample_batch_size: int | None, num_steps: int | None, time_stacked: bool
    ) -> tuple[Nest, BufferInfo]:
        if tf.executing_eagerly():
            key = f"sample/{sample_batch_size}/{num_steps}"
            fn = self._eager_fn(
                key,
                lambda: tf.function(
                    lambda: self._sample_tensors(sample_batch_size, num_steps), autograph=False
                ).get_concrete_function(),
            )
            try:
                items, info = fn()
            except tf.errors.InvalidArgumentError as err:  # the graph's emptiness check
                if empty_message("get_next", num_steps) in err.message:
                    raise ValueError(empty_message("get_next", num_steps)) from None
                raise
        else:
            items, info = self._sample_tensors(sample_batch_size, num_steps)
        if num_steps is None or time_stacked:
            return items, info
        return self._package(
            tf.nest.flatten(items), info.ids, info.probabilities, sample_batch_size is not None, num_steps, time_stacked
        )

    def _eager_fn(self, key: str, trace: Callable[[], Any]) -> Any:
        if key not in self._eager_fns:
            self._eager_fns[key] = trace()
        return self._eager_fns[key]

    def _sample_tensors(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Nest, BufferInfo]:
        with tf.device(self._device), tf.name_scope(self._scope):
            leaves, ids, probs = self._sample(sample_batch_size, num_steps)
        return self._package(leaves, ids, probs, sample_batch_size is not None, num_steps, True)

    def _clear(self) -> Any:
        return self._exclusive(lambda: self._num_adds.assign(0).read_value())

    def _read_num_adds(self) -> tf.Tensor:
        return self._num_adds.read_value()

    def _num_adds_tensor(self) -> tf.Tensor:
        return self._exclusive(self._num_adds.read_value)

    def _draw(self, shape: list, total: tf.Tensor, num_steps: int | None) -> tf.Tensor:
        check = tf.debugging.assert_positive(total, message=empty_message("get_next", num_steps))
        with tf.control_dependencies([check]):
            return self._rng.uniform(shape, minval=0, maxval=tf.maximum(total, 1), dtype=tf.int64)

    def _gather(self, rows: tf.Tensor) -> list:
        return self._storage.gather(rows)

    def _gather_tensors(self, rows: tf.Tensor) -> list:
        return self._exclusive(lambda: self._storage.gather(rows))

    def _exclusive(self, fn: Callable[[], Any]) -> Any:
        if not tf.executing_eagerly() and _in_xla_graph(tf.compat.v1.get_default_graph()):
            return fn()
        return self._lock.execute(fn)


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


class PyUniformReplayBuffer(_RingBuffer):
    """The NumPy twin of `TFUniformReplayBuffer`: same API, same semantics.

    Construct it the TF-Agents way, `PyUniformReplayBuffer(data_spec, capacity)`
    (one ring; `add_batch` takes any number of rows, appended in order), or
    like the TF twin, `PyUniformReplayBuffer(data_spec, batch_size=B,
    max_length=L)` (B segments; each batch must have B rows). Thread-safe:
    one lock covers every write and every sample, so no item is ever torn.
    `get_next` and `gather_all` return NumPy arrays; `as_dataset` yields
    tensors. Checkpointable with `tf.train.Checkpoint`.
    """

    _ops = ring.NUMPY_OPS

    def __init__(
        self,
        data_spec: Nest,
        capacity: int | None = None,
        *,
        batch_size: int | None = None,
        max_length: int | None = None,
        seed: int | None = None,
        dataset_drop_remainder: bool = False,
        dataset_window_shift: int | None = None,
        stateful_dataset: bool = False,
        name: str = "PyUniformReplayBuffer",
    ):
        segments, length = numpy_layout(type(self).__name__, capacity, batch_size, max_length)
        super().__init__(
            data_spec,
            segments,
            length,
            window_shift=dataset_window_shift,
            drop_remainder=dataset_drop_remainder,
            stateful_dataset=stateful_dataset,
            name=name,
        )
        self._rows_per_add = None if batch_size is None else batch_size
        self._storage = NumpyStorage(self._data_spec, self._capacity)
        self._num_adds = 0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._checkpoint_state = NumpyCheckpointState(
            self._lock,
            lambda: self._storage.arrays,
            self._rng,
            lambda: {"num_adds": self._num_adds},
            lambda d: setattr(self, "_num_adds", int(d["num_adds"])),
        )

    @property
    def nbytes(self) -> int:
        return self._storage.nbytes

    def _num_frames(self) -> int:
        return min(self._num_adds, self._max_length) * self._num_segments

    def _add_batch(self, items: Nest) -> None:
        arrays = specs.validate_numpy_batch("add_batch", self._data_spec, self._leaf_paths, items, self._rows_per_add)
        num_new = 1 if self._rows_per_add is not None else arrays[0].shape[0]
        if num_new == 0:
            return
        skip = max(num_new - self._max_length, 0)  # only the newest max_length rows survive
        if skip:
            arrays = [a[skip:] for a in arrays]
        with self._lock:
            rows = ring.write_rows(
                self._num_adds + skip, num_new - skip, self._max_length, self._num_segments, self._ops
            )
            self._storage.write(rows.reshape(-1), arrays)
            self._num_adds += num_new

    def _get_next(
        self, sample_batch_size: int | None, num_steps: int | None, time_stacked: bool
    ) -> tuple[Nest, BufferInfo]:
        leaves, ids, probs = self._sample(sample_batch_size, num_steps)
        return self._package(leaves, ids, probs, sample_batch_size is not None, num_steps, time_stacked)

    def _sample_tensors(self, sample_batch_size: int | None, num_steps: int | None) -> tuple[Nest, BufferInfo]:
        outer = ([] if sample_batch_size is None else [sample_batch_size]) + ([] if num_steps is None else [num_steps])

        def sample(_: Any) -> list:
            leaves, ids, probs = self._sample(sample_batch_size, num_steps)
            return leaves + [ids, probs]

        out = self._numpy_call(sample, [tf.constant(0)], [tf.int64, tf.float32])
        for tensor, spec in zip(out, tf.nest.flatten(self._data_spec)):
            tensor.set_shape(outer + spec.shape.as_list())
        out[-2].set_shape(outer)
        out[-1].set_shape([] if sample_batch_size is None else [sample_batch_size])  # one per window
        return tf.nest.pack_sequence_as(self._data_spec, out[:-2]), BufferInfo(ids=out[-2], probabilities=out[-1])

    def _numpy_call(self, fn: Callable, inputs: list, extra: list) -> list:
        dtypes = [s.dtype for s in tf.nest.flatten(self._data_spec)] + extra
        return list(tf.numpy_function(fn, inputs, dtypes, stateful=True))

    def _clear(self) -> None:
        with self._lock:
            self._num_adds = 0

    def _read_num_adds(self) -> int:
        return self._num_adds

    def _num_adds_tensor(self) -> tf.Tensor:
        return tf.numpy_function(lambda: np.int64(self._num_adds), [], tf.int64, stateful=True)

    def _draw(self, shape: list, total: Any, num_steps: int | None) -> np.ndarray:
        if total <= 0:
            raise ValueError(empty_message("get_next", num_steps))
        return self._rng.integers(0, total, size=shape, dtype=np.int64)

    def _gather(self, rows: np.ndarray) -> list:
        return self._storage.gather(rows)

    def _gather_tensors(self, rows: tf.Tensor) -> list:
        def gather(r: np.ndarray) -> list:
            with self._lock:
                return self._storage.gather(r)

        out = self._numpy_call(gather, [rows], [])
        for tensor, spec in zip(out, tf.nest.flatten(self._data_spec)):
            tensor.set_shape(rows.shape.concatenate(spec.shape))
        return out

    def _exclusive(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            return fn()
