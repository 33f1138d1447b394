"""Prioritized replay: a sample + priority update against uniform sampling, array ops and cpprb.

Buffers: the CartPole spec, 16 segments x 65,536 rows (1M rows), full, every
item given a random priority in [0.1, 10) (alpha 0.6). A "PER pair" is
`get_next(256)` then `update_priorities(ids, new)` of the drawn ids. Groups:

* NumPy: the `PyPrioritizedReplayBuffer` pair against the uniform twin's
  `get_next(256)` (the baseline), the same pair with the compiled sum tree
  off (`PrioritizedSampler(use_native=False)`, array ops), and cpprb's
  `PrioritizedReplayBuffer` (`sample(256, beta=0.4)` + `update_priorities`)
  where cpprb is installed (the `bench` extra).
* TF in-graph: the same in one serialized graph loop (200 pairs, each after
  the previous one), against the uniform `get_next(256)` in the same loop; the
  floor is random rows + one `tf.gather` per leaf in that loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.common import GraphLoop, fill_in_graph, measure, size
from tfreplay import PrioritizedSampler, PyUniformReplayBuffer, TFUniformReplayBuffer, compose

SEGMENTS, LENGTH, SAMPLE, ALPHA = 16, size(65_536, 64), size(256, 8), 0.6
CAPACITY = SEGMENTS * LENGTH
SPEC = {
    "observation": tf.TensorSpec([4], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "discount": tf.TensorSpec([], tf.float32),
}
KINDS = ["uniform", "compiled tree", "array ops"]


class Prioritized(compose.Buffer):
    """A prioritized buffer assembled from its parts (`tfreplay.compose`), so its sampler can be chosen."""

    update_priorities = compose.update_priorities


def _sampler(kind: str) -> Any:
    return PrioritizedSampler(ALPHA, use_native=kind == "compiled tree")


def _batch() -> dict:
    rng = np.random.default_rng(0)
    return {
        "observation": rng.normal(size=(SEGMENTS, 4)).astype(np.float32),
        "action": rng.integers(0, 2, SEGMENTS),
        "reward": np.ones(SEGMENTS, np.float32),
        "discount": np.ones(SEGMENTS, np.float32),
    }


def _priorities() -> np.ndarray:
    return np.random.default_rng(1).uniform(0.1, 10.0, CAPACITY)


@pytest.fixture(scope="module")
def py_buffers() -> dict:
    batch, out = _batch(), {}
    for kind in KINDS:
        if kind == "uniform":
            rb = PyUniformReplayBuffer(SPEC, batch_size=SEGMENTS, max_length=LENGTH, seed=0)
        else:
            twin = compose.NumpyTwin(0)
            rb = Prioritized(
                SPEC, twin, batch_size=SEGMENTS, max_length=LENGTH, sampler=_sampler(kind), episode_rule=None
            )
        for _ in range(LENGTH):
            rb.add_batch(batch)
        if kind != "uniform":
            rb.update_priorities(np.arange(CAPACITY), _priorities())
        out[kind] = rb
    return out


@pytest.fixture(scope="module")
def tf_buffers() -> dict:
    batch, out = tf.nest.map_structure(tf.constant, _batch()), {}
    for kind in KINDS:
        if kind == "uniform":
            rb = TFUniformReplayBuffer(SPEC, SEGMENTS, LENGTH, seed=0)
        else:
            twin = compose.TFTwin("per", seed=0)
            rb = Prioritized(
                SPEC, twin, batch_size=SEGMENTS, max_length=LENGTH, sampler=_sampler(kind), episode_rule=None
            )
        fill_in_graph(rb.add_batch, batch, LENGTH)
        if kind != "uniform":
            rb.update_priorities(np.arange(CAPACITY), _priorities())
        out[kind] = rb
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_numpy(benchmark, py_buffers, kind):
    rb, new = py_buffers[kind], np.random.default_rng(2).uniform(0.1, 10.0, SAMPLE)

    def pair() -> None:
        _, info = rb.get_next(SAMPLE)
        rb.update_priorities(info.ids, new)

    if kind == "uniform":
        fn, case, role = (lambda: rb.get_next(SAMPLE)), "uniform get_next", "baseline"
    else:
        fn, case, role = pair, f"PER pair, {kind}", None
    measure(benchmark, fn, group="prioritized NumPy", case=case, role=role, items=SAMPLE)


def test_numpy_cpprb(benchmark):
    cpprb = pytest.importorskip("cpprb")
    env = {"obs": {"shape": 4}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    rb = cpprb.PrioritizedReplayBuffer(CAPACITY, env, alpha=ALPHA)
    batch = _batch()
    rows = {"obs": batch["observation"], "act": batch["action"], "rew": batch["reward"], "done": batch["discount"]}
    for _ in range(LENGTH):
        rb.add(**rows)
    rb.update_priorities(np.arange(CAPACITY), _priorities())
    new = np.random.default_rng(2).uniform(0.1, 10.0, SAMPLE)

    def pair() -> None:
        rb.update_priorities(rb.sample(SAMPLE, beta=0.4)["indexes"], new)

    measure(benchmark, pair, group="prioritized NumPy", case="cpprb PER pair", items=SAMPLE)


@pytest.mark.parametrize("kind", KINDS)
def test_tf_in_graph(benchmark, tf_buffers, kind):
    rb = tf_buffers[kind]

    def pair() -> Any:
        items, info = rb.get_next(SAMPLE)
        new = tf.cast(tf.abs(items["observation"][:, 0]), tf.float64) + 0.1
        return items, rb.update_priorities(info.ids, new)

    if kind == "uniform":
        loop, case, role = GraphLoop(lambda: rb.get_next(SAMPLE)), "uniform get_next", "baseline"
    else:
        loop, case, role = GraphLoop(pair), f"PER pair, {kind}", None
    measure(benchmark, loop, group="prioritized TF in-graph", case=case, role=role, items=SAMPLE)


def test_tf_in_graph_floor(benchmark, tf_buffers):
    leaves = [v for v in tf_buffers["uniform"].variables() if v.shape.rank and v.shape[0] == CAPACITY]
    loop = GraphLoop(lambda: [tf.gather(v, tf.random.uniform([SAMPLE], 0, CAPACITY, tf.int64)) for v in leaves])
    measure(
        benchmark,
        loop,
        group="prioritized TF in-graph",
        case="floor: random rows + tf.gather",
        role="floor",
        items=SAMPLE,
    )
