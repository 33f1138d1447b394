"""The fused train loop: `steps_per_call` iterations of sample -> step -> priorities in one graph call.

A learner that calls `get_next` and its train step once per call pays a
function call, and the Python around it, per step. `TrainLoop` traces one
iteration, the buffer's in-graph sample, the user's step and (prioritized
buffers) `update_priorities`, as one function, and runs it `steps_per_call`
times in a `tf.while_loop` inside one `tf.function` (XLA-compiled with
`jit_compile`). The graph holds one iteration whatever `steps_per_call` is.

Steps run one after the other (`parallel_iterations=1`), and the draws come
in the order of separate calls, so the samples, and the results, are those of
the same number of separate `get_next` + step calls from the same seed. A
prioritized buffer draws after the previous iteration's priority update. A
uniform draw does not depend on the step, so each iteration draws the next
one's sample while its step runs: where the step leaves a core idle, the
draw takes it.

A rate limiter admits a call as `steps_per_call * sample_batch_size` samples
at once, before the loop runs (eagerly in Python, in a graph through the
buffer's wait op), so the loop itself never waits and may be compiled with
XLA. A call that fails eagerly gives back the samples of the iterations that
did not finish; the finished ones keep their samples counted, as they keep
their priority updates.

XLA compiles a uniform buffer's loop by default (`jit_compile=None`): the
draws are the same, the step runs faster. XLA has no mutex and no
assertion, so the uncompiled graph around it holds the lock (after the rate
limiter's wait) and, under it, refuses a sample with nothing to draw before
anything runs. A uniform loop draws every iteration's sample there first,
in the serial loop's order, and runs the compiled steps on them after the
lock is released, so writers on other threads wait for the draws only; a
prioritized loop's draws wait for each update, so it holds the lock for the
whole call. A step XLA cannot compile, found by lowering the loop before
its first run, falls back to the plain loop with one warning.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

import tensorflow as tf

from tfreplay import native
from tfreplay._src import specs
from tfreplay._src.api import BufferInfo
from tfreplay._src.backends.tf import FlatCall
from tfreplay._src.buffer import Buffer
from tfreplay._src.front_door import FrontDoor
from tfreplay._src.rate_limiting.limiter import EmptyBufferError
from tfreplay._src.specs import Nest

_log = logging.getLogger("tfreplay")
_METRICS = ("last", "mean", "stack")
_WHERE = "TrainLoop"
_EMPTY = (
    "TrainLoop: a sample found nothing to draw; under jit_compile XLA cannot refuse it, so its step ran on "
    "zeros (probability 0). Fill the buffer before training, e.g. with a MinSize rate limiter."
)


class TrainLoop:
    """`steps_per_call` train steps per call, each on a fresh sample drawn inside the same graph.

    Each iteration draws `buffer.get_next(sample_batch_size, num_steps,
    time_stacked, transform)`, runs `step(items, info)` and, with a
    prioritized buffer, `buffer.update_priorities(info.ids, priorities)`; one
    call runs `steps_per_call` iterations in one `tf.function` call. For the
    same buffer seed the samples and the results equal `steps_per_call`
    separate `get_next` + `step` calls (eagerly, inside `tf.function`, and
    with `jit_compile`, where the draws agree with eager ones: see the
    fused-learner guide).

    Example:
      ```
      def step(items, info):
          with tf.GradientTape() as tape:
              loss = tf.reduce_mean((model(items["observation"]) - items["target"]) ** 2)
          grads = tape.gradient(loss, model.trainable_variables)
          optimizer.apply_gradients(zip(grads, model.trainable_variables))
          return {"loss": loss}

      train = tfreplay.TrainLoop(buffer, step, steps_per_call=16, sample_batch_size=128, metrics="mean")
      metrics = train()  # 16 gradient steps; their mean loss
      ```

    Args:
      buffer: a TF buffer (`TFUniformReplayBuffer`, `TFFrameReplayBuffer`,
        `TFPrioritizedReplayBuffer`, `TFPrioritizedFrameReplayBuffer`, or a
        `tfreplay.compose.Buffer` on a `TFTwin`).
      step: `step(items, info) -> metrics`, a nest of tensors with static
        shapes (Keras 3 or tf-keras models and optimizers inside are fine).
        It must not write to `buffer`: a uniform buffer draws the next
        iteration's sample while the step runs.
        With a prioritized buffer it returns the pair `(metrics,
        priorities)`, a plain tuple: `priorities` shaped like `info.ids`
        (e.g. `|TD error| + eps`), or `None` to leave them.
      steps_per_call: iterations per call, a positive integer.
      sample_batch_size, num_steps, time_stacked, transform: each iteration's
        sample, as `get_next` takes them (checked here, once).
      metrics: what a call returns: `"last"` (the last step's metrics),
        `"mean"` (each leaf's mean over the steps; floating-point leaves) or
        `"stack"` (each leaf stacked on a new leading axis of
        `steps_per_call`).
      jit_compile: compile the loop, the step included, with XLA. `None`
        (the default): XLA for a uniform buffer of rows, the plain loop for
        prioritized and frame buffers, whose draws run ops of their own
        outside XLA; a step XLA cannot compile (`tf.py_function`, string
        ops) runs the plain loop, and one warning says so. `True`: XLA for
        any buffer (a prioritized buffer's sum tree then runs as array ops,
        slower, drawing other numbers than outside XLA; one warning says
        so); a step that does not compile fails. `False`: never. Under XLA
        the draws are the plain loop's and the results equal up to XLA's
        rounding; the buffer's lock is held while a call draws (a
        prioritized buffer: the whole call), so writers on other threads
        (`add_batch`, `clear`) wait for the draws (a
        `TrainLoop` called inside a `jit_compile` function of your own
        cannot take the lock).

    Raises:
      TypeError: a NumPy buffer (use its TF twin), a `step` that is not
        callable, a `jit_compile` that is not a bool or None.
      ValueError: `steps_per_call` not a positive integer, an unknown
        `metrics`, a sample `get_next` would refuse, or a rate limiter whose
        error range cannot hold a call's samples.
    """

    def __init__(
        self,
        buffer: Any,
        step: Callable[[Nest, BufferInfo], Any],
        steps_per_call: int,
        sample_batch_size: int | None,
        *,
        num_steps: int | None = None,
        time_stacked: bool = True,
        transform: Any = None,
        metrics: str = "last",
        jit_compile: bool | None = None,
    ):
        door = _front_door(buffer)
        if not callable(step):
            raise TypeError(f"{_WHERE}: step ({step!r}) must be callable as step(items, info).")
        specs.check_positive_int(_WHERE, "steps_per_call", steps_per_call)
        if metrics not in _METRICS:
            raise ValueError(f"{_WHERE}: metrics ({metrics!r}) must be 'last', 'mean' or 'stack'.")
        if jit_compile is not None and not isinstance(jit_compile, bool):
            raise TypeError(
                f"{_WHERE}: jit_compile ({jit_compile!r}) must be True, False or None (XLA where it is safe)."
            )
        self._request = door.request(_WHERE, sample_batch_size, num_steps, time_stacked, transform)
        self._buffer, self._door, self._step, self._steps = buffer, door, step, int(steps_per_call)
        self._prioritized = door.capabilities.prioritized
        self._auto = jit_compile is None  # XLA unless the step does not compile
        own_ops = self._prioritized or door.capabilities.history_len is not None  # draws XLA would replace
        host = door.capabilities.host_fields  # XLA on an accelerator cannot read variables in host memory
        if jit_compile and host:
            raise ValueError(
                f"{_WHERE}: jit_compile=True, but {type(buffer).__name__} on {door.capabilities.device} keeps "
                f"{', '.join(host)} in host memory (no kernel there writes their rows), and XLA cannot read host "
                "variables from the device. Pass jit_compile=None or False (the loop without XLA), or keep the "
                "buffer on the CPU."
            )
        if jit_compile is None and host and not own_ops:
            _log.warning(
                "TrainLoop: %s on %s keeps %s in host memory, which XLA cannot read from the device, so the loop "
                "runs without XLA, slower. Pass jit_compile=False to choose that and silence this warning.",
                type(buffer).__name__, door.capabilities.device, ", ".join(host),
            )  # fmt: skip
        auto = not (own_ops or host)
        self._metrics, self._jit = metrics, (auto if jit_compile is None else jit_compile)
        self._samples = self._steps * self._request.size  # what a call asks the rate limiter for
        # Refused now rather than at the first call.
        door.check_room(f"{_WHERE} (steps_per_call * sample_batch_size per call)", self._samples)
        if jit_compile and self._prioritized and self._request.window is None and native.sum_tree_ops() is not None:
            _log.warning(
                "TrainLoop: jit_compile=True with %s: XLA cannot run the compiled sum-tree op, so each draw and "
                "priority update runs as XLA array ops instead, slower than the op outside XLA (see the fused-learner "
                "guide). Leave jit_compile at None (the plain loop for this buffer) unless your step gains more "
                "from XLA.",
                type(buffer).__name__,
            )
        self._loop: Any = None  # traced at the first call
        with tf.init_scope(), tf.device(door.capabilities.device):  # iterations finished by the last call
            self._finished = tf.Variable(0, dtype=tf.int64, trainable=False, name="TrainLoop_finished")

    @property
    def buffer(self) -> Any:
        """The buffer each iteration samples."""
        return self._buffer

    @property
    def steps_per_call(self) -> int:
        """Iterations (train steps) per call."""
        return self._steps

    @property
    def jit_compile(self) -> bool:
        """Whether calls run compiled by XLA: as `jit_compile` asked or, for `None`, chosen by the buffer (and,
        from the first call on, by whether the step compiles)."""
        return self._jit

    def __call__(self) -> Nest:
        """Runs `steps_per_call` iterations; eagerly or inside a `tf.function`.

        Returns:
          The metrics, as `metrics` asks (`"stack"`: a leading axis of `steps_per_call`).

        Raises:
          tf.errors.InvalidArgumentError: nothing to draw (naming the sample), before any step runs.
          BufferClosedError: the buffer is closed (in a graph: `tf.errors.OutOfRangeError`).
          RateLimitTimeoutError: the rate limiter did not admit the call's samples in time.
        """
        if self._loop is None:
            self._loop = FlatCall(self._trace().get_concrete_function())
        metrics, drawn = self._door.under_gate(_WHERE, self._samples, self._loop, self._used)
        if not self._jit:
            return metrics
        if tf.executing_eagerly():
            if not bool(drawn):
                raise EmptyBufferError(_EMPTY)
            return metrics
        return self._door.check(drawn, metrics, _EMPTY)

    def _trace(self) -> Any:
        """The loop's function: compiled under the lock, or plain. Called as a concrete function: tf.function's
        retracing warning counts the traces of one Python function, and every TrainLoop's `_run` is one."""
        if self._jit:
            loop, why = self._drawn_first() if not self._prioritized else self._compiled_whole()
            if why is None:
                return loop
            _log.warning(
                "TrainLoop: XLA cannot compile this step (%s), so the loop runs without XLA, slower. Pass "
                "jit_compile=False to choose that and silence this warning, or keep the op XLA lacks out of the "
                "step (see the fused-learner guide).",
                why,
            )
            self._jit = False
        return tf.function(self._run, autograph=False)

    def _compiled_whole(self) -> tuple[Any, str | None]:
        """The compiled loop of a prioritized buffer, each draw waiting for the previous update, all under the
        lock; and why XLA cannot compile it (None: it can, or `jit_compile=True` asked for it)."""
        compiled = tf.function(self._run, autograph=False, jit_compile=True)
        traced = compiled.get_concrete_function()  # traced as it runs, then checked (tracing for the check alone
        why = _not_compiled(compiled) if self._auto else None  # loses a Keras step's gradients)
        return _locked(self._door, self._request, self._finished, traced), why

    def _drawn_first(self) -> tuple[Any, str | None]:
        """The compiled loop of a buffer whose draws do not depend on the steps: every iteration's sample is
        drawn first, in the serial loop's order, in one compiled call holding the lock, and the compiled steps
        run on them in a second call after it, so writers on other threads wait for the draws only. And why XLA
        cannot compile the two (None: it can, or `jit_compile=True` asked for it)."""
        draw_all = tf.function(self._draw_all, autograph=False, jit_compile=True)
        draws = _locked(self._door, self._request, self._finished, draw_all.get_concrete_function())
        draws = draws.get_concrete_function()
        drawn = draws.structured_outputs
        flat_specs = [tf.TensorSpec(t.shape, t.dtype) for t in tf.nest.flatten(drawn)]  # flat: the check's inputs
        run_on = lambda *flat: self._run_on(tf.nest.pack_sequence_as(drawn, flat))  # noqa: E731
        compiled = tf.function(run_on, autograph=False, jit_compile=True)
        steps = compiled.get_concrete_function(*flat_specs)  # traced as it runs, then checked (see above)
        why = (_not_compiled(draw_all) or _not_compiled(compiled, *flat_specs)) if self._auto else None
        return tf.function(lambda: steps(*tf.nest.flatten(draws())), autograph=False), why

    def _used(self) -> int:
        """The samples a failed call drew: those of its finished iterations."""
        return int(self._finished.numpy()) * self._request.size

    # The graph.
    def _draw(self) -> tuple[Nest, BufferInfo]:
        """One iteration's sample."""
        return _sample(self._door, self._request)

    def _train(self, items: Nest, info: BufferInfo) -> tuple[Nest, tf.Tensor]:
        """One step and priority update: `(metrics, whether the sample drew anything)`. AutoGraph converts it
        for the step's sake; the library's own parts are marked not to be converted."""
        return _after_step(self._buffer, self._prioritized, self._jit, info, self._step(items, info))

    def _draw_all(self) -> tuple[Nest, BufferInfo]:
        """Every iteration's sample, drawn one after the other as the serial loop draws them, stacked on a
        leading axis of `steps_per_call`."""
        draw = tf.function(self._draw, autograph=False).get_concrete_function()
        outputs = draw.structured_outputs
        stacks = [tf.TensorArray(t.dtype, size=self._steps, element_shape=t.shape) for t in tf.nest.flatten(outputs)]

        def body(i: tf.Tensor, stacks: list) -> tuple:
            return i + 1, [s.write(i, x) for s, x in zip(stacks, tf.nest.flatten(draw()))]

        _, stacks = tf.while_loop(
            lambda i, stacks: i < self._steps, body, (tf.constant(0), stacks), parallel_iterations=1
        )
        return tf.nest.pack_sequence_as(outputs, [s.stack() for s in stacks])

    def _run(self) -> tuple[Nest, tf.Tensor]:
        """The loop, each iteration drawing its sample."""
        return self._iterate(None)

    def _run_on(self, samples: Any) -> tuple[Nest, tf.Tensor]:
        """The loop on samples drawn already (`_draw_all`)."""
        return self._iterate(samples)

    def _iterate(self, samples: Any) -> tuple[Nest, tf.Tensor]:
        # The draw and the step, each one traced function called in the loop. A uniform draw does not depend on
        # the step, so iteration i draws iteration i + 1's sample beside its step (the two run at once) and
        # carries it; the draws come in the same order, so the samples are those of the serial loop. A
        # prioritized draw waits for the previous update, so it stays inside its own iteration. `samples`: every
        # iteration's sample, drawn already (`_draw_all`), of which iteration i takes the i-th.
        if samples is None:
            draw = tf.function(self._draw, autograph=False).get_concrete_function()
            sample_specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), draw.structured_outputs)
        else:
            draw = None
            sample_specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), samples)
        ahead = samples is None and not self._prioritized
        train = tf.function(self._train).get_concrete_function(*sample_specs)
        outputs = train.structured_outputs[0]
        paths = specs.leaf_paths(outputs)
        starts = [_start(self._metrics, p, t, self._steps) for p, t in zip(paths, tf.nest.flatten(outputs))]
        init = tf.nest.pack_sequence_as(outputs, starts)

        def body(i: tf.Tensor, ready: Any, acc: Nest, drawn: tf.Tensor) -> tuple:
            with tf.control_dependencies([drawn]):  # after the previous iteration, its update included
                if samples is not None:
                    items, info = tf.nest.map_structure(lambda x: tf.gather(x, i), samples)
                else:
                    items, info = ready if ahead else draw()
                metrics, ok = train(items, info)
                if ahead:  # the next iteration's sample; the last iteration draws none
                    ready = tf.cond(i + 1 < self._steps, draw, lambda: (items, info))
            acc = tf.nest.map_structure(lambda a, m: _accumulate(self._metrics, a, m, i), acc, metrics)
            with tf.control_dependencies(tf.nest.flatten(metrics) + [ok]):
                finished = self._finished.assign(tf.cast(i + 1, tf.int64), read_value=False)
            with tf.control_dependencies([finished]):
                return i + 1, ready, acc, drawn & ok

        first = tf.cast(self._finished.assign(0), tf.int32)  # 0, once the count of a failed call is reset
        _, _, acc, drawn = tf.while_loop(
            lambda i, ready, acc, drawn: i < self._steps,
            body,
            (first, draw() if ahead else (), init, tf.constant(True)),
            parallel_iterations=1,  # iteration i's step before iteration i + 1's: the serial loop's results
            maximum_iterations=self._steps,
        )
        return tf.nest.map_structure(lambda a: _finish(self._metrics, a, self._steps), acc), drawn


