"""The TF twin: a composed buffer in `tf.Variable`s, usable eagerly, in `tf.function` and under XLA.

Writes run in one `tf.CriticalSection`. Samples read without it (a
versioned read): writers count the items they start and finish, a sample
reads the finished count before its draw and the started count after its
gather, and only a sample a write may have torn is drawn again, under the
lock. A small sample needs no write to have started meanwhile, so its draw
reads the index unlocked too; a large one (`UNLOCKED_READ_BYTES`) allows
writes that land beside its rows, so while writers run, samplers still copy
large samples in parallel (its draw then takes the lock, except plain
uniform ring windows, which read nothing but one atomic `num_adds`). XLA
has no mutex: under `jit_compile` the caller must not race; XLA cannot
raise either, so there an empty buffer's samples carry probability 0.
Eager calls go through concrete functions traced once per shape. Draws
through the episode index are compiled with XLA, except padded windows over
rows (n-step returns, padded sequences of a uniform buffer), which two
compiled ops plan (`kernels/window_ops.cc`); frames are stacked by the
native kernel on CPU (`tfreplay.native`).
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Callable

import tensorflow as tf

from tfreplay import native
from tfreplay._src import checkpoint, specs, stacks
from tfreplay._src.api import BufferInfo
from tfreplay._src.buffer import PRIORITIES_RULE, ComposedBuffer, check_priorities, variable_name
from tfreplay._src.episodes import Shape
from tfreplay._src.gate import Gate
from tfreplay._src.ops import TF_OPS, under_xla
from tfreplay._src.samplers.uniform import UniformSampler
from tfreplay._src.specs import Nest
from tfreplay._src.storage import spec_nbytes

# Samples of at least this many bytes allow writes beside their rows while they copy (see `TFBuffer._sample`):
# there the copy costs more than the per-row overwrite check.
UNLOCKED_READ_BYTES = 1 << 18


class Untracked:
    """Holds a value out of sight of `tf.Module` and checkpoint tracking (state that is not saved)."""

    def __init__(self, value: Any):
        self.value = value


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


def _unless_torn(whole: tf.Tensor, kept: Callable[[], Any], redrawn: Callable[[], Any]) -> Any:
    """`tf.cond(whole, kept, redrawn)` with the redraw one function call that is never inlined.

    A graph's cond is lowered into switches, and each op of its untaken
    branch still costs the executor a step: as one call op, the redraw
    costs one. Measured per in-graph CartPole sample (TF 2.15): 46-48 µs
    with windows of 2 and 30-31 µs with single items, against 50-52 / 33-35
    inlined, 46-53 / 35-38 as a functional `If` (which runs its taken branch
    as a function call), and 47 / 42-44 under the lock.
    """
    call = tf.function(redrawn, autograph=False, experimental_attributes={"_noinline": True})
    return tf.cond(whole, kept, lambda: call())


def resolve_seed(seed: Any) -> Any:
    """`seed`, or TF's global seed with an op seed (so buffers made under one global seed draw apart)."""
    if seed is not None:
        return seed
    global_seed, op_seed = tf.compat.v1.get_seed(None)
    return None if global_seed is None else [global_seed, op_seed]


