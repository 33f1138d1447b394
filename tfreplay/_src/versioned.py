"""The TF twin's versioned read: samples read without the buffer's lock, drawn again under it if torn.

Writers count the items they start and finish per segment (`Counters`,
around every write and clear). A sample reads the finished count before its
draw and the started count after its gather. A small sample is whole when
no write started meanwhile (the counts are equal): then its draw needs no
lock either. A large one (`UNLOCKED_READ_BYTES`) copies long enough for
writes to land beside it, so it allows them where they cannot touch its
rows: started minus finished covers every item written meanwhile, or still
being written when the draw read the ring, and they land at the ring
positions just after the draw's `num_adds` (`slack`). Only a sample that may
be torn is drawn again, under the lock. (A clear counts as `max_length`
items: every row.) While writers run, samplers still copy large samples in
parallel; a large sample's draw then takes the lock, except plain uniform
ring windows, which read nothing but one atomic `num_adds`.

Draws through the episode index are compiled with XLA (a function traced
once per kind of sample); XLA has no mutex, so under `jit_compile` the
caller must not race and this module is bypassed.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from tfreplay._src import sample as samples
from tfreplay._src.ops import under_xla
from tfreplay._src.parts import Parts, Request
from tfreplay._src.storage import spec_nbytes

# Samples of at least this many bytes allow writes beside their rows while they copy: there the copy costs more
# than the per-row overwrite check.
UNLOCKED_READ_BYTES = 1 << 18


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


def read(parts: Parts, twin: Any, req: Request) -> tuple:
    """`(items, ids, probabilities, count)` of `req` (see the module docstring); `twin` is the `TFTwin`."""
    if under_xla():  # no lock and no concurrency
        view = twin.view(parts, req)
        read_plan, ids, probs, count = samples.plan(parts, view, req)
        return samples.read(parts, read_plan, req), ids, probs, count
    large = req.size * req.n * spec_nbytes(parts.storage.item_spec) >= UNLOCKED_READ_BYTES
    counters = twin.counters
    finished = counters.finished.value.read_value()
    with tf.control_dependencies([finished]):
        read_plan, ids, probs, count, num_adds = _draw(parts, twin, req, locked=large)
    if large:  # computed while the rows are gathered
        limit = finished + slack(parts, read_plan if req.transform is None else read_plan[0], num_adds)
    items = samples.read(parts, read_plan, req)
    with tf.control_dependencies(tf.nest.flatten(items)):
        started = counters.started.value.read_value()
    return _unless_torn(
        tf.reduce_all(started <= (limit if large else finished)),
        lambda: (items, ids, probs, count),
        lambda: _locked(parts, twin, req),
    )


def _draw(parts: Parts, twin: Any, req: Request, locked: bool) -> tuple:
    """`(read plan, ids, probabilities, count, num_adds)`: the draw and the ring state it saw.

    Plain uniform ring windows read nothing but `num_adds` (one atomic read,
    published by writers after their rows) and the generator: no lock. Other
    draws read several variables, so a draw that writes may overlap (`locked`)
    takes the lock; through the episode index the draw is compiled with XLA.
    """

    def draw() -> tuple:
        view = twin.view(parts, req)
        return (*samples.plan(parts, view, req), view.num_adds)

    locked = locked and (req.window is not None or not parts.sampler.draws_uniformly)
    if req.window is not None:
        draw = twin.eager.get(f"plan/{req.key}", draw, jit_compile=True)
    return twin.locked_call(draw) if locked else draw()


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


def _locked(parts: Parts, twin: Any, req: Request) -> tuple:
    """The draw and the read under the lock (ring windows), or an XLA-compiled draw and the read."""
    if req.window is None:

        def ring() -> tuple:
            read_plan, ids, probs, count = samples.plan(parts, twin.view(parts, req), req)
            return samples.read(parts, read_plan, req), ids, probs, count

        return twin.locked_call(ring)
    plan = twin.eager.get(
        f"plan/{req.key}/locked", lambda: samples.plan(parts, twin.view(parts, req), req), jit_compile=True
    )

    def call() -> tuple:
        read_plan, ids, probs, count = plan()
        return samples.read(parts, read_plan, req), ids, probs, count

    return twin.locked_call(call)


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