def _locked(door: Any, request: Any, finished: tf.Variable, compiled: Any) -> Any:
    """A function that calls `compiled` (the compiled loop, or a uniform loop's draws) holding the buffer's
    lock: XLA has no mutex op, so the lock is taken by the (uncompiled) graph around the call, and writers on
    other threads wait for it to end. Under the lock, and before the loop, it refuses a sample with nothing to
    draw (XLA has no assertion): a refused call runs no step and changes nothing."""

    def checked() -> Any:
        found, message = door.drawable(_WHERE, request)
        with tf.control_dependencies([finished.assign(0, read_value=False)]):  # a refused call finished none
            found = door.check(found, found, message)
        with tf.control_dependencies([found]):
            return compiled()

    return tf.function(lambda: door.locked_call(checked), autograph=False)


def _not_compiled(compiled: Any, *args: Any) -> str | None:
    """None when XLA compiles `compiled` on inputs of specs `args` (lowered to HLO, before anything runs), or
    the first line of why not."""
    try:
        with tf.init_scope():  # lowered eagerly, also when the loop is traced inside a graph
            compiled.experimental_get_compiler_ir(*args)(stage="hlo")
    except Exception as error:  # noqa: BLE001  (any failure to lower means the plain loop)
        text = str(error)
        ops = re.search(r"Detected unsupported operations.*? on XLA_\w+: (\w+)", text)
        return f"no XLA kernel for {ops.group(1)}" if ops else text.strip().split("\n")[0][:200]
    return None


