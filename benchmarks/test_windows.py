"""Transforms over windows: sequences' cost against capacity, n-step returns against a plain window.

Buffers: the drivers' `Transition` of CartPole, 4 segments, full, episodes of
500 steps that end terminated, at capacities 10k, 100k and 1M rows.

* sequences: `get_next(32, transform=Sequences(80))` (strict: inside one
  episode) and `Sequences(80, pad=True)`, TF eagerly and the NumPy twin; each
  group's baseline is the 10k buffer, so "x base" is the cost of capacity.
  The floor groups are the bare gather of 32 random windows of 80 items of
  one segment, every field, no library code (`tf.gather` of the TF buffer's
  variables in one function call; NumPy `take` of arrays of the same size):
  what memory alone costs at that capacity.
* n-step: `get_next(256, transform=NStepReturns(3, 0.99))` against the plain
  `get_next(256, num_steps=4)` of the same 100k buffer: TF eagerly, TF in a
  serialized graph loop of 50 calls, and the NumPy twin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.common import GraphLoop, measure, size
from tfreplay import NStepReturns, PyUniformReplayBuffer, Sequences, TFUniformReplayBuffer
from tfreplay.rl.drivers import Transition

SEGMENTS, EPISODE, BATCH, STEPS = 4, size(500, 20), size(32, 4), size(80, 8)
CAPACITIES = [size(10_000, 400), size(100_000, 800), size(1_000_000, 1600)]
N_STEP_CAPACITY = CAPACITIES[1]
SPEC = Transition(
    observation=tf.TensorSpec([4], tf.float32),
    action=tf.TensorSpec([], tf.int64),
    reward=tf.TensorSpec([], tf.float32),
    discount=tf.TensorSpec([], tf.float32),
    next_observation=tf.TensorSpec([4], tf.float32),
    step_type=tf.TensorSpec([], tf.int32),
    terminated=tf.TensorSpec([], tf.bool),
    truncated=tf.TensorSpec([], tf.bool),
)


def _np_rows(t: int) -> Transition:
    """Row `t` of every segment: episodes of EPISODE steps, the last step terminated."""
    pos, zeros = t % EPISODE, np.zeros([SEGMENTS, 4], np.float32)
    last = np.full([SEGMENTS], pos == EPISODE - 1)
    return Transition(
        observation=zeros,
        action=np.zeros([SEGMENTS], np.int64),
        reward=np.ones([SEGMENTS], np.float32),
        discount=(~last).astype(np.float32),
        next_observation=zeros,
        step_type=np.full([SEGMENTS], 0 if pos == 0 else 1, np.int32),
        terminated=last,
        truncated=np.zeros([SEGMENTS], bool),
    )


def _tf_rows(t: tf.Tensor) -> Transition:
    """`_np_rows` in a graph."""
    pos, zeros = t % EPISODE, tf.zeros([SEGMENTS, 4])
    last = tf.fill([SEGMENTS], tf.equal(pos, EPISODE - 1))
    return Transition(
        observation=zeros,
        action=tf.zeros([SEGMENTS], tf.int64),
        reward=tf.ones([SEGMENTS]),
        discount=tf.cast(tf.logical_not(last), tf.float32),
        next_observation=zeros,
        step_type=tf.fill([SEGMENTS], tf.cast(pos > 0, tf.int32)),
        terminated=last,
        truncated=tf.zeros([SEGMENTS], tf.bool),
    )


def _tf_filled(capacity: int) -> Any:
    rb = TFUniformReplayBuffer(SPEC, SEGMENTS, capacity // SEGMENTS, seed=0)

    @tf.function
    def fill() -> None:
        for t in tf.range(capacity // SEGMENTS, dtype=tf.int64):
            rb.add_batch(_tf_rows(t))

    fill()
    return rb


def _py_filled(capacity: int) -> Any:
    rb = PyUniformReplayBuffer(SPEC, batch_size=SEGMENTS, max_length=capacity // SEGMENTS, seed=0)
    for t in range(capacity // SEGMENTS):
        rb.add_batch(_np_rows(t))
    return rb


@pytest.fixture(scope="module")
def buffers() -> dict:
    return {(twin, c): (_tf_filled if twin == "TF" else _py_filled)(c) for twin in ("TF", "Py") for c in CAPACITIES}


def _role(capacity: int) -> str | None:
    return "baseline" if capacity == CAPACITIES[0] else None


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("pad", [False, True], ids=["strict", "padded"])
@pytest.mark.parametrize("twin", ["TF", "Py"])
def test_sequences(benchmark, buffers, twin, pad, capacity):
    rb, transform = buffers[twin, capacity], Sequences(STEPS, pad=pad)
    group = f"sequences {twin} Sequences({STEPS}{', pad=True' if pad else ''}), get_next({BATCH})"
    fn = lambda: rb.get_next(BATCH, transform=transform)  # noqa: E731
    measure(benchmark, fn, group=group, case=f"{capacity:,} rows", role=_role(capacity), items=BATCH * STEPS)


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("twin", ["TF", "Py"])
def test_sequences_floor_bare_gather(benchmark, buffers, twin, capacity):
    length = capacity // SEGMENTS
    if twin == "TF":
        leaves = [v for v in buffers[twin, capacity].variables() if v.shape.rank and v.shape[0] == capacity]
        rng = tf.random.Generator.from_seed(1)

        def read() -> list:
            segment = rng.uniform([BATCH, 1], 0, SEGMENTS, dtype=tf.int64)
            t = rng.uniform([BATCH, 1], 0, length - STEPS + 1, dtype=tf.int64)
            return [tf.gather(v, (t + tf.range(STEPS, dtype=tf.int64)) * SEGMENTS + segment) for v in leaves]

        fn = tf.function(read, autograph=False)
    else:
        arrays = [np.ones([capacity] + s.shape.as_list(), s.dtype.as_numpy_dtype) for s in tf.nest.flatten(SPEC)]
        rng, steps = np.random.default_rng(1), np.arange(STEPS) * SEGMENTS

        def fn() -> list:
            rows = rng.integers(0, length - STEPS + 1, [BATCH, 1]) * SEGMENTS + rng.integers(0, SEGMENTS, [BATCH, 1])
            return [a.take(rows + steps, axis=0) for a in arrays]

    group = f"sequences {twin} floor: bare gather of {BATCH} x {STEPS} rows, every field"
    measure(benchmark, fn, group=group, case=f"{capacity:,} rows", role=_role(capacity), items=BATCH * STEPS)


@pytest.mark.parametrize("transform", ["num_steps=4", "NStepReturns(3)"])
@pytest.mark.parametrize("mode", ["TF eager", "TF in-graph", "Py"])
def test_n_step(benchmark, buffers, mode, transform):
    rb = buffers[mode[:2].strip(), N_STEP_CAPACITY]
    n = size(256, 8)
    if transform == "num_steps=4":
        sample = lambda: rb.get_next(n, num_steps=4)  # noqa: E731
    else:
        n_step = NStepReturns(n=3, gamma=0.99)
        sample = lambda: rb.get_next(n, transform=n_step)  # noqa: E731
    fn = GraphLoop(lambda: sample()[0], calls=size(50, 2)) if mode == "TF in-graph" else sample
    role = "baseline" if transform == "num_steps=4" else None
    group = f"n-step {mode}, get_next({n}), {N_STEP_CAPACITY:,} rows"
    measure(benchmark, fn, group=group, case=transform, role=role, items=n)
