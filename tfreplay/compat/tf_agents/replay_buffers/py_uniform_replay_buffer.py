"""`tf_agents.replay_buffers.py_uniform_replay_buffer` over tfreplay's `PyUniformReplayBuffer`.

TF-Agents 0.19's constructor `(data_spec, capacity)` (ArraySpecs welcome) and
returns: `get_next` gives the items alone, the dataset yields items alone.
Unlike TF-Agents it takes batches of any size, counts `num_frames()`, refuses
to sample an empty buffer instead of returning uninitialised arrays, and
supports `num_parallel_calls` and the deterministic pass.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from tfreplay import buffers
from tfreplay._src import specs
from tfreplay._src.specs import Nest
from tfreplay.compat.tf_agents.replay_buffers import replay_buffer

__all__ = ["PyUniformReplayBuffer"]


class PyUniformReplayBuffer(buffers.PyUniformReplayBuffer):
    """TF-Agents' `PyUniformReplayBuffer`, by tfreplay: one ring of `capacity` items, thread-safe.

    As TF-Agents' NumPy buffer, an empty one samples zeros (TF-Agents returns unset arrays) instead of
    refusing: code switched from TF-Agents may rely on it. `tfreplay.PyUniformReplayBuffer` refuses.

    Args:
      data_spec: a nest of `ArraySpec`s (or `tf.TensorSpec`s) of one item.
      capacity: how many items it holds.
      seed: (keyword only, tfreplay's) seed of the sampling generator.
    """

    _zeros_when_empty = True

    def __init__(self, data_spec: Nest, capacity: int, *, seed: int | None = None):
        super().__init__(data_spec, capacity, seed=seed)
        object.__setattr__(self, "_given_spec", data_spec)
        object.__setattr__(self, "_as_given", replay_buffer.as_given(data_spec))
        ints = [s.dtype.as_numpy_dtype if s.dtype.is_integer else None for s in tf.nest.flatten(self._data_spec)]
        object.__setattr__(self, "_int_leaves", ints if any(ints) else None)

    @property
    def data_spec(self) -> Nest:
        """The spec as given."""
        return self._given_spec

    def add_batch(self, items: Nest) -> None:
        """Adds items; an integer array whose every value fits the spec's integer dtype is taken as that dtype.

        TF-Agents' NumPy buffer casts whatever it gets (`np.array([0])` is
        int64 against an int32 spec); here only such exact integer
        conversions are made, and anything lossy is still refused.
        """
        if not self._int_leaves:
            super().add_batch(items)
            return
        flat = specs.flatten_items("add_batch", self._data_spec, items)  # a bad structure: tfreplay's own error
        flat = [_exact_int(x, dtype) if dtype else x for x, dtype in zip(flat, self._int_leaves)]
        super().add_batch(tf.nest.pack_sequence_as(self._data_spec, flat))

    def get_next(  # type: ignore[override]
        self, sample_batch_size: Any = None, num_steps: Any = None, time_stacked: bool = True, *, transform: Any = None
    ) -> Nest:
        """The sampled items alone, as TF-Agents' NumPy buffer returns them."""
        items, _ = super().get_next(sample_batch_size, num_steps, time_stacked, transform)
        if num_steps is not None and not time_stacked:
            return tuple(self._as_given(step) for step in items)
        return self._as_given(items)

    def as_dataset(  # type: ignore[override]
        self,
        sample_batch_size: Any = None,
        num_steps: Any = None,
        num_parallel_calls: Any = None,
        sequence_preprocess_fn: Callable[[Nest], Nest] | None = None,
        single_deterministic_pass: bool = False,
        *,
        transform: Any = None,
    ) -> tf.data.Dataset:
        """A dataset of items alone (no `BufferInfo`), as TF-Agents' NumPy buffer yields them."""
        ds = super().as_dataset(
            sample_batch_size,
            num_steps,
            num_parallel_calls,
            sequence_preprocess_fn,
            single_deterministic_pass,
            transform,
        )
        return ds.map(lambda items, info: items)

    def gather_all(self) -> Nest:
        return self._as_given(super().gather_all())


def _exact_int(value: Any, dtype: Any) -> Any:
    """`value` as `dtype` when it is an integer NumPy array (or scalar) whose values all survive; else unchanged."""
    if not isinstance(value, (np.ndarray, np.integer)) or value.dtype == dtype or value.dtype.kind not in "iu":
        return value
    converted = np.asarray(value).astype(dtype)
    return converted if np.array_equal(converted, value) else value


replay_buffer.ReplayBuffer.register(PyUniformReplayBuffer)
