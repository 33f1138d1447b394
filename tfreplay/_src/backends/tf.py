"""The TF backend: a buffer's state in `tf.Variable`s, usable eagerly, in `tf.function` and under XLA.

Writes run in one `tf.CriticalSection`; samples read without it, drawn again
under it when a write may have torn them (`tf_versioned.py`). XLA has no mutex:
under `jit_compile` the caller must not race (`TrainLoop` holds the lock
around its compiled call, `locked_call`); XLA cannot raise either, so
there an empty buffer's samples carry probability 0. Eager calls go through
concrete functions traced once per kind of call. What a buffer asks of a
backend is `backends.Backend`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import uuid
from typing import Any, Callable, Iterator

import tensorflow as tf

from tfreplay._src import tracebacks
from tfreplay._src.arrays.ops import TF_OPS, under_xla
from tfreplay._src.backends import BackendBase, tf_versioned
from tfreplay._src.checkpoint import staged, state
from tfreplay._src.checkpoint.layout import LayoutState
from tfreplay._src.parts import Parts
from tfreplay._src.specs import Nest

_log = logging.getLogger("tfreplay")


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


@functools.cache
def _writable_on(device_type: str, dtype: tf.DType) -> bool | None:
    """Whether this TensorFlow has a `device_type` kernel that writes rows of `dtype` (`ResourceScatterUpdate`
    with int64 rows, the buffer's write; on TF 2.21 a GPU's cover the float types and every int but int32, and
    bool only with int32 rows); None where it has no `device_type` kernels at all."""
    from tensorflow.python.framework import kernels  # the kernel registry; no public API lists it

    found = None
    for kernel in kernels.get_registered_kernels_for_op("ResourceScatterUpdate").kernel:
        if kernel.device_type != device_type:
            continue
        allowed = {c.name: set(c.allowed_values.list.type) for c in kernel.constraint}
        rows = allowed.get("Tindices", {tf.int64.as_datatype_enum})
        found = found or (dtype.as_datatype_enum in allowed.get("dtype", ()) and tf.int64.as_datatype_enum in rows)
    return found


def host_only(device: str, dtype: tf.DType) -> bool:
    """Whether a variable of `dtype` meant for `device` must live in host memory: `device` is an accelerator
    present here, with no kernel that writes rows of `dtype` (the CPU writes every dtype)."""
    device_type = (tf.DeviceSpec.from_string(device).device_type or "CPU").upper()
    if device_type == "CPU" or not tf.config.list_physical_devices(device_type):
        return False  # no such device here: TensorFlow places the variable on the CPU itself
    return _writable_on(device_type, tf.as_dtype(dtype)) is False


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


class TFTwin(BackendBase):
    """The TF backend (`backends.Backend`): variables, a lock and a generator of one buffer.

    Args:
      scope: name scope of its variables and ops (any string).
      device: where the variables live.
      seed: of the sampling generator (`tf.random.Generator`); None: TF's global seed if set, else
        nondeterministic.
    """

    ops = TF_OPS
    is_tf = True

    def __init__(self, scope: str = "Buffer", device: str = "cpu:*", seed: Any = None):
        self.scope, self.device, self.seed = scope, device, resolve_seed(seed)
        self.state: dict[str, tf.Variable] = {}
        with tf.device(device), tf.name_scope(scope):
            generator = staged.StagedGenerator  # its state restores with the buffer's, checked first
            self.rng = generator.from_non_deterministic_state() if self.seed is None else generator.from_seed(self.seed)
        # Its own mutex: eagerly created sections otherwise share one, and every buffer would wait for all others.
        self.lock = tf.CriticalSection(name="lock", shared_name=f"tfreplay_lock_{uuid.uuid4().hex}")
        self.eager = EagerFunctions()
        self.counters: tf_versioned.Counters | None = None  # made by `bind` (see `tf_versioned.py`)
        self.staging = staged.Staging(check=lambda values: None)  # the buffer's check, once its parts exist
        self.on_host: list[str] = []  # variables kept in host memory: no kernel on `device` writes their rows

    def module_name(self, name: str | None) -> str:
        """A `tf.Module` name (an identifier) from the scope, which may be any string."""
        name = re.sub(r"\W", "_", self.scope)
        return name if name[:1].isalpha() or name[:1] == "_" else f"buffer_{name}"

    def make(self, name: str, shape: list, dtype: tf.DType) -> tf.Variable:
        """A zero-filled variable, part of the checkpoint: on the buffer's device, or in host memory where
        that device has no kernel to write rows of `dtype` (see `host_only`)."""
        host = host_only(self.device, dtype)
        with self.placement(), tf.device("CPU:0") if host else contextlib.nullcontext():  # None would clear it
            variable = staged.make(self.staging, tf.zeros(shape, dtype), variable_name(name))
        if host:
            self.on_host.append(f"{name} ({dtype.name})")
        self.state[name] = variable
        return variable

    def bind(self, parts: Parts, layout: dict, gate: Any, stored: Callable[[], Any], owner: str) -> dict:
        """Makes the write counters (not saved: only their changes matter); returns what a `tf.train.Checkpoint`
        saves, under the names format 1 gave them: the variables (the ring's and the index's also by their own
        names), the generator and the layout record."""
        if self.on_host:
            _log.warning(
                "%s on %s: TensorFlow has no %s kernel to write rows of %s, so %s kept in host memory (CPU:0) "
                "and copied at each add and sample, slower. Fields under storage/ are your spec's: float16, "
                "bfloat16, float32, float64 and int64 stay on the device.",
                owner, self.device, tf.DeviceSpec.from_string(self.device).device_type,
                ", ".join(self.on_host), "it is" if len(self.on_host) == 1 else "they are",
            )  # fmt: skip
        with self.placement():
            self.counters = tf_versioned.Counters(parts.num_segments, parts.max_length)
        trackables: dict = {"_state": dict(self.state), "_rng": self.rng, "_num_adds": parts.num_adds}
        if parts.rule is not None:
            trackables.update(_pos=parts.pos, _pos_counts=parts.pos_counts, _newest=parts.newest)
        self.staging = staged.Staging(check=lambda values: state.check(parts, values))
        checked = {**self.state, "random generator state": self.rng.state}
        for variable in checked.values():
            variable._staging = self.staging
        record = LayoutState(layout, gate, stored, commit=lambda: self.staging.commit(checked))
        record.staging = self.staging
        return {**trackables, "_layout_record": record}

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        return tf_exclusive(self.lock, fn)

    def locked_call(self, fn: Callable[[], Any]) -> Any:
        """`fn()`, one call in a graph, holding the lock (see `locked_call`): a TF write, a compiled train loop."""
        return locked_call(self.lock, fn)

    def changing(self, parts: Parts, fn: Callable[[], Any], num_new: int | None, segments: Any = None) -> Any:
        """`fn()` between the write counters' two steps, which samples reading without the lock check."""
        assert self.counters is not None
        with self.placement():
            return self.counters.counted(fn, num_new)

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

    def pick(self, shape: list, total: Any) -> tuple[tf.Tensor, tf.Tensor]:
        return self.draw(shape, total), TF_OPS.probability(shape, total)

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

    # The versioned read (`tf_versioned.py`): a sample, and any other read that must not be torn.
    read = tf_versioned.sample
    consistent = tf_versioned.consistent

    def as_tensors(self, fn: Callable, inputs: list, out_specs: Nest) -> Nest:
        """`fn`'s own ops."""
        return fn(*inputs)

    def compile(self, key: str, fn: Callable, *signature: Any) -> Any:
        """The concrete function of `fn` for `key`, traced on first use (`EagerFunctions`)."""
        return self.eager.get(key, fn, *signature)

    @contextlib.contextmanager
    def placement(self) -> Iterator[None]:
        """The variables' device and the scope: where the buffer's ops go."""
        with tf.device(self.device), tf.name_scope(self.scope):
            yield

    def variables(self) -> tuple:
        """The generator's state and the write counters (what a v1 graph initializes besides the state)."""
        assert self.counters is not None
        return (self.rng.state, *self.counters.variables())