class TFBuffer(ComposedBuffer):
    """A composed buffer in `tf.Variable`s; public classes choose its storage and sampler.

    `options`: `window_shift`, `drop_remainder`, `stateful_dataset`, as
    `ComposedBuffer` takes them. `rate_limiter`: see `core/rate_limiter.py` and `core/gate.py`.
    """

    _ops = TF_OPS

    def __init__(
        self,
        data_spec: Nest,
        batch_size: int,
        max_length: int,
        storage: Callable,
        sampler: Any,
        episode_rule: Any,
        *,
        scope: str,
        device: str,
        seed: Any,
        rate_limiter: Any = None,
        **options: Any,
    ):
        self._device, self._scope, self._seed = device, scope, resolve_seed(seed)
        name = re.sub(r"\W", "_", scope)  # a tf.Module name (an identifier); the scope may be any string
        name = name if name[:1].isalpha() or name[:1] == "_" else f"buffer_{name}"
        super().__init__(data_spec, batch_size, max_length, storage, sampler, episode_rule, name=name, **options)
        object.__setattr__(self, "_gate", Gate(rate_limiter, type(self).__name__, self._capacity, batch_size))
        self._layout_record = checkpoint.LayoutState(self.checkpoint_layout(), self._gate, self._num_frames)

    @property
    def device(self) -> str:
        return self._device

    @property
    def scope(self) -> str:
        return self._scope

    def variables(self) -> tuple:
        """Every variable of the buffer, the random generator's state and the write counters included
        (what a v1 graph initializes; the counters are not checkpointed)."""
        return super().variables() + (self._rng.state, self._started.value, self._finished.value)

    def _init_state(self) -> None:
        self._state: dict = {}
        with tf.device(self._device), tf.name_scope(self._scope):
            self._rng = (
                tf.random.Generator.from_non_deterministic_state()
                if self._seed is None
                else tf.random.Generator.from_seed(self._seed)
            )
        # Its own mutex: eagerly created sections otherwise share one, and every buffer would wait for all others.
        self._lock = tf.CriticalSection(name="lock", shared_name=f"tfreplay_lock_{uuid.uuid4().hex}")
        self._eager = EagerFunctions()
        self._native_stacks = True  # off: frames are stacked by XLA (tests compare both)
        # Items writers started and finished per segment since the buffer was made: a sample read outside the
        # lock checks them (see `_sample`). Not checkpoint state: only their changes matter.
        with tf.device(self._device), tf.name_scope(self._scope):
            zeros = tf.zeros([self._num_segments], tf.int64)
            self._started = Untracked(tf.Variable(zeros, trainable=False, name="index/writes_started"))
            self._finished = Untracked(tf.Variable(zeros, trainable=False, name="index/writes_finished"))

    def _make(self, name: str, shape: list, dtype: tf.DType) -> tf.Variable:
        with tf.device(self._device), tf.name_scope(self._scope):
            variable = tf.Variable(tf.zeros(shape, dtype), trainable=False, name=variable_name(name))
        self._state[name] = variable
        return variable

    def frame_stacks(self, frames: tf.Variable, rows: tf.Tensor, history_len: int, num_steps: int | None) -> Any:
        """Stacks with the native kernel when it is built and the frames are on the CPU, else with XLA."""
        op = native.frame_stack() if self._native_stacks and stacks.on_cpu(frames) and not under_xla() else None
        if op is None:
            return stacks.tf_stacks(frames, rows, history_len, num_steps)
        return stacks.kernel_stacks(op, frames, rows, history_len, num_steps)

    def _exclusive(self, fn: Callable[[], Any]) -> Any:
        return tf_exclusive(self._lock, fn)

    # The generator's own draws as one op each: `Generator.uniform` spends eight ops (read-and-skip, then a
    # stateless draw) on the same numbers and the same state update. XLA's kernels of these ops draw other
    # numbers, so there `Generator.uniform` keeps compiled and eager samples equal.
    def _draw(self, shape: list, total: Any) -> tf.Tensor:
        if under_xla():
            return self._rng.uniform(shape, minval=0, maxval=tf.maximum(total, 1), dtype=tf.int64)
        return tf.raw_ops.StatefulUniformInt(
            resource=self._rng.state.handle,
            algorithm=tf.constant(self._rng.algorithm, tf.int64),
            shape=shape,
            minval=tf.constant(0, tf.int64),
            maxval=tf.maximum(tf.cast(total, tf.int64), 1),
        )

    def _uniform(self, shape: list) -> tf.Tensor:
        if under_xla():
            return self._rng.uniform(shape, dtype=tf.float64)
        return tf.raw_ops.StatefulUniform(
            resource=self._rng.state.handle,
            algorithm=tf.constant(self._rng.algorithm, tf.int64),
            shape=shape,
            dtype=tf.float64,
        )

    def _check(self, ok: Any, value: Any, message: str) -> Any:
        if under_xla():  # no assertions in XLA: a refused sample carries zeros (ids) and probability 0
            return tf.nest.map_structure(lambda x: tf.where(ok, x, tf.zeros_like(x)), value)
        check = tf.debugging.Assert(ok, [message])  # string data only: one Assert op, no cond around it
        # tf.function runs every assertion anyway; one output carries it for v1 graphs (an identity per output
        # costs more than the check).
        leaves = tf.nest.flatten(value)
        with tf.control_dependencies([check]):
            leaves[-1] = tf.identity(leaves[-1])
        return tf.nest.pack_sequence_as(value, leaves)

    def _num_frames(self) -> Any:
        return tf.reduce_sum(tf.minimum(self._num_adds.read_value(), self._max_length))

    def _add_batch(self, items: Nest) -> Any:
        leaves, asserts = specs.validate_tensor_batch(
            "add_batch", self._data_spec, self._leaf_paths, items, self._num_segments
        )
        n = self._num_segments
        if tf.executing_eagerly():
            signature = [tf.TensorSpec(x.shape, x.dtype) for x in leaves]
            write = self._eager.get("add", self._write, signature)
            return self._gate.call("add_batch", "insert", n, lambda: write(leaves))
        with tf.control_dependencies(asserts):  # checked, then wait for the rate limiter, then lock and write
            admitted = self._gate.admit_op("add_batch", "insert", n)
        with tf.control_dependencies(asserts + admitted):
            return self._gate.settle_op("add_batch", "insert", n, True, self._write(leaves))

    def _write(self, leaves: list) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):
            return locked_call(self._lock, lambda: self._write_locked(leaves, 1))  # always traced

    def _get_next(
        self, sample_batch_size: int | None, num_steps: int | None, time_stacked: bool, transform: Any = None
    ) -> tuple[Nest, BufferInfo]:
        if not tf.executing_eagerly():
            items, info = self._sample_tensors(sample_batch_size, num_steps, transform)
        else:
            # Eagerly the emptiness check is a Python test of the count: a graph assertion costs more than it.
            key = f"sample/{sample_batch_size}/{num_steps}/{transform!r}"
            fn = self._eager.get(key, lambda: self._unchecked_sample(sample_batch_size, num_steps, transform))
            items, info, count = fn()
            if count.numpy() <= 0:
                raise ValueError(self.empty_message("get_next", num_steps, transform))
        return self._split_steps(items, info, sample_batch_size is not None, num_steps, time_stacked)

    def _sample_tensors(
        self, sample_batch_size: int | None, num_steps: int | None, transform: Any = None
    ) -> tuple[Nest, BufferInfo]:
        items, info, count = self._unchecked_sample(sample_batch_size, num_steps, transform)
        count = self._gate.settle_op("get_next", "sample", sample_batch_size or 1, count > 0, count)  # refund if empty
        with tf.name_scope(self._scope):
            return self._guard(count, (items, info), "get_next", num_steps, transform)

    def _unchecked_sample(self, sample_batch_size: int | None, num_steps: int | None, transform: Any = None) -> tuple:
        """`(items, BufferInfo, count of windows)`, time-stacked; the caller refuses `count == 0`."""
        size = 1 if sample_batch_size is None else sample_batch_size
        n = (num_steps or 1) if transform is None else transform.num_steps
        large = size * n * spec_nbytes(self._storage.item_spec) >= UNLOCKED_READ_BYTES
        with tf.device(self._device), tf.name_scope(self._scope):
            items, ids, probs, count = self._sample(size, num_steps, transform, large)
        items, info = self._package(items, ids, probs, sample_batch_size is not None, num_steps, True, transform)
        return items, info, count

    def _sample(self, size: int, num_steps: int | None, transform: Any, large: bool) -> tuple:
        """`(items, ids, probabilities, count)`: a versioned read, drawn again under the lock if it may be torn.

        Writers count the items they start and finish per segment. The draw
        reads the finished count first, and the started count is read after
        the gather. A small sample is whole when no write started meanwhile
        (the counts are equal): then the draw needs no lock either. A large
        one copies long enough for writes to land beside it, so it allows
        them where they cannot touch its rows: started minus finished covers
        every item written meanwhile, or still being written when the draw
        read the ring, and they land at the ring positions just after the
        draw's `num_adds`. (A clear counts as `max_length` items: every row.)
        Only a sample that may be torn is drawn again, under the lock.
        """
        if under_xla():  # no lock and no concurrency
            return self._read_sample(size, num_steps, transform)
        finished = self._finished.value.read_value()
        with tf.control_dependencies([finished]):
            plan, ids, probs, count, num_adds = self._draw_plan(size, num_steps, transform, locked=large)
        if large:  # computed while the rows are gathered
            limit = finished + self._slack(plan if transform is None else plan[0], num_adds)
        items = self._read_planned(plan, num_steps, transform)
        with tf.control_dependencies(tf.nest.flatten(items)):
            started = self._started.value.read_value()
        return _unless_torn(
            tf.reduce_all(started <= (limit if large else finished)),
            lambda: (items, ids, probs, count),
            lambda: self._locked_sample(size, num_steps, transform),
        )

    def _draw_plan(self, size: int, num_steps: int | None, transform: Any, locked: bool) -> tuple:
        """`(read plan, ids, probabilities, count, num_adds)`: the draw and the ring state it saw.

        Plain uniform ring windows read nothing but `num_adds` (one atomic
        read, published by writers after their rows) and the generator: no
        lock. Other draws read several variables, so a draw that writes may
        overlap (`locked`) takes the lock; through the episode index the draw
        is compiled with XLA (padded windows over rows: `_padded_plan`).
        """

        def draw() -> tuple:
            view = self._view(transform)
            return (*self._sample_plan(size, num_steps, transform, view), view.num_adds)

        locked = locked and (self._windows(transform)[0] is not None or type(self._sampler) is not UniformSampler)
        if self._compiled_padded_plan(transform):
            draw = lambda: self._padded_plan(size, transform)  # noqa: E731
        elif self._windows(transform)[0] is not None:
            draw = self._eager.get(f"plan/{size}/{num_steps}/{transform!r}", draw, jit_compile=True)
        return locked_call(self._lock, draw) if locked else draw()

    def _compiled_padded_plan(self, transform: Any) -> bool:
        """Whether `_padded_plan` plans these windows here: a uniform sampler's padded windows over rows through
        the episode index, on the CPU outside XLA, where the ops are built (decided while tracing)."""
        return (
            transform is not None
            and transform.padded
            and self._rule is not None
            and type(self._sampler) is UniformSampler
            and self._storage.window == Shape()
            and not under_xla()
            and stacks.on_cpu(self._pos)
            and native.window_ops() is not None
        )

    def _padded_plan(self, size: int, transform: Any) -> tuple:
        """`(read plan, ids, probabilities, count, num_adds)` of padded windows, from two compiled ops
        (`kernels/window_ops.cc`), the NumPy twin's plan (`core/native_windows.py`): the same draws and plan
        as `_sample_plan` computes in array ops (an XLA-compiled function here), in two op calls."""
        kernels, n, length = native.window_ops(), int(transform.num_steps), self._max_length
        num_adds = self._num_adds.read_value()
        start, counts, total = kernels.tfreplay_padded_counts(
            num_adds, self._newest.read_value(), max_length=length, num_steps=n
        )
        draws = self._draw([size], total)  # the random numbers the array-op path draws
        segment, t, rows, ids, mask, last, last_rows = kernels.tfreplay_window_plan(
            draws, counts, start, num_adds, self._pos.handle, num_steps=n, max_length=length
        )
        planned = self._compiled_windows(segment, t, rows, mask, last, last_rows, transform)
        return planned, ids, TF_OPS.probability([size], total), total, num_adds

    def _slack(self, plan: Any, num_adds: tf.Tensor) -> tf.Tensor:
        """Per segment, how many items may be written after `num_adds` before one overwrites a row of `plan`,
        a storage's read plan (the `k`-th new item lands at ring position `num_adds + k`); `max_length` where
        `plan` reads none."""
        rows = [tf.reshape(tf.cast(r, tf.int64), [-1]) for r in tf.nest.flatten(plan)]
        rows = rows[0] if len(rows) == 1 else tf.concat(rows, 0)
        n, length = self._num_segments, self._max_length
        segment = rows % n
        ahead = (rows // n - tf.gather(num_adds, segment)) % length
        ahead = tf.where(rows < self._capacity, ahead, length)  # a frame buffer's zero row is never written
        return tf.minimum(tf.math.unsorted_segment_min(ahead, segment, n), length)

    def _locked_sample(self, size: int, num_steps: int | None, transform: Any = None) -> tuple:
        """The draw and the read under the lock (ring windows), or a compiled draw (XLA, or `_padded_plan`'s ops)
        and the read."""
        if self._windows(transform)[0] is None or under_xla():
            return locked_call(self._lock, lambda: self._read_sample(size, num_steps, transform))
        if self._compiled_padded_plan(transform):
            plan: Callable[[], tuple] = lambda: self._padded_plan(size, transform)[:4]  # noqa: E731
        else:
            plan = self._eager.get(
                f"plan/{size}/{num_steps}/{transform!r}/locked",
                lambda: self._sample_plan(size, num_steps, transform),
                jit_compile=True,
            )

        def call() -> tuple:
            read_plan, ids, probs, count = plan()
            return self._read_planned(read_plan, num_steps, transform), ids, probs, count

        return locked_call(self._lock, call)

    def _write_locked(self, leaves: list, num_new: int, segments: Any = None) -> Any:
        return self._overwriting(lambda: super(TFBuffer, self)._write_locked(leaves, num_new, segments), num_new)

    def _clear_locked(self) -> Any:
        return self._overwriting(super()._clear_locked)

    def _overwriting(self, fn: Callable[[], Any], num_new: int | None = None) -> Any:
        """`fn()`, a change of stored rows (under the lock), between the write counters' two steps.

        `num_new` items per segment; None: every row (a clear)."""
        step = tf.constant([self._max_length if num_new is None else num_new] * self._num_segments, tf.int64)
        started = self._started.value.assign_add(step, read_value=False)
        with tf.control_dependencies([started]):
            out = fn()
        with tf.control_dependencies(tf.nest.flatten(out)):
            finished = self._finished.value.assign_add(step, read_value=False)
        with tf.control_dependencies([finished]):
            return tf.nest.map_structure(tf.identity, out)

    def _update_priorities(self, ids: Any, priorities: Any) -> Any:
        ids = tf.convert_to_tensor(ids, tf.int64)
        priorities = tf.convert_to_tensor(priorities, tf.float64)
        if tf.executing_eagerly():
            check_priorities(ids.shape, priorities.shape, priorities.numpy())
            shape = [None] * ids.shape.rank  # one trace for any number of ids
            fn = self._eager.get(
                f"update/{len(shape)}", self._update, tf.TensorSpec(shape, tf.int64), tf.TensorSpec(shape, tf.float64)
            )
            return fn(ids, priorities)
        check_priorities(ids.shape, priorities.shape, None)
        if self._update_checks_priorities():  # the compiled update raises on a bad priority itself
            return self._update(ids, priorities)
        ok = tf.reduce_all(tf.math.is_finite(priorities) & (priorities >= 0))
        return self._check(ok, self._update(ids, priorities), PRIORITIES_RULE)

    def _update(self, ids: tf.Tensor, priorities: tf.Tensor) -> tf.Tensor:
        with tf.device(self._device), tf.name_scope(self._scope):
            unlocked = getattr(self._sampler, "unlocked_update", None)  # a compiled update safe without the lock
            fused = unlocked and unlocked(self._window, self._num_adds, self._max_length, ids, priorities)
            if fused is not None:
                return fused[1]
            return self._exclusive(lambda: self._update_locked(ids, priorities))

    def _gather_all(self) -> Nest:
        return self._exclusive(self._gather_all_locked)

    def _clear(self) -> Any:
        return self._exclusive(self._clear_locked)

    def _call_tensors(self, fn: Callable, inputs: list, out_specs: Nest) -> Nest:
        """`fn(*inputs)` on tensors, under the lock."""
        return self._exclusive(lambda: fn(*inputs))
