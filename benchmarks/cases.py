"""What is timed: each buffer operation beside the same work on plain NumPy arrays.

`setup` builds a full TF buffer, a full NumPy (Py) buffer and, as the
baseline, one preallocated NumPy array per spec leaf, measuring the buffers'
memory on the way. `cases` lists every operation to time, each as a `Case`
whose `build` returns `(subject, baseline)` benches, built only when timed so
a dataset's prefetching threads live only while their own case runs.

Baselines: `add_batch` is `array[pos:pos + batch_size] = leaf` per leaf (the
position advancing round the ring); `get_next` and `as_dataset` are
`array.take(rows, axis=0)` per leaf for `[sample_batch_size, num_steps]`
random window rows (pre-drawn, so drawing them is not timed).

In-graph rows (`graph_loop`, also used by floors.py, peers.py,
prioritized.py and windows.py): many calls in one tf.function's while loop,
per call, each call waiting for the previous one's outputs, as in a training
step (sample, train, update, then the next sample). `--overlap` on every
bench entry point builds the earlier loop instead (calls independent of
the previous one's outputs, up to 10 iterations in flight), to reproduce
figures measured before the loop was serialized.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import tensorflow as tf

import tfreplay
from benchmarks.memory import MemoryReport, build_and_fill
from benchmarks.timing import Bench
from benchmarks.workloads import Workload

# get_next calls per invocation of the in-graph loop: enough that the one
# tf.function call is amortised to a few percent of the loop.
GRAPH_LOOP_CALLS = 200
# How the in-graph loops built from now on run (`set_overlap`): serialized unless an entry point's `--overlap`.
_LOOP = {"overlap": False}
_ROW_POOL = 64


@dataclasses.dataclass
class Subjects:
    """Everything a workload's cases use: full buffers, baseline arrays, data."""

    workload: Workload
    tf_buffer: tfreplay.TFUniformReplayBuffer
    py_buffer: tfreplay.PyUniformReplayBuffer
    arrays: List[np.ndarray]
    batch: Dict[str, np.ndarray]
    tf_batch: Dict[str, tf.Tensor]
    rows: List[np.ndarray]
    memory: Dict[str, MemoryReport]


@dataclasses.dataclass
class Case:
    """One line of the table: an operation, a variant, and how to time it."""

    op: str
    variant: str
    items: int
    build: Callable[[], Tuple[Bench, Bench]]


def _fill_tf(buffer: tfreplay.TFUniformReplayBuffer, tf_batch: Dict[str, tf.Tensor]) -> None:
    @tf.function
    def fill(items: Dict[str, tf.Tensor], count: tf.Tensor) -> None:
        repeat(lambda: buffer.add_batch(items), count)

    fill(tf_batch, tf.constant(buffer.max_length))


def _fill_py(buffer: tfreplay.PyUniformReplayBuffer, batch: Dict[str, np.ndarray]) -> None:
    for _ in range(buffer.max_length):
        buffer.add_batch(batch)


