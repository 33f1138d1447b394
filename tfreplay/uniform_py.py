"""`PyUniformReplayBuffer`: the uniform ring in NumPy arrays."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import checkpoint, ring, specs
from tfreplay.replay_buffer import BufferInfo
from tfreplay.specs import Nest
from tfreplay.storage import NumpyStorage
from tfreplay.uniform import RingBuffer, empty_message


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


class PyUniformReplayBuffer(RingBuffer):
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
        self._numpy_state = checkpoint.NumpyState(
            self._lock,
            lambda: dict(zip(self._leaf_paths, self._storage.arrays)),
            self._rng,
            layout=checkpoint.layout(self._data_spec, segments, length),
            scalars=lambda: {"num_adds": self._num_adds},
            restore_scalars=lambda d: setattr(self, "_num_adds", d["num_adds"]),
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
