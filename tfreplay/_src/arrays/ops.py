"""The array operations the core is written over: one namespace for NumPy, one for TF.

Every concept of the core (ring, episode index, samplers, storage) is written
once against an `ops` namespace, so the NumPy twin runs the same lines on
arrays that the TF twin runs on tensors, in graphs and under XLA. Stateful
operations (`scatter`, `assign`) act on a NumPy array in place or on a
`tf.Variable`, returning the update op (`bin_add` returns the step that does
it); `after(updates, fn)` orders what follows after them (a no-op for NumPy),
and `commit(reads, steps, result)` runs a write's steps in order, all of
them or none (see `_np_commit`). `rare(common, then, otherwise)` is a `cond`
whose `otherwise` is rarely taken (a fallback): in a graph it stays one
functional `If`, whose cost does not grow with the fallback's ops.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tfreplay import native
from tfreplay._src.arrays import stacks

try:  # XLA has no mutex op and cannot raise: the twins check this to skip locks and assertions.
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla_graph
except ImportError:  # pragma: no cover

    def _in_xla_graph(graph: Any) -> bool:
        return False


def under_xla() -> bool:
    """Whether ops are being traced into an XLA (`jit_compile`) function."""
    return not tf.executing_eagerly() and _in_xla_graph(tf.compat.v1.get_default_graph())


def _np_scatter(array: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    # One add usually fills a contiguous run of rows: a slice copy is a memcpy.
    first = int(rows[0]) if len(rows) else 0
    if len(rows) and rows[-1] - first == len(rows) - 1:
        array[first : first + len(rows)] = values
    else:
        array[rows] = values


def _np_gather(x: np.ndarray, i: Any) -> np.ndarray:
    # A `[B, T]` index laid out time-major (a transposed view) reads time-major as well: NumPy is slow to
    # broadcast or reduce over a short innermost axis.
    if getattr(i, "ndim", 0) == 2 and i.flags.f_contiguous and not i.flags.c_contiguous:
        return x.take(i.T, axis=0).swapaxes(0, 1)
    return x.take(i, axis=0)


def _np_gather_each(arrays: list, i: Any) -> list:
    """`_np_gather` of every array at the same rows, in one call (a sample reads each leaf)."""
    out = []
    if getattr(i, "ndim", 0) == 2 and i.flags.f_contiguous and not i.flags.c_contiguous:
        for x in arrays:
            out.append(x.take(i.T, axis=0).swapaxes(0, 1))
    else:
        for x in arrays:
            out.append(x.take(i, axis=0))
    return out


def _np_assign(array: np.ndarray, value: Any) -> None:
    array[...] = value


def _np_bin_add(counts: np.ndarray, first: np.ndarray, second: np.ndarray, weights: np.ndarray) -> Callable:
    """The step that adds `weights` to the cells `(first, second)` of `counts`: the counts after it are taken
    now, so the step only copies them in and running it again changes nothing (see `_np_commit`)."""
    after = counts.copy()  # a few KiB per segment, cheaper than summing duplicate cells apart
    np.add.at(after, (first, second), weights)
    return lambda: np.copyto(counts, after)


def _tf_bin_add(counts: tf.Variable, first: tf.Tensor, second: tf.Tensor, weights: tf.Tensor) -> Callable:
    """The step that adds `weights` to the cells `(first, second)` of `counts` (its op made where it runs)."""
    at = tf.stack([tf.reshape(first, [-1]), tf.reshape(second, [-1])], 1)
    return lambda: counts.scatter_nd_add(at, tf.reshape(weights, [-1]))


def _np_commit(reads: list, steps: list, result: Callable[[], Any]) -> Any:
    """Runs a NumPy write's `steps` in order, then returns `result()`: all of them or none, whatever exception
    lands in the write (Ctrl-C's `KeyboardInterrupt` may come between any two bytecodes of the main thread).

    Before its steps a write only reads (`reads`) and computes, so an exception there changes nothing. Each
    step assigns values computed before the first step (never `+=`), so it may run again: an exception during
    the steps finishes them, the interrupted one again, before it goes on (a second exception while they
    finish, Ctrl-C twice within microseconds, goes on at once). Deferring SIGINT instead would cover Ctrl-C
    alone, on the main thread alone, and cost two `signal.signal` calls per write.
    """
    done = 0
    try:
        for step in steps:
            step()
            done += 1
    except BaseException:
        for step in steps[done:]:
            step()
        raise
    return result()


def _tf_commit(reads: list, steps: list, result: Callable[[], Any]) -> Any:
    """`result()` after every step's updates, each step after the reads or the updates of the step before
    (a graph runs them all or none)."""
    deps: list = list(reads)
    made: list = []
    for step in steps:
        out = _tf_after(deps, step)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        deps, made = out or deps, made + out
    return _tf_after(made, result)


def _tf_after(updates: list, fn: Callable[[], Any]) -> Any:
    with tf.control_dependencies([u for u in updates if u is not None]):
        return fn()


def _tf_power(x: tf.Tensor, a: float) -> tf.Tensor:
    """`x ** a` for `x >= 0` as `exp(a * log(x))`: a few ulps from `tf.pow`, whose float64 kernel is ~10x slower."""
    return tf.ones_like(x) if a == 0 else tf.exp(a * tf.math.log(x))


def _tf_cummax0(x: tf.Tensor) -> tf.Tensor:
    return x if x.shape[0] == 1 else tf.scan(tf.maximum, x)


def _tf_rare(common: Any, then: Callable[[], Any], otherwise: Callable[[], Any]) -> Any:
    """`tf.cond(common, then, otherwise)` for an `otherwise` rarely taken. In a graph the `If` stays a function
    call: lowered to switches, as a graph's conds are, each of the branch's ops would still cost the executor a
    step whenever the branch is not taken."""
    out = tf.cond(common, then, otherwise)
    if isinstance(common, tf.Tensor) and not tf.executing_eagerly():
        branch = tf.nest.flatten(out)[0].op.inputs[0].op  # the outputs are identities of the If's
        if branch.type in ("If", "StatelessIf"):
            branch._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))
    return out


def _tf_running_sum0(x: tf.Tensor) -> tf.Tensor:
    """Running sums along axis 0, added first to last (`tf.cumsum` may add in another order)."""
    rows = tf.unstack(x, axis=0)
    running = [rows[0]]
    for row in rows[1:]:
        running.append(running[-1] + row)
    return tf.stack(running)


def _tf_frame_stacks(frames: tf.Variable, rows: tf.Tensor, history_len: int, num_steps: int | None) -> Any:
    """Frame stacks by the native op where it is built and the frames are on the CPU outside XLA, else by XLA."""
    op = native.frame_stack() if stacks.on_cpu(frames) and not under_xla() else None
    if op is None:
        return stacks.tf_stacks(frames, rows, history_len, num_steps)
    return stacks.kernel_stacks(op, frames, rows, history_len, num_steps)


def _negative_bits(bits: Any) -> Any:
    """Which float64 values (as their int64 bits) are below zero, by the sign bit, -0.0 aside: a negative
    subnormal counts whatever the float mode (a TF thread that flushes denormals to zero compares it as 0)."""
    return (bits < 0) & (bits != np.iinfo(np.int64).min)


def _np_loop(cond: Callable, body: Callable, state: tuple, most: int) -> tuple:
    for _ in range(most):
        if not cond(*state):
            break
        state = body(*state)
    return state


NUMPY_OPS = types.SimpleNamespace(
    name="numpy",
    minimum=np.minimum,
    maximum=np.maximum,
    power=np.power,
    arange=lambda n: np.arange(n, dtype=np.int64),
    unstack=lambda x, axis: tuple(np.moveaxis(x, axis, 0)),
    stack=lambda xs, axis: np.stack(xs, axis),
    probability=lambda shape, total: np.full(shape, 1.0 / total if total else 0.0, np.float32),
    gather=_np_gather,
    gather_each=_np_gather_each,
    where=np.where,
    cumsum=np.cumsum,
    cummax0=lambda x: np.maximum.accumulate(x, axis=0),
    # Methods and ufuncs: `np.sum` and `np.searchsorted` cost a microsecond more per call on small arrays.
    searchsorted=lambda a, v: a.searchsorted(v, "right").astype(np.int64, copy=False),
    sum=lambda x, axis=None: np.add.reduce(x, axis),
    all=np.all,
    any0=lambda x: np.any(x, axis=0),
    argmax0=lambda x: np.argmax(x, axis=0).astype(np.int64),
    argsort_stable=lambda x: np.argsort(x, kind="stable"),
    to_int64=lambda x: np.asarray(x, np.int64),
    to_int32=lambda x: np.asarray(x, np.int32),
    to_float32=lambda x: np.asarray(x, np.float32),
    to_float64=lambda x: np.asarray(x, np.float64),
    max=np.max,
    reshape=np.reshape,
    transpose=lambda x: x.T,  # a view
    # `[B, n]` window ids `t + k`, laid out time-major (a transposed view): NumPy broadcasts and reduces slowly
    # over a short innermost axis, and elementwise results keep the layout.
    window_ids=lambda t, n: (t + np.arange(n, dtype=np.int64)[:, None]).T,
    zeros_like=np.zeros_like,
    ones_like=np.ones_like,
    flatnonzero=lambda x: np.flatnonzero(x).astype(np.int64),
    read=lambda x: x.copy(),
    scatter=_np_scatter,
    assign=_np_assign,
    bin_add=_np_bin_add,
    after=lambda updates, fn: fn(),
    commit=_np_commit,
    cond=lambda pred, true_fn, false_fn: true_fn() if pred else false_fn(),
    rare=lambda common, then, otherwise: then() if common else otherwise(),
    loop=_np_loop,
    concat=lambda parts: np.concatenate(parts, 0),
    outer_reshape=lambda x, like: x.reshape(np.shape(like) + x.shape[1:]),
    running_sum0=lambda x: np.add.accumulate(x, axis=0),  # adds first to last, as the TF loop does
    negative=lambda x: _negative_bits(np.asarray(x, np.float64).view(np.int64)),
    max0=lambda x: x.max(axis=0),
    sum0=lambda x: np.add.reduce(x, 0),
    # Transforms (ufunc reductions: the `sum` and `prod` methods cost a microsecond more per call).
    count1=lambda mask: np.add.reduce(mask, 1, np.int64),
    sum1=lambda x: np.add.reduce(x, 1),
    prod1=lambda x: np.multiply.reduce(x, 1),
    pick=lambda x, i: x[np.arange(len(i)), i],
    cast=lambda x, dtype: np.asarray(x, dtype),
    dtype=lambda x: x.dtype,
    rank=lambda x: x.ndim,
    # The frame stacks: NumPy packs whole words, no kernel needed. (A sum tree finds its compiled loops when its
    # sampler is bound: `kernels.sum_tree_finder`.)
    frame_stacks=stacks.np_stacks,
)

TF_OPS = types.SimpleNamespace(
    name="tf",
    minimum=tf.minimum,
    maximum=tf.maximum,
    power=_tf_power,
    arange=lambda n: tf.range(n, dtype=tf.int64),
    unstack=lambda x, axis: tuple(tf.unstack(x, axis=axis)),
    stack=lambda xs, axis: tf.stack(xs, axis),
    probability=lambda shape, total: tf.fill(shape, tf.math.divide_no_nan(1.0, tf.cast(total, tf.float32))),
    gather=tf.gather,
    gather_each=lambda arrays, rows: [tf.gather(x, rows) for x in arrays],
    where=tf.where,
    cumsum=tf.cumsum,
    cummax0=_tf_cummax0,
    searchsorted=lambda a, v: tf.searchsorted(a, v, side="right", out_type=tf.int64),
    sum=tf.reduce_sum,
    all=tf.reduce_all,
    any0=lambda x: tf.reduce_any(x, axis=0),
    argmax0=lambda x: tf.argmax(tf.cast(x, tf.int32), axis=0, output_type=tf.int64),
    argsort_stable=lambda x: tf.argsort(x, stable=True),
    to_int64=lambda x: tf.cast(x, tf.int64),
    to_int32=lambda x: tf.cast(x, tf.int32),
    to_float32=lambda x: tf.cast(x, tf.float32),
    to_float64=lambda x: tf.cast(x, tf.float64),
    max=tf.reduce_max,
    reshape=tf.reshape,
    transpose=tf.transpose,
    window_ids=lambda t, n: t[:, None] + tf.range(n, dtype=tf.int64)[None, :],  # XLA lays out the rest
    zeros_like=tf.zeros_like,
    ones_like=tf.ones_like,
    flatnonzero=lambda x: tf.where(x)[:, 0],
    read=lambda v: v.read_value(),
    scatter=lambda v, rows, values: v.scatter_update(tf.IndexedSlices(values, rows)),
    assign=lambda v, value: v.assign(value),
    bin_add=_tf_bin_add,
    after=_tf_after,
    commit=_tf_commit,
    cond=tf.cond,
    rare=_tf_rare,  # a cond whose second branch is rarely taken
    loop=lambda cond, body, state, most: tf.while_loop(cond, body, state, maximum_iterations=most),
    concat=lambda parts: tf.concat(parts, 0),
    outer_reshape=lambda x, like: tf.reshape(x, tf.concat([tf.shape(like), tf.shape(x)[1:]], 0)),
    running_sum0=_tf_running_sum0,
    negative=lambda x: _negative_bits(tf.bitcast(tf.cast(x, tf.float64), tf.int64)),
    max0=lambda x: tf.reduce_max(x, 0),
    sum0=lambda x: tf.reduce_sum(x, 0),
    count1=lambda mask: tf.reduce_sum(tf.cast(mask, tf.int64), axis=1),
    sum1=lambda x: tf.reduce_sum(x, axis=1),
    prod1=lambda x: tf.reduce_prod(x, axis=1),
    pick=lambda x, i: tf.gather(x, i, batch_dims=1),
    cast=lambda x, dtype: tf.cast(x, dtype),
    dtype=lambda x: x.dtype.as_numpy_dtype,
    rank=lambda x: x.shape.rank,
    frame_stacks=_tf_frame_stacks,
)
