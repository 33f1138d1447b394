"""What the benchmark files share: sizes, the two buffer workloads, the serialized graph loop, and `measure`.

Every figure is a pytest-benchmark case. A case's `group` puts a library
figure beside the floor or baseline it is read against, both timed in the same
run; `extra_info` carries what `benchmarks/report.py` needs to print a table:
`ops` (operations per timed call: a graph loop of 200 calls is 200), `items`
(rows an operation moves) and `role` (`"baseline"`: the group's denominator;
`"floor"`: the least that kind of call costs, whatever a buffer does inside).
Under pytest's `--interleaved=R` (`make bench ROUNDS=R`) the same cases are
timed in R interleaved rounds instead (`benchmarks/interleave.py`).

`TFREPLAY_BENCH_TINY=1` shrinks every size (buffers of a few hundred rows,
short loops) so that `pytest benchmarks --benchmark-disable` checks in seconds
that each case runs; its figures mean nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from typing import Any, Callable, Dict, List

import numpy as np
import tensorflow as tf

from benchmarks import interleave

TINY = os.environ.get("TFREPLAY_BENCH_TINY") == "1"


def size(full: int, tiny: int) -> int:
    """`full`, or `tiny` under `TFREPLAY_BENCH_TINY=1`."""
    return tiny if TINY else full


# Calls per invocation of the in-graph loop: enough that the one tf.function call is a few percent of the loop.
GRAPH_LOOP_CALLS = size(200, 3)


def repeat(step: Callable[[], Any], count: Any) -> Any:
    """Calls `step` `count` (>= 1) times in a graph while loop, each call after the previous one; returns the last
    call's outputs.

    Each call's ops wait for the previous call's outputs and one iteration is
    in flight (`parallel_iterations=1`), so a time per call is the latency a
    training step sees: sample, train, update, then the next sample. Call it
    inside a `tf.function`; `step` returns a nest of tensors of the same
    structure and shapes on every call.
    """

    def body(i: tf.Tensor, previous: Any) -> tuple:
        with tf.control_dependencies(tf.nest.flatten(previous)):
            return i + 1, step()

    first = (tf.constant(1, tf.int64), step())
    count = tf.cast(count, tf.int64)
    return tf.while_loop(lambda i, _: i < count, body, first, parallel_iterations=1)[1]


class GraphLoop:
    """`calls` calls of `step` in one `tf.function`'s serialized while loop (`repeat`); `ops` is `calls`."""

    def __init__(self, step: Callable[[], Any], calls: int = GRAPH_LOOP_CALLS, jit_compile: bool = False):
        self.ops = calls
        self._count = tf.constant(calls)
        self._loop = tf.function(lambda count: repeat(step, count), jit_compile=jit_compile)

    def __call__(self) -> Any:
        return self._loop(self._count)


def measure(
    benchmark: Any,
    fn: Callable[[], Any],
    *,
    group: str,
    case: str,
    ops: int | None = None,
    items: int | None = None,
    role: str | None = None,
    versus: str | tuple | None = None,
    setup: Callable[[], Any] | None = None,
    rounds: int = 5,
    warmup: int = 2,
) -> Any:
    """Warms `fn` up (traces, compiles) and times it with pytest-benchmark, labelled for the report.

    `group` is the table it sits in, `case` its row; `ops` defaults to `fn.ops`
    (a `GraphLoop`), else 1. `versus` names a second case to set this one
    beside, in the same group (`"TF-Agents"`) or another (`(group, case)`).
    With `setup` (untimed, before every call), `fn` is timed `rounds` times
    once each, without a warm-up. Under `--interleaved` (`benchmarks/conftest.py`)
    the case joins its file's interleaved rounds instead (`benchmarks/interleave.py`).
    """
    ops = ops or getattr(fn, "ops", 1)
    if isinstance(versus, str):
        versus = (group, versus)
    interleaved = getattr(benchmark, "interleaved", None)
    if setup is None and (interleaved is not None or not benchmark.disabled):
        for _ in range(warmup):
            fn()
    if interleaved is not None:
        calls = 1 if setup is not None else 0
        interleaved.add(interleave.Case(group, case, fn, ops, items, role, setup, versus, calls))
        return benchmark(lambda: None)  # pytest-benchmark's fixture, off under --interleaved, counts as used
    benchmark.group = group
    benchmark.extra_info.update(case=case, ops=ops)
    for key, value in (("items", items), ("role", role), ("versus", versus)):
        if value is not None:
            benchmark.extra_info[key] = list(value) if key == "versus" else value
    if setup is not None:
        return benchmark.pedantic(fn, setup=setup, rounds=rounds)
    return benchmark(fn)