@tf.autograph.experimental.do_not_convert
def _sample(door: Any, request: Any) -> tuple[Nest, BufferInfo]:
    return door.sample_admitted(request)


@tf.autograph.experimental.do_not_convert
def _after_step(buffer: Any, prioritized: bool, jit: bool, info: BufferInfo, out: Any) -> tuple[Nest, tf.Tensor]:
    """The step's metrics once its priorities are given (with a prioritized buffer), and whether the sample
    drew anything (checked under XLA only: outside it an empty sample is refused)."""
    metrics, priorities = _split(out) if prioritized else (out, None)
    metrics = _tensors(metrics)
    done = []
    if priorities is not None:
        done = [buffer.update_priorities(info.ids, priorities)]
    drawn = tf.reduce_all(info.probabilities > 0) if jit else tf.constant(True)
    with tf.control_dependencies(done):  # this iteration's outputs come after its update
        return tf.nest.map_structure(tf.identity, metrics), tf.identity(drawn)


def _front_door(buffer: Any) -> FrontDoor:
    """The front door of a TF buffer; any other buffer is refused."""
    door = buffer.front_door if isinstance(buffer, Buffer) else None
    if door is not None and door.capabilities.backend == "tf":
        return door
    name = type(buffer).__name__
    if isinstance(buffer, Buffer) and name.startswith("Py"):
        raise TypeError(
            f"{_WHERE}: buffer ({name}) must be a TF buffer: the loop samples inside one TensorFlow graph. "
            f"Use its TF twin, TF{name[2:]}, which has the same API."
        )
    raise TypeError(
        f"{_WHERE}: buffer ({name}) must be a TF buffer (TFUniformReplayBuffer, TFFrameReplayBuffer, "
        "TFPrioritizedReplayBuffer, TFPrioritizedFrameReplayBuffer, or a tfreplay.compose.Buffer on a TFTwin)."
    )