def _baseline_arrays(w: Workload, batch: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """One filled `[capacity, *shape]` array per leaf (every page written)."""
    arrays = []
    for spec, leaf in zip(tf.nest.flatten(w.data_spec), tf.nest.flatten(batch)):
        array = np.empty([w.capacity] + spec.shape.as_list(), spec.dtype.as_numpy_dtype)
        array.reshape((w.max_length,) + leaf.shape)[...] = leaf  # broadcast over time
        arrays.append(array)
    return arrays


def _memory(w: Workload, make: Callable, fill: Callable) -> Tuple[Any, MemoryReport]:
    buffer, created, peak, filled = build_and_fill(make, fill)
    return buffer, MemoryReport(buffer.nbytes, buffer.capacity, w.spec_bytes, created, peak, filled)


def setup(w: Workload, seed: int = 0) -> Subjects:
    """Builds and fills both buffers (measuring memory) and the baseline arrays."""
    rng = np.random.default_rng(seed)
    batch = w.make_batch(rng)
    tf_batch = tf.nest.map_structure(tf.constant, batch)
    spec = w.data_spec
    tf_buffer, tf_mem = _memory(
        w,
        lambda: tfreplay.TFUniformReplayBuffer(spec, w.batch_size, w.max_length, seed=seed),
        lambda b: _fill_tf(b, tf_batch),
    )
    py_buffer, py_mem = _memory(
        w,
        lambda: tfreplay.PyUniformReplayBuffer(spec, batch_size=w.batch_size, max_length=w.max_length, seed=seed),
        lambda b: _fill_py(b, batch),
    )
    return Subjects(
        w,
        tf_buffer,
        py_buffer,
        _baseline_arrays(w, batch),
        batch,
        tf_batch,
        w.window_rows(rng, _ROW_POOL),
        {"TF": tf_mem, "Py": py_mem},
    )


def numpy_add(s: Subjects) -> Bench:
    """Preallocated assignment of one batch per leaf, advancing round the ring."""
    leaves = tf.nest.flatten(s.batch)
    step, capacity = s.workload.batch_size, s.workload.capacity
    pos = 0

    def add() -> None:
        nonlocal pos
        for array, leaf in zip(s.arrays, leaves):
            array[pos : pos + step] = leaf
        pos = (pos + step) % capacity

    return Bench(add)


def numpy_gather(s: Subjects) -> Bench:
    """Fancy-index gather of one sample's window rows per leaf."""
    pool = itertools.cycle(s.rows)

    def gather() -> List[np.ndarray]:
        rows = next(pool)
        return [array.take(rows, axis=0) for array in s.arrays]

    return Bench(gather)


def add_overlap_flag(parser: argparse.ArgumentParser) -> None:
    """Adds `--overlap`, the old in-graph loop, to an entry point's parser."""
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="in-graph loops as before this flag: calls independent of the previous one's outputs, up to 10 "
        "iterations in flight (default: each call waits for the previous one, as in a training step)",
    )


def set_overlap(overlap: bool) -> None:
    """Makes the in-graph loops built from now on overlap their calls (the old loop) or serialize them."""
    _LOOP["overlap"] = overlap


def repeat(step: Callable[[], Any], count: Any, overlap: bool = False) -> Any:
    """Calls `step` `count` (>= 1) times in a graph while loop; returns the last call's outputs.

    Serialized unless `overlap`: each call's ops wait for the previous call's outputs, and the loop keeps one
    iteration in flight (`parallel_iterations=1`), so a time per call is the latency a training step sees
    (sample, train, update, then the next sample). With `overlap` (the earlier loop) a call waits only for what
    TF orders by itself (in TF 2.21 each iteration's outputs wait for its stateful ops) and up to 10 iterations
    are in flight, so the rest of a call may run beside the next one. Call it inside a `tf.function`; `step`
    returns a nest of tensors of the same structure and shapes on every call.
    """

    def body(i: tf.Tensor, previous: Any) -> Tuple[tf.Tensor, Any]:
        if overlap:
            return i + 1, step()
        with tf.control_dependencies(tf.nest.flatten(previous)):
            return i + 1, step()

    count = tf.cast(count, tf.int64)
    first = (tf.constant(1, tf.int64), step())
    iterations = 10 if overlap else 1  # 10: tf.while_loop's default, what the old `for _ in tf.range` loop had
    return tf.while_loop(lambda i, _: i < count, body, first, parallel_iterations=iterations)[1]


def graph_loop(step: Callable[[], Any], jit_compile: bool = False, calls: int = GRAPH_LOOP_CALLS) -> Bench:
    """`calls` calls of `step` in one tf.function's while loop (`repeat`), per call.

    `step`'s result is the loop variable, so no call can be pruned; the one function call is amortised over
    the loop. Serialized unless `set_overlap(True)` was called before building it.
    """
    overlap = _LOOP["overlap"]

    @tf.function(jit_compile=jit_compile)
    def loop(count: tf.Tensor) -> Any:
        return repeat(step, count, overlap)

    count = tf.constant(calls)
    return Bench(lambda: loop(count), ops=calls)


