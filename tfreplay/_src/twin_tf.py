"""The TF twin: a buffer's state in `tf.Variable`s, usable eagerly, in `tf.function` and under XLA.

Writes run in one `tf.CriticalSection`; samples read without it, drawn again
under it when a write may have torn them (`versioned.py`). XLA has no mutex:
under `jit_compile` the caller must not race (`TrainLoop` holds the lock
around its compiled call, `locked_call`); XLA cannot raise either, so
there an empty buffer's samples carry probability 0. Eager calls go through
concrete functions traced once per kind of call. What a buffer asks of a
twin is listed in `buffer.py`.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Callable

import tensorflow as tf

from tfreplay._src import sample, specs, tracebacks, versioned, write
from tfreplay._src.api import BufferInfo
from tfreplay._src.checkpoint import staged, state
from tfreplay._src.checkpoint.layout import LayoutState
from tfreplay._src.ops import TF_OPS, under_xla
from tfreplay._src.parts import Parts, Request
from tfreplay._src.rate_limiter import EmptyBufferError
from tfreplay._src.specs import Nest


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
            self._fns[key] = FlatCall(traced.get_concrete_function(*signature))
        return self._fns[key]


class FlatCall:
    """A concrete function whose eager calls skip its signature check.

    Its callers pass tensors already checked against the spec (`add_batch`,
    `update_priorities`) or no inputs at all, and the check (a structured
    binding that converts and compares every input) costs a quarter of a small
    eager call. In a graph, or where TF lacks the flat entry, the ordinary call.
    """

    def __init__(self, concrete: Any):
        self.concrete = concrete
        self._flat = getattr(concrete, "_call_flat", None)  # TF's flat entry (TF 2.15 to 2.21 at least)

    def __call__(self, *args: Any) -> Any:
        if self._flat is None or not tf.executing_eagerly():
            return self.concrete(*args)
        return self._flat(tf.nest.flatten(args), self.concrete.captured_inputs)


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
    ops per sample. Around one call the mutex ops alone keep the order: the
    call waits for the lock, the release waits for the call's outputs. It is
    the section's own mutex, so this excludes `execute` callers as well. The
    lock tensor lives and dies inside one function execution, which frees it
    when the call fails too; eager callers reach it through a concrete
    function (`EagerFunctions.get`), so no Python object ever holds the mutex.

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


def resolve_seed(seed: Any) -> Any:
    """`seed`, or TF's global seed with an op seed (so buffers made under one global seed draw apart)."""
    if seed is not None:
        return seed
    global_seed, op_seed = tf.compat.v1.get_seed(None)
    return None if global_seed is None else [global_seed, op_seed]


def variable_name(path: str) -> str:
    """A valid TF name for a spec path (`'my obs'`, `'<item>'` are not)."""
    name = re.sub(r"[^A-Za-z0-9_.\-/]", "_", path).strip("/")
    return name if re.match(r"[A-Za-z0-9.]", name) else f"v{name}"


