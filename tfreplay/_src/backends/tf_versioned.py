"""The TF twin's versioned read: samples never wait on the buffer's lock; a read a write may have torn is
drawn again.

Writers count the items they start and finish per segment (`Counters`,
around every write and clear, which hold the lock among themselves). A
sample reads the finished count before its draw and the started count after
its gather. A small sample is whole when no write started meanwhile (the
counts are equal). A large one (`UNLOCKED_READ_BYTES`) copies long enough
for writes to land beside it, so it allows them where they cannot touch its
rows: started minus finished covers every item written meanwhile, or still
being written when the draw read the ring, and they land at the ring
positions just after the draw's `num_adds` (`slack`). A sample that may be
torn is drawn again, unlocked, with the slack rule whatever its size, until
one is whole (at most `MAX_ATTEMPTS`; a buffer whose writers overwrite every
draw's rows that often raises instead of waiting). (A clear counts as
`max_length` items: every row.)

Why never the lock: TensorFlow's `MutexLock` marks its mutex free when a
waiter is cancelled while another holds it, and a dataset iterator that is
dropped cancels the map calls it has in flight. A sample waiting for the
lock there would let a second writer in beside the first.

A draw reads the ring's counters, and through the episode index its counts
and the `pos` of the rows it reads, while writes may go on: items are never
torn (their rows are checked), and a window's rows are valid when read; the
count behind a probability is the buffer's at some moment of the draw.
Draws through the index are compiled with XLA (one function per kind of
sample); XLA has no mutex and no concurrency, so under `jit_compile` the
caller must not race and this module reads once.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from tfreplay._src import sample as samples
from tfreplay._src.arrays.ops import TF_OPS, under_xla
from tfreplay._src.parts import Parts, Request
from tfreplay._src.storage import spec_nbytes

# Samples of at least this many bytes allow writes beside their rows while they copy: there the copy costs more
# than the per-row overwrite check.
UNLOCKED_READ_BYTES = 1 << 18
# Draws of one sample before it gives up: only writers that overwrite a sample's rows at every draw reach it.
MAX_ATTEMPTS = 1000
TORN = (
    "{where}: every one of {attempts} draws had rows overwritten by writers while it read them; sample from a "
    "larger buffer, or pause writers while sampling."
)


class Untracked:
    """Holds a value out of sight of `tf.Module` and checkpoint tracking (state that is not saved)."""

    def __init__(self, value: Any):
        self.value = value


class Counters:
    """Items writers started and finished per segment since the buffer was made (not checkpoint state: only
    their changes matter)."""

    def __init__(self, num_segments: int, max_length: int):
        zeros = tf.zeros([num_segments], tf.int64)
        self.started = Untracked(tf.Variable(zeros, trainable=False, name="index/writes_started"))
        self.finished = Untracked(tf.Variable(zeros, trainable=False, name="index/writes_finished"))
        self.num_segments, self.max_length = num_segments, max_length

    def variables(self) -> tuple:
        return self.started.value, self.finished.value

    def counted(self, fn: Callable[[], Any], num_new: int | None) -> Any:
        """`fn()`, a change of stored rows (under the lock), between the counters' two steps; `num_new` items
        per segment, None: every row (a clear)."""
        step = tf.constant([self.max_length if num_new is None else num_new] * self.num_segments, tf.int64)
        started = self.started.value.assign_add(step, read_value=False)
        with tf.control_dependencies([started]):
            out = fn()
        with tf.control_dependencies(tf.nest.flatten(out)):
            finished = self.finished.value.assign_add(step, read_value=False)
        with tf.control_dependencies([finished]):
            return tf.nest.map_structure(tf.identity, out)

    def whole(self, parts: Parts, read: Callable[[], tuple], strict: bool) -> tuple:
        """`(whole, outputs)` of `read() -> (outputs, rows, num_adds)`: whole when no write started while it ran
        (`strict`), or none overwrote the `rows` it read (rows of `parts`' storage; `num_adds` as it read them)."""
        finished = self.finished.value.read_value()
        with tf.control_dependencies([finished]):
            outputs, rows, num_adds = read()
        limit = finished if strict else finished + slack(parts, rows, num_adds)
        with tf.control_dependencies(tf.nest.flatten(outputs)):
            started = self.started.value.read_value()
        return tf.reduce_all(started <= limit), outputs


def sample(twin: Any, parts: Parts, req: Request) -> tuple:
    """`(items, BufferInfo, count)` of `req`, packaged (`TFTwin.read`): eagerly one traced call per kind of
    sample, whose refused draw is rewound here; in a graph the rewind is an op (a function call, rarely taken),
    skipped under XLA."""
    if tf.executing_eagerly():
        items, info, count, before = twin.eager.get(f"sample/{req.key}", lambda: _packaged(twin, parts, req))()
        found = count.numpy()
        if found <= 0:  # a Python test: a graph assertion costs more than it
            twin.rng.state.assign(before)
        return items, info, found
    items, info, count, before = _packaged(twin, parts, req)
    if under_xla():
        return items, info, count
    with twin.placement():
        rewound = TF_OPS.rare(count > 0, lambda: tf.constant(True), lambda: _rewind(twin, before))
    with tf.control_dependencies([rewound]):
        return items, info, tf.identity(count)


def _packaged(twin: Any, parts: Parts, req: Request) -> tuple:
    """`(items, BufferInfo, count, the generator's state before the draw)`, time-stacked."""
    with twin.placement():
        before = twin.rng.state.read_value()
        with tf.control_dependencies([before]):
            items, ids, probs, count = read(parts, twin, req)
    items, info = samples.package(items, ids, probs, req, TF_OPS, split=False)
    return items, info, count, before


def _rewind(twin: Any, state: tf.Tensor) -> tf.Tensor:
    """Puts the generator's state back (a refused sample draws nothing): same seed, same samples."""
    with tf.control_dependencies([twin.rng.state.assign(state)]):
        return tf.constant(False)


def read(parts: Parts, twin: Any, req: Request) -> tuple:
    """`(items, ids, probabilities, count)` of `req` (see the module docstring); `twin` is the `TFTwin`."""
    if under_xla():  # no lock and no concurrency
        view = parts.view(req.window, req.padded, twin, TF_OPS.read)
        read_plan, ids, probs, count = samples.plan(parts, view, req)
        return req.read(read_plan), ids, probs, count
    large = req.size * req.n * spec_nbytes(parts.storage.item_spec) >= UNLOCKED_READ_BYTES
    attempt = lambda: _draw_and_read(parts, twin, req)  # noqa: E731
    whole, first = twin.counters.whole(parts, attempt, strict=not large)
    return unless_torn(whole, lambda: first, lambda: retried(parts, twin, attempt, first, "get_next"))


def _draw_and_read(parts: Parts, twin: Any, req: Request) -> tuple:
    """`((items, ids, probabilities, count), rows read, num_adds the draw saw)`; through the episode index the
    draw is one XLA-compiled function (its array ops would be a hundred small ones)."""

    def draw() -> tuple:
        view = parts.view(req.window, req.padded, twin, TF_OPS.read)
        return (*samples.plan(parts, view, req), view.num_adds)

    if req.window is not None:
        draw = twin.eager.get(f"plan/{req.key}", draw, jit_compile=True)
    read_plan, ids, probs, count, num_adds = draw()
    items = req.read(read_plan)
    return (items, ids, probs, count), samples.rows_read(read_plan, req), num_adds


def retried(parts: Parts, twin: Any, read: Callable[[], tuple], like: Any, where: str, strict: bool = False) -> Any:
    """`read()`'s outputs from the first of up to `MAX_ATTEMPTS` calls that no write tore (the slack rule, or
    with `strict` no write at all); `like`: outputs of the same structure and shapes. Refused (`twin.check`)
    if every attempt was torn."""

    def attempt(i: tf.Tensor, whole: tf.Tensor, outputs: Any) -> tuple:
        again, outputs = twin.counters.whole(parts, read, strict=strict)
        return i + 1, again, outputs

    _, whole, outputs = tf.while_loop(
        lambda i, whole, outputs: ~whole,
        attempt,
        (tf.constant(0), tf.constant(False), like),
        maximum_iterations=MAX_ATTEMPTS,
    )
    return twin.check(whole, outputs, TORN.format(where=where, attempts=MAX_ATTEMPTS))


def consistent(twin: Any, parts: Parts, fn: Callable[[], tuple], where: str, strict: bool = False) -> Any:
    """The outputs of `fn() -> (outputs, rows read, num_adds as read)` from a call no write tore (`strict`: no
    write overlapped it), drawn again while one did (the deterministic pass reads this way)."""
    if under_xla():
        return fn()[0]
    whole, first = twin.counters.whole(parts, fn, strict=strict)
    return unless_torn(whole, lambda: first, lambda: retried(parts, twin, fn, first, where, strict=strict))


def slack(parts: Parts, read_plan: Any, num_adds: tf.Tensor) -> tf.Tensor:
    """Per segment, how many items may be written after `num_adds` before one overwrites a row of `read_plan`
    (the `k`-th new item lands at ring position `num_adds + k`); `max_length` where it reads none."""
    rows = [tf.reshape(tf.cast(r, tf.int64), [-1]) for r in tf.nest.flatten(read_plan)]
    rows = rows[0] if len(rows) == 1 else tf.concat(rows, 0)
    n, length = parts.num_segments, parts.max_length
    segment = rows % n
    ahead = (rows // n - tf.gather(num_adds, segment)) % length
    ahead = tf.where(rows < parts.capacity, ahead, length)  # a frame buffer's zero row is never written
    return tf.minimum(tf.math.unsorted_segment_min(ahead, segment, n), length)


def unless_torn(whole: tf.Tensor, kept: Callable[[], Any], redrawn: Callable[[], Any]) -> Any:
    """`tf.cond(whole, kept, redrawn)` with the redraw one function call that is never inlined.

    A graph's cond is lowered into switches, and each op of its untaken
    branch still costs the executor a step: as one call op, the redraw
    costs one. Measured per in-graph CartPole sample (TF 2.15): 46-48 µs
    with windows of 2 and 30-31 µs with single items, against 50-52 / 33-35
    inlined, 46-53 / 35-38 as a functional `If` (which runs its taken branch
    as a function call).
    """
    call = tf.function(redrawn, autograph=False, experimental_attributes={"_noinline": True})
    return tf.cond(whole, kept, lambda: call())
