"""`TFUniformReplayBuffer`: the uniform ring in `tf.Variable`s."""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from tfreplay import ring, specs
from tfreplay.replay_buffer import BufferInfo
from tfreplay.specs import Nest
from tfreplay.storage import TFStorage
from tfreplay.uniform import RingBuffer, empty_message

try:  # XLA has no mutex op: inside jit_compile the critical section is skipped.
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla_graph
except ImportError:  # pragma: no cover

    def _in_xla_graph(graph: Any) -> bool:
        return False


class EagerFunctions:
    """Concrete functions traced once per key, for eager calls (graphs may call them too).

    A concrete function is cheaper per call than a polymorphic `tf.function`,
    which re-checks its signature every time. Kept out of `tf.Module` tracking:
    it is not checkpoint state.
    """

    def __init__(self) -> None:
        self._fns: dict[str, Any] = {}

    def get(self, key: str, fn: Callable, *signature: Any, jit_compile: bool | None = None) -> Any:
        """The concrete function of `fn` for `key`, traced (and compiled) on first use."""
        if key not in self._fns:
            traced = tf.function(fn, autograph=False, jit_compile=jit_compile)
            self._fns[key] = traced.get_concrete_function(*signature)
        return self._fns[key]


def under_xla() -> bool:
    """Whether ops are being traced into an XLA (`jit_compile`) function."""
    return not tf.executing_eagerly() and _in_xla_graph(tf.compat.v1.get_default_graph())


def tf_exclusive(lock: tf.CriticalSection, fn: Callable[[], Any]) -> Any:
    """Runs `fn` in `lock`, except under XLA, which has no mutex op.

    In a graph the section is `lock.execute`: its lock tensor lives and dies in
    one function execution. Eagerly (`clear`, `gather_all`, `num_transitions`;
    `fn` is a new closure each time, so tracing it would cost a trace per call)
    the lock tensor's only reference is a local dropped in `finally`: the mutex
    is free again as soon as `fn` returns, raises or is interrupted, never left
    to the garbage collector (`CriticalSection.execute` keeps it in its frame,
    which a kept traceback keeps alive).
    """
    if under_xla():
        return fn()
    if not tf.executing_eagerly():
        return lock.execute(fn)
    held = None
    try:
        held = tf.raw_ops.MutexLock(mutex=lock._handle)
        return fn()
    finally:
        del held  # its only reference: the mutex is released here


def locked_call(lock: tf.CriticalSection, call: Callable[[], Any]) -> Any:
    """`call()`, one compiled function call, holding `lock`'s mutex: graph only.

    `CriticalSection.execute` adds identity ops around every output: a dozen
    ops per sample, slower than the sample itself. Around one call, the mutex
    ops alone keep the order: the call waits for the lock, the release waits
    for the call's outputs. It is the section's own mutex, so this excludes
    `execute` callers as well. The lock tensor lives and dies inside one
    function execution, which frees it when the call fails too. Eager callers
    trace this into a concrete function (`EagerFunctions.get`) and call that,
    so no Python object ever holds the mutex.

    Raises:
      RuntimeError: called eagerly.
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "locked_call: called eagerly; trace it into a concrete function (EagerFunctions.get) and call that, "
            "so the mutex lives and dies inside one function execution."
        )
    if under_xla():
        return call()
    held = tf.raw_ops.MutexLock(mutex=lock._handle)
    with tf.control_dependencies([held]):
        out = call()
    with tf.control_dependencies(tf.nest.flatten(out)):
        tf.raw_ops.ConsumeMutexLock(mutex_lock=held)  # stateful: tf.function always runs it
    return out


class TFUniformReplayBuffer(RingBuffer):
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
        self._eager = EagerFunctions()

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
            signature = [tf.TensorSpec(x.shape, x.dtype) for x in leaves]
            return self._eager.get("add", self._write, signature)(leaves)
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
            fn = self._eager.get(
                f"sample/{sample_batch_size}/{num_steps}", lambda: self._sample_tensors(sample_batch_size, num_steps)
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
        return tf_exclusive(self._lock, fn)