class TFTwin:
    """Variables, lock and generator of one TF buffer, and how its calls reach them.

    Args:
      scope: name scope of its variables and ops (any string).
      device: where the variables live.
      seed: of the sampling generator (`tf.random.Generator`); None: TF's global seed if set, else
        nondeterministic.
    """

    ops = TF_OPS
    is_tf = True
    lockstep = True

    def __init__(self, scope: str = "Buffer", device: str = "cpu:*", seed: Any = None):
        self.scope, self.device, self.seed = scope, device, resolve_seed(seed)
        self.state: dict[str, tf.Variable] = {}
        with tf.device(device), tf.name_scope(scope):
            generator = staged.StagedGenerator  # its state restores with the buffer's, checked first
            self.rng = generator.from_non_deterministic_state() if self.seed is None else generator.from_seed(self.seed)
        # Its own mutex: eagerly created sections otherwise share one, and every buffer would wait for all others.
        self.lock = tf.CriticalSection(name="lock", shared_name=f"tfreplay_lock_{uuid.uuid4().hex}")
        self.eager = EagerFunctions()
        self.counters: versioned.Counters | None = None
        self.staging = staged.Staging(check=lambda values: None)  # the buffer's check, once its parts exist

    def module_name(self, name: str | None) -> str:
        """A `tf.Module` name (an identifier) from the scope, which may be any string."""
        name = re.sub(r"\W", "_", self.scope)
        return name if name[:1].isalpha() or name[:1] == "_" else f"buffer_{name}"

    # What the parts are made with.
    def make(self, name: str, shape: list, dtype: tf.DType) -> tf.Variable:
        """A zero-filled variable, part of the checkpoint."""
        with tf.device(self.device), tf.name_scope(self.scope):
            variable = staged.make(self.staging, tf.zeros(shape, dtype), variable_name(name))
        self.state[name] = variable
        return variable

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        return tf_exclusive(self.lock, fn)

    def locked_call(self, fn: Callable[[], Any]) -> Any:
        return locked_call(self.lock, fn)

    # The generator's own draws as one op each: `Generator.uniform` spends eight ops (read-and-skip, then a
    # stateless draw) on the same numbers and the same state update. XLA's kernels of these ops draw other
    # numbers, so there `Generator.uniform` keeps compiled and eager samples equal.
    def draw(self, shape: list, total: Any) -> tf.Tensor:
        """Uniform int64 draws in `[0, total)` (any defined value when `total` is 0)."""
        if under_xla():
            return self.rng.uniform(shape, minval=0, maxval=tf.maximum(total, 1), dtype=tf.int64)
        return tf.raw_ops.StatefulUniformInt(
            resource=self.rng.state.handle,
            algorithm=tf.constant(self.rng.algorithm, tf.int64),
            shape=shape,
            minval=tf.constant(0, tf.int64),
            maxval=tf.maximum(tf.cast(total, tf.int64), 1),
        )

    def uniform(self, shape: list) -> tf.Tensor:
        if under_xla():
            return self.rng.uniform(shape, dtype=tf.float64)
        return tf.raw_ops.StatefulUniform(
            resource=self.rng.state.handle,
            algorithm=tf.constant(self.rng.algorithm, tf.int64),
            shape=shape,
            dtype=tf.float64,
        )

    def check(self, ok: Any, value: Any, message: str) -> Any:
        """`value`, once `ok` is checked: a graph assertion with `message` (XLA: zeros where not ok)."""
        if under_xla():  # no assertions in XLA: a refused sample carries zeros (ids) and probability 0
            return tf.nest.map_structure(lambda x: tf.where(ok, x, tf.zeros_like(x)), value)
        with tracebacks.hidden():  # a failure shows where the caller sampled, not tfreplay's frames
            check = tf.debugging.Assert(ok, [message])  # string data only: one Assert op, no cond around it
        # tf.function runs every assertion anyway; one output carries it for v1 graphs (an identity per output
        # costs more than the check).
        leaves = tf.nest.flatten(value)
        with tf.control_dependencies([check]):
            leaves[-1] = tf.identity(leaves[-1])
        return tf.nest.pack_sequence_as(value, leaves)

    def view(self, parts: Parts, req: Request) -> Any:
        return parts.view(req.window, req.padded, self.draw, self.uniform, TF_OPS.read)

    def begin(self, num_segments: int, max_length: int) -> None:
        """Makes what the layout decides, before the parts: the write counters (see `versioned.py`)."""
        with tf.device(self.device), tf.name_scope(self.scope):
            self.counters = versioned.Counters(num_segments, max_length)

    def flush(self) -> None:
        """Nothing to write: the state lives in variables (checkpoint them to keep it)."""

    def close(self) -> None:
        """Nothing to release."""

    def checkpoint_state(self, buffer: Any, layout: dict, gate: Any, stored: Callable[[], Any]) -> None:
        """Attaches what a `tf.train.Checkpoint` saves, under the names format 1 gave them: the variables (the
        ring's and the index's also by their own names), the generator and the layout record. The write
        counters are not saved (only their changes matter)."""
        parts = buffer._parts
        buffer._state = dict(self.state)
        buffer._rng = self.rng
        buffer._num_adds = parts.num_adds
        if parts.rule is not None:
            buffer._pos, buffer._pos_counts, buffer._newest = parts.pos, parts.pos_counts, parts.newest
        self.staging = staged.Staging(check=lambda values: state.check(parts, values))
        checked = {**self.state, "random generator state": self.rng.state}
        for variable in checked.values():
            variable._staging = self.staging
        record = LayoutState(layout, gate, stored, commit=lambda: self.staging.commit(checked))
        record.staging = self.staging
        buffer._layout_record = record

    def variables(self) -> tuple:
        """The generator's state and the write counters (what a v1 graph initializes besides the state)."""
        assert self.counters is not None
        return (self.rng.state, *self.counters.variables())

    # Calls.
    def _write(self, parts: Parts, leaves: list) -> tf.Tensor:
        assert self.counters is not None
        counters = self.counters
        with tf.device(self.device), tf.name_scope(self.scope):  # always traced
            return locked_call(self.lock, lambda: counters.counted(lambda: write.write(parts, leaves, 1), 1))

    def add(self, parts: Parts, gate: Any, where: str, data_spec: Nest, items: Nest, segment: Any = None) -> Any:
        """Validates a batch, waits for the rate limiter, then writes it under the lock (eagerly: one traced
        call per batch signature)."""
        leaves, asserts = specs.validate_tensor_batch(where, data_spec, parts.leaf_paths, items, parts.num_segments)
        n = parts.num_segments
        if tf.executing_eagerly():
            signature = [tf.TensorSpec(x.shape, x.dtype) for x in leaves]
            run = self.eager.get("add", lambda leaves: self._write(parts, leaves), signature)
            return gate.call(where, "insert", n, lambda: run(leaves))
        with tf.control_dependencies(asserts):  # checked, then wait for the rate limiter, then lock and write
            admitted = gate.admit_op(where, "insert", n)
        with tf.control_dependencies(asserts + admitted):
            return gate.settle_op(where, "insert", n, True, self._write(parts, leaves))

    def _unchecked(self, parts: Parts, req: Request) -> tuple:
        """`(items, BufferInfo, count of windows, the generator's state before the draw)`, time-stacked; the
        caller refuses `count == 0` and puts that state back (a refused sample draws nothing)."""
        with tf.device(self.device), tf.name_scope(self.scope):
            before = self.rng.state.read_value()
            with tf.control_dependencies([before]):
                items, ids, probs, count = versioned.read(parts, self, req)
        items, info = sample.package(items, ids, probs, req, TF_OPS, split=False)
        return items, info, count, before

    def get_next(self, parts: Parts, gate: Any, req: Request) -> tuple[Nest, BufferInfo]:
        if not tf.executing_eagerly():
            items, info = self.sample_tensors(parts, gate, req)
        else:
            # Eagerly the emptiness check is a Python test of the count: a graph assertion costs more than it.
            items, info, count, before = self.eager.get(f"sample/{req.key}", lambda: self._unchecked(parts, req))()
            if count.numpy() <= 0:
                self.rng.state.assign(before)
                raise EmptyBufferError(sample.empty_message(parts, "get_next", req))
        return sample.split_steps(items, info, req, TF_OPS)

    def sample_tensors(self, parts: Parts, gate: Any, req: Request) -> tuple[Nest, BufferInfo]:
        """One time-stacked sample as graph tensors (a `get_next` in a graph, or a dataset element); with a
        gate, an empty draw gives its admission back."""
        items, info, count, before = self._unchecked(parts, req)
        count = gate.settle_op("get_next", "sample", req.size, count > 0, count)  # refund if empty
        if under_xla():  # nothing refused: an empty sample carries probability 0
            return self.check(count > 0, (items, info), "")
        with tf.name_scope(self.scope):
            rewound = TF_OPS.rare(count > 0, lambda: tf.constant(True), lambda: self._rewind(before))
            with tf.control_dependencies([rewound]):
                return self.check(count > 0, (items, info), sample.empty_message(parts, "get_next", req))

    def _rewind(self, state: tf.Tensor) -> tf.Tensor:
        """Puts the generator's state back (a refused sample draws nothing): same seed, same samples."""
        with tf.control_dependencies([self.rng.state.assign(state)]):
            return tf.constant(False)

    def sample_dataset(self, parts: Parts, gate: Any, req: Request, counter: tf.data.Dataset, parallel: Any) -> Any:
        """Fresh samples, one drawn per element when the pipeline asks for it (so one read after an add sees
        that add, as TF-Agents' tests rely on)."""
        deterministic = None if parallel is None else False  # independent draws: deliver as they finish
        return gate.ticks(counter, req.size).map(
            lambda _: self.sample_tensors(parts, gate, req), num_parallel_calls=parallel, deterministic=deterministic
        )

    def snapshot(self, parts: Parts, fn: Callable[[], Any], out_specs: Nest, where: str) -> Nest:
        """`fn()` (reads of the state) from a call no write overlapped: read again, never waiting on the lock."""
        return versioned.snapshot(parts, self, fn, where)

    def read_whole(self, parts: Parts, fn: Callable, inputs: list, out_specs: Nest, message: str) -> Nest:
        """The items of `fn(*inputs) -> (ok, items, rows, num_adds)` no write tore (read again, never waiting on
        the lock), once `ok` is checked."""
        return versioned.read_whole(parts, self, fn, inputs, message)

    def update_priorities(self, parts: Parts, ids: Any, priorities: Any) -> Any:
        ids, priorities = tf.convert_to_tensor(ids), tf.convert_to_tensor(priorities)
        write.priority_dtypes(ids.dtype, priorities.dtype)
        ids, priorities = tf.cast(ids, tf.int64), tf.cast(priorities, tf.float64)
        limit = parts.sampler.priority_limit
        if tf.executing_eagerly():
            write.check_priorities(ids.shape, priorities.shape, priorities.numpy(), limit)
            shape = [None] * ids.shape.rank  # one trace for any number of ids
            signature = (tf.TensorSpec(shape, tf.int64), tf.TensorSpec(shape, tf.float64))
            return self.eager.get(f"update/{len(shape)}", lambda i, p: self._update(parts, i, p), *signature)(
                ids, priorities
            )
        write.check_priorities(ids.shape, priorities.shape, None)
        view = parts.view(parts.window, False, self.draw, self.uniform, lambda v: v)
        stale = self._update(parts, ids, priorities)
        if parts.sampler.checks_priorities(view):  # the compiled update raises on a bad priority itself
            return stale
        return self.check(stale >= 0, stale, write.PRIORITIES_RULE)  # -1: a bad priority, nothing written

    def _update(self, parts: Parts, ids: tf.Tensor, priorities: tf.Tensor) -> tf.Tensor:
        with tf.device(self.device), tf.name_scope(self.scope):
            # A compiled update safe without the lock reads the counters' variable itself (a view of the variables).
            unlocked = parts.view(parts.window, False, self.draw, self.uniform, lambda v: v)
            fused = parts.sampler.unlocked_update(unlocked, ids, priorities)
            if fused is not None:
                return fused[1]

            def locked() -> Any:
                view = parts.view(parts.window, False, self.draw, self.uniform, TF_OPS.read)
                return write.update_priorities(parts, view, ids, priorities)

            return self.exclusive(locked)

    def num_frames(self, parts: Parts) -> Any:
        return tf.reduce_sum(tf.minimum(parts.num_adds.read_value(), parts.max_length))

    def gather_all(self, parts: Parts) -> Nest:
        return self.exclusive(lambda: write.gather_all(parts))

    def clear(self, parts: Parts, also: Callable[[], list] | None = None) -> Any:
        """Empties the buffer under the lock (`also`: more updates first, e.g. zeroing rows); samples reading
        without the lock learn of it from the write counters."""
        assert self.counters is not None
        counters = self.counters

        def cleared() -> Any:
            with tf.control_dependencies(also() if also is not None else []):
                return write.clear(parts)

        return self.exclusive(lambda: counters.counted(cleared, None))
