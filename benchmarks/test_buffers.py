"""The uniform buffers' add_batch, get_next and as_dataset, each group beside plain NumPy and TensorFlow's floors.

Workloads (`benchmarks.common`), both buffers full before anything is timed:
CartPole `{observation: f32[4], action: i64, reward: f32, discount: f32}`, 16
segments x 4,096 rows, samples of 256 windows x 2 steps; Atari `{observation:
u8[84,84,4], action: i64}`, 4 segments x 5,000 rows (564 MB), samples of 32 x 2.

Per group, the baseline (ratio = case / baseline in the report) is NumPy on
preallocated arrays: `array[pos:pos + B] = leaf` for add_batch, `take` of the
same number of pre-drawn window rows for sampling. Floors are the cheapest call
of each kind a buffer is built on: a `tf.function` call with the batch as
arguments, random rows + `tf.gather` in the serialized graph loop, `next()` on
a dataset repeating a ready element, NumPy drawing rows + take. "in-graph":
calls in one `tf.function`'s while loop, each after the previous one, per call.
"XLA": the TF buffer takes no lock under XLA, so that mode is only safe when
nothing else writes or samples meanwhile.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.common import drained, measure

MODES = ["eager", "tf.function", "tf.function XLA", "in-graph"]


def _group(s, op: str) -> str:
    return f"{s.workload.name} {op}"


def test_add_numpy_baseline(benchmark, subjects):
    measure(
        benchmark,
        subjects.numpy.add,
        group=_group(subjects, "add_batch"),
        case="NumPy: assign rows",
        role="baseline",
        items=subjects.workload.batch_size,
    )


def test_add_floor_function_call(benchmark, subjects):
    call = tf.function(lambda items: tf.nest.flatten(items)[0][0])
    n = subjects.workload.batch_size
    measure(
        benchmark,
        lambda: call(subjects.tf_batch),
        group=_group(subjects, "add_batch"),
        case="floor: tf.function call with the batch",
        role="floor",
        items=n,
    )


@pytest.mark.parametrize("mode", MODES)
def test_add_tf(benchmark, subjects, graph_loop, mode):
    rb, batch = subjects.tf_buffer, subjects.tf_batch
    if mode == "in-graph":
        fn = graph_loop(lambda: rb.add_batch(batch))
    elif mode == "eager":
        fn = lambda: rb.add_batch(batch)  # noqa: E731
    else:
        add = tf.function(lambda items: rb.add_batch(items), jit_compile=mode.endswith("XLA"))
        fn = lambda: add(batch)  # noqa: E731
    measure(benchmark, fn, group=_group(subjects, "add_batch"), case=f"TF {mode}", items=subjects.workload.batch_size)


def test_add_py(benchmark, subjects):
    rb, batch = subjects.py_buffer, subjects.batch
    measure(
        benchmark,
        lambda: rb.add_batch(batch),
        group=_group(subjects, "add_batch"),
        case="Py",
        items=subjects.workload.batch_size,
    )


def _window_rows_baseline(benchmark, subjects, op):
    """A sampling group's baseline: the same window rows taken from NumPy arrays (timed beside the group)."""
    group, items = _group(subjects, op), subjects.workload.items_per_sample
    measure(benchmark, subjects.numpy.gather, group=group, case="NumPy: take window rows", role="baseline", items=items)


def test_get_next_numpy_baseline(benchmark, subjects):
    _window_rows_baseline(benchmark, subjects, "get_next")


def test_get_next_floor_numpy_draw(benchmark, subjects):
    w, arrays, rng = subjects.workload, subjects.numpy.arrays, np.random.default_rng(1)
    steps = np.arange(w.num_steps, dtype=np.int64) * w.batch_size
    high = w.capacity - (w.num_steps - 1) * w.batch_size

    def draw_and_take():
        rows = rng.integers(0, high, size=(w.sample_batch_size, 1)) + steps
        return [array.take(rows, axis=0) for array in arrays]

    measure(
        benchmark,
        draw_and_take,
        group=_group(subjects, "get_next"),
        case="floor: NumPy draw rows + take",
        role="floor",
        items=w.items_per_sample,
    )


def test_get_next_floor_graph_gather(benchmark, subjects, graph_loop):
    w = subjects.workload
    leaves = [v for v in subjects.tf_buffer.variables() if v.shape.rank and v.shape[0] == w.capacity]

    def step():
        rows = tf.random.uniform([w.sample_batch_size, w.num_steps], 0, w.capacity, dtype=tf.int64)
        return [tf.gather(v, rows) for v in leaves]

    measure(
        benchmark,
        graph_loop(step),
        group=_group(subjects, "get_next"),
        case="floor: in-graph random rows + tf.gather",
        role="floor",
        items=w.items_per_sample,
    )


@pytest.mark.parametrize("mode", ["eager", "tf.function", "in-graph", "in-graph XLA"])
def test_get_next_tf(benchmark, subjects, graph_loop, mode):
    w, rb = subjects.workload, subjects.tf_buffer
    b, t = w.sample_batch_size, w.num_steps
    if mode.startswith("in-graph"):
        fn = graph_loop(lambda: rb.get_next(b, num_steps=t)[0], jit_compile=mode.endswith("XLA"))
    elif mode == "eager":
        fn = lambda: rb.get_next(b, num_steps=t)  # noqa: E731
    else:
        fn = tf.function(lambda: rb.get_next(b, num_steps=t))
    measure(benchmark, fn, group=_group(subjects, "get_next"), case=f"TF {mode}", items=w.items_per_sample)


def test_get_next_py(benchmark, subjects):
    w, rb = subjects.workload, subjects.py_buffer
    measure(
        benchmark,
        lambda: rb.get_next(w.sample_batch_size, num_steps=w.num_steps),
        group=_group(subjects, "get_next"),
        case="Py",
        items=w.items_per_sample,
    )


def test_as_dataset_numpy_baseline(benchmark, subjects):
    _window_rows_baseline(benchmark, subjects, "as_dataset")


def test_as_dataset_floor_ready_element(benchmark, subjects):
    w = subjects.workload
    items, info = subjects.tf_buffer.get_next(w.sample_batch_size, num_steps=w.num_steps)
    dataset = tf.data.Dataset.from_tensors((dict(items), tuple(info))).repeat().prefetch(tf.data.AUTOTUNE)
    measure(
        benchmark,
        drained(iter(dataset)),
        group=_group(subjects, "as_dataset"),
        case="floor: next() on a ready element",
        role="floor",
        items=w.items_per_sample,
    )


@pytest.mark.parametrize("parallel", ["AUTOTUNE", "None"])
@pytest.mark.parametrize("twin", ["TF", "Py"])
def test_as_dataset(benchmark, subjects, twin, parallel):
    w = subjects.workload
    rb = subjects.tf_buffer if twin == "TF" else subjects.py_buffer
    npc = tf.data.AUTOTUNE if parallel == "AUTOTUNE" else None
    dataset = rb.as_dataset(w.sample_batch_size, num_steps=w.num_steps, num_parallel_calls=npc)
    iterator = iter(dataset.prefetch(tf.data.AUTOTUNE))
    measure(
        benchmark,
        drained(iterator),
        group=_group(subjects, "as_dataset"),
        case=f"{twin} num_parallel_calls={parallel}",
        items=w.items_per_sample,
    )
