"""Uniform replay: the ring both twins share.

`TFUniformReplayBuffer` (`uniform_tf.py`) and `PyUniformReplayBuffer`
(`uniform_py.py`) are this ring (see `ring.py`) over a storage; they differ
only in their array operations, their lock and their random source.
"""

from __future__ import annotations

import abc
from typing import Any, Callable

import tensorflow as tf

from tfreplay import ring, specs
from tfreplay.replay_buffer import BufferInfo, SegmentedReplayBuffer
from tfreplay.specs import Nest


def empty_message(where: str, num_steps: int | None) -> str:
    if num_steps is None or num_steps == 1:
        return f"{where}: the buffer is empty; add items before sampling."
    return (
        f"{where}: no segment holds {num_steps} consecutive items yet (num_steps={num_steps}); "
        "add more items before sampling."
    )


class RingBuffer(SegmentedReplayBuffer):
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