def drained(iterator: Any, seconds: float = 0.05) -> Callable[[], Any]:
    """`next(iterator)`, after consuming it for `seconds` so no timing is served from a prefetched backlog."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        next(iterator)
    return lambda: next(iterator)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One buffer configuration: the item spec, the ring (segments x rows) and the sample shape."""

    name: str
    spec: Dict[str, tf.TensorSpec]
    batch_size: int  # segments (parallel envs), and rows per `add_batch`
    max_length: int  # rows per segment
    sample_batch_size: int
    num_steps: int

    @property
    def capacity(self) -> int:
        return self.batch_size * self.max_length

    @property
    def items_per_sample(self) -> int:
        return self.sample_batch_size * self.num_steps

    def make_batch(self, rng: np.random.Generator) -> Dict[str, np.ndarray]:
        """A random `add_batch` argument: `batch_size` rows of every leaf."""
        batch = {}
        for key, spec in self.spec.items():
            shape, dtype = [self.batch_size] + spec.shape.as_list(), spec.dtype.as_numpy_dtype
            if spec.dtype.is_floating:
                batch[key] = rng.standard_normal(shape).astype(dtype)
            else:
                batch[key] = rng.integers(0, min(256, int(spec.dtype.max)), size=shape).astype(dtype)
        return batch

    def window_rows(self, rng: np.random.Generator, count: int) -> List[np.ndarray]:
        """`count` arrays of `[sample_batch_size, num_steps]` storage rows: windows of one segment in the
        buffers' time-major layout (row = t * batch_size + segment)."""
        pool = []
        for _ in range(count):
            segment = rng.integers(0, self.batch_size, size=(self.sample_batch_size, 1))
            start = rng.integers(0, self.max_length - self.num_steps + 1, size=(self.sample_batch_size, 1))
            pool.append(((start + np.arange(self.num_steps)) * self.batch_size + segment).astype(np.int64))
        return pool


CARTPOLE = Workload(
    "cartpole",
    {
        "observation": tf.TensorSpec([4], tf.float32),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "discount": tf.TensorSpec([], tf.float32),
    },
    batch_size=16,
    max_length=size(4096, 64),
    sample_batch_size=size(256, 8),
    num_steps=2,
)
ATARI = Workload(
    "atari",
    {"observation": tf.TensorSpec([84, 84, 4], tf.uint8), "action": tf.TensorSpec([], tf.int64)},
    batch_size=4,
    max_length=size(5000, 16),
    sample_batch_size=size(32, 4),
    num_steps=2,
)
WORKLOADS = {w.name: w for w in (CARTPOLE, ATARI)}


def fill_in_graph(add_batch: Callable[[Any], Any], batch: Any, count: int) -> None:
    """`count` calls of `add_batch(batch)` in one graph loop (a million eager calls would take minutes)."""

    def add() -> tf.Tensor:
        with tf.control_dependencies(tf.nest.flatten(add_batch(batch))):  # TF-Agents' returns an op
            return tf.constant(0, tf.int64)

    tf.function(lambda n: repeat(add, n))(tf.constant(count))


class NumpyRing:
    """The baseline: one preallocated, filled NumPy array per leaf of a workload."""

    def __init__(self, w: Workload, batch: Dict[str, np.ndarray], rows: List[np.ndarray]):
        self.w, self.leaves, self.pool = w, list(batch.values()), itertools.cycle(rows)
        self.arrays = []
        for spec, leaf in zip(w.spec.values(), self.leaves):
            array = np.empty([w.capacity] + spec.shape.as_list(), spec.dtype.as_numpy_dtype)
            array.reshape((w.max_length,) + leaf.shape)[...] = leaf  # every page written
            self.arrays.append(array)
        self.pos = 0

    def add(self) -> None:
        """`array[pos:pos + batch_size] = leaf` per leaf, going round the ring."""
        step = self.w.batch_size
        for array, leaf in zip(self.arrays, self.leaves):
            array[self.pos : self.pos + step] = leaf
        self.pos = (self.pos + step) % self.w.capacity

    def gather(self) -> List[np.ndarray]:
        """`array.take(rows)` per leaf of one sample's pre-drawn window rows."""
        rows = next(self.pool)
        return [array.take(rows, axis=0) for array in self.arrays]