def add_cases(s: Subjects) -> List[Case]:
    """`add_batch` of one batch: TF in a tf.function (per call, also under XLA, and
    amortised in a loop), TF eager, Py."""
    tf_buffer, py_buffer, n = s.tf_buffer, s.py_buffer, s.workload.batch_size
    add_in_graph = tf.function(lambda items: tf_buffer.add_batch(items))
    add_in_xla = tf.function(lambda items: tf_buffer.add_batch(items), jit_compile=True)

    def pair(make: Callable[[], Bench]) -> Callable[[], Tuple[Bench, Bench]]:
        return lambda: (make(), numpy_add(s))

    def add_step() -> tf.Tensor:
        return tf_buffer.add_batch(s.tf_batch)

    return [
        Case("add_batch", "TF tf.function", n, pair(lambda: Bench(lambda: add_in_graph(s.tf_batch)))),
        Case("add_batch", "TF tf.function XLA", n, pair(lambda: Bench(lambda: add_in_xla(s.tf_batch)))),
        Case("add_batch", "TF in-graph", n, pair(lambda: graph_loop(add_step))),
        Case("add_batch", "TF eager", n, pair(lambda: Bench(lambda: tf_buffer.add_batch(s.tf_batch)))),
        Case("add_batch", "Py", n, pair(lambda: Bench(lambda: py_buffer.add_batch(s.batch)))),
    ]


def get_next_cases(s: Subjects) -> List[Case]:
    """`get_next(sample_batch_size, num_steps)`: TF eagerly, TF in a graph loop (also under XLA), Py."""
    w, tf_buffer, py_buffer = s.workload, s.tf_buffer, s.py_buffer
    b, t = w.sample_batch_size, w.num_steps

    def pair(make: Callable[[], Bench]) -> Callable[[], Tuple[Bench, Bench]]:
        return lambda: (make(), numpy_gather(s))

    def sample_step() -> Dict[str, tf.Tensor]:
        return tf_buffer.get_next(b, num_steps=t)[0]

    return [
        Case("get_next", "TF eager", w.items_per_sample, pair(lambda: Bench(lambda: tf_buffer.get_next(b, t)))),
        Case("get_next", "TF in-graph", w.items_per_sample, pair(lambda: graph_loop(sample_step))),
        Case("get_next", "TF in-graph XLA", w.items_per_sample, pair(lambda: graph_loop(sample_step, True))),
        Case("get_next", "Py", w.items_per_sample, pair(lambda: Bench(lambda: py_buffer.get_next(b, t)))),
    ]


def drain_for(iterator: Any) -> Callable[[float], None]:
    """A `Bench.prepare` that consumes a dataset for a quarter of a block.

    Consuming is much faster than producing, so this empties whatever the
    prefetch buffer stored meanwhile and leaves the pipeline at its steady rate.
    """

    def drain(block_seconds: float) -> None:
        end = time.perf_counter() + max(0.01, block_seconds / 4)
        while time.perf_counter() < end:
            next(iterator)

    return drain


def _dataset_bench(buffer: tfreplay.ReplayBuffer, w: Workload, parallel: int | None) -> Bench:
    dataset = buffer.as_dataset(w.sample_batch_size, num_steps=w.num_steps, num_parallel_calls=parallel)
    iterator = iter(dataset.prefetch(tf.data.AUTOTUNE))
    return Bench(lambda: next(iterator), prepare=drain_for(iterator))


def dataset_cases(s: Subjects) -> List[Case]:
    """Steady-state iteration of a prefetching `as_dataset`, per element."""
    out = []
    for name, buffer in (("TF", s.tf_buffer), ("Py", s.py_buffer)):
        for label, parallel in (("AUTOTUNE", tf.data.AUTOTUNE), ("None", None)):

            def build(b: tfreplay.ReplayBuffer = buffer, p: int | None = parallel) -> Tuple[Bench, Bench]:
                return _dataset_bench(b, s.workload, p), numpy_gather(s)

            out.append(Case("as_dataset", f"{name} npc={label}", s.workload.items_per_sample, build))
    return out


def cases(s: Subjects) -> List[Case]:
    """Every case of a workload, in table order."""
    return add_cases(s) + get_next_cases(s) + dataset_cases(s)
