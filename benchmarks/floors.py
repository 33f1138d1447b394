"""Floors: the least each kind of call costs here, whatever a buffer does inside.

They are timed like the buffers, beside the same NumPy baselines, so a ratio
target below a floor's ratio cannot be met by any buffer built on that kind
of call (a tf.function call, a tf.data iterator, a graph loop, NumPy random
draws). None of them touches a buffer. The graph floor runs in the same
serialized loop as the buffers' in-graph rows (`cases.graph_loop`: each call
waits for the previous one; `--overlap` on `benchmarks.run` for the old loop).
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import numpy as np
import tensorflow as tf

from benchmarks.cases import Case, Subjects, drain_for, graph_loop, numpy_add, numpy_gather
from benchmarks.timing import Bench


def _call_floor(s: Subjects) -> Bench:
    """A tf.function taking the same batch and doing almost nothing with it."""
    fn = tf.function(lambda items: tf.nest.flatten(items)[0][0])
    return Bench(lambda: fn(s.tf_batch))


def _element(s: Subjects) -> Tuple[Any, Any]:
    """A dataset element shaped like `as_dataset`'s, in plain dicts and tuples."""
    items, info = s.tf_buffer.get_next(s.workload.sample_batch_size, num_steps=s.workload.num_steps)
    return dict(items), tuple(info)


def _iterator_floor(s: Subjects) -> Bench:
    """`next()` on a prefetching dataset that repeats one ready element."""
    dataset = tf.data.Dataset.from_tensors(_element(s)).repeat().prefetch(tf.data.AUTOTUNE)
    iterator = iter(dataset)
    return Bench(lambda: next(iterator), prepare=drain_for(iterator))


def _graph_gather_floor(s: Subjects) -> Bench:
    """In a graph loop: uniform random rows, then one `tf.gather` per leaf."""
    w = s.workload
    variables = s.tf_buffer.variables()  # every variable it holds
    leaves = [v for v in variables if v.shape.rank and v.shape[0] == w.capacity]

    def step() -> List[tf.Tensor]:
        rows = tf.random.uniform([w.sample_batch_size, w.num_steps], 0, w.capacity, dtype=tf.int64)
        return [tf.gather(v, rows) for v in leaves]

    return graph_loop(step)


def _numpy_draw_floor(s: Subjects) -> Bench:
    """NumPy drawing `[B, num_steps]` window rows, then the baseline's take."""
    w, rng = s.workload, np.random.default_rng(1)
    steps = np.arange(w.num_steps, dtype=np.int64) * w.batch_size
    high = w.capacity - (w.num_steps - 1) * w.batch_size

    def draw_and_take() -> List[np.ndarray]:
        rows = rng.integers(0, high, size=(w.sample_batch_size, 1)) + steps
        return [array.take(rows, axis=0) for array in s.arrays]

    return Bench(draw_and_take)


def floor_cases(s: Subjects) -> List[Case]:
    """The floors, each beside the NumPy baseline of the operation it bounds."""
    n, m = s.workload.batch_size, s.workload.items_per_sample

    def pair(make: Callable[[Subjects], Bench], baseline: Callable[[Subjects], Bench]) -> Callable:
        return lambda: (make(s), baseline(s))

    return [
        Case("floor", "tf.function call, add args", n, pair(_call_floor, numpy_add)),
        Case("floor", "TF graph: rand rows+gather", m, pair(_graph_gather_floor, numpy_gather)),
        Case("floor", "tf.data next(), same element", m, pair(_iterator_floor, numpy_gather)),
        Case("floor", "NumPy: draw rows + take", m, pair(_numpy_draw_floor, numpy_gather)),
    ]