def _split(out: Any) -> tuple[Any, Any]:
    """A prioritized step's `(metrics, priorities)`."""
    if type(out) not in (tuple, list) or len(out) != 2:
        raise TypeError(
            f"{_WHERE}: step must return (metrics, priorities), a plain pair, with a prioritized buffer; it "
            f"returned {type(out).__name__}. Return (metrics, None) to leave the priorities as they are."
        )
    return out[0], out[1]


def _tensors(metrics: Nest) -> Nest:
    leaves, paths = tf.nest.flatten(metrics), specs.leaf_paths(metrics)
    for path, leaf in zip(paths, leaves):
        if leaf is None:
            raise TypeError(f"{_WHERE}: the step's metric {path} (None) must be a tensor.")
    return tf.nest.map_structure(tf.convert_to_tensor, metrics)


def _start(mode: str, path: str, leaf: tf.Tensor, steps: int) -> Any:
    """The loop's first value of one metric (`leaf`: the traced iteration's)."""
    if not leaf.shape.is_fully_defined():
        raise ValueError(
            f"{_WHERE}: the step's metric {path} has shape {leaf.shape}; a metric must have a static shape "
            "(it is carried from step to step)."
        )
    if mode == "stack":
        return tf.TensorArray(leaf.dtype, size=steps, element_shape=leaf.shape)
    if mode == "mean" and not leaf.dtype.is_floating:
        raise TypeError(
            f"{_WHERE}: metrics ('mean') averages floating-point metrics; the step's metric {path} is "
            f"{leaf.dtype.name}. Cast it to a float, or use metrics='last' or 'stack'."
        )
    return tf.zeros(leaf.shape, leaf.dtype)


def _accumulate(mode: str, acc: Any, value: tf.Tensor, i: tf.Tensor) -> Any:
    if mode == "stack":
        return acc.write(i, value)
    return acc + value if mode == "mean" else value


def _finish(mode: str, acc: Any, steps: int) -> tf.Tensor:
    if mode == "stack":
        return acc.stack()
    return acc / steps if mode == "mean" else acc
