"""The abstract replay buffer API, as in `tf_agents.replay_buffers`.

Public methods check their arguments once (`_sample_request`: a request the
hooks receive) and then call a protected hook that each implementation
provides (`buffer.Buffer`, the sharded service's client). A TF-Agents user
switches by changing the import.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, NamedTuple

import tensorflow as tf

from tfreplay._src import checked_dataset, specs
from tfreplay._src.rate_limiting.gate import Gate
from tfreplay._src.specs import Nest


class BufferInfo(NamedTuple):
    """What a sample carries beside its items.

    Attributes:
      ids: each sampled item's global id (insertion order since the last
        clear), shaped like the items' outer dimensions.
      probabilities: the probability with which each sampled window was drawn,
        one per sample (`()` for the deterministic pass, which does not draw).
    """

    ids: Any
    probabilities: Any


class SampleArgs(NamedTuple):
    """A checked `get_next` / `as_dataset` request, as the default `_sample_request` makes it."""

    sample_batch_size: int | None
    num_steps: int | None
    time_stacked: bool
    transform: Any

    @property
    def size(self) -> int:
        return self.sample_batch_size or 1


def _is_variable(value: Any) -> bool:
    return isinstance(value, tf.Variable)


def counter_dataset() -> tf.data.Dataset:
    if hasattr(tf.data.Dataset, "counter"):
        return tf.data.Dataset.counter()
    return tf.data.experimental.Counter()  # pragma: no cover (TF < 2.13)


class ReplayBuffer(tf.Module, metaclass=abc.ABCMeta):
    """Abstract base: a store of spec-shaped items that can be sampled.

    A subclass implements the abstract hooks below, and sets `_sample(request) -> (items, BufferInfo)`,
    one sample of a checked request, as an attribute when it is made (a function bound to its state, so
    `get_next` calls it with no forwarding method between).

    Args:
      data_spec: a nest of `tf.TensorSpec` describing one item.
      capacity: how many items the buffer holds at most.
      stateful_dataset: whether `as_dataset` carries state (the buffer) that
        tf.data should not try to serialize; sets the dataset's options.
    """

    _sample: Callable[[Any], tuple[Nest, BufferInfo]]

    def __init__(self, data_spec: Nest, capacity: int, stateful_dataset: bool = False, name: str | None = None):
        super().__init__(name=name)
        # Not tracked by tf.Module (specs hold no state): tracking would wrap dicts
        # in DictWrapper, and every item packed from the spec would come back wrapped.
        object.__setattr__(self, "_data_spec", specs.normalize_spec(data_spec))
        object.__setattr__(self, "_leaf_paths", specs.leaf_paths(self._data_spec))
        specs.check_positive_int(type(self).__name__, "capacity", capacity)
        self._capacity = int(capacity)
        self._stateful_dataset = stateful_dataset
        object.__setattr__(self, "_gate", Gate(None, type(self).__name__, self._capacity, 1))  # no rate limiter

    @property
    def data_spec(self) -> Nest:
        """The spec of one item."""
        return self._data_spec

    @property
    def capacity(self) -> int:
        """How many items the buffer holds at most."""
        return self._capacity

    @property
    def stateful_dataset(self) -> bool:
        return self._stateful_dataset

    def variables(self) -> tuple:  # type: ignore[override]
        """Every `tf.Variable` of the buffer: a method, as in TF-Agents (`tf.Module` has a property)."""
        return tuple(self._flatten(predicate=_is_variable, expand_composites=True))

    def num_frames(self) -> tf.Tensor | int:
        """How many items are stored now (not how many were ever added): a scalar int64 tensor from a TF
        buffer, an `int` from a NumPy one."""
        return self._num_frames()

    def add_batch(self, items: Nest) -> tf.Tensor | None:
        """Adds a batch of items: a nest like `data_spec` with an outer batch dim.

        A rejected batch (wrong structure, dtype, shape or batch size) raises
        `TypeError`/`ValueError` naming the leaf and leaves the buffer unchanged.
        With a `rate_limiter` it first waits for room (see `close()`).

        Returns:
          A TF buffer: a tensor to depend on inside a graph (the write is done
          when it is). A NumPy buffer: None.
        """
        self._gate.check_open("add_batch")
        return self._add_batch(items)

    def get_next(
        self,
        sample_batch_size: int | None = None,
        num_steps: int | None = None,
        time_stacked: bool = True,
        transform: Any = None,
    ) -> tuple[Nest, BufferInfo]:
        """Samples an item, a window of `num_steps` items, or a batch of either.

        Args:
          sample_batch_size: `None` for one sample with no batch dimension.
          num_steps: `None` for single items; `N` for N consecutive items of one
            segment, which never cross the write head.
          time_stacked: with `num_steps`, stack the window on a time axis
            (`[B, T, ...]`, or `[T, ...]` without a batch size); otherwise return
            a tuple of `num_steps` items.
          transform: a `tfreplay.transforms.Transform` (`NStepReturns`,
            `Sequences`): reads its windows and returns what it makes of them,
            with the ids and probabilities of each window's first item.

        Returns:
          `(items, BufferInfo)`.

        Raises:
          ValueError: a non-positive size, `num_steps` longer than a segment, or
            an empty buffer (`EmptyBufferError`, which is also a
            `tf.errors.InvalidArgumentError`: what the same refusal raises
            inside `tf.function`, where TF heads the message with `Graph
            execution error:` and the caller's frames that made the sample).
          BufferClosedError: after `close()` (in a graph: `tf.errors.OutOfRangeError`).
          RateLimitTimeoutError: the `rate_limiter` did not admit it in time.
        """
        request = self._sample_request("get_next", sample_batch_size, num_steps, time_stacked, transform)
        gate = self._gate
        if tf.executing_eagerly():
            if gate.idle:  # no rate limiter, not closed: nothing to wait for
                return self._sample(request)
            return gate.call("get_next", "sample", request.size, lambda: self._sample(request))
        with tf.control_dependencies(gate.admit_op("get_next", "sample", request.size)):  # wait, then sample
            return self._sample(request)

    def as_dataset(
        self,
        sample_batch_size: int | None = None,
        num_steps: int | None = None,
        num_parallel_calls: int | None = None,
        sequence_preprocess_fn: Callable[[Nest], Nest] | None = None,
        single_deterministic_pass: bool = False,
        transform: Any = None,
    ) -> tf.data.Dataset:
        """A `tf.data.Dataset` of `(items, BufferInfo)`.

        By default every element is a fresh uniform sample, drawn when the
        iterator asks for it, so it sees data a collector keeps adding. With
        `single_deterministic_pass=True` it yields every stored item exactly
        once, segment by segment in insertion order, in windows of `num_steps`.
        With a `rate_limiter` each sampled element waits until it is admitted,
        and the dataset ends (`StopIteration`) once the buffer is closed; the
        deterministic pass reads what is stored and is not limited.

        For `model.fit`, map the elements to `(x, y)` first:
        `tfreplay.keras.fit_dataset(buffer, 64, x="observation", y="reward")`
        (or `.map(tfreplay.keras.fit_map(x, y))`). Keras reads an element as
        `(x, y)`, so a raw element would give the model the whole items as
        inputs and the `BufferInfo` as targets, and Keras reports only that the
        model's inputs did not match.

        Nothing to draw (an empty buffer, no window of `num_steps` yet, no rate
        limiter to wait): an eager `iter()` of this dataset raises
        `tfreplay.EmptyBufferError` as it starts, before tf.data runs. An
        iterator that meets it later (the buffer emptied by `clear()`, a
        dataset made from this one by `map` or `batch`, an iterator made inside
        `tf.function`) raises `tf.errors.InvalidArgumentError` with the same
        message, which TF prefixes with its pipeline's words (`Error in
        user-defined function passed to MapDataset...`) and logs as `Local
        rendezvous is aborting`.

        Args:
          sample_batch_size: elements' batch size (`None`: unbatched).
          num_steps: window length, as in `get_next`.
          num_parallel_calls: samples drawn in parallel (`tf.data.AUTOTUNE` ok).
          sequence_preprocess_fn: applied to the (time-stacked, batched) items
            of every element before it is returned.
          single_deterministic_pass: one ordered pass instead of sampling.
          transform: as in `get_next`, applied to every element's sample.

        Raises:
          ValueError: a bad argument (as `get_next`), at once.
          EmptyBufferError: nothing to draw, when an eager iterator starts.
        """
        self._gate.check_open("as_dataset")
        request = self._sample_request("as_dataset", sample_batch_size, num_steps, True, transform)
        if transform is not None and single_deterministic_pass:
            raise ValueError("as_dataset: transform must be None with single_deterministic_pass (which does not draw).")
        if num_parallel_calls not in (None, tf.data.AUTOTUNE):
            specs.check_positive_int("as_dataset", "num_parallel_calls", num_parallel_calls)
        if sequence_preprocess_fn is not None and not callable(sequence_preprocess_fn):
            raise TypeError(f"as_dataset: sequence_preprocess_fn ({sequence_preprocess_fn!r}) must be callable.")
        if single_deterministic_pass:
            ds = self._single_pass_dataset(request, num_parallel_calls)
        else:
            ds = self._sample_dataset(request, num_parallel_calls)
        if sequence_preprocess_fn is not None:
            fn = sequence_preprocess_fn
            ds = ds.map(lambda items, info: (fn(items), info), num_parallel_calls=num_parallel_calls)
        if self._stateful_dataset:
            options = tf.data.Options()
            options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
            ds = ds.with_options(options)
        check = None if single_deterministic_pass else self._iterator_check(request)
        return ds if check is None else checked_dataset.checked(ds, check)

    def _iterator_check(self, request: Any) -> Callable[[], None] | None:
        """What an eager iterator of sampled elements calls as it starts: raises `EmptyBufferError` when
        nothing can be drawn and nothing would wait (None: no check)."""
        return None

    def _sample_dataset(self, request: Any, num_parallel_calls: int | None) -> tf.data.Dataset:
        """Fresh samples, one drawn per element, each once the rate limiter admits it; endless until `close()`.

        Parallel draws are delivered as they finish (`deterministic=False`): elements are independent
        draws, and which call gets which draw was never ordered, so in-order delivery would only make
        each element wait for the slowest call before it."""
        return self._gate.ticks(counter_dataset(), request.size).map(
            lambda _: self._sample_tensors(request),
            num_parallel_calls=num_parallel_calls,
            deterministic=None if num_parallel_calls is None else False,
        )

    def gather_all(self) -> Nest:
        """Every stored item, shaped `[batch_size, time, ...]` (a row per segment, oldest first), whatever
        windows the buffer samples (`within_episodes` too). Frame buffers, whose items are built from
        frames, return every valid transition instead: `[num_transitions, ...]`, segment by segment."""
        return self._gather_all()

    def clear(self) -> tf.Tensor | None:
        """Empties the buffer; capacity and spec stay. A rate limiter's counts start again from zero.

        Returns:
          A TF buffer: a tensor to depend on inside a graph. A NumPy buffer: None.
        """
        return self._gate.after_clear(self._clear())

    def close(self) -> None:
        """Ends the buffer's service to collectors and learners; idempotent.

        Every `add_batch` and `get_next` waiting for the rate limiter raises
        `BufferClosedError` (inside a graph: `tf.errors.OutOfRangeError`),
        sampling datasets end (`StopIteration`) after the elements already
        drawn, and later `add_batch`, `get_next` and `as_dataset` calls are
        refused the same way. The items stay: `gather_all`, `num_frames` and
        checkpoints still work. Without a rate limiter nothing waits: graphs
        traced and dataset iterators made before `close()` keep working.
        """
        self._gate.close()

    def _sample_request(
        self, where: str, sample_batch_size: Any, num_steps: Any, time_stacked: bool, transform: Any
    ) -> Any:
        """The checked request the sampling hooks receive (sizes as Python ints: scalar tensors and NumPy
        integers too); it has a `size` (windows per sample)."""
        sample_batch_size = specs.static_int(where, "sample_batch_size", sample_batch_size)
        num_steps = specs.static_int(where, "num_steps", num_steps)
        specs.check_positive_int(where, "sample_batch_size", sample_batch_size, allow_none=True)
        specs.check_positive_int(where, "num_steps", num_steps, allow_none=True)
        longest = self._max_window()
        if num_steps is not None and num_steps > longest:
            raise ValueError(
                f"{where}: num_steps ({num_steps}) must be at most max_length ({longest}); "
                "a window is drawn from one segment, which never holds more."
            )
        if transform is not None and not time_stacked:
            raise ValueError(f"{where}: time_stacked (False) must be True with a transform, which maps whole windows.")
        return SampleArgs(sample_batch_size, num_steps, time_stacked, transform)

    @abc.abstractmethod
    def _max_window(self) -> int:
        """The longest `num_steps` a window may have."""

    @abc.abstractmethod
    def _num_frames(self) -> Any: ...

    @abc.abstractmethod
    def _add_batch(self, items: Nest) -> Any: ...

    @abc.abstractmethod
    def _sample_tensors(self, request: Any) -> tuple[Nest, BufferInfo]:
        """One time-stacked sample as tensors, usable inside a dataset map."""

    @abc.abstractmethod
    def _single_pass_dataset(self, request: Any, num_parallel_calls: int | None) -> tf.data.Dataset: ...

    @abc.abstractmethod
    def _gather_all(self) -> Nest: ...

    @abc.abstractmethod
    def _clear(self) -> Any: ...
