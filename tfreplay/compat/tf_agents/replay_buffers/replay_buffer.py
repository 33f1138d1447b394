"""`tf_agents.replay_buffers.replay_buffer`: the abstract `ReplayBuffer` with TF-Agents' hooks.

A TF-Agents subclass (implementing `_num_frames`, `_add_batch`, `_get_next`,
`_as_dataset`, `_single_deterministic_pass_dataset`, `_gather_all`, `_clear`)
works unchanged on this base. The compat uniform buffers are registered as
its subclasses, so `isinstance(rb, ReplayBuffer)` holds for them too.
"""

from __future__ import annotations

import abc
from typing import Any, Callable

import tensorflow as tf

from tfreplay._src.api import BufferInfo
from tfreplay._src.specs import Nest

__all__ = ["BufferInfo", "ReplayBuffer"]


class ReplayBuffer(tf.Module, metaclass=abc.ABCMeta):
    """Abstract base of a replay buffer: public methods call the protected hooks subclasses implement.

    Args:
      data_spec: a nest of specs of one item.
      capacity: how many items the buffer holds.
      stateful_dataset: whether `as_dataset` carries state tf.data must not serialize.
    """

    def __init__(self, data_spec: Nest, capacity: Any, stateful_dataset: bool = False):
        super().__init__()
        self._data_spec = data_spec
        self._capacity = capacity
        self._stateful_dataset = stateful_dataset

    @property
    def data_spec(self) -> Nest:
        return self._data_spec

    @property
    def capacity(self) -> Any:
        return self._capacity

    @property
    def stateful_dataset(self) -> bool:
        return self._stateful_dataset

    def num_frames(self) -> Any:
        """How many items are stored."""
        return self._num_frames()

    def add_batch(self, items: Nest) -> Any:
        """Adds a batch of items (a leading batch dimension on every leaf)."""
        return self._add_batch(items)

    def get_next(self, sample_batch_size: Any = None, num_steps: Any = None, time_stacked: bool = True) -> Any:
        """A sample: items (or windows of `num_steps`), batched when `sample_batch_size` is given."""
        return self._get_next(sample_batch_size, num_steps, time_stacked)

    def as_dataset(
        self,
        sample_batch_size: Any = None,
        num_steps: Any = None,
        num_parallel_calls: Any = None,
        sequence_preprocess_fn: Callable | None = None,
        single_deterministic_pass: bool = False,
    ) -> tf.data.Dataset:
        """A dataset of samples, or one ordered pass with `single_deterministic_pass=True`."""
        make = self._single_deterministic_pass_dataset if single_deterministic_pass else self._as_dataset
        ds = make(
            sample_batch_size=sample_batch_size,
            num_steps=num_steps,
            sequence_preprocess_fn=sequence_preprocess_fn,
            num_parallel_calls=num_parallel_calls,
        )
        if self._stateful_dataset:
            options = tf.data.Options()
            options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
            ds = ds.with_options(options)
        return ds

    def gather_all(self) -> Nest:
        """Every stored item, `[batch_size, time, ...]`."""
        return self._gather_all()

    def clear(self) -> Any:
        """Empties the buffer."""
        return self._clear()

    @abc.abstractmethod
    def _num_frames(self) -> Any: ...

    @abc.abstractmethod
    def _add_batch(self, items: Nest) -> Any: ...

    @abc.abstractmethod
    def _get_next(self, sample_batch_size: Any, num_steps: Any, time_stacked: bool) -> Any: ...

    @abc.abstractmethod
    def _as_dataset(
        self, sample_batch_size: Any, num_steps: Any, sequence_preprocess_fn: Any, num_parallel_calls: Any
    ) -> tf.data.Dataset: ...

    @abc.abstractmethod
    def _single_deterministic_pass_dataset(
        self, sample_batch_size: Any, num_steps: Any, sequence_preprocess_fn: Any, num_parallel_calls: Any
    ) -> tf.data.Dataset: ...

    @abc.abstractmethod
    def _gather_all(self) -> Nest: ...

    @abc.abstractmethod
    def _clear(self) -> Any: ...


def has_lists(structure: Nest) -> bool:
    """Whether a nest holds a list anywhere (tfreplay stores lists as tuples)."""
    if isinstance(structure, list):
        return True
    if isinstance(structure, dict):
        return any(has_lists(v) for v in structure.values())
    if isinstance(structure, tuple):
        return any(has_lists(v) for v in structure)
    return False


def as_given(data_spec: Nest) -> Callable[[Nest], Nest]:
    """Repacks items into the structure of `data_spec` as the user gave it (lists stay lists, as in TF-Agents)."""
    if not has_lists(data_spec):
        return lambda items: items
    return lambda items: tf.nest.pack_sequence_as(data_spec, tf.nest.flatten(items))
